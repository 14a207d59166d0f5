"""A small document algebra: printers build documents, ``render`` lays them out.

Modelled on JAX's ``pretty_printer`` (itself Wadler's "prettier printer"): a printer says
*what* is printed and where a line may break; ``render`` decides *how*, fitting each group
on one line when it fits the width and breaking every break of the group otherwise. Keeping
layout out of the printers is what lets one printer serve a compact and a detailed view.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Union


@dataclass(frozen=True, slots=True)
class Text:
    text: str

    def __post_init__(self) -> None:
        if "\n" in self.text:
            raise ValueError(f"text {self.text!r} holds a newline; use hardline() between lines")


@dataclass(frozen=True, slots=True)
class Concat:
    docs: tuple["Doc", ...]


@dataclass(frozen=True, slots=True)
class Nest:
    """Lines broken inside ``doc`` start ``indent`` columns further right."""

    indent: int
    doc: "Doc"


@dataclass(frozen=True, slots=True)
class Break:
    """``flat`` when its group fits on the line, a newline otherwise."""

    flat: str


@dataclass(frozen=True, slots=True)
class HardLine:
    """Always a newline; a group holding one never lays out flat."""


@dataclass(frozen=True, slots=True)
class Group:
    doc: "Doc"


@dataclass(frozen=True, slots=True)
class IfBroken:
    """Printed only when the enclosing group is broken (a trailing comma)."""

    text: str


@dataclass(frozen=True, slots=True)
class NeverFlat:
    """Keeps the enclosing group broken: a view that wants one item per line."""


Doc = Union[Text, Concat, Nest, Break, HardLine, Group, IfBroken, NeverFlat]

EMPTY: Doc = Concat(())
_HARD = HardLine()


def text(s: str) -> Doc:
    return Text(s)


def concat(*docs: Doc | str) -> Doc:
    return Concat(tuple(Text(d) if isinstance(d, str) else d for d in docs))


def nest(indent: int, doc: Doc) -> Doc:
    return Nest(indent, doc)


def brk(flat: str = " ") -> Doc:
    return Break(flat)


def hardline() -> Doc:
    return _HARD


def group(doc: Doc) -> Doc:
    return Group(doc)


def join(sep: Doc, docs: Iterable[Doc]) -> Doc:
    out: list[Doc] = []
    for i, d in enumerate(docs):
        if i:
            out.append(sep)
        out.append(d)
    return Concat(tuple(out))


def lines(docs: Iterable[Doc]) -> Doc:
    """One document per line."""
    return join(_HARD, docs)


def bracket(open_: str, items: Iterable[Doc], close: str, *, indent: int = 2, force: bool = False) -> Doc:
    """``open a, b, c close`` on one line if it fits, else one item per line, indented, with a
    trailing comma (Python style, so the broken form is still valid wrapper source).
    ``force`` always breaks it."""
    docs = tuple(items)
    if not docs:
        return text(open_ + close)
    body = join(concat(",", brk()), docs)
    inner = concat(open_, nest(indent, concat(brk(""), body, IfBroken(","))), brk(""), close)
    return Group(concat(inner, NeverFlat()) if force else inner)


_FLAT, _BROKEN = True, False


def render(doc: Doc, width: int = 100) -> str:
    """Lay ``doc`` out within ``width`` columns where groups allow; no trailing spaces."""
    out: list[str] = []
    col = 0
    pending = -1  # indent owed to the current line, written before its first text
    stack: list[tuple[int, bool, object]] = [(0, _BROKEN, doc)]
    while stack:
        indent, mode, d = stack.pop()
        if isinstance(d, Text):
            if d.text:
                if pending >= 0:
                    out.append(" " * pending)
                    col, pending = pending, -1
                out.append(d.text)
                col += len(d.text)
        elif isinstance(d, Concat):
            stack.extend((indent, mode, c) for c in reversed(d.docs))
        elif isinstance(d, Nest):
            stack.append((indent + d.indent, mode, d.doc))
        elif isinstance(d, Break):
            if mode is _FLAT:
                stack.append((indent, mode, Text(d.flat)))
            else:
                out.append("\n")
                col, pending = 0, indent
        elif isinstance(d, HardLine):
            out.append("\n")
            col, pending = 0, indent
        elif isinstance(d, Group):
            here = pending if pending >= 0 else col
            flat = mode is _FLAT or _fits(d.doc, width - here, stack)
            stack.append((indent, _FLAT if flat else _BROKEN, d.doc))
        elif isinstance(d, IfBroken):
            if mode is _BROKEN:
                stack.append((indent, mode, Text(d.text)))
        elif isinstance(d, NeverFlat):
            pass
        else:
            raise TypeError(f"not a document: {d!r}")
    return "".join(out)


def _fits(doc: Doc, room: int, rest: list[tuple[int, bool, object]]) -> bool:
    """Does ``doc`` laid out flat, plus whatever follows it up to the next line break, fit?"""
    todo: list[tuple[bool, object]] = [(_FLAT, doc)]
    i = len(rest)
    while room >= 0:
        if not todo:
            if i == 0:
                return True
            i -= 1
            _, mode, d = rest[i]
            todo.append((mode, d))
            continue
        mode, d = todo.pop()
        if isinstance(d, Text):
            room -= len(d.text)
        elif isinstance(d, Concat):
            todo.extend((mode, c) for c in reversed(d.docs))
        elif isinstance(d, Nest):
            todo.append((mode, d.doc))
        elif isinstance(d, Break):
            if mode is _BROKEN:
                return True
            room -= len(d.flat)
        elif isinstance(d, HardLine):
            return mode is _BROKEN
        elif isinstance(d, Group):
            todo.append((mode, d.doc))
        elif isinstance(d, IfBroken):
            if mode is _BROKEN:
                room -= len(d.text)
        elif isinstance(d, NeverFlat):
            if mode is _FLAT:
                return False
    return False
