"""Compiling a graph with symbolic dims once, and binding its sizes when it runs.

The rule (docs/tiling.md, "Symbolic sizes"): every op over a symbolic dim ``S`` runs inside a
loop over ``S`` whose *tile is fixed* (``slices={"S": S.size // T}``, the form the hardware
prefers: every LX buffer and every op's iteration space has a fixed size, only the trip count
``|S|/T`` and the HBM sizes, offsets and advances of the tensors holding all of ``S`` vary) or
whose *count is fixed* (``slices={"S": n}``: tiles of ``|S|/n`` elements, so per-tile LX
buffers grow with ``|S|`` and an upper bound on ``|S|`` keeps them inside LX). A graph that
reduces over a symbolic dim, or has a dim whose size follows it (``|S| + 1``), has no loop
over it (the *whole* form): every op holds all of ``S``, work division never splits it, and
each number of the program is a combination of ``1``, ``|S|`` and the stick counts
``ceiling(e/E)`` of the buffers over it (``Fit``, ``stick_basis``), so any size runs, not only
whole tiles.

How the expressions are found. The concrete stages (tiling, residency, work division,
allocation, program) run unchanged at several *witness* sizes of ``S`` that satisfy the
divisibility the loop needs: ``|S| = k * L`` for k in ``WITNESSES``. With the tile fixed every
decision those stages take is a decision about one tile, so the programs must have the same
structure at every witness, and every integer in them (trip counts, byte sizes, HBM
addresses, advances) is affine in ``|S|``; ``generalize`` checks both -- the structure
equal, each number on the line through the first two witnesses at the third -- and writes
the line as a sympy expression. A program for which either fails is refused, naming the
field that moved. Concrete compiles never come here, so they pay nothing for sympy.

What the program assumes is recorded in it (``Program.symbolic``): ``|S|`` a multiple of
the loop's tile (whole tiles, no tail), at least one tile, and at most the size at which
the HBM the program allocates (or, in the count form, its LX) would overflow. ``fspyre.run``
binds ``|S|`` from the input shapes, checks each assumption and runs ``instantiate``'s
concrete program on the interpreter.
"""

from __future__ import annotations

import dataclasses
import math
import typing
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import sympy

from fspyre.errors import ExecutionError, FspyreError, FspyreWarning, TilingError
from fspyre.ir.frozen import FrozenMap
from fspyre.ir.graph import Graph, HintScope, Reduction, iteration_dims
from fspyre.ir.program import KernelArg, LoopSpec, Program, op_specs
from fspyre.ir.symbolic import (
    Assumption,
    SymbolicDim,
    SymbolicSizes,
    is_size_symbol,
    is_symbolic,
    size_dim_name,
    size_symbol,
    size_symbols,
)
from fspyre.machine.formats import FORMATS, STICK_BYTES
from fspyre.machine.rules import device_bytes

# |S| = k * L at these k: two fix each number's line, the third checks it. Not 1: a loop of
# one iteration is a degenerate witness (nothing advances), and the program must also run there.
WITNESSES = (3, 4, 5)
# The tile a symbolic dim gets when no hint cuts it: one stick of 2-byte elements.
DEFAULT_TILE = STICK_BYTES // 2


class SymbolicError(TilingError):
    """A symbolic dim used where its size must be fixed, or a program that is not the same
    program at every size."""


# --- the graph ------------------------------------------------------------------------------
def symbolic_dim_names(graph: Graph) -> tuple[str, ...]:
    """The symbolic dims of ``graph`` (by the name their size symbol carries), in buffer order."""
    names: dict[str, None] = {}
    for b in graph.buffers:
        for d in b.type.dims:
            if not isinstance(d.size, int):
                names.update((size_dim_name(x), None) for x in sorted(size_symbols(d.size), key=str))
    return tuple(names)


def symbolic_size_dims(graph: Graph) -> frozenset[str]:
    """The dims of ``graph`` whose size depends on a symbolic size (``|S|``, ``|S| + 1``)."""
    dims = [d for b in graph.buffers for d in b.type.dims]
    dims += [d for op in graph.ops for d in iteration_dims(op)]
    return frozenset(d.name for d in dims if not isinstance(d.size, int))


