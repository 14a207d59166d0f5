"""Symbolic sizes: a dim declared without a size, and the assumptions a compile makes about it.

``g.dim("S")`` gives dim ``S`` the size ``size_symbol("S")``, a positive integer sympy Symbol
printed ``|S|`` (the iteration variable of the dim stays ``sym("S")``: the two are different
symbols, and the printed forms keep them apart). A compiled program over such a dim holds
expressions in ``|S|`` where a concrete one holds integers (loop counts, byte sizes, HBM
offsets and advances); ``Assumption`` records each fact about ``|S|`` the compile relied on,
and ``SymbolicSizes`` is the record a symbolic compile hands to ``fspyre.run``, which binds
``|S|`` from the input shapes and checks every assumption before it runs
(docs/tiling.md, "Symbolic sizes").
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import sympy

from fspyre.errors import GraphError
from fspyre.ir.frozen import require_int, require_tuple

# the fixed quantity of a symbolic dim's loop: its tile or its count; or no loop at all (whole)
SIZE_FORMS = ("tile", "count", "whole")
ASSUMPTION_KINDS = ("divisible", "at_least", "at_most")


@lru_cache(maxsize=None)
def size_symbol(name: str) -> sympy.Symbol:
    """The size of symbolic dim ``name``: a positive integer, printed ``|name|``."""
    return sympy.Symbol(f"|{name}|", integer=True, positive=True)


def is_size_symbol(value: object) -> bool:
    return isinstance(value, sympy.Symbol) and value.name.startswith("|") and value.name.endswith("|")


def size_dim_name(symbol: sympy.Symbol) -> str:
    """The dim whose size ``symbol`` is."""
    return symbol.name[1:-1]


def is_size_expr(value: object) -> bool:
    """A dim size that is a size symbol or an affine form ``a*|S| + b`` in one (integers
    ``a >= 1``, ``b``): the size of a dim that follows a symbolic dim, as a cache of
    ``|L| + 1`` rows follows the ``|L|`` it was concatenated from."""
    if is_size_symbol(value):
        return True
    if not isinstance(value, sympy.Expr) or len(value.free_symbols) != 1:
        return False
    (s,) = value.free_symbols
    if not is_size_symbol(s):
        return False
    a, b = sympy.expand(value).as_coefficients_dict(s).get(s, 0), value.xreplace({s: 0})
    return (sympy.expand(value - a * s - b) == 0 and sympy.Integer(a).is_Integer and a >= 1
            and sympy.sympify(b).is_Integer)


def is_symbolic(value: object) -> bool:
    """A size, count or address that is an expression in symbolic sizes, not an integer."""
    return isinstance(value, sympy.Basic) and not value.is_Integer


def size_symbols(value: sympy.Basic) -> frozenset[sympy.Symbol]:
    return frozenset(s for s in value.free_symbols if is_size_symbol(s))


@dataclass(frozen=True, slots=True, kw_only=True)
class Assumption:
    """One fact about symbolic dim ``dim`` the compile relies on: ``|dim| % value == 0``
    (``divisible``), ``|dim| >= value`` (``at_least``) or ``|dim| <= value`` (``at_most``).
    ``reason`` says which decision needs it, in words a user can act on."""

    dim: str
    kind: str
    value: int
    reason: str

    def __post_init__(self) -> None:
        if self.kind not in ASSUMPTION_KINDS:
            raise GraphError(f"assumption on {self.dim}: kind {self.kind!r} is not one of {ASSUMPTION_KINDS}")
        require_int(self.value, f"assumption on {self.dim}: value", GraphError, 1)

    def holds(self, size: int) -> bool:
        if self.kind == "divisible":
            return size % self.value == 0
        if self.kind == "at_least":
            return size >= self.value
        return size <= self.value

    def __str__(self) -> str:
        op = {"divisible": "%", "at_least": ">=", "at_most": "<="}[self.kind]
        claim = f"|{self.dim}| % {self.value} == 0" if op == "%" else f"|{self.dim}| {op} {self.value}"
        return f"{claim}  ({self.reason})"


@dataclass(frozen=True, slots=True, kw_only=True)
class SymbolicDim:
    """How the loop over symbolic dim ``name`` is cut: ``form="tile"`` keeps each tile at
    ``fixed`` elements and runs ``|name| / fixed`` iterations; ``form="count"`` runs ``fixed``
    iterations of ``|name| / fixed`` elements; ``form="whole"`` (``fixed`` 1) has no loop:
    every op takes all of the dim, of any size, on each core it runs on."""

    name: str
    form: str
    fixed: int

    def __post_init__(self) -> None:
        if self.form not in SIZE_FORMS:
            raise GraphError(f"symbolic dim {self.name}: form {self.form!r} is not one of {SIZE_FORMS}")
        require_int(self.fixed, f"symbolic dim {self.name}: fixed {self.form}", GraphError, 1)

    @property
    def symbol(self) -> sympy.Symbol:
        return size_symbol(self.name)

    @property
    def count(self) -> sympy.Expr:
        return self.symbol / self.fixed if self.form == "tile" else sympy.Integer(self.fixed)

    @property
    def tile(self) -> sympy.Expr:
        return sympy.Integer(self.fixed) if self.form == "tile" else self.symbol / self.fixed



@dataclass(frozen=True, slots=True, kw_only=True)
class SymbolicSizes:
    """What a symbolic compile decided about its symbolic dims and everything it assumed.
    ``witnesses`` are the sizes of each dim (in ``dims`` order) at which the concrete stages
    ran to derive the program's expressions (docs/tiling.md, "Symbolic sizes")."""

    dims: tuple[SymbolicDim, ...]
    assumptions: tuple[Assumption, ...]
    witnesses: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        require_tuple(self.dims, "symbolic sizes: dims", GraphError, SymbolicDim, non_empty=True)
        require_tuple(self.assumptions, "symbolic sizes: assumptions", GraphError, Assumption)
        require_tuple(self.witnesses, "symbolic sizes: witnesses", GraphError, tuple)
        names = {d.name for d in self.dims}
        for a in self.assumptions:
            if a.dim not in names:
                raise GraphError(f"symbolic sizes: an assumption names {a.dim}, which is not one of {sorted(names)}")

    def violated(self, sizes: dict[str, int]) -> list[Assumption]:
        return [a for a in self.assumptions if not a.holds(sizes[a.dim])]


def require_size(value: object, what: str, error: type[Exception], least: int) -> None:
    """An integer >= ``least``, or an expression in symbolic sizes alone (a count, byte size or
    address of a symbolic program; ``instantiate`` checks the integer it becomes)."""
    if type(value) is int:  # the common case first: concrete programs are most of them
        if value < least:
            raise error(f"{what} {value!r:.60} must be an integer >= {least}")
        return
    if isinstance(value, sympy.Expr) and is_symbolic(value):
        if value.free_symbols and all(is_size_symbol(s) for s in value.free_symbols):
            return
        raise error(f"{what} {value} must be an integer or an expression in symbolic sizes")
    require_int(value, what, error, least)


def require_sizes(value: object, what: str, error: type[Exception], least: int, non_empty: bool = False) -> None:
    if type(value) is tuple and (value or not non_empty) and all(type(x) is int and x >= least for x in value):
        return
    require_tuple(value, what, error, (int, sympy.Expr), non_empty=non_empty)
    for x in value:  # type: ignore[attr-defined]
        require_size(x, what, error, least)
