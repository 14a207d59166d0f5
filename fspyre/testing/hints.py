"""Hypothesis strategies for tiling hint nests, laid over an already built graph.

    from hypothesis import given, strategies as st
    from fspyre.testing import graphs
    from fspyre.testing.hints import legal_hint_nests, any_hint_nests

    @given(st.data())
    def test_tiling(data):
        graph = data.draw(graphs())
        nest = data.draw(legal_hint_nests(graph))
        hinted = nest.apply(graph)      # the same graph, its ops now under hint scopes

A ``HintNest`` is what ``with g.hint(slices=...)`` blocks would have produced: properly
nested scopes over contiguous runs of ops (by position in ``graph.ops``), each with its
slices in written order, plus *holes*: ops inside a scope's span left unhinted (the
interlopers that ``plan_tiling`` moves out of a run). Its repr lists the scopes by op name,
so a falsifying example reads as the hints to write.

``legal_hint_nests`` draws nests that fspyre must compile, by construction from sufficient
conditions written here independently of the tiling stages (docs/tiling.md, "Legal hints"):
any count >= 2 on any dim (a count that does not divide the range peels a tail, a tile that
is not whole sticks is rounded up: docs/tiling.md, "Tails"); an op that reads or writes a
buffer through a view that is not one same-named variable per dim (a reshape) keeps its dims
untiled; a reduction dim is tiled only when no level inside it leaves the reduction invariant
(ops of the group that read it are split into a later loop nest by loop fission; an output
level inside it gets an accumulator spanning its tiles); an unhinted
hole is only placed where data flow lets it move out of its run. ``any_hint_nests`` draws
anything a user could write (unknown dims, counts that do not divide, holes that cannot move,
work-division-only scopes, several dims per scope): compiling must then either succeed or
raise an FspyreError.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import sympy
from hypothesis import strategies as st

from fspyre.ir.frozen import FrozenMap
from fspyre.ir.graph import Graph, HintScope, Op, Reduction, TensorType, iteration_dims
from fspyre.ir.looptree import LoopTree, op_nodes

COUNTS = (2, 3, 4, 5, 8)


@dataclass(frozen=True, slots=True, kw_only=True)
class ScopeSpec:
    """One hint scope over ops ``[start, stop)`` of ``graph.ops``."""

    start: int
    stop: int
    slices: tuple[tuple[str, int], ...] = ()
    work_div: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class HintNest:
    scopes: tuple[ScopeSpec, ...]  # properly nested; outer scopes first among equal starts
    holes: tuple[int, ...] = ()  # op positions left out of every scope
    names: tuple[str, ...] = ()  # op names, for the repr

    def apply(self, graph: Graph) -> Graph:
        """``graph`` with these scopes: ``HintScope`` ids follow (start, -length), so an outer
        scope gets a smaller id, as the builder numbers them."""
        order = sorted(range(len(self.scopes)), key=lambda i: (self.scopes[i].start, -self.scopes[i].stop, i))
        scopes = [self.scopes[i] for i in order]
        holes = set(self.holes)
        ops = []
        for pos, op in enumerate(graph.ops):
            ids = () if pos in holes else tuple(k for k, s in enumerate(scopes) if s.start <= pos < s.stop)
            ops.append(replace(op, hints=ids))
        hints = tuple(
            HintScope(id=k, slices=FrozenMap(s.slices), work_div=FrozenMap(s.work_div)) for k, s in enumerate(scopes)
        )
        return replace(graph, ops=tuple(ops), hints=hints)

    def __repr__(self) -> str:
        def span(s: ScopeSpec) -> str:
            names = self.names[s.start:s.stop] if self.names else ()
            ops = f"[{names[0]}..{names[-1]}]" if names else f"[{s.start}:{s.stop}]"
            parts = []
            if s.slices:
                parts.append(f"slices={dict(s.slices)}")
            if s.work_div:
                parts.append(f"work_div={dict(s.work_div)}")
            return f"hint({', '.join(parts)}) over {ops}"

        holes = [self.names[h] if self.names else str(h) for h in self.holes]
        return "HintNest(" + "; ".join(map(span, self.scopes)) + (f"; unhinted {holes}" if holes else "") + ")"

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(repr(self))


def tiles_a_reduction(tree: LoopTree) -> bool:
    """True when some op of ``tree`` reduces over a dim that a loop tiles or a tail splits: its
    result then sums in a different order than untiled and agrees only within
    ``fspyre.check.REDUCTION_RTOL``. (A level whose one tile of 32 leaves a tail of 2 makes no
    loop, but the reduction is still two partial results combined.)"""
    for node in op_nodes(tree):
        if isinstance(node.op, Reduction):
            reduced = {d.name for d in node.op.reduction_ranges}
            if any(s.dim in reduced for level in node.tiling for s in level) or any(
                    p.dim in reduced for p in node.peeled):
                return True
    return False


# -- structure shared by both strategies --------------------------------------------------------
@st.composite
def _spans(draw, n: int) -> list[tuple[int, int, tuple[int, int] | None]]:
    """One or two disjoint top-level spans, each maybe with one nested span."""
    k = 2 if n >= 4 and draw(st.booleans()) else 1
    cuts = sorted(draw(st.lists(st.integers(0, n), min_size=2 * k, max_size=2 * k, unique=True)))
    out = []
    for i in range(k):
        lo, hi = cuts[2 * i], cuts[2 * i + 1]
        inner = None
        if hi - lo >= 1 and draw(st.booleans()):
            a, b = sorted(draw(st.lists(st.integers(lo, hi), min_size=2, max_size=2, unique=True)))
            inner = (a, b)
        out.append((lo, hi, inner))
    return out


def _keys(n: int, spans: Sequence[tuple[int, int]], holes: set[int]) -> list[tuple[int, ...]]:
    return [() if p in holes else tuple(i for i, (a, b) in enumerate(spans) if a <= p < b) for p in range(n)]


# -- any hints ------------------------------------------------------------------------------------
@st.composite
def _any_slice(draw, sizes: Mapping[str, int], max_count: int) -> tuple[str, int]:
    dim = draw(st.sampled_from(sorted(sizes) + ["nope"]))
    divisors = [c for c in range(2, min(sizes.get(dim, 1), max_count) + 1) if sizes[dim] % c == 0]
    if divisors and draw(st.booleans()):  # half the time a count that at least divides
        return dim, draw(st.sampled_from(divisors))
    return dim, draw(st.one_of(st.sampled_from((1, 2, 3, 4, 5, 8)), st.integers(1, max_count)))


@st.composite
def any_hint_nests(draw, graph: Graph, *, max_count: int = 16) -> HintNest:
    """Hints a user might write, legal or not."""
    n = len(graph.ops)
    sizes = {d.name: d.size for op in graph.ops for d in iteration_dims(op) if d.size > 1}
    names = sorted({d.name for op in graph.ops for d in iteration_dims(op)}) + ["nope"]
    scopes = []
    for lo, hi, inner in draw(_spans(n)):
        for a, b in [(lo, hi)] + ([inner] if inner else []):
            slices = draw(st.lists(_any_slice(sizes, max_count), max_size=2, unique_by=lambda t: t[0]))
            work = []
            if draw(st.booleans()):
                # 3 rarely divides: an uneven division (or a count above the dim's units, refused)
                work = draw(st.lists(st.tuples(st.sampled_from(names), st.sampled_from((1, 2, 3, 4))), max_size=1))
            scopes.append(ScopeSpec(start=a, stop=b, slices=tuple(slices), work_div=tuple(work)))
    holes = draw(st.lists(st.integers(0, max(n - 1, 0)), max_size=2, unique=True)) if n else []
    return HintNest(scopes=tuple(scopes), holes=tuple(sorted(holes)), names=tuple(op.name for op in graph.ops))


# -- legal hints ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class _Facts:
    """What legality needs to know about a graph, computed once."""

    ops: tuple[Op, ...]
    size: Mapping[str, int]  # dim name -> its size (> 1) wherever an op iterates it
    iterated: tuple[frozenset[str], ...]  # per op: dims of size > 1
    reduced: tuple[frozenset[str], ...]  # per op: reduction dims of size > 1
    unaligned: tuple[frozenset[str], ...]  # per op: dims it walks through a non-aligned access
    readers: Mapping[str, tuple[int, ...]]  # buffer -> positions of the ops reading it
    writer: Mapping[str, int]


def _aligned(index, btype: TensorType, op: Op) -> bool:
    """The access walks each dim of the buffer with the op's variable of the same name."""
    strides = dict(zip((d.name for d in btype.dims), btype.strides()))
    sizes = {d.name: d.size for d in iteration_dims(op)}
    have = {d.name: d.size for d in btype.dims}
    for term in sympy.Add.make_args(sympy.expand(index)):
        if term == 0:
            continue
        coef, var = term.as_coeff_Mul()
        if not var.is_Symbol or var.name not in strides:
            return False
        if strides[var.name] != coef or sizes[var.name] != have[var.name]:
            return False
    return True