def plan_symbolic(graph: Graph, hinted: bool = True) -> tuple[Graph, tuple[SymbolicDim, ...], tuple[str, ...]]:
    """The graph with every op over a symbolic dim in a loop over it, the form of each such
    loop, and the warnings for the loops fspyre added. Refuses what cannot be symbolic.
    A reduction over the dim, or a dim that follows it, gives the whole form (no loop).
    Without hints (``tiling="none"``, ``hinted=False``) every op takes the whole dim: the
    count form with one tile."""
    names = symbolic_dim_names(graph)
    if len(names) > 1:
        raise SymbolicError(
            f"graph {graph.name}: dims {', '.join(names)} are all symbolic; fspyre compiles one symbolic dim "
            f"per graph: give all but one of them a size (g.dim(name, size))")
    (name,) = names
    s = size_symbol(name)
    # A reduction over the symbolic size, or a dim whose size only follows it (|S| + 1), takes
    # the whole form: no loop over it, every op holds all of it (a loop of fixed tiles could
    # not cut |S| and |S| + 1 alike, nor run a tail whose size moves).
    varying = symbolic_size_dims(graph)
    reduces = [(op, d) for op in graph.ops if isinstance(op, Reduction) for d in op.reduction_ranges
               if d.name in varying]
    follows = sorted({d.name for b in graph.buffers for d in b.type.dims if d.name in varying and d.size != s})
    if reduces or follows:
        scopes = graph.hint_table()
        for op in graph.ops:
            for h in op.hints:
                sliced = sorted(set(scopes[h].slices) & varying)
                if sliced:
                    why = (f"{reduces[0][0].fn} op {reduces[0][0].name} reduces over {reduces[0][1].name}" if reduces
                           else f"dims {', '.join(follows)} follow it")
                    raise SymbolicError(
                        f"op {op.name}: hint scope {h} slices dims {sliced} of symbolic size {s}, which is held whole "
                        f"({why}); drop the slices hint on {', '.join(sliced)}, or give {name} a size")
        return graph, (SymbolicDim(name=name, form="whole", fixed=1),), ()
    if not hinted:
        return graph, (SymbolicDim(name=name, form="count", fixed=1),), ()
    scopes = graph.hint_table()
    forms: dict[str, set[tuple[str, int]]] = {}
    uncut = []
    for op in graph.ops:
        over = [d.name for d in iteration_dims(op) if d.size == s]
        if not over:
            continue
        cut = False
        for h in op.hints:
            for dim_name, count in scopes[h].slices.items():
                if dim_name not in over:
                    continue
                cut = True
                if isinstance(count, sympy.Basic):
                    tile = s / count
                    if not tile.is_Integer or tile < 1:  # |S|/T: tiles of T elements
                        raise SymbolicError(f"op {op.name}: hint scope {h} slices={{{dim_name!r}: {count}}}: a "
                                            f"count on symbolic dim {dim_name} is {s}/T, T whole tiles' elements")
                    form = ("tile", int(tile))
                else:
                    form = ("count", int(count))
                forms.setdefault(dim_name, set()).add(form)
        for h in op.hints:
            for dim_name, k in scopes[h].work_div.items():
                if dim_name in over:
                    raise SymbolicError(
                        f"op {op.name}: work_div={{{dim_name!r}: {k}}} on symbolic dim {dim_name}: the cores split the "
                        f"fixed tile of a symbolic dim, chosen by fspyre; drop the work_div hint on {dim_name}")
        if not cut:
            if len(over) > 1:
                raise SymbolicError(f"op {op.name}: dims {over} all have the symbolic size {s}; slice each with a "
                                    f"hint (slices={{{over[0]!r}: {over[0]}.size // 64}})")
            uncut.append((op.name, over[0]))
    warns: list[str] = []
    if uncut:
        # one loop around every op over S that no hint cuts, the innermost scope of each
        dims = sorted({dim for _, dim in uncut})
        new = HintScope(id=len(graph.hints), slices=FrozenMap({dim: s / DEFAULT_TILE for dim in dims}))
        cut_ops = {n for n, _ in uncut}
        ops = tuple(dataclasses.replace(op, hints=op.hints + (new.id,)) if op.name in cut_ops else op
                    for op in graph.ops)
        graph = dataclasses.replace(graph, ops=ops, hints=graph.hints + (new,))
        for dim in dims:
            forms.setdefault(dim, set()).add(("tile", DEFAULT_TILE))
        warns.append(f"symbolic dim {name}: ops {', '.join(n for n, _ in uncut)} run in loops of fixed tiles of "
                     f"{DEFAULT_TILE} elements of {', '.join(dims)} (no hint cuts them); |{name}| must be a multiple "
                     f"of {DEFAULT_TILE}")
    if not forms:
        raise SymbolicError(f"graph {graph.name}: no op iterates over symbolic dim {name}")
    all_forms = set().union(*forms.values())
    kinds = {f for f, _ in all_forms}
    if len(kinds) > 1:
        raise SymbolicError(
            f"symbolic dim {name}: hints fix the tile ({sorted(n for f, n in all_forms if f == 'tile')}) in some "
            f"scopes and the count ({sorted(n for f, n in all_forms if f == 'count')}) in others; use one form "
            f"for every loop over {name}")
    (kind,) = kinds
    fixed = sorted(n for _, n in all_forms)
    if kind == "count":
        # each count's tile must itself be whole sticks at every size: |S| a multiple of count * stick
        unit = math.lcm(*(n * DEFAULT_TILE for n in fixed))
    else:
        unit = math.lcm(*fixed)
    return graph, (SymbolicDim(name=name, form=kind, fixed=unit if kind == "tile" else fixed[0]),), tuple(warns)


