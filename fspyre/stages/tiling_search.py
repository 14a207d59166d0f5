"""Stage ``search_tiling``: graph + machine -> TilingSearch (the tiling fspyre finds itself).

The tile-and-fuse seed's consumer-driven pass on fspyre's IR (docs/tiling.md, "Automatic
tiling"):

- Ops under ``slices`` hints keep the groups their scopes give (``plan_tiling``'s "hints"
  mode). The search covers every run of other ops between those groups.
- Inside a run, ops are visited in reverse program order, so an op is tiled only after all
  its consumers were. The last op not yet in a group is the *consumer*; the contiguous ops
  before it that produce what the group reads join it under the fuse mode.
- A candidate (the group's ops, its loop levels) is judged by running the real downstream
  stages on the extracted subgraph: ``tile``, ``keep_resident``, ``divide_work``,
  ``allocate``, ``emit_program`` and ``traffic_report``. It *fits* when every intermediate
  of the group got LX. LX planning does not depend on a loop's trip count, so one compile
  of the group judges all its iterations (the seed's "first iteration only" reduction, for
  free).
- Shrink, then grow back: starting untiled, each of the consumer's output dims in turn (the
  outermost first) takes the smallest count that fits, trying the counts that divide the dim
  into whole sticks (tiles of power-of-two sticks with a peeled tail when none does) from the
  coarsest up (fitting is not monotone in the count: tiles too
  small for the cores make work division split a reduction, and its partials leave LX); if
  no count of a dim fits, that dim keeps its finest and the next dim is tried. Then every
  tiled dim grows back, by binary search, to the largest tile that still fits. Last, the
  outermost dim is refined to finer counts while the estimate keeps improving: a smaller
  tile can leave LX room for copies of re-read operands, and even a group that fits
  untiled may gain from one loop nest, whose memory time the cost model overlaps with its
  compute (one kernel).
- The choice is the candidate with the lowest estimated time among all judged, HBM bytes as
  tie-break, then fewer iterations: the untiled candidate is always judged, so a group is
  never slower (estimated) than leaving it untiled.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

import sympy
from tqdm import tqdm

from fspyre.errors import FspyreError, TilingError
from fspyre.ir.graph import Buffer, Graph, Load, Op, Output, Reduction, Store
from fspyre.ir.kinds import FUSE_MODES, FuseMode
from fspyre.ir.plans import Candidate, Group, GroupSearch, Level, TilingPlan, TilingSearch
from fspyre.machine.report import traffic_report
from fspyre.machine.spyre import Machine
from fspyre.stages.allocation import AllocationOptions
from fspyre.stages.loop_tree import elems_per_stick, tile
from fspyre.stages.online_softmax import OnlineOptions, match_online
from fspyre.stages.residency import ResidencyOptions, place_copies
from fspyre.stages.split_plan import SplitOptions
from fspyre.stages.tiling_plan import TilingOptions, plan_tiling, split_at_tiled_reductions


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchOptions:
    """``fuse``: which producers join a consumer's loop.

    - "max-producers": every contiguous producer; tiles shrink until all of them fit, and
      only when none fits is the farthest producer left out;
    - "max-size": the consumer's own best tiling first; a producer joins only if that tiling
      still fits with it;
    - "only-patterns": only what must share a loop: a reduction with the ops that read its
      result;
    - "no-fuse": every op is a group of its own.
    ``residency``, ``online``, ``split`` and ``allocation`` are the options the downstream
    stages will run with: each candidate is judged as it would be compiled."""

    fuse: FuseMode = "max-producers"  # which producers join a consumer's loop (above)
    residency: bool = True  # judge each candidate with keep_resident's LX copies, as compile will run it
    online: OnlineOptions = OnlineOptions()  # the online-softmax rewrite the candidates are tiled with
    split: SplitOptions = SplitOptions()  # the work division each candidate is judged under
    allocation: AllocationOptions = AllocationOptions()  # the allocation each candidate is judged under

    def __post_init__(self) -> None:
        if self.fuse not in FUSE_MODES:
            raise TilingError(f"fuse={self.fuse!r}: use one of {', '.join(FUSE_MODES)}")


def search_tiling(graph: Graph, machine: Machine, options: SearchOptions = SearchOptions()) -> TilingSearch:
    hinted = plan_tiling(graph, TilingOptions(mode="hints", online=options.online))
    in_group = {name for g in hinted.groups for name in g.ops}
    ctx = _Search(graph=graph, machine=machine, options=options, ops=graph.op_table(),
                  buffers=graph.buffer_table(), readers=_readers(graph),
                  outputs=frozenset(o.buffer for o in graph.outputs))
    records: list[GroupSearch] = []
    run: list[str] = []
    # A search of tens of seconds shows its progress on a terminal (not under a pipe or a test,
    # and not at all when it ends within a second).
    with tqdm(total=len(hinted.order), desc=f"tiling search {graph.name}", unit="op", delay=1.0, leave=False,
              disable=None) as progress:
        for name in hinted.order + ("",):  # "" closes the last run
            if name and name not in in_group:
                run.append(name)
                continue
            records.extend(_search_run(ctx, run))
            progress.update(len(run) + bool(name))
            run = []
    position = {name: i for i, name in enumerate(hinted.order)}
    # a searched accumulation's readers run after its loop (loop fission), as _judge compiled them
    searched = split_at_tiled_reductions(graph, TilingPlan(order=hinted.order, groups=tuple(
        Group(ops=r.ops, levels=r.choice.levels) for r in records if r.choice.levels)), options.online)
    found = searched.groups
    groups = sorted(hinted.groups + found, key=lambda g: position[g.ops[0]])
    plan = TilingPlan(order=hinted.order, groups=tuple(groups), warnings=hinted.warnings,
                      notes=hinted.notes + searched.notes)
    note = ""
    if found:
        # Each group was judged alone; together they share LX and copies differently. The
        # whole program must not be estimated slower than leaving those ops untiled.
        mine, base = _whole(ctx, graph, plan), _whole(ctx, graph, hinted)
        if base is not None and (mine is None or base < mine):
            note = (f"the searched groups together are estimated at "
                    f"{'a refusal' if mine is None else f'{mine[0] / 1000:.2f} us'}, the hinted plan alone at "
                    f"{base[0] / 1000:.2f} us: kept the hinted plan")
            plan = hinted
    return TilingSearch(plan=plan, groups=tuple(records), fuse=options.fuse, note=note)


def _whole(ctx: _Search, graph: Graph, plan: TilingPlan) -> tuple[float, int] | None:
    """(estimated time, HBM bytes) of the whole graph compiled under ``plan``."""
    try:
        placed = place_copies(tile(graph, plan, ctx.options.online), ctx.machine, ResidencyOptions(
            enabled=ctx.options.residency, split=ctx.options.split, allocation=ctx.options.allocation))
        report = traffic_report(placed.program)
    except FspyreError:
        return None
    return round(report.time_ns, 6), report.hbm_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class _Search:
    graph: Graph
    machine: Machine
    options: SearchOptions
    ops: Mapping[str, Op]
    buffers: Mapping[str, Buffer]
    readers: Mapping[str, tuple[str, ...]]
    outputs: frozenset[str]


def _readers(graph: Graph) -> dict[str, tuple[str, ...]]:
    out: dict[str, list[str]] = {}
    for op in graph.ops:
        for ld in op.loads:
            names = out.setdefault(ld.buffer, [])
            if op.name not in names:
                names.append(op.name)
    return {b: tuple(n) for b, n in out.items()}


# -- one run of unhinted ops ------------------------------------------------------------------
def _search_run(ctx: _Search, run: Sequence[str]) -> list[GroupSearch]:
    records: list[GroupSearch] = []
    end = len(run)
    while end > 0:
        members = _fusable(ctx, run, end - 1)
        record = _search_group(ctx, members)
        records.append(record)
        end -= len(record.ops)
    return records[::-1]


def _fusable(ctx: _Search, run: Sequence[str], i: int) -> list[str]:
    """The consumer ``run[i]`` and the contiguous ops before it that the fuse mode lets join."""
    members = [run[i]]
    if ctx.options.fuse == "no-fuse":
        return members
    reads = {ld.buffer for ld in ctx.ops[run[i]].loads}
    for j in range(i - 1, -1, -1):
        op = ctx.ops[run[j]]
        if op.store.buffer not in reads:
            break  # not a producer of the group: the group must stay contiguous
        if ctx.options.fuse == "only-patterns" and not isinstance(op, Reduction):
            break  # the pattern that must share a loop: a reduction and the ops that read its result
        members.insert(0, op.name)
        reads |= {ld.buffer for ld in op.loads}
    return members


def _search_group(ctx: _Search, members: list[str]) -> GroupSearch:
    if ctx.options.fuse == "max-size":
        return _grow_producers(ctx, members)
    while True:
        record = _fit(ctx, members)
        if record.choice.verdict == "fits" or len(members) == 1:
            return record
        members = members[1:]  # nothing fits with every producer: leave the farthest out


def _grow_producers(ctx: _Search, members: list[str]) -> GroupSearch:
    """max-size: the consumer's best tiling, then producers (nearest first) while it still fits."""
    best = _fit(ctx, members[-1:])
    judge = _Judge(ctx)
    for k in range(len(members) - 2, -1, -1):
        trial = members[k:]
        cand = judge(trial, best.choice.levels)
        if cand.verdict != "fits":
            break
        best = GroupSearch(consumer=members[-1], ops=tuple(trial), candidates=best.candidates + (cand,),
                           chosen=len(best.candidates))
    return best