def _facts(graph: Graph) -> _Facts:
    buffers = graph.buffer_table()
    size: dict[str, int] = {}
    iterated, reduced, unaligned = [], [], []
    readers: dict[str, list[int]] = {}
    for pos, op in enumerate(graph.ops):
        it = frozenset(d.name for d in iteration_dims(op) if d.size > 1)
        for d in iteration_dims(op):
            if d.size > 1:
                size[d.name] = d.size
        bad: set[str] = set()
        for acc in list(op.loads) + [op.store]:
            if not _aligned(acc.index, buffers[acc.buffer].type, op):
                bad |= {s.name for s in acc.index.free_symbols}
        for ld in op.loads:
            readers.setdefault(ld.buffer, []).append(pos)
        iterated.append(it)
        reduced.append(frozenset(d.name for d in op.reduction_ranges if d.size > 1))
        unaligned.append(frozenset(bad))
    return _Facts(
        ops=graph.ops, size=size, iterated=tuple(iterated), reduced=tuple(reduced), unaligned=tuple(unaligned),
        readers={k: tuple(v) for k, v in readers.items()},
        writer={op.store.buffer: i for i, op in enumerate(graph.ops)},
    )


def _groups(keys: Sequence[tuple[int, ...]], holes: set[int]) -> list[tuple[tuple[int, ...], list[int]]]:
    """Runs of equal non-empty key once the holes have left them (plan_tiling's grouping)."""
    out: list[tuple[tuple[int, ...], list[int]]] = []
    for p, key in enumerate(keys):
        if p in holes:
            continue
        if out and out[-1][0] == key and key:
            out[-1][1].append(p)
        elif key:
            out.append((key, [p]))
        else:
            out.append(((), [p]))
    return [(k, ops) for k, ops in out if k]