# --- substitution -------------------------------------------------------------------------
def substitute(value: Any, env: Mapping[sympy.Symbol, int], tp: Any = Any) -> Any:
    """``value`` with each size symbol in ``env`` replaced by its integer: every frozen IR
    value is rebuilt through its constructor (so its checks run again), and an expression
    that becomes a number becomes an ``int`` where the field's declared type takes one."""
    if isinstance(value, sympy.Basic):
        out = sympy.sympify(value.xreplace(env)) if value.free_symbols & env.keys() else value
        if out.is_Integer and _takes_int(tp):
            return int(out)
        if out.is_Rational and not out.is_Integer and _takes_int(tp):
            raise SymbolicError(f"{value} is not a whole number at {_sizes(env)}")
        unknown = sorted(str(s) for s in out.free_symbols if is_size_symbol(s) and s not in env)
        if unknown and tp is not Any and _takes_int(tp):
            raise SymbolicError(f"{value} names the size {unknown[0]}, which is none of the sizes given "
                                f"({_sizes(env)})")
        return out
    if isinstance(value, tuple):
        args = typing.get_args(tp)
        item = args[0] if len(args) == 2 and args[1] is Ellipsis else Any
        return tuple(substitute(v, env, item) for v in value)
    if isinstance(value, FrozenMap):
        kt, vt = typing.get_args(tp) or (Any, Any)
        return FrozenMap((substitute(k, env, kt), substitute(v, env, vt)) for k, v in value.items())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        hints = _hints(type(value))
        changes = {f.name: substitute(getattr(value, f.name), env, hints[f.name])
                   for f in dataclasses.fields(value) if f.init}
        return type(value)(**changes)
    return value


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _takes_int(tp: Any) -> bool:
    return tp is int or tp is Any or int in typing.get_args(tp)


def _sizes(env: Mapping[sympy.Symbol, int]) -> str:
    return ", ".join(f"{k} = {v}" for k, v in env.items())


def specialize(graph: Graph, sizes: Mapping[str, int]) -> Graph:
    """``graph`` at the given sizes of its symbolic dims: a concrete graph (hints ``|S|/T``
    become the integer count)."""
    env = {size_symbol(n): sympy.Integer(v) for n, v in sizes.items()}
    return substitute(graph, env, Graph)


# --- generalization -----------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class Fit:
    """How a number that moves with the size is written: a combination, with rational
    coefficients, of the ``basis`` expressions in ``symbol`` (``1`` and ``|S|``: a line; the
    whole form adds each stick count ``ceiling(e/E)``, see ``stick_basis``). The first
    ``len(basis)`` ``sizes`` fix the coefficients (``inverse`` solves for them), the rest check."""

    symbol: sympy.Symbol
    sizes: tuple[int, ...]
    basis: tuple[sympy.Expr, ...]
    inverse: tuple[tuple[Fraction, ...], ...]
    rows: tuple[tuple[int, ...], ...]  # the basis at each size

    @staticmethod
    def of(sizes: Sequence[int], symbol: sympy.Symbol, basis: Sequence[sympy.Expr] | None = None) -> Fit:
        basis = tuple(basis) if basis is not None else (sympy.Integer(1), symbol)
        k = len(basis)
        table = {n: tuple(int(b.xreplace({symbol: n})) for b in basis) for n in sizes}
        fixing: list[int] = []  # the first sizes that fix the coefficients; the rest check
        for n in sizes:
            if len(fixing) < k and sympy.Matrix([table[m] for m in fixing + [n]]).rank() == len(fixing) + 1:
                fixing.append(n)
        if len(fixing) < k:
            raise SymbolicError(f"witness sizes {list(sizes)} of {symbol} do not fix a combination of {list(basis)}")
        sizes = fixing + [n for n in sizes if n not in fixing]
        rows = tuple(table[n] for n in sizes)
        square = sympy.Matrix([list(r) for r in rows[:k]])
        inv = square.inv()
        inverse = tuple(tuple(Fraction(int(inv[i, j].p), int(inv[i, j].q)) for j in range(k)) for i in range(k))
        return Fit(symbol=symbol, sizes=tuple(sizes), basis=basis, inverse=inverse, rows=rows)

    def __call__(self, values: Sequence[int], where: str) -> sympy.Expr:
        k = len(self.basis)
        coeffs = [sum((m * v for m, v in zip(row, values[:k])), Fraction(0)) for row in self.inverse]
        for n, row, v in zip(self.sizes[k:], self.rows[k:], values[k:]):
            if sum((c * f for c, f in zip(coeffs, row)), Fraction(0)) != v:
                form = "linear" if k == 2 else f"a combination of {', '.join(map(str, self.basis))}"
                raise SymbolicError(
                    f"{where}: {list(values)} at {self.symbol} = {list(self.sizes)} is not {form} in {self.symbol}; "
                    f"the program is not one program for every size: give {size_dim_name(self.symbol)} a size")
        return sympy.Add(*(sympy.Rational(c.numerator, c.denominator) * b for c, b in zip(coeffs, self.basis)))


