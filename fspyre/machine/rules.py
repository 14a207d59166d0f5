"""The machine's shared rules: how an op's iteration space is sliced across cores, which device
coordinates each core touches, the LX box a core holds, how long a buffer lives, and how many
bytes a device tensor or box occupies. The compiler's stages plan with these rules and the
oracle (interpreter, memory check, traffic report, memory map, lowerings) executes and checks
with them, so each has exactly one home here.

- **Slices of a dim** (``slice_extents``): ``n`` elements (whole ``unit``-element sticks along
  a stick dim) over ``k`` slices take ceil and floor shares, the larger first; the last slice
  may end in a partial stick. An even split is the case where all shares are equal.
- **Core -> slice** (``core_slices``): the splits of an op's iteration space, first symbol
  fastest: ``slice[i] = (core // prod(splits[:i])) % splits[i]`` (the anchor's
  ``core_to_slice_mapping``); ``core_spaces`` writes each core's (start, extent) per symbol.
- **Coordinate bounds** (``coord_bounds``): each device coordinate's min and max over each
  core's slice. A coordinate is a sum of terms; grouped so that no two groups share a
  variable, its min and max over a core's box of the iteration grid is the sum of each group's
  min and max over the box of that group's variables: exact, and linear in the iteration sizes
  when every group has one variable (the stick rule's forms; the exact floor/Mod forms of odd
  views have more).
- **LX box** (``lx_box``): a core holds an LX tensor as the box spanned by its slice's device
  coordinates, row-major, whole sticks in the stick dim, at the tensor's LX address. A
  consumer finds the right bytes only if its slice spans the same box on that core as the
  producer's did.
- **Writers** (``writing_cores``): with a split reduction only the core holding slice 0 of
  every reduced symbol stores the combined value.
- **Lifetime** (``program_timeline`` / ``live_intervals``): program time is the index of an op
  in program order, loop bodies included once. A buffer lives from its first use to its last;
  a use inside a loop that does not hold every use of the buffer stretches over that whole
  loop (the value crosses iterations); a buffer used only inside one loop body lives within
  one iteration.
- **Bytes and strides** (``row_major_strides``, ``device_bytes``, ``box_bytes``): device
  storage is row-major over ``device_size`` whose last dim is the 128-byte stick, so a
  tensor's bytes count its padded sticks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from functools import lru_cache

import numpy as np
import sympy

from fspyre.errors import ExecutionError
from fspyre.ir.program import LoopSpec, OpSpec, Program, Spec, TensorArg
from fspyre.machine import formats
from fspyre.machine.indexing import as_expr, compile_index

# -- grids, strides, bytes ----------------------------------------------------------------------


def open_grid(sizes: Sequence[int], starts: Sequence[int] | None = None) -> list[np.ndarray]:
    """One int64 arange per axis, shaped to broadcast against the others (like np.ix_)."""
    n = len(sizes)
    starts = starts or [0] * n
    return [
        (np.arange(size, dtype=np.int64) + start).reshape([size if i == j else 1 for j in range(n)])
        for i, (size, start) in enumerate(zip(sizes, starts))
    ]


def row_major_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Contiguous row-major element strides of a shape (host tensors, device sizes, LX boxes)."""
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        n = shape[i + 1]
        # a symbolic program's device size may be an expression in a symbolic dim's size
        strides[i] = strides[i + 1] * (n if type(n) is not int and getattr(n, "is_Integer", True) is False else int(n))
    return tuple(strides)


def device_bytes(device_size: Sequence[int], elem_bytes: int) -> int:
    """Bytes of a row-major device tensor, padded sticks included (the last dim is the stick)."""
    return math.prod(device_size) * elem_bytes


def moved_within(first: TensorArg, a: TensorArg) -> bool:
    """``a`` is ``first``'s HBM tensor with its base moved inside the tensor: an unrolled
    program's copy of a loop body (``fspyre.lower.unroll``) places each iteration's tile by
    moving the address by the loop's tile advance, where the looped program advances it. One
    allocation for ``verify_program`` and the memory check alike."""
    if (first.memory, first.device_size, first.device_dtype, first.arg_index) != (
            "hbm", a.device_size, a.device_dtype, a.arg_index) or a.memory != "hbm":
        return False
    if not isinstance(first.address, int) or not isinstance(a.address, int):
        return False
    return abs(a.address - first.address) < device_bytes(a.device_size, formats.FORMATS[a.device_dtype].nbytes)


def box_bytes(extents: np.ndarray, elem_bytes: int) -> np.ndarray:
    """``device_bytes`` of each row of ``extents`` (one box per core)."""
    return np.prod(extents, axis=1) * elem_bytes