def _movable(f: _Facts, hole: int, keys: Sequence[tuple[int, ...]]) -> bool:
    """A hole between two ops of one run can leave it (before, else after); at a boundary
    between different keys it stays where it is."""
    before = [p for p in range(hole) if keys[p]]
    after = [p for p in range(hole + 1, len(keys)) if keys[p]]
    if not before or not after or keys[before[-1]] != keys[after[0]]:
        return True
    key = keys[before[-1]]
    lo = before[-1]
    while lo > 0 and (keys[lo - 1] == key or not keys[lo - 1]):
        lo -= 1
    run_before = {p for p in range(lo, hole) if keys[p] == key}
    op = f.ops[hole]
    if not any(f.writer.get(ld.buffer) in run_before for ld in op.loads):
        return True
    hi = after[0]
    while hi + 1 < len(keys) and (keys[hi + 1] == key or not keys[hi + 1]):
        hi += 1
    return not any(keys[r] == key and hole < r <= hi for r in f.readers.get(op.store.buffer, ()))


def _legal(f: _Facts, members: Sequence[int], prior: Sequence[tuple[str, int]], dim: str, count: int) -> bool:
    """Can a level (dim, count) follow the ``prior`` levels of a group of ops ``members``?"""
    if not any(dim in f.iterated[p] for p in members):
        return True  # dropped with a warning for this group
    if any(dim in f.unaligned[p] for p in members):
        return False
    for p in members:
        op = f.ops[p]
        if not isinstance(op, Reduction):
            continue
        reduced = {d.name for d in op.reduction_ranges if d.size > 1}
        tiled_before = any(d in reduced for d, _ in prior)
        if tiled_before and dim not in f.iterated[p]:
            return False  # a level inside the reduction level that leaves the reduction invariant
    return True


@st.composite
def legal_hint_nests(draw, graph: Graph, *, max_levels: int = 3) -> HintNest:
    """Hints fspyre must honour (see the module docstring for the conditions)."""
    f = _facts(graph)
    n = len(graph.ops)
    spans: list[tuple[int, int]] = []
    for lo, hi, inner in draw(_spans(n)):
        spans.append((lo, hi))
        if inner:
            spans.append(inner)
    holes: set[int] = set()
    lo, hi = spans[0]
    if hi - lo >= 3 and draw(st.integers(0, 2)) == 0:
        h = draw(st.integers(lo + 1, hi - 2))
        if _movable(f, h, _keys(n, spans, {h})):
            holes.add(h)
    keys = _keys(n, spans, holes)
    groups = _groups(keys, holes)
    prior: dict[int, list[tuple[str, int]]] = {g: [] for g in range(len(groups))}
    slices: list[list[tuple[str, int]]] = [[] for _ in spans]
    levels = 0
    for s in range(len(spans)):
        mine = [g for g, (key, _) in enumerate(groups) if s in key]
        dims = sorted({d for g in mine for p in groups[g][1] for d in f.iterated[p]})
        for _ in range(draw(st.integers(1, 2))):
            options = [
                (d, c) for d in dims for c in COUNTS
                if levels < max_levels and all(_legal(f, groups[g][1], prior[g], d, c) for g in mine)
                and d not in dict(slices[s])
            ]
            if not options:
                break
            # Tiled reductions are the delicate case: offer them half the time when possible.
            reducing = [o for o in options if any(o[0] in f.reduced[p] for g in mine for p in groups[g][1])]
            d, c = draw(st.sampled_from(reducing if reducing and draw(st.booleans()) else options))
            slices[s].append((d, c))
            levels += 1
            for g in mine:
                if any(d in f.iterated[p] for p in groups[g][1]):
                    prior[g].append((d, c))
        if not slices[s]:
            # keep the scope (it shapes the groups) with a level plan_tiling drops
            slices[s].append((dims[0] if dims else next(iter(f.size), "A"), 1))
    scopes = tuple(ScopeSpec(start=a, stop=b, slices=tuple(sl)) for (a, b), sl in zip(spans, slices))
    return HintNest(scopes=scopes, holes=tuple(sorted(holes)), names=tuple(op.name for op in graph.ops))