def generalize(values: tuple[Any, ...], sizes: tuple[int, ...], symbol: sympy.Symbol, where: str = "program",
               basis: Sequence[sympy.Expr] | None = None) -> Any:
    """One value whose numbers are lines in ``symbol`` through ``(sizes[i], values[i])`` (or,
    with ``basis``, combinations of its expressions): the values must have one structure,
    and every number that differs must lie on the line its first values fix."""
    return _generalize(values, Fit.of(sizes, symbol, basis), where)


def _generalize(values: tuple[Any, ...], fit: Fit, where: str) -> Any:
    first = values[0]
    if all(type(v) is type(first) for v in values) and all(_same(v, first) for v in values[1:]):
        return first
    if isinstance(first, (int, sympy.Integer)) and not isinstance(first, bool) and all(
            isinstance(v, (int, sympy.Integer)) and not isinstance(v, bool) for v in values):
        return fit(tuple(int(v) for v in values), where)
    if isinstance(first, sympy.Expr) and all(isinstance(v, sympy.Expr) for v in values):
        return _generalize_expr(values, fit, where)
    if isinstance(first, tuple) and all(isinstance(v, tuple) and len(v) == len(first) for v in values):
        return tuple(_generalize(tuple(v[i] for v in values), fit, f"{where}[{i}]") for i in range(len(first)))
    if isinstance(first, FrozenMap) and all(isinstance(v, FrozenMap) and tuple(v) == tuple(first) for v in values):
        return FrozenMap((k, _generalize(tuple(v[k] for v in values), fit, f"{where}[{k}]")) for k in first)
    if dataclasses.is_dataclass(first) and all(type(v) is type(first) for v in values):
        label = getattr(first, "name", "") or type(first).__name__
        fields = {f.name: _generalize(tuple(getattr(v, f.name) for v in values), fit, f"{where}/{label}.{f.name}")
                  for f in dataclasses.fields(first) if f.init}
        return type(first)(**fields)  # type: ignore[misc]
    symbol, sizes = fit.symbol, fit.sizes
    raise SymbolicError(
        f"{where}: differs in structure between {symbol} = {list(sizes)} ({_brief(values[0])} vs {_brief(values[1])}); "
        f"the stages decide differently at different sizes: give {size_dim_name(symbol)} a size, or a hint that fixes "
        f"its tile (slices={{{size_dim_name(symbol)!r}: {size_dim_name(symbol)}.size // 64}})")


def _generalize_expr(values: tuple[sympy.Expr, ...], fit: Fit, where: str) -> sympy.Expr:
    """An index expression whose integer coefficients move with the size (the stride of an
    outer dim of a tensor over S): each monomial's coefficient generalized on its own."""
    terms = [sympy.expand(v).as_coefficients_dict() for v in values]
    if any(set(t) != set(terms[0]) for t in terms[1:]) or not all(
            c.is_Integer for t in terms for c in t.values()):
        raise SymbolicError(f"{where}: {values[0]} and {values[1]} at {fit.symbol} = {list(fit.sizes[:2])} differ "
                            f"in more than their coefficients; give {size_dim_name(fit.symbol)} a size")
    return sympy.Add(*(_generalize(tuple(int(t[m]) for t in terms), fit, f"{where}[{m}]") * m
                       for m in terms[0]))


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except TypeError:
        return False