# -- shrink and grow ----------------------------------------------------------------------------
def _fit(ctx: _Search, members: Sequence[str]) -> GroupSearch:
    judge = _Judge(ctx)
    ops = [ctx.ops[m] for m in members]
    dims = _tileable_dims(ops)
    counts = {d: _counts(ctx, ops, d, size) for d, size in dims}
    chosen: dict[str, int] = {}

    def levels(at: Mapping[str, int]) -> tuple[Level, ...]:
        return tuple(Level(count=at[d], dims=(d,), source="auto") for d, _ in dims if at.get(d, 1) > 1)

    def fits(at: Mapping[str, int]) -> bool:
        return judge(members, levels(at)).verdict == "fits"

    if not fits(chosen):
        for d, _ in dims:  # shrink
            options = counts[d]
            if not options:
                continue
            k = next((i for i, c in enumerate(options) if fits({**chosen, d: c})), None)
            chosen[d] = options[-1 if k is None else k]
            if k is not None:
                break
        for d in list(chosen):  # grow back: the largest tile of each dim that still fits
            options = [1] + [c for c in counts[d] if c < chosen[d]]
            k = _first(options, lambda c: fits({**chosen, d: c}))
            if k is not None:
                chosen[d] = options[k]
    # Refine the outermost tiled dim while finer tiles keep paying: a fitting tiling may
    # leave no LX for copies of re-read operands that a smaller tile makes room for. When
    # untiled fits, one loop is judged too: the cost model overlaps a loop nest's memory time
    # with its compute (one kernel), which separate untiled kernels cannot.
    first = next((d for d, _ in dims if counts[d]), None)
    if first is not None:
        best_rank = min(t.rank for t in judge.tried)
        for c in (c for c in counts[first] if c > chosen.get(first, 1)):
            trial = {**chosen, first: c}
            rank = _rank(judge(members, levels(trial)))
            if rank >= best_rank:
                break
            best_rank = rank
    _try_online(ctx, judge, members, ops, chosen, levels)
    _try_accumulation(ctx, judge, members, ops)
    best = min(range(len(judge.tried)), key=lambda i: judge.tried[i].rank)
    return GroupSearch(consumer=members[-1], ops=tuple(members),
                       candidates=tuple(c.candidate for c in judge.tried), chosen=best)