# -- slicing across cores -----------------------------------------------------------------------


@lru_cache(maxsize=4096)
def slice_extents(size: int, count: int, unit: int = 1) -> tuple[int, ...]:
    """Element extents of ``count`` slices of a dim of ``size`` elements, each a whole number
    of ``unit``-element sticks but the last, which may end in the dim's partial stick: ceil
    and floor shares of the ``ceil(size / unit)`` sticks, the larger ones first (so slice 0 is
    a largest). ``1 <= count <= ceil(size / unit)``."""
    units = -(-size // unit)
    if not 1 <= count <= units:
        raise ValueError(f"{count} slices of {units} {'sticks' if unit > 1 else 'elements'}")
    q, r = divmod(units, count)
    out = [(q + 1) * unit] * r + [q * unit] * (count - r)
    out[-1] -= units * unit - size  # the partial stick, in the last slice
    return tuple(out)


def slice_starts(extents: Sequence[int]) -> tuple[int, ...]:
    out, at = [], 0
    for e in extents:
        out.append(at)
        at += e
    return tuple(out)


def even_extents(size: int, count: int) -> tuple[int, ...]:
    return (size // count,) * count


def core_spaces(extents: Sequence[Sequence[int]]) -> tuple[tuple[tuple[int, int], ...], ...]:
    """Each core's ``(start, extent)`` per symbol, from each symbol's slice extents, cores
    enumerating the slices first symbol fastest (``core_slices``)."""
    return _core_spaces(tuple(tuple(e) for e in extents))


@lru_cache(maxsize=4096)
def _core_spaces(extents: tuple[tuple[int, ...], ...]) -> tuple[tuple[tuple[int, int], ...], ...]:
    # cached: the ops of a chain, and every OpSpec built or loaded, repeat their divisions
    starts = [slice_starts(e) for e in extents]
    slices = core_slices([len(e) for e in extents])
    return tuple(tuple((starts[i][k], int(extents[i][k])) for i, k in enumerate(row)) for row in slices.tolist())


def core_slices(splits: Sequence[int]) -> np.ndarray:
    """``[cores, len(splits)]``: the slice index of each core per symbol, first symbol fastest
    (read-only: cached per splits)."""
    return _core_slices(tuple(int(s) for s in splits))


@lru_cache(maxsize=1024)
def _core_slices(splits: tuple[int, ...]) -> np.ndarray:
    cores = math.prod(splits)
    c = np.arange(cores, dtype=np.int64)
    cols, stride = [], 1
    for s in splits:
        cols.append((c // stride) % s)
        stride *= s
    out = np.stack(cols, axis=1) if cols else np.zeros((cores, 0), dtype=np.int64)
    out.setflags(write=False)
    return out


def writing_cores(splits: Sequence[int], reduced: Sequence[bool]) -> np.ndarray:
    """Cores that store an op's result: with a split reduction only the core holding slice 0
    of every reduced symbol writes the combined value (the interpreter's rule)."""
    slices = core_slices(splits)
    red = [i for i, r in enumerate(reduced) if r]
    if not red:
        return np.ones(len(slices), dtype=bool)
    return np.all(slices[:, red] == 0, axis=1)


def reduced_symbols(spec: OpSpec) -> set[sympy.Symbol]:
    return set(spec.op_info.reduced) if spec.is_reduction else set()


@lru_cache(maxsize=8192)
def coord_terms(expr: sympy.Expr) -> tuple[int, tuple[tuple[tuple[sympy.Symbol, ...], sympy.Expr], ...]]:
    """A coordinate as ``const + sum(group)``: its terms grouped so that no two groups share a
    variable (``floor(c1/64) + Mod(c2, 4)`` has two groups; ``floor((2*P1 + P2)/64)`` one of
    two variables). Over a box of the iteration grid, each group ranges independently."""
    const = 0
    groups: list[tuple[frozenset, sympy.Expr]] = []
    for term in sympy.Add.make_args(as_expr(expr, "coord_terms")):
        free = frozenset(term.free_symbols)
        if not free:
            const += int(term)
            continue
        joined = [g for g in groups if g[0] & free]
        for g in joined:
            groups.remove(g)
        groups.append((free.union(*(g[0] for g in joined)), sympy.Add(term, *(g[1] for g in joined))))
    return const, tuple((tuple(sorted(v, key=lambda s: s.name)), e) for v, e in groups)


@lru_cache(maxsize=8192)
def term_extremes(term: sympy.Expr, syms: tuple[sympy.Symbol, ...],
                  extents: tuple[tuple[int, ...], ...]) -> tuple[np.ndarray, np.ndarray]:
    """Min and max of ``term`` over each slice block: arrays of shape ``[len(e) for e in
    extents]`` (block ``(k1, k2, ...)`` holds ``syms[i]`` in its ``k_i``-th slice, the slices
    of ``syms[i]`` having the element extents ``extents[i]``, even or not). Evaluated on the
    whole grid of the term's own variables, unless the term never decreases as a variable
    grows: then a block's min and max are at its first and last point, and the work is the
    number of slices, not of elements (a 2^24-element dim is one 2^24-point sweep otherwise)."""
    sizes = tuple(sum(e) for e in extents)
    if _ascending(term):
        starts = [np.array(slice_starts(e), dtype=np.int64) for e in extents]
        firsts = [st.reshape([-1 if i == j else 1 for j in range(len(extents))]) for i, st in enumerate(starts)]
        lasts = [(st + np.array(e, dtype=np.int64) - 1).reshape(f.shape)
                 for st, e, f in zip(starts, extents, firsts)]
        shape = tuple(len(e) for e in extents)
        f = compile_index(term, syms)
        lo = np.array(np.broadcast_to(np.asarray(f(*firsts)), shape))
        hi = np.array(np.broadcast_to(np.asarray(f(*lasts)), shape))
        lo.setflags(write=False)
        hi.setflags(write=False)
        return lo, hi
    if len(syms) == 1 and (period := _period(term, syms[0])) is not None and sizes[0] > 2 * period:
        return _periodic_extremes(term, syms, extents[0], period)
    grid = open_grid(list(sizes))
    vals = np.broadcast_to(np.asarray(compile_index(term, syms)(*grid)), sizes)
    if all(len(set(e)) == 1 for e in extents):  # even: one reshape, (slice, point) per axis
        blocks = [x for e in extents for x in (len(e), e[0])]
        vals = vals.reshape(blocks)
        inner = tuple(range(1, len(blocks), 2))
        lo, hi = vals.min(axis=inner), vals.max(axis=inner)
    else:
        lo = hi = vals
        for axis, e in enumerate(extents):
            cuts = np.array(slice_starts(e), dtype=np.int64)
            lo = np.minimum.reduceat(lo, cuts, axis=axis)
            hi = np.maximum.reduceat(hi, cuts, axis=axis)
        lo, hi = np.array(lo), np.array(hi)
    lo.setflags(write=False)  # cached: shared by every caller
    hi.setflags(write=False)
    return lo, hi


def _period(term: sympy.Expr, var: sympy.Symbol) -> int | None:
    """The period of a term periodic in its one variable (``Mod(a*v + c, m)``, perhaps under
    floor or a positive scale), or None. Proven on the expression: shifting the variable by
    the period gives the same term."""
    mods = term.atoms(sympy.Mod)
    if not mods:
        return None
    period = 1
    for mod in mods:
        arg, m = mod.args
        a = arg.coeff(var)
        if not (m.is_Integer and a.is_Integer and int(m) > 0):
            return None
        period = math.lcm(period, int(m) // math.gcd(int(a), int(m)))
    return period if term.xreplace({var: var + period}) == term else None


def _periodic_extremes(term: sympy.Expr, syms: tuple[sympy.Symbol, ...], extents: tuple[int, ...],
                       period: int) -> tuple[np.ndarray, np.ndarray]:
    """``term_extremes`` of a term periodic in its one variable: a slice as long as a period
    takes every value of one period; a shorter one is evaluated point by point."""
    f = compile_index(term, syms)

    def values(start: int, n: int) -> np.ndarray:
        return np.broadcast_to(np.asarray(f(np.arange(start, start + n, dtype=np.int64))), (n,))

    whole = values(0, period)
    lo = np.empty(len(extents), dtype=np.int64)
    hi = np.empty_like(lo)
    for i, (start, e) in enumerate(zip(slice_starts(extents), extents)):
        part = whole if e >= period else values(start, e)
        lo[i], hi[i] = part.min(), part.max()
    lo.setflags(write=False)
    hi.setflags(write=False)
    return lo, hi


def _ascending(expr: sympy.Expr) -> bool:
    """``expr`` never decreases as any of its (non-negative) variables grows: built from
    variables and constants by sums, products with a positive constant, and floor."""
    if expr.is_Symbol or expr.is_Integer:
        return True
    if isinstance(expr, sympy.Add):
        return all(_ascending(a) for a in expr.args)
    if isinstance(expr, sympy.Mul):
        const, rest = expr.as_coeff_Mul()
        return bool(const.is_Rational and const > 0 and rest is not expr and _ascending(rest)
                    and not isinstance(rest, sympy.Mul))
    if isinstance(expr, sympy.floor):
        return _ascending(expr.args[0])
    return False


def coord_bounds(coords: Sequence[sympy.Expr], syms: Sequence[sympy.Symbol],
                 extents: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """``lows, highs`` of shape ``[cores, len(coords)]``: each device coordinate's min and max
    over each core's slice of the iteration grid (``extents[i]``: the element extents of the
    slices of ``syms[i]``, summing to its whole per-tile size; ``OpSpec.slice_extents``).
    Read-only arrays, cached: the ops of a chain or of a candidate tiling repeat the same
    coordinates over the same splits, and the allocator, checker and report all ask."""
    return _coord_bounds(tuple(coords), tuple(syms), tuple(map(tuple, extents)))


@lru_cache(maxsize=4096)
def _coord_bounds(coords: tuple[sympy.Expr, ...], syms: tuple[sympy.Symbol, ...],
                  extents: tuple[tuple[int, ...], ...]) -> tuple[np.ndarray, np.ndarray]:
    slices = core_slices([len(e) for e in extents])
    pos = {s: i for i, s in enumerate(syms)}
    lows = np.zeros((len(slices), len(coords)), dtype=np.int64)
    highs = np.zeros_like(lows)
    for d, expr in enumerate(coords):
        const, groups = coord_terms(expr)
        lows[:, d] = highs[:, d] = const
        for group_syms, term in groups:
            missing = [str(v) for v in group_syms if v not in pos]
            if missing:
                raise ExecutionError(
                    f"device coordinate {expr} uses {missing}, which are not among {list(map(str, syms))}"
                )
            idx = [pos[v] for v in group_syms]
            lo, hi = term_extremes(term, group_syms, tuple(extents[i] for i in idx))
            at = tuple(slices[:, i] for i in idx)
            lows[:, d] += lo[at]
            highs[:, d] += hi[at]
    lows.setflags(write=False)
    highs.setflags(write=False)
    return lows, highs


def lx_box(lows: np.ndarray, highs: np.ndarray, device_size: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """The LX box per core: (lows, extents), the stick dim whole."""
    lows = lows.copy()
    ext = highs - lows + 1
    lows[:, -1] = 0
    ext[:, -1] = device_size[-1]
    return lows, ext


# -- program time -------------------------------------------------------------------------------


def program_timeline(program: Program) -> tuple[list[tuple[int, OpSpec, tuple[int, ...], tuple[int, ...]]],
                                                dict[int, tuple[int, int]]]:
    """``(time, spec, loop ids, loop counts)`` per op in program order, and each loop's span."""
    ops: list[tuple[int, OpSpec, tuple[int, ...], tuple[int, ...]]] = []
    spans: dict[int, tuple[int, int]] = {}

    def visit(body: tuple[Spec, ...], chain: tuple[int, ...], counts: tuple[int, ...]) -> None:
        for spec in body:
            if isinstance(spec, LoopSpec):
                lid, start = len(spans), len(ops)
                spans[lid] = (start, start)
                visit(spec.body, chain + (lid,), counts + (spec.count,))
                spans[lid] = (start, len(ops))
            else:
                ops.append((len(ops), spec, chain, counts))

    visit(program.body, (), ())
    return ops, spans


def common_loops(chains: Sequence[Sequence[int]]) -> int:
    """How many enclosing loops (outermost first) every one of ``chains`` shares: a buffer
    all of whose uses sit inside one iteration of those loops is dead between iterations."""
    common = 0
    while all(len(c) > common for c in chains) and len({c[common] for c in chains}) == 1:
        common += 1
    return common


def live_chain(chain: tuple[int, ...], runs: str) -> tuple[int, ...]:
    """The enclosing loops a use counts for liveness: an op of only the first or last
    iteration of its innermost loop uses its buffers as if it ran before or after that loop,
    so what it writes lives across all the loop's iterations and what it reads lives until
    the last one (``OpNode.runs``)."""
    return chain[:-1] if runs != "every" else chain


def live_intervals(uses: Mapping[str, Sequence[tuple[int, tuple[int, ...]]]],
                   loop_spans: Mapping[int, tuple[int, int]]) -> dict[str, tuple[int, int]]:
    """``[start, end)`` per buffer from its uses ``(time, enclosing loop ids outermost first)``."""
    out = {}
    for name, us in uses.items():
        if not us:
            continue
        common = common_loops([c for _, c in us])
        lo, hi = math.inf, -math.inf
        for t, chain in us:
            if len(chain) > common:
                s, e = loop_spans[chain[common]]
            else:
                s, e = t, t + 1
            lo, hi = min(lo, s), max(hi, e)
        out[name] = (int(lo), int(hi))
    return out