def _brief(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


# --- the compile -----------------------------------------------------------------------------
def compile_symbolic(graph: Graph, machine: Any, compile_concrete: Callable[[Graph, frozenset[str]], Any],
                     hinted: bool = True) -> tuple[Any, Program, tuple[str, ...]]:
    """The first witness's compilation, the symbolic program and the warnings (the first
    witness's and the symbolic plan's). ``compile_concrete`` runs the concrete pipeline with
    work division keeping the given dims whole; ``hinted`` is false when it ignores hints
    (``tiling="none"``)."""
    planned, dims, warns = plan_symbolic(graph, hinted)
    (d,) = dims
    whole: frozenset[str] = frozenset()
    if d.form == "whole":
        # no loop over S and no core split of it: every number is a combination of |S| and
        # the stick counts of the buffers over it, fixed by as many witnesses, checked by two more
        whole = symbolic_size_dims(planned)
        basis, least = stick_basis(planned, machine, d.symbol)
        basis, sizes = whole_witnesses(basis, d.symbol, least)
    else:
        unit = d.fixed * DEFAULT_TILE if d.form == "count" else d.fixed
        sizes, basis, least = tuple(k * unit for k in WITNESSES), None, unit
    fit = Fit.of(sizes, d.symbol, basis)
    comps = []
    for size in sizes:
        with warnings.catch_warnings():  # the Compilation keeps them; compile raises the symbolic ones once
            warnings.simplefilter("ignore", FspyreWarning)
            comps.append(compile_concrete(specialize(planned, {d.name: size}), whole))
    program = _generalize(tuple(c.program for c in comps), fit, f"program {graph.name}")
    spans = _generalize(tuple(_spans(c, machine) for c in comps), fit, f"per-core spans of {graph.name}")
    modulus = 1 if d.form == "whole" else _modulus(program, d.symbol)
    assumptions = _assumptions(d, program, machine, modulus, spans, least)
    record = SymbolicSizes(dims=dims, assumptions=assumptions, witnesses=tuple((s,) for s in sizes))
    program = dataclasses.replace(program, symbolic=record)
    _check_beyond_witnesses(program, fit)
    return comps[0], program, warns + comps[0].warnings


def program_basis(program: Program, s: sympy.Symbol) -> tuple[sympy.Expr, ...]:
    """The basis a derived program's numbers are combinations of: ``1``, ``|S|`` and the
    stick counts that occur in it (what a whole-form program's bundle regions may need)."""
    counts = {a for e in _expressions(program) for a in e.atoms(sympy.ceiling)}
    return (sympy.Integer(1), s) + tuple(sorted(counts, key=str))


def stick_basis(graph: Graph, machine: Any, s: sympy.Symbol) -> tuple[tuple[sympy.Expr, ...], int]:
    """What a number of a whole-form program may depend on: ``1``, ``|S|`` and, per buffer
    whose stick (last) dim has a size ``e`` in ``|S|``, its stick count ``ceiling(e/E)`` (``E``
    elements a stick in the buffer's device format); and the least ``|S|`` at which every dim
    that follows ``|S|`` has an element (one-element dims run too: ``instantiate`` writes their
    kernel-argument strides as the stick layout does)."""
    basis: dict[sympy.Expr, None] = {sympy.Integer(1): None, s: None}
    least = 1
    for b in graph.buffers:
        for d in b.type.dims:
            if not isinstance(d.size, int):
                a, c = sympy.expand(d.size).coeff(s), d.size.xreplace({s: 0})
                least = max(least, -(-(1 - int(c)) // int(a)))
        last = b.type.dims[-1].size if b.type.dims else 1
        if not isinstance(last, int):
            per = FORMATS[machine.device_format(b.type.dtype)].elems_per_stick
            basis[sympy.ceiling(last / per)] = None
    return tuple(basis), least


def whole_witnesses(basis: tuple[sympy.Expr, ...], s: sympy.Symbol, least: int
                    ) -> tuple[tuple[sympy.Expr, ...], tuple[int, ...]]:
    """The basis without expressions the others give at every size, and the witness sizes:
    each size that adds a new combination of the basis (a stick count that steps), then two
    more that only check. They start past two of the longest sticks, where every tensor over
    S spans several sticks (within one, the stages write its stick coordinate as 0 rather
    than ``floor(s/E)``), and run over two more, so every stick count steps."""
    import numpy as np

    stick = max([int(1 / sympy.Rational(e.args[0].coeff(s))) for e in basis if isinstance(e, sympy.ceiling)],
                default=1)
    start = max(least, 2 * stick + 1)
    candidates = list(range(start, start + 2 * stick + 8))
    table = np.array([[float(e.xreplace({s: n})) for e in basis] for n in candidates])
    keep: list[int] = []
    for j in range(len(basis)):  # the columns: drop a stick count another one gives
        if np.linalg.matrix_rank(table[:, keep + [j]]) == len(keep) + 1:
            keep.append(j)
    table = table[:, keep]
    chosen: list[int] = []
    for i in range(len(candidates)):
        if len(chosen) == len(keep):
            break
        if np.linalg.matrix_rank(table[chosen + [i]]) == len(chosen) + 1:
            chosen.append(i)
    rest = [i for i in range(len(candidates)) if i not in chosen]
    checks = [rest[-1], rest[len(rest) // 2]]
    return tuple(basis[j] for j in keep), tuple(candidates[i] for i in chosen + checks)


# How far past the witnesses the derived program is checked: up to this many tiles (or the
# recorded bound, if smaller).
CHECKED_TILES = 4096


def _check_beyond_witnesses(program: Program, fit: Fit) -> None:
    """The program at the smallest sizes its assumptions allow and at a large one passes the
    checks every concrete program passes (``verify_program``, the static memory check): the
    lines through the witnesses hold their allocations apart and in bounds there too, not
    only at the witnesses. A whole-form program is also checked where each stick count steps."""
    from fspyre.machine.memcheck import check_memory
    from fspyre.stages.program import verify_program

    record = program.symbolic
    assert record is not None
    (d,) = record.dims
    least = max(a.value for a in record.assumptions if a.kind == "at_least")
    step = math.lcm(*(a.value for a in record.assumptions if a.kind == "divisible"))
    most = min([a.value for a in record.assumptions if a.kind == "at_most"] + [CHECKED_TILES * max(step, 64)])
    low = -(-least // step) * step
    sizes = {low, low + step, most // step * step}
    for e in fit.basis:
        if isinstance(e, sympy.ceiling):  # each side of the first two steps of the stick count
            per = int(1 / sympy.Rational(e.args[0].coeff(d.symbol)))
            off = int(e.args[0].xreplace({d.symbol: 0}) * per)
            sizes |= {k * per - off + j for k in (1, 2) for j in (0, 1)}
    for n in sorted(sizes):
        if n < low or n > most:
            continue
        try:
            concrete = instantiate(program, {d.name: n})
            verify_program(concrete)
        except FspyreError as e:
            raise SymbolicError(f"program {program.name} derived at {d.name} = {[w[0] for w in record.witnesses]} is "
                                f"not a program at {d.name} = {n}: {str(e).splitlines()[0]}; give {d.name} a size"
                                ) from None
        report = check_memory(concrete)
        if not report.clean:
            raise SymbolicError(f"program {program.name} derived at {d.name} = {[w[0] for w in record.witnesses]} is "
                                f"not safe at {d.name} = {n}: {report.issues[0]}; give {d.name} a size")


def _modulus(program: Program, s: sympy.Symbol) -> int:
    """The least M such that every expression of ``program`` has an integer slope at multiples
    of M: the lcm of the slopes' denominators (a per-core slice ``|S|/16`` needs 16 | |S|)."""
    m = 1
    for e in _expressions(program):
        slope = sympy.diff(e, s)
        if slope.is_Rational:
            m = math.lcm(m, int(slope.q))
    return m


def _expressions(value: Any):
    if isinstance(value, sympy.Basic):
        if is_symbolic(value) and any(is_size_symbol(x) for x in value.free_symbols):
            yield value
    elif isinstance(value, tuple):
        for v in value:
            yield from _expressions(v)
    elif isinstance(value, FrozenMap):
        for k, v in value.items():
            yield from _expressions(k)
            yield from _expressions(v)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            if f.init:
                yield from _expressions(getattr(value, f.name))


def _spans(comp: Any, machine: Any) -> tuple[tuple[str, int], ...]:
    """Per op and tensor of a witness compile, the bytes a core spans (the rule work division
    keeps within ``machine.span_limit``, fspyre/stages/split_plan.py): a tensor laid out with
    S inside an outer dim a core walks spans more as S grows."""
    from fspyre.stages.access import access_plan
    from fspyre.stages.split_plan import per_core_span

    tree, plan = comp.stages["resident_tree"], comp.stages["split_plan"]
    out = []
    for name, record in access_plan(tree, plan, machine).ops.items():
        split = plan.ops[name]
        sizes = {x.name: x.size for x in record.dims}
        for acc in record.tensors:
            out.append((f"{name}/{acc.buffer}", per_core_span(acc, sizes, split.splits, split.stick_elems)))
    return tuple(out)


def _assumptions(d: SymbolicDim, program: Program, machine: Any, modulus: int,
                 spans: tuple[tuple[str, Any], ...] = (), least: int = 1) -> tuple[Assumption, ...]:
    s = d.symbol
    if d.form == "whole":
        out = [Assumption(dim=d.name, kind="at_least", value=least,
                          reason="every dim that follows it has an element")]
    else:
        if d.form == "tile":
            unit = d.fixed
            out = [Assumption(dim=d.name, kind="at_least", value=unit, reason="at least one tile")]
            why = f"loops over {d.name} run whole tiles of {d.fixed} elements"
        else:
            unit = d.fixed * DEFAULT_TILE
            out = [Assumption(dim=d.name, kind="at_least", value=unit, reason="every tile at least one stick")]
            why = (f"{d.fixed} tiles of whole sticks ({DEFAULT_TILE} elements)" if d.fixed > 1
                   else f"whole sticks ({DEFAULT_TILE} elements)")
        need = math.lcm(unit, modulus)
        if need != unit:
            why += f", each tile's per-core slices whole ({need // unit} x {unit})"
        out.append(Assumption(dim=d.name, kind="divisible", value=need, reason=why))
    for what, expr, cap in (("HBM", program.hbm_bytes, machine.hbm_bytes), ("LX", _lx_end(program), machine.lx_bytes)):
        bound = _largest(expr, s, cap)
        if bound is not None:
            out.append(Assumption(dim=d.name, kind="at_most", value=bound,
                                  reason=f"the program's {what} ({expr} bytes) fits the {cap} bytes of {what}"))
    growing = [(b, where, span) for where, span in spans if (b := _largest(span, s, machine.span_limit)) is not None]
    if growing:
        bound, where, span = min(growing, key=lambda g: g[0])
        out.append(Assumption(dim=d.name, kind="at_most", value=bound,
                              reason=f"op {where.split('/')[0]}: a core spans {span} bytes of "
                                     f"{where.split('/', 1)[1]}, within the {machine.span_limit}-byte span limit"))
    return tuple(out)


def _lx_end(program: Program) -> sympy.Expr:
    """The end of the highest LX tensor of a core, as an expression (0 without LX tensors)."""
    ends = [sympy.Integer(0)]
    for spec in op_specs(program):
        for a in spec.args:
            if a.memory == "lx" and (is_symbolic(a.address) or any(is_symbolic(n) for n in a.device_size)):
                nbytes = device_bytes(a.device_size, FORMATS[a.device_dtype].nbytes)
                ends.append(sympy.sympify(a.address) + nbytes)
    return sympy.Max(*ends)


def _largest(expr: Any, s: sympy.Symbol, cap: int) -> int | None:
    """The largest |S| at which ``expr`` (a line, or a combination with stick counts) stays
    within ``cap``; None if it never grows. A stick count ``ceiling(u)`` is bounded by ``u + 1``
    where it adds and by ``u`` where it subtracts, so the bound holds at every size below it."""
    if not is_symbolic(expr):
        return None
    parts = expr.args if isinstance(expr, sympy.Max) else (expr,)
    best = None
    for p in parts:
        p = _upper_line(p)
        slope = sympy.diff(p, s)
        if slope.is_zero or not slope.free_symbols == set() or slope <= 0:
            continue
        bound = int(sympy.floor((cap - p.xreplace({s: 0})) / slope))
        best = bound if best is None else min(best, bound)
    return best


def _upper_line(expr: sympy.Expr) -> sympy.Expr:
    if not expr.has(sympy.ceiling):
        return expr
    terms = []
    for t in sympy.Add.make_args(sympy.expand(expr)):
        c, rest = t.as_independent(sympy.ceiling)
        if isinstance(rest, sympy.ceiling):
            u = rest.args[0]
            terms.append(c * (u + 1) if c > 0 else c * u)
        else:
            terms.append(t)
    return sympy.Add(*terms)


# --- binding ---------------------------------------------------------------------------------
def bind_sizes(program: Program, inputs: Mapping[str, object]) -> dict[str, int]:
    """Each symbolic dim's size, read off the inputs' shapes where a kernel argument's host
    shape is that size; an ExecutionError names the dim when no input gives it, or two
    inputs disagree."""
    assert program.symbolic is not None
    found: dict[str, tuple[int, str]] = {}
    for arg in program.kernel_args:
        if not arg.is_input or arg.name not in inputs:
            continue
        shape = getattr(inputs[arg.name], "shape", None)
        if shape is None or len(shape) != len(arg.host_shape):
            continue
        for k, want in zip(shape, arg.host_shape):
            solved = _solve(want, int(k))
            if solved is not None:
                name, n = solved
                have = found.get(name)
                if have is not None and have[0] != n:
                    raise ExecutionError(
                        f"run: symbolic dim {name} is {have[0]} in input {have[1]} and {n} in input {arg.name}; "
                        f"every input must agree on |{name}|")
                found[name] = (n, arg.name)
    out = {}
    for d in program.symbolic.dims:
        if d.name not in found:
            raise ExecutionError(f"run: no input has symbolic dim {d.name} in its shape, so |{d.name}| is unbound; "
                                 f"pass every input of the program")
        out[d.name] = found[d.name][0]
    return out


def _solve(size: Any, have: int) -> tuple[str, int] | None:
    """The symbolic dim and its size that make ``size`` (``|S|`` or ``a*|S| + b``) equal
    ``have``; None for a fixed size. A ``have`` no whole size gives is an ExecutionError."""
    if isinstance(size, int) or not isinstance(size, sympy.Expr) or not size_symbols(size):
        return None
    (s,) = size_symbols(size)
    a, b = sympy.expand(size).coeff(s), size.xreplace({s: 0})
    n = sympy.Rational(have - b, a)
    if not n.is_Integer or n < 1:
        raise ExecutionError(f"run: a dim of size {size} is {have}, which no size {s} >= 1 gives")
    return size_dim_name(s), int(n)


def instantiate(program: Program, sizes: Mapping[str, int]) -> Program:
    """The concrete program at ``sizes``, after checking every assumption the symbolic
    program records (an ExecutionError naming the dim, the size, the assumption and what to
    change for the first that fails)."""
    record = program.symbolic
    if record is None:
        return program
    for a in record.violated(dict(sizes)):
        fix = {"divisible": f"pad {a.dim} to a multiple of {a.value}",
               "at_least": f"give {a.dim} at least {a.value} elements",
               "at_most": f"split the input along {a.dim} into runs of at most {a.value}"}[a.kind]
        raise ExecutionError(f"run: symbolic dim {a.dim} = {sizes[a.dim]} violates the compiled assumption "
                             f"{str(a).split('  (')[0]} ({a.reason}); {fix}, or compile for this size")
    env = {size_symbol(n): sympy.Integer(v) for n, v in sizes.items()}
    try:
        concrete = substitute(dataclasses.replace(program, symbolic=None), env, Program)
    except FspyreError as err:
        raise ExecutionError(f"run: the program at {_sizes(env)}: {err}") from None
    body = _one_tile_in_place(concrete.body, 0)
    args = tuple(_unit_dims_unstrided(a) for a in concrete.kernel_args)
    if body is concrete.body and all(a is b for a, b in zip(args, concrete.kernel_args)):
        return concrete
    return dataclasses.replace(concrete, body=body, kernel_args=args)


def _unit_dims_unstrided(arg: KernelArg) -> KernelArg:
    """``arg`` with its layout written as a concrete compile writes it: a host dim the sizes
    leave one element (``|S| = 1`` where the witnesses had ``|S| >= 2``) has no stride."""
    from fspyre.machine.layout import strides_without_unit_dims

    strides = strides_without_unit_dims(arg.host_shape, arg.stride_map)
    return arg if strides == tuple(arg.stride_map) else dataclasses.replace(arg, stride_map=strides)


def _one_tile_in_place(body: tuple, depth: int) -> tuple:
    """``body`` with each loop that the sizes leave one iteration (``|S|/T == 1``) tiling
    nothing: its one tile is the dim's whole range, run in place as a concrete compile runs it
    (``verify_program`` refuses a loop of one iteration that tiles a dim); nothing moves there,
    and its guarded ops run in its one iteration as before."""
    out, changed = [], False
    for spec in body:
        if isinstance(spec, LoopSpec):
            inner = _one_tile_in_place(spec.body, depth + 1)
            if spec.count == 1 and spec.tiled_symbols:
                inner = tuple(_stay(s, depth) for s in inner)
                spec = dataclasses.replace(spec, body=inner, tiled_symbols=())
                changed = True
            elif inner is not spec.body:
                spec = dataclasses.replace(spec, body=inner)
                changed = True
        out.append(spec)
    return tuple(out) if changed else body


def _stay(spec, level: int):
    """``spec`` with nothing moving at loop ``level``."""
    if isinstance(spec, LoopSpec):
        return dataclasses.replace(spec, body=tuple(_stay(s, level) for s in spec.body))
    tiled = spec.tiled_symbols
    if tiled:
        tiled = tiled[:level] + ((),) + tiled[level + 1:]
    args = tuple(dataclasses.replace(a, tile_advance=a.tile_advance[:level] + (0,) + a.tile_advance[level + 1:])
                 for a in spec.args)
    return dataclasses.replace(spec, tiled_symbols=tiled, args=args)


def graph_sizes(graph: Graph, inputs: Mapping[str, object]) -> dict[str, int]:
    """The sizes of ``graph``'s symbolic dims read off the shapes of ``inputs``."""
    found: dict[str, tuple[int, str]] = {}
    buffers = graph.buffer_table()
    for name in graph.inputs:
        shape = getattr(inputs.get(name), "shape", None)
        dims = buffers[name].type.dims
        if shape is None or len(shape) != len(dims):
            continue
        for k, d in zip(shape, dims):
            solved = _solve(d.size, int(k))
            if solved is not None:
                dim, n = solved
                if dim in found and found[dim][0] != n:
                    raise ExecutionError(f"symbolic dim {dim} is {found[dim][0]} in input {found[dim][1]} and {n} "
                                         f"in input {name}; every input must agree on |{dim}|")
                found[dim] = (n, name)
    missing = [n for n in symbolic_dim_names(graph) if n not in found]
    if missing:
        raise ExecutionError(f"graph {graph.name}: no input gives the size of symbolic dim {missing[0]}; pass every "
                             f"input of the graph")
    return {k: v for k, (v, _) in found.items()}


def concrete_graph(graph: Graph, inputs: Mapping[str, object]) -> Graph:
    """``graph`` at the sizes its inputs have (itself when it has no symbolic dim)."""
    return specialize(graph, graph_sizes(graph, inputs)) if graph.symbolic else graph