def _try_online(ctx: _Search, judge: _Judge, members: Sequence[str], ops: Sequence[Op], chosen: Mapping[str, int],
                levels: Callable[[Mapping[str, int]], tuple[Level, ...]]) -> None:
    """Judge tiling the reduction dim of a softmax in the group (an online softmax: its max,
    sum and value product carried across the tiles), innermost, alone and under the output
    tiling found: it reads k and v of an attention once where query tiles re-read them.
    Counts from the coarsest up until one fits, then finer while the estimate improves."""
    for dim, size in _online_dims(ctx, ops):
        counts = _counts(ctx, ops, dim, size)
        for base in ({}, dict(chosen)) if chosen else ({},):
            outer = levels(base)
            _coarse_to_fine(judge, members, counts, partial(_innermost, outer, dim))


def _innermost(outer: tuple[Level, ...], dim: str, count: int) -> tuple[Level, ...]:
    return outer + (Level(count=count, dims=(dim,), source="auto"),)


def _coarse_to_fine(judge: _Judge, members: Sequence[str], counts: Sequence[int],
                    levels: Callable[[int], tuple[Level, ...]]) -> None:
    """Judge the counts from the coarsest up until one fits, then finer while the estimate
    improves."""
    best_rank = None
    for c in counts:
        cand = judge(members, levels(c))
        if cand.verdict != "fits":
            # refused (tiles too small for whole sticks, ...) or spilling: a finer count may
            # fit, and spilling estimates need not fall as the tiles shrink
            continue
        rank = _rank(cand)
        if best_rank is not None and rank >= best_rank:
            break
        best_rank = rank


