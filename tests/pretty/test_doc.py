"""The document algebra: layout never changes content, fits the width when it can, and
leaves no trailing spaces."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from fspyre.pretty.doc import Doc, bracket, concat, hardline, lines, nest, render, text

words = st.text(alphabet="abcxyz0123=", min_size=1, max_size=8)
trees = st.recursive(words, lambda inner: st.lists(inner, min_size=0, max_size=5), max_leaves=30)


def to_doc(tree) -> Doc:
    if isinstance(tree, str):
        return text(tree)
    return bracket("[", (to_doc(t) for t in tree), "]")


def flat(tree) -> str:
    return tree if isinstance(tree, str) else "[" + ", ".join(map(flat, tree)) + "]"


def depth(tree) -> int:
    return 0 if isinstance(tree, str) else 1 + max(map(depth, tree), default=0)


@given(trees)
def test_wide_enough_is_one_line(tree):
    assert render(to_doc(tree), width=10**6) == flat(tree)


@given(trees, st.integers(min_value=0, max_value=120))
def test_breaking_keeps_the_content(tree, width):
    out = render(to_doc(tree), width=width)
    squeezed = re.sub(r",\]", "]", re.sub(r"\s", "", out))  # broken lists end in a trailing comma
    assert squeezed == re.sub(r"\s", "", flat(tree))
    assert all(line == line.rstrip() for line in out.splitlines())


@given(trees, st.integers(min_value=0, max_value=120))
def test_lines_fit_when_every_atom_does(tree, width):
    # A broken line holds at most its indent, one word or bracket, and ", ]"-style punctuation.
    if width < 2 * depth(tree) + 8 + 3:
        return
    out = render(to_doc(tree), width=width)
    assert max(len(line) for line in out.splitlines()) <= width


def test_nest_indents_only_broken_lines():
    doc = lines([text("for A in 0..2:"), nest(2, concat(hardline(), "body")), text("end")])
    assert render(doc) == "for A in 0..2:\n\n  body\nend"
    assert render(concat("f", bracket("(", [text("x")], ")", force=True))) == "f(\n  x,\n)"
