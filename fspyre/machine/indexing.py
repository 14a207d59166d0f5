"""Exact integer evaluation of device-coordinate expressions on numpy arrays.

``device_coordinates`` yields sympy expressions such as ``floor(c1/64)`` and ``Mod(c1, 64)``;
the machine-model interpreter evaluates them over millions of elements. ``sympy.lambdify``
computes in floats, so this module compiles the small integer subset those expressions use into
one Python lambda over ``//``, ``%``, ``+`` and ``*``: numpy int64 arrays (open grids from
``np.ix_`` broadcast) and plain ints both work, with floor-division semantics throughout.

Supported: Integer, Symbol, Add, Mul with an integer coefficient, ``Mod(x, c)`` with integer
``c``, and ``floor(x)`` where ``x`` may carry Rational coefficients (``floor(c1/64)`` is
evaluated as ``c1 // 64``). Anything else raises LoweringError.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import lru_cache

import numpy as np
import sympy

from fspyre.errors import LoweringError

IndexFn = Callable[..., np.ndarray | int]


def as_expr(expr: sympy.Basic | int, where: str) -> sympy.Basic:
    """``expr`` as a sympy expression, without parsing: ``sympify`` of a string evaluates it as
    Python, and an index that arrived as text (a hand-edited artifact) must not run."""
    if isinstance(expr, sympy.Basic):
        return expr
    if isinstance(expr, (int, np.integer)) and not isinstance(expr, bool):
        return sympy.Integer(int(expr))
    raise LoweringError(
        f"{where}: expected an index expression (sympy or int), got a {type(expr).__name__} {expr!r:.60}"
    )


@lru_cache(maxsize=16384)
def free_names(expr: sympy.Basic) -> frozenset[str]:
    """Names of the symbols ``expr`` uses. Cached and keyed by name: sympy recomputes
    ``free_symbols`` on every access, and printing a Symbol to get its name is slower still."""
    return frozenset(s.name for s in expr.free_symbols)


def compile_index(expr: sympy.Expr | int, symbols: Sequence[sympy.Symbol]) -> IndexFn:
    """A function of ``symbols`` (positionally) that evaluates ``expr`` exactly in integers."""
    return _compile(as_expr(expr, "compile_index"), tuple(symbols))


@lru_cache(maxsize=4096)
def _compile(expr: sympy.Expr, symbols: tuple[sympy.Symbol, ...]) -> IndexFn:
    names: dict[sympy.Symbol, str] = {}
    for i, s in enumerate(symbols):
        if not isinstance(s, sympy.Symbol) or s in names:
            raise LoweringError(f"compile_index: symbols must be distinct sympy Symbols, got {symbols}")
        names[s] = f"a{i}"
    body = _emit(expr, expr, names)
    # Generated source is one expression: one Python call per evaluation and no per-node
    # closure overhead, which matters when the interpreter evaluates per element in scalar mode.
    source = f"lambda {', '.join(names.values())}: {body}"
    # (the filename stays constant: printing the expression for it cost more than compiling)
    return eval(compile(source, "<fspyre index>", "eval"), {"__builtins__": {}})


def _emit(node: sympy.Expr, whole: sympy.Expr, names: dict[sympy.Symbol, str]) -> str:
    """Python source for an integer-valued ``node``."""
    if node.is_Integer:
        return f"({int(node)})"
    if node.is_Symbol:
        if node not in names:
            raise LoweringError(f"compile_index: {node} in {whole} is not among the symbols {tuple(names)}")
        return names[node]
    if isinstance(node, sympy.Add):
        return "(" + " + ".join(_emit(a, whole, names) for a in node.args) + ")"
    if isinstance(node, sympy.Mul):
        coef, rest = node.as_coeff_Mul()
        if not coef.is_Integer:
            raise LoweringError(
                f"compile_index: {node} in {whole} has the non-integer coefficient {coef}; "
                f"a Rational coefficient is only supported inside floor"
            )
        factors = [_emit(f, whole, names) for f in sympy.Mul.make_args(rest)]
        if coef != 1:
            factors.insert(0, f"({int(coef)})")
        return "(" + " * ".join(factors) + ")"
    if isinstance(node, sympy.floor):
        return _emit_floor(node, whole, names)
    if isinstance(node, sympy.Mod):
        base, modulus = node.args
        if not modulus.is_Integer or modulus == 0:
            raise LoweringError(f"compile_index: {node} in {whole} needs a nonzero integer modulus, got {modulus}")
        return f"({_emit(base, whole, names)} % {int(modulus)})"
    raise LoweringError(
        f"compile_index: unsupported sub-expression {node} ({type(node).__name__}) in {whole}; "
        f"supported are integers, symbols, +, integer *, floor and Mod"
    )


def _emit_floor(node: sympy.floor, whole: sympy.Expr, names: dict[sympy.Symbol, str]) -> str:
    """``floor(sum(q_i * t_i))`` with rational ``q_i`` as ``sum(q_i * L * t_i) // L``."""
    terms = []
    for term in sympy.Add.make_args(node.args[0]):
        coef, rest = term.as_coeff_Mul()
        if not coef.is_Rational:
            raise LoweringError(f"compile_index: {node} in {whole} has the non-rational coefficient {coef}")
        terms.append((coef, rest))
    denom = math.lcm(*(int(c.q) for c, _ in terms))
    parts = []
    for coef, rest in terms:
        scaled = int(coef * denom)
        if rest is sympy.S.One:
            parts.append(f"({scaled})")
        else:
            parts.append(f"({scaled}) * {_emit(rest, whole, names)}")
    numerator = "(" + " + ".join(parts) + ")"
    return numerator if denom == 1 else f"({numerator} // {denom})"