def _try_accumulation(ctx: _Search, judge: _Judge, members: Sequence[str], ops: Sequence[Op]) -> None:
    """Judge tiling the reduction dim of a sum or matmul in the group (a K-accumulation: the
    partial results summed into an accumulator across the tiles) when the ops before it
    produce that dim as an output dim: the mlp's second matmul over the hidden dim, whose
    producers (the first matmul, its bias, gelu) then walk the hidden dim with it. Each weight
    is read once, where a token tiling re-reads both per tile; the copy of the tokens and the
    finish (the cast, the bias add writing y) run in the loop's first and last iterations
    (``fspyre.stages.residency.guard_boundaries``). Loop fission puts the readers of the sum
    after the loop. Counts from the coarsest up until one fits, then finer while the estimate
    improves."""
    for dim, size in _accumulation_dims(ops):
        _coarse_to_fine(judge, members, _counts(ctx, ops, dim, size), partial(_innermost, (), dim))


def _accumulation_dims(ops: Sequence[Op]) -> list[tuple[str, int]]:
    """The reduction dims of the group's sums and matmuls that are not an output dim of the
    consumer and that some op before the reduction in the group produces as an output dim
    (tiling only the reduction's own operand loads re-reads nothing: the search keeps to dims
    a producer chain walks with it)."""
    out: list[tuple[str, int]] = []
    consumer = {d.name for d in ops[-1].ranges}
    for k, op in enumerate(ops):
        if not isinstance(op, Reduction) or op.fn not in ("sum", "matmul"):
            continue
        for d in op.reduction_ranges:
            if (d.size > 1 and d.name not in consumer and (d.name, d.size) not in out
                    and any(any(r.name == d.name and r.size == d.size for r in p.ranges) for p in ops[:k])):
                out.append((d.name, d.size))
    return out


def _online_dims(ctx: _Search, ops: Sequence[Op]) -> list[tuple[str, int]]:
    """The reduction dims an online softmax of the group could be tiled over."""
    out = []
    for op in ops:
        if isinstance(op, Reduction) and op.fn == "amax" and len(op.reduction_ranges) == 1:
            d = op.reduction_ranges[0]
            if d.size > 1 and (d.name, d.size) not in out and match_online(
                    ops, {o.name: (d.name,) for o in ops}, ctx.readers, ctx.outputs,
                    ctx.options.online) is not None:
                out.append((d.name, d.size))
    return out


def _first(options: Sequence[int], ok: Callable[[int], bool]) -> int | None:
    """Index of the first option ``ok`` accepts, by binary search (``ok`` is taken to be
    monotone: a larger count only shrinks tiles); None when even the last is refused."""
    lo, hi = 0, len(options)
    while lo < hi:
        mid = (lo + hi) // 2
        if ok(options[mid]):
            hi = mid
        else:
            lo = mid + 1
    return lo if lo < len(options) and ok(options[lo]) else None


def _tileable_dims(ops: Sequence[Op]) -> list[tuple[str, int]]:
    """The consumer's output dims (outermost first) that every op of the group iterates as an
    output dim: a level on any other dim would re-run an op every iteration or split a
    reduction whose result the group reads."""
    consumer = ops[-1]
    out = []
    for d in consumer.ranges:
        if d.size > 1 and all(any(r.name == d.name and r.size == d.size for r in op.ranges) for op in ops):
            out.append((d.name, d.size))
    return out


def _counts(ctx: _Search, ops: Sequence[Op], dim: str, size: int) -> list[int]:
    """Counts > 1 dividing ``size`` whose tiles are whole sticks wherever ``dim`` is a buffer's
    stick dim (the unit-stride dim of a load or store). When none does, short of tiles of one
    element (a prime size; a stick dim of no whole-stick divisor, such as 100 fp16 columns),
    the counts of tiles of ``stick * 2**k`` elements: ``tile`` peels the remainder
    (docs/tiling.md, "Tails")."""
    var = sympy.Symbol(dim, integer=True, nonnegative=True)
    stick = 1
    for op in ops:
        accesses: tuple[Load | Store, ...] = (*op.loads, op.store)
        for access in accesses:
            btype = ctx.buffers[access.buffer].type
            if btype.dims and btype.dims[-1].size > 1 and access.index.coeff(var) == 1:
                stick = max(stick, elems_per_stick(btype.dtype))
    exact = [c for c in range(2, size + 1) if size % c == 0 and (size // c) % stick == 0]
    if any(c < size for c in exact):
        return exact
    tiles = (stick << k for k in range(size.bit_length()))
    return sorted(set(exact) | {-(-size // t) for t in tiles if t < size})


# -- judging one candidate ------------------------------------------------------------------------
def _rank(cand: Candidate) -> tuple[int, float, int, int]:
    """Refused last, then estimated time (equal to a femtosecond is a tie: such times differ
    only by float summation order), HBM bytes, iterations."""
    return int(cand.verdict == "refused"), round(cand.time_ns, 6), cand.hbm_bytes, cand.iterations


@dataclass(frozen=True, slots=True)
class _Tried:
    candidate: Candidate
    rank: tuple[int, float, int, int]


class _Judge:
    """Compiles candidates of one group and remembers each verdict (a search's scratch state,
    local to one ``_fit`` call)."""

    def __init__(self, ctx: _Search) -> None:
        self.ctx = ctx
        self.tried: list[_Tried] = []
        self._memo: dict[tuple, Candidate] = {}

    def __call__(self, members: Sequence[str], levels: tuple[Level, ...]) -> Candidate:
        key = (tuple(members), levels)
        if key not in self._memo:
            cand = _judge(self.ctx, members, levels)
            self._memo[key] = cand
            self.tried.append(_Tried(candidate=cand, rank=_rank(cand)))
        return self._memo[key]


def _judge(ctx: _Search, members: Sequence[str], levels: tuple[Level, ...]) -> Candidate:
    sub = _subgraph(ctx, members)
    plan = TilingPlan(order=tuple(members), groups=(Group(ops=tuple(members), levels=levels),) if levels else ())
    try:
        # a level over a reduction dim that ops of the group read the result of: loop fission
        plan = split_at_tiled_reductions(sub, plan, ctx.options.online)
        placed = place_copies(tile(sub, plan, ctx.options.online), ctx.machine, ResidencyOptions(
            enabled=ctx.options.residency, split=ctx.options.split, allocation=ctx.options.allocation))
        tree, alloc = placed.tree, placed.allocation
        report = traffic_report(placed.program)
    except FspyreError as err:
        return Candidate(levels=levels, verdict="refused", reason=str(err).splitlines()[0])
    kept = {o.buffer for o in sub.outputs} | set(sub.inputs)
    spilled = [b.name for b in tree.buffers if b.name not in kept and alloc.buffers[b.name].memory != "lx"]
    reason = ""
    if spilled:
        placement = alloc.buffers[spilled[0]]
        reason = f"{spilled[0]} in HBM" + (f" ({placement.reason})" if placement.reason else "")
    return Candidate(levels=levels, verdict="spills" if spilled else "fits", reason=reason,
                     time_ns=report.time_ns, hbm_bytes=report.hbm_bytes)


def _subgraph(ctx: _Search, members: Sequence[str]) -> Graph:
    """The group's ops as a graph of their own: what they read from outside is an input, what
    they write that is read outside (or is a graph output) is an output."""
    inside = set(members)
    written: set[str] = set()
    inputs: list[str] = []
    outputs: list[str] = []
    for name in members:
        op = ctx.ops[name]
        for ld in op.loads:
            if ld.buffer not in written and ld.buffer not in inputs:
                inputs.append(ld.buffer)
        written.add(op.store.buffer)
        buf = op.store.buffer
        if buf in ctx.outputs or any(r not in inside for r in ctx.readers.get(buf, ())):
            outputs.append(buf)
    names = inputs + [ctx.ops[m].store.buffer for m in members]
    return Graph(
        name=ctx.graph.name, buffers=tuple(ctx.buffers[n] for n in names), inputs=tuple(inputs),
        ops=tuple(ctx.ops[m] for m in members), outputs=tuple(Output(name=b, buffer=b) for b in outputs),
        hints=ctx.graph.hints,
    )
