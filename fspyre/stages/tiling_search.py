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
  outermost dim is refined to finer counts while the estimate keeps improving (past up to
  2 ties in a row, ``_TIES``): a smaller
  tile can leave LX room for copies of re-read operands, and even a group that fits
  untiled may gain from one loop nest, whose memory time the cost model overlaps with its
  compute (one kernel).
- The choice is the candidate with the lowest estimated time among all judged, HBM bytes as
  tie-break, then fewer iterations: the untiled candidate is always judged, so a group is
  never slower (estimated) than leaving it untiled.
- The whole program under the plan found is compiled; when it disagrees with what the groups
  claim (each judged alone), the groups are weighed again in it (``_corrected``, in
  ``plan_correction``), and the hinted plan is kept when it is estimated faster still.

The options and the state the search shares with that correction are in ``search_context``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Literal

import sympy
from tqdm import tqdm

from fspyre.errors import FspyreError
from fspyre.ir.graph import (
    Buffer,
    Graph,
    Load,
    Op,
    Reduction,
    Store,
    iteration_dims,
    store_region,
)
from fspyre.ir.looptree import LoopTree, op_nodes
from fspyre.ir.plans import Alternative, Candidate, Group, GroupSearch, Level, TilingPlan, TilingSearch
from fspyre.machine.formats import FORMATS
from fspyre.machine.report import traffic_report
from fspyre.machine.rules import row_major_strides
from fspyre.machine.spyre import HBM_BYTES_PER_NS, HBM_TURNAROUND_NS_PER_BYTE, MACS_PER_NS_PER_CORE, Machine
from fspyre.stages.arguments import require, require_graph
from fspyre.stages.loop_tree import elems_per_stick, tile
from fspyre.stages.online_softmax import match_online
from fspyre.stages.plan_correction import _RUNNER_UPS, _corrected
from fspyre.stages.program import verify_program
from fspyre.stages.residency import Residency, ResidencyOptions, place_copies
from fspyre.stages.search_context import (
    SearchOptions,
    _canonical,
    _charged,
    _Compiled,
    _compiled,
    _device_bytes,
    _in_place,
    _plan,
    _renamed,
    _Search,
    _structure,
    _subgraph,
    _whole,
)
from fspyre.stages.tiling_plan import TilingOptions, plan_tiling, split_at_tiled_reductions


def search_tiling(graph: Graph, machine: Machine, options: SearchOptions = SearchOptions()) -> TilingSearch:
    return search_placed(graph, machine, options).search


@dataclass(frozen=True, slots=True, kw_only=True)
class Placed:
    """The search and the whole graph compiled under its plan, as the search judged it: the
    loop tree ``tile`` made and keep_resident's tree, work division, allocation and verified
    program (``placed``). The pipeline hands these on instead of compiling the plan again.
    ``tree`` and ``placed`` are None when the plan's compile was refused (compiling it again
    reports why)."""

    search: TilingSearch
    tree: LoopTree | None = None
    placed: Residency | None = None


def search_placed(graph: Graph, machine: Machine, options: SearchOptions = SearchOptions()) -> Placed:
    require(machine, Machine, "search_tiling", "machine")
    require_graph(graph, "search_tiling", machine)
    require(options, SearchOptions, "search_tiling", "options")
    hinted = plan_tiling(graph, TilingOptions(mode="hints", online=options.online))
    base = _compiled(options, machine, graph, hinted)
    ctx = _Search(graph=graph, machine=machine, options=options, ops=graph.op_table(),
                  buffers=graph.buffer_table(), readers=_readers(graph),
                  outputs=frozenset(o.buffer for o in graph.outputs), untiled=_alone(base, graph),
                  order=hinted.order, position={name: k for k, name in enumerate(hinted.order)})
    # Candidates' programs are not verified (``_judge``): the program of the plan found is,
    # and when it is refused the search runs again verifying every candidate, as a candidate
    # the verifier refuses must not be chosen.
    placed = _searched(ctx, hinted, base)
    if placed is None:
        placed = _searched(replace(ctx, memo={}, verify=True), hinted, base)
        assert placed is not None  # with every candidate verified, a refusal keeps the hinted plan
    return placed


def _searched(ctx: _Search, hinted: TilingPlan, base: _Compiled | None) -> Placed | None:
    """The search over the runs of unhinted ops and the program of its plan; None when that
    program is refused and the candidates were not verified (``ctx.verify``)."""
    graph, machine, options = ctx.graph, ctx.machine, ctx.options
    records = _records(ctx, hinted)
    plan = _plan(ctx, hinted, records)
    note = ""
    chosen = base
    if plan is not hinted:
        # Each group was judged alone; together they share LX and copies differently. The
        # whole program must not be estimated slower than leaving those ops untiled.
        mine = _compiled(options, machine, graph, plan)
        if mine is None and not ctx.verify:
            return None
        chosen = mine
        if base is not None and mine is not None:
            records, plan, chosen, note = _corrected(ctx, hinted, base, records, plan, mine, _records, _runner_ups)
        if base is not None and (chosen is None or _whole(base.report) < _whole(chosen.report)):
            note = (f"the searched groups together are estimated at "
                    f"{'a refusal' if chosen is None else f'{chosen.report.time_ns / 1000:.2f} us'}, the hinted "
                    f"plan alone at {base.report.time_ns / 1000:.2f} us: kept the hinted plan")
            plan, chosen = hinted, base
    search = TilingSearch(plan=plan, groups=tuple(records), fuse=options.fuse, note=note,
                          compiled=ctx.tally["compiled"], reused=ctx.tally["reused"], screened=ctx.tally["screened"],
                          rechecked=ctx.tally["rechecked"])
    if chosen is None:
        return Placed(search=search)
    return Placed(search=search, tree=chosen.tree, placed=chosen.placed)


def _records(ctx: _Search, hinted: TilingPlan) -> list[GroupSearch]:
    """The search over each run of unhinted ops (between the hinted groups)."""
    in_group = {name for g in hinted.groups for name in g.ops}
    records: list[GroupSearch] = []
    run: list[str] = []
    # A search of tens of seconds shows its progress on a terminal (not under a pipe or a test,
    # and not at all when it ends within a second).
    with tqdm(total=len(hinted.order), desc=f"tiling search {ctx.graph.name}", unit="op", delay=1.0, leave=False,
              disable=None) as progress:
        for name in hinted.order + ("",):  # "" closes the last run
            if name and name not in in_group:
                run.append(name)
                continue
            records.extend(_search_run(ctx, run))
            progress.update(len(run) + bool(name))
            run = []
    return records


def _runner_ups(ctx: _Search, record: GroupSearch) -> list[Alternative]:
    """The tiled segments besides ``record``'s group that the DP weighed for its consumer; when
    it judged none, the segment inside the group (its consumer and the ops nearest it) that it
    screened with the least bound, judged now (from the memo when solved elsewhere). The
    screening trusted the claims the whole program has just not borne out: logsumexp fp16
    x[129, 3000] on 8 cores and 64 KiB took [amax .. sum] C:2 (claimed -28.26 us, 12.29 us as
    a whole), which screened [sub, exp, sum] by its bound (-27.86); judged, R:2 claims -27.82
    and is 11.33 us as a whole with the amax untiled (the claims were off by the amax's share
    of the untiled sub's and exp's read/write turnaround: docs/tiling.md, "Why auto missed a
    plan"). Only inside the group: a longer segment swapped in for a block's lone projection
    S:2 (S=128, D=256, F=688, 4 cores, 128 KiB) led the correction to a plan slower than the
    hinted one, where leaving groups out finds 32.73 us against 33.00."""
    tiled = [a for a in record.alternatives if a.choice is not None and a.choice.levels and a.ops != record.ops
             and a.choice.verdict != "refused"]
    inside = [a for a in record.alternatives if a.choice is None and set(a.ops) < set(record.ops)]
    if inside and not tiled:
        alt = min(inside, key=lambda a: (a.bound_ns, -len(a.ops)))
        choice = _solve(ctx, alt.ops).choice
        if choice.levels and choice.verdict != "refused":
            in_place = _in_place(ctx, alt.ops)
            before = alt.bound_ns - (_bound(ctx, alt.ops) - in_place[0])  # the run's best change before it
            tiled.append(replace(alt, choice=choice, change_ns=_add((before, 0, 0), choice, in_place)[0]))
    return tiled


def _alone(base: _Compiled | None, graph: Graph) -> dict[str, tuple[float, int]]:
    """op -> (estimated time, HBM bytes) of each op that is a kernel of its own in the program
    ``base`` (the hinted plan's): what an op left untiled costs in the program as a whole,
    where the allocator may keep its operands in LX across kernels. A kernel that only copies
    a region into LX for its readers (``keep_resident``) is charged to the first graph op that
    reads the copy: it exists for that op, and a group holding the op and the region's
    producer does without it (c[2, 2] read twice by a matmul on 2 cores with 128 B of LX: the
    matmul's 2.3 ns untiled were 7.0 ns with its copy, which the group that fuses the constant
    into the matmul's tiles saves)."""
    if base is None:
        return {}
    report = base.report
    ops: dict[int, list[str]] = {}
    for o in report.ops:
        ops.setdefault(o.kernel, []).append(o.name)
    hbm = {o.name: o.hbm_read + o.hbm_write for o in report.ops}
    out = {names[0]: (k.time_ns, hbm[names[0]]) for k in report.kernels if len(names := ops[k.index]) == 1}
    nodes = op_nodes(base.placed.tree)
    graph_ops = {op.name for op in graph.ops}
    for node in nodes:
        if node.op.fn != "copy" or node.name in graph_ops or node.name not in out:
            continue
        reader = next((n.name for n in nodes if n.name in graph_ops
                       and any(ld.buffer == node.op.store.buffer for ld in n.op.loads)), None)
        if reader in out:
            t, b = out.pop(node.name)
            out[reader] = (out[reader][0] + t, out[reader][1] + b)
    return out




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
    if ctx.options.fuse == "max-producers" and ctx.options.strategy == "dp":
        return _segments(ctx, run)
    records: list[GroupSearch] = []
    end = len(run)
    while end > 0:
        members = _fusable(ctx, run, end - 1)
        record = _search_group(ctx, members)
        records.append(record)
        end -= len(record.ops)
    return records[::-1]


# The reason of an op's untiled candidate taken from the hinted program, not compiled alone.
IN_CONTEXT = "untiled alone: the hinted program's kernel (not compiled again)"

_Cost = tuple[float, int, int]  # estimated time, HBM bytes, iterations: compared in that order
_REFUSED: _Cost = (math.inf, 0, 0)


def _segments(ctx: _Search, run: Sequence[str]) -> list[GroupSearch]:
    """The groups of ``run`` that minimise its estimated time, by dynamic programming over
    contiguous segments: ``best[i]`` is the least cost of ``run[:i]``, the minimum over the
    segments ``run[j:i]`` of ``best[j]`` plus what the segment's best tiling (``_solve``)
    changes against running its ops untiled in the whole program. A segment is a consumer with
    producers before it (``_fusable``) and sibling branches, outputs of an intermediate the
    segment writes (``_fusable_starts``), at most ``window`` ops long, or a consumer's whole
    producer chain (the seed's max-producers group) of at most twice that: judging a whole
    model's chain (in a transformer every op feeds the next) costs a dozen compiles of the
    model, for groups the window's segments cover.
    The consumer untiled on its own is always an option, at no change and without a compile;
    so, where it can pay, is the last tiled group before it with the untiled ops after it
    through the consumer, compiled together (``_with_epilogue``): in the whole program those
    ops run in the group's loop's last iteration, one kernel. Segments are judged in the
    order of ``best[j]`` plus the segment's lower bound (``_bound``), and one whose bound
    cannot beat the best found for ``i`` is not judged; nor
    are the rest once ``patience`` judged in a row did not improve it (the bound ranks the
    segments that can gain; one further down that order rarely gains where those before it
    did not), nor one that ends at an op that costs nothing untiled in the hinted
    program, nor one that starts at such an op unless the segment without it improved the
    consumer's best."""
    n = len(run)
    best: list[_Cost] = [(0.0, 0, 0)] + [_REFUSED] * n
    back: list[tuple[int, tuple[GroupSearch, ...], tuple[Alternative, ...]] | None] = [None] * (n + 1)
    # the last tiled group run[j:k] on the best path to i, the ops after it untiled: (j, k, levels);
    # and the judged tiled segment ending at i of least cost, on the best path or not
    last: list[_Head | None] = [None] * (n + 1)
    tiled_at: list[_Head | None] = [None] * (n + 1)
    chains = _chain_starts(ctx, run)
    # the options weighed at the run's last consumer: (cost, start, records of the segment)
    ends: list[tuple[_Cost, int, tuple[GroupSearch, ...]]] = []
    for i in range(1, n + 1):
        starts = _fusable_starts(ctx, run, i - 1, ctx.options.window)
        # the starts of the chain segments the window cut: these also weigh levels on dims
        # their leading ops do not iterate, those ops hoisted before the loop (``_tileable_dims``)
        hoisting: set[int] = set()
        if chains.get(i) is not None and chains[i] not in starts and i - chains[i] <= 2 * ctx.options.window:
            hoisting.add(chains[i])
            starts.append(chains[i])
            # and the chain's longest tail a level can tile, when the window cuts it: a
            # captured GQA attention's 11-op chain has its two repeat_interleave copies,
            # which do not iterate the query heads, and its 9 ops after them tiled over the
            # heads are 2.41 us against 2.84 for the 8 the window gives (3 cores, 32 KiB)
            # Each tail whose ops share more of the consumer's output dims than the longer
            # tail: the chain without its leading ops that do not iterate a dim the rest share
            # (a causal mask's gt(mask[S, T]) before the attention of H heads, 10 ops)
            tails = [j for j in _shared_starts(ctx, run, chains[i], i) if j not in starts]
            hoisting.update(tails)
            starts.extend(tails)
        # and, where the window cuts the walk back from the consumer, the segment of every op
        # that walk passes when it stops within twice the window: a consumer's producers with
        # the sibling branches between them (contiguous in program order), which its producer
        # chain skips -- a softmax with its logsumexp, lse = log(sum) + max, 9 ops: the lse's
        # add out of the probabilities' loop sends the max and log(sum) through HBM
        # (fp16 x[4093, 256], 8 cores, 64 KiB: 75.97 us against 51.05 for all 9 ops R:16)
        if i > ctx.options.window:
            whole = _fusable_starts(ctx, run, i - 1, 2 * ctx.options.window, closed=True)
            starts.extend(j for j in whole if j not in starts and i - j > ctx.options.window)
        # and, before a segment, the free producers it reads (below), whole within twice the window
        for j in list(starts):
            f = _free_start(ctx, run, j, i)
            if f < j and f not in starts and i - f <= 2 * ctx.options.window:
                starts.append(f)
        # a segment's cost is what its tiling changes against running its ops untiled in the
        # whole program, with what its boundary costs the free ops before it (``_charged``);
        # an untiled segment changes nothing (its ops are no group)
        # (the bounds leave the charge out: it ranks and screens the segments as before, and a
        # charge in the bound reordered a transformer block's judging into a group the whole
        # program's correction then left out, 11 more compiles)
        charged = {j: _charged(ctx, run[j:i]) for j in starts}
        in_place = {j: _in_place(ctx, run[j:i])[0] for j in starts}
        bounds = {j: _bound(ctx, run[j:i]) - in_place[j] for j in starts}
        # a gain below this share of what the segment's ops cost in place is not worth a judging
        tol = {j: _GAIN_TOLERANCE * in_place[j] for j in starts}
        rank = {j: best[j][0] + bounds[j] for j in starts}
        # a segment starting at an op that costs nothing is weighed after the one starting at
        # the next op, whose verdict the rule below needs (its bound may rank it first: it
        # reads fewer inputs)
        for j in sorted(starts, reverse=True):
            if j < i - 1 and _costs_nothing(ctx, run[j]) and j + 1 in rank:
                rank[j] = max(rank[j], rank[j + 1])
        order = sorted(starts, key=lambda j: (rank[j], -j))
        found: tuple[int, tuple[GroupSearch, ...]] | None = None
        alternatives: list[Alternative] = []
        consumer = run[i - 1]
        if consumer in ctx.untiled and best[i - 1] != _REFUSED:
            # the consumer untiled on its own changes nothing: it costs what it costs in the
            # hinted program, whose figures it is given without a compile
            t, b = ctx.untiled[consumer]
            alone = Candidate(levels=(), verdict="fits", time_ns=t, hbm_bytes=b, reason=IN_CONTEXT)
            best[i], found = best[i - 1], (i - 1, (_untiled_record(consumer, alone),))
            if i == n:
                ends.append((best[i], *found))
            alternatives.append(Alternative(ops=(consumer,), bound_ns=best[i - 1][0], choice=alone,
                                            change_ns=best[i - 1][0]))
        # An op that costs nothing untiled in the hinted program (it moves no HBM byte and
        # computes nothing: its operands and result stay in LX) does not end a group: the group
        # adds the op's work to its loop and saves nothing the hinted program pays for it (the
        # group without it is weighed in its place). It may start one: a group starting at such
        # an op can win (x0[2, 64, 1] read by three negs and an add on 1 core, 32 KiB LX: 802 ns
        # against 843 ns untiled, which the rule had screened; test_tiling_search's property) --
        # but only where the group without it was judged for this consumer and improved its
        # best: the op then joins a group that pays, instead of starting one of its own.
        free = found is not None and _costs_nothing(ctx, consumer)
        idle = 0  # segments judged in a row that did not improve best[i]
        tiled_cost = _REFUSED
        gained: set[int] = set()  # starts of the segments that improved best[i] when judged
        for j in order:
            members = tuple(run[j:i])
            reach = best[j][0] + bounds[j]
            # a bound that only ties the best found (or beats it by less than the tolerance)
            # cannot lower the estimated time (by more than the tolerance)
            if found is not None and (free or reach >= best[i][0] - tol[j] or idle >= ctx.options.patience
                                      or (j < i - 1 and _costs_nothing(ctx, run[j]) and j + 1 not in gained)):
                ctx.tally["screened"] += 1
                alternatives.append(Alternative(ops=members, bound_ns=reach))
                continue
            record = _solve(ctx, members, hoist=j in hoisting)
            if ctx.in_context:
                record = _in_context(record, charged[j])
            cost = _add(best[j], record.choice, charged[j])
            alternatives.append(Alternative(ops=members, bound_ns=reach, choice=record.choice, change_ns=cost[0]))
            if i == n:
                ends.append((cost, j, (record,)))
            if record.choice.levels and (tiled_at[i] is None or cost < tiled_cost):
                tiled_at[i], tiled_cost = (j, i, record.choice.levels, cost), cost
            if found is None or cost < best[i]:
                best[i], found = cost, (j, (record,))
                idle = 0
                gained.add(j)
            elif j < i - 1 and _costs_nothing(ctx, run[j]):
                if j - 1 in rank and _costs_nothing(ctx, run[j - 1]):
                    # a run of ops that cost nothing joins whole: cut inside it, the segment
                    # reads from HBM what the run keeps in LX (x -> abs -> +1 -> pow beside
                    # sin(x), tanh and a matmul over E: only the segment from abs, reading x
                    # alone, gains, 825 ns against 1,557 from pow on)
                    gained.add(j)
                else:
                    # the group that paid, grown by an op that costs nothing, gains nothing more:
                    # the segments left rank below both by their bound
                    idle = ctx.options.patience
            elif charged[j] != _in_place(ctx, members) and any(
                    c.levels and _add(best[j], c, _in_place(ctx, members)) < best[i] for c in record.candidates):
                # a tiling of it lost only by the charge for reading its free neighbours' results
                # (``_charged``): the segment grown over them, which is not charged, is weighed
                # next (sin(x), tanh(pow(abs(x) + 1)) and a matmul over E: [sin .. matmul]
                # reads pow's result; from abs it reads x alone and gains 825 ns against 1,557)
                gained.add(j)
            else:
                idle += 1
        assert found is not None  # the consumer alone is always a segment, judged when not free
        j, chosen = found
        last[i] = (j, i, chosen[0].choice.levels, best[i]) if chosen[0].choice.levels else last[j]
        # The last tiled group before this consumer with the untiled ops after it, the
        # consumer among them: in the whole program the untiled ops that read the group's
        # results run in its loop's last iteration ("Kernel boundaries"), one kernel, whose
        # compute may hide their memory time -- which the sum of the group's score and their
        # own kernels in the hinted program does not see (layernorm -> matmul bf16 over 1,003
        # rows on 16 cores: the norm T:16 with the matmul untiled is 152.0 us, scored as if
        # 169.3). Judged as one segment whose tiled group is its head.
        # The head is the best path's last tiled group, and the best tiled segment ending just
        # before the consumer where that is another (it may lose alone and win with its readers).
        for head in dict.fromkeys(h for h in (last[i - 1], tiled_at[i - 1]) if h is not None):
            ext = _with_epilogue(ctx, run, i, head, best, bounds)
            if ext is None:
                continue
            cost, headed, alternative = ext
            alternatives.append(alternative)
            if i == n:
                ends.append((cost, head[0], headed))
            if cost < best[i]:
                best[i], found, last[i] = cost, (head[0], headed), head
        back[i] = (*found, tuple(alternatives))

    def path(i: int) -> list[GroupSearch]:
        """The records of the best path to ``i``."""
        records: list[GroupSearch] = []
        while i > 0:
            entry = back[i]
            assert entry is not None
            j, chosen, weighed = entry
            records.append(replace(chosen[-1], alternatives=weighed))
            records.extend(reversed(chosen[:-1]))
            i = j
        return records[::-1]

    records = path(n)
    # The runner-ups: the best plans of the run that end in another segment than the one
    # chosen, by cost, for the correction to compile whole (``plan_correction``).
    tiled = {(r.ops, r.choice.levels) for r in records if r.choice.levels}
    seen = {frozenset(tiled)}
    runner_ups: list[tuple[float, tuple[GroupSearch, ...]]] = []
    for cost, j, last_records in sorted(ends, key=lambda e: e[0]):
        if cost == _REFUSED or len(runner_ups) == _RUNNER_UPS:
            break
        plan = [*path(j), *last_records]
        key = frozenset((r.ops, r.choice.levels) for r in plan if r.choice.levels)
        if key not in seen:
            seen.add(key)
            runner_ups.append((cost[0] - best[n][0], tuple(plan)))
    if n:
        ctx.runner_ups[(ctx.in_context, tuple(run))] = tuple(runner_ups)
    return records




def _untiled_record(op: str, cand: Candidate) -> GroupSearch:
    return GroupSearch(consumer=op, ops=(op,), candidates=(cand,), chosen=0)


# a tiled group run[j:k] at levels, and the cost of the run up to k with it: (j, k, levels, cost)
_Head = tuple[int, int, tuple[Level, ...], _Cost]


def _with_epilogue(ctx: _Search, run: Sequence[str], i: int, head: _Head,
                   best: Sequence[_Cost], bounds: Mapping[int, float]
                   ) -> tuple[_Cost, tuple[GroupSearch, ...], Alternative] | None:
    """The segment ``run[j:i]`` whose group is the tiled ``run[j:k]`` of ``head`` and whose
    other ops run untiled after it: its cost, its records (the group's, then each untiled
    op's) and the alternative weighed; None when it is not weighed -- it is longer than a
    chain may be, the consumer reads nothing the segment writes (it would not join the
    loop), the untiled ops cost nothing in the hinted program, the group has a matmul or
    its readers none (below), or it is screened by its lower bound."""
    j, k, levels, through = head
    members = tuple(run[j:i])
    if i - j > 2 * ctx.options.window or k >= i:
        return None
    written = {ctx.ops[m].store.buffer for m in members[:-1]}
    if not any(ld.buffer in written for ld in ctx.ops[run[i - 1]].loads):
        return None
    # A kernel's time is max(memory, compute) and only a matmul computes: the case weighed is
    # a group of memory time alone (no matmul) whose readers include a matmul, under whose
    # compute the loop's memory time hides. (A group with a matmul of its own hiding its
    # readers' memory is not weighed: on the S=2048, D=4096 block that took 8 more compiles
    # and changed no plan.)
    def computes(names: Sequence[str]) -> bool:
        return any(isinstance(op, Reduction) and op.fn == "matmul" for op in (ctx.ops[m] for m in names))

    if _in_place(ctx, run[k:i]) == (0.0, 0) or computes(run[j:k]) or not computes(run[k:i]):
        return None
    reach = best[j][0] + (bounds[j] if j in bounds else _bound(ctx, members) - _in_place(ctx, members)[0])
    # and not when hiding every untiled op's time entirely under the loop would not beat the
    # best found (a rule of thumb: the group's own estimate may change with its readers beside it)
    hidden = through[0] - _in_place(ctx, run[k:i])[0]
    if max(reach, hidden) >= best[i][0]:
        ctx.tally["screened"] += 1
        return None
    cand = _solve_headed(ctx, members, k - j, levels)
    cost = _add(best[j], cand, _in_place(ctx, members))
    tail = ", ".join(run[k:i])
    group = GroupSearch(consumer=run[k - 1], ops=tuple(run[j:k]), chosen=0, candidates=(
        replace(cand, reason=f"{cand.reason + '; ' if cand.reason else ''}judged with {tail} untiled after it"),))
    untiled = tuple(_untiled_record(op, Candidate(levels=(), verdict="fits", time_ns=ctx.untiled.get(op, (0.0, 0))[0],
                                                  hbm_bytes=ctx.untiled.get(op, (0.0, 0))[1], reason=IN_CONTEXT))
                    for op in run[k:i])
    return cost, (group, *untiled), Alternative(ops=members, bound_ns=reach, choice=group.choice, change_ns=cost[0])


def _in_context(record: GroupSearch, untiled: tuple[float, int]) -> GroupSearch:
    """``record`` choosing the candidate that changes the run's time most against its ops
    untiled in the hinted program (``untiled``). The candidate fastest alone may be the
    untiled one, but untiled the segment is no group and changes nothing, while a tiling a
    little slower alone may still beat what its ops cost in the whole program: the softmax
    x[1021, 1000] on 12 cores and 2 MiB LX ran [sub, exp, sum, div] untiled at 43.2 us alone
    and tiled R:2 at 43.2 us too (more iterations: ranked second), where those ops cost 77.4
    us in the hinted program (sub's result spills there). Ties keep the record's choice."""
    zero: _Cost = (0.0, 0, 0)
    best, at = _add(zero, record.choice, untiled), record.chosen
    for k, cand in enumerate(record.candidates):
        if cand.levels and (cost := _add(zero, cand, untiled)) < best:
            best, at = cost, k
    return record if at == record.chosen else replace(record, chosen=at)


# The search does not judge a segment to gain less than this share of what its ops cost in
# place (the cost model's own fit is 7-40 %): a producer that costs a few ns in place (the
# RMSNorm's scale multiply before a projection: 69 ns beside the projection's 0.94 ms) makes the
# segment with it promise that much more than the one without, which then had to be compiled.
_GAIN_TOLERANCE = 1e-4


def _costs_nothing(ctx: _Search, op: str) -> bool:
    return ctx.untiled.get(op) == (0.0, 0)


def _free_start(ctx: _Search, run: Sequence[str], j: int, i: int) -> int:
    """The start of ``run[j:i]`` grown back over the contiguous ops before it that cost nothing
    in the hinted program and write something the grown segment reads: the segment that holds
    the free producers its boundary would otherwise cut (``_charged``: a layernorm's mean(h)
    and h - mean, 9 ops from the mean, past the window)."""
    reads = {ld.buffer for m in run[j:i] for ld in ctx.ops[m].loads}
    f = j
    while f > 0 and i - f < 2 * ctx.options.window and _costs_nothing(ctx, run[f - 1]) \
            and ctx.ops[run[f - 1]].store.buffer in reads:
        f -= 1
        reads |= {ld.buffer for ld in ctx.ops[run[f]].loads}
    return f


def _add(prefix: _Cost, cand: Candidate, untiled: tuple[float, int]) -> _Cost:
    if not cand.levels:
        return prefix
    if cand.verdict == "refused" or prefix[0] == math.inf:
        return _REFUSED
    return (round(prefix[0] + cand.time_ns - untiled[0], 6), prefix[1] + cand.hbm_bytes - untiled[1],
            prefix[2] + cand.iterations)


def _fusable_starts(ctx: _Search, run: Sequence[str], i: int, window: int, closed: bool = False) -> list[int]:
    """The starts j of the segments ``run[j:i+1]`` of at most ``window`` ops ending at the
    consumer ``run[i]`` in which every other op writes something a later op of the segment
    reads (a producer) or writes a result no op reads (a graph output: a *sibling* branch),
    and whose ops are connected through the intermediates the segment writes, nearest first.
    Without siblings these are the producer chains ``_fusable`` grows.

    Siblings: outputs y_k = g_k(e) of one intermediate e, in program order [e, y1, y2, y3]
    (or branches [e, y1, z1, y2, z2] with z_k = h_k(y_k)). One loop reads e's tile from LX
    for all of them and writes e nowhere; no y is a producer of the next, so a producer chain
    never holds two of them. A branch whose result an op after the segment reads (the v
    projection before the q-k product of an attention, the gate's silu before the up
    projection of a SwiGLU) ends the walk back from the consumer: its reader's group is where
    it can stay in LX, and every longer segment holds it. Ops that share only a buffer
    written outside the segment are not connected by it (such a group saves none of that
    buffer's HBM traffic). A union-find over the segment's ops, joining an op to the readers
    of what it writes (and to the other pieces of a concatenation it writes a piece of),
    tells a segment whose branches are not yet connected to the rest (their intermediate's
    writer is further back). At most ``window`` ops: linear in the run
    for a bounded window.

    ``closed``: only the start of the segment that holds every op the walk back from the
    consumer passes, when the walk stops within ``window`` ops (at an op the segment does not
    read and others do, or at the run's start) with those ops connected; none otherwise."""
    starts = [i]
    parent = list(range(window))  # union-find over the segment's ops, by distance from i

    def root(k: int) -> int:
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    # buffer -> the segment's ops that read it or write it: a buffer of several regions (a
    # concatenation's) has a writer per piece, each a producer of its readers, and the pieces
    # in one segment are one result, whole after the last of them (the walk had stopped at
    # the second piece from the end, its buffer taken by the last piece: no segment held
    # both pieces of concat([exp(a), -b]) * w)
    waiting: dict[str, list[int]] = {}
    parts = 0  # unconnected parts of run[j:i+1]
    for j in range(i, max(i - window, -1), -1):
        op, k = ctx.ops[run[j]], i - j
        feeds = op.store.buffer in waiting
        if j < i and not feeds and ctx.readers.get(op.store.buffer):
            if closed:
                return [j + 1] if parts == 1 else []
            break
        parts += 1
        for r in {root(m) for m in waiting.get(op.store.buffer, ())}:
            parent[r] = k
            parts -= 1
        for b in {ld.buffer for ld in op.loads} | {op.store.buffer}:
            waiting.setdefault(b, []).append(k)
        if j < i and parts == 1:
            starts.append(j)
    if closed:  # the walk reached the run's start, or the window cut it
        return [0] if i < window and parts == 1 else []
    return starts


def _shared_starts(ctx: _Search, run: Sequence[str], start: int, end: int) -> list[int]:
    """The starts of the longest suffixes of ``run[start:end]`` whose ops all iterate a set of
    output dims of its last op, one for each set those suffixes share, longest suffix last:
    the segments a level can tile, and each without the leading ops that do not iterate a dim
    the ops after them share (at most one start per output dim of the last op)."""
    dims = {(d.name, d.size) for d in ctx.ops[run[end - 1]].ranges if d.size > 1}
    out = []
    j = end - 1
    while j > start:
        have = {(d.name, d.size) for d in ctx.ops[run[j - 1]].ranges}
        if not dims & have:
            break
        if not dims <= have:
            out.append(j)
        dims &= have
        j -= 1
    out.append(j)
    return out


def _chain_starts(ctx: _Search, run: Sequence[str]) -> dict[int, int]:
    """end -> start of the seed's max-producers groups: from the last op back, each consumer
    with every contiguous producer before it (linear in the run)."""
    out: dict[int, int] = {}
    end = len(run)
    while end > 0:
        start = end - len(_fusable(ctx, run, end - 1))
        out[end] = start
        end = start
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Floor:
    """What no tiling of a segment as one group is estimated below, from shapes alone: a time
    (ns) and HBM bytes (``_floor``)."""

    time_ns: float
    hbm_bytes: int

    def reached(self, cand: Candidate) -> bool:
        """Whether ``cand`` is estimated at the floor's time: no candidate is estimated faster
        (one could tie it with fewer HBM bytes, which the walks no longer look for)."""
        return cand.verdict != "refused" and cand.time_ns <= self.time_ns * (1 + 1e-9)


def _bound(ctx: _Search, members: Sequence[str]) -> float:
    return _floor(ctx, members).time_ns


def _floor(ctx: _Search, members: Sequence[str]) -> Floor:
    """A lower bound on the estimated time and HBM bytes of any tiling of ``members`` as one
    group, from their shapes alone: every input they read whole is read from HBM at least
    once and every output written once (at their device size) -- those are its bytes --,
    at the fitted bandwidth with the read/write turnaround of at least min(reads, writes); and
    a matmul's MACs at the peak rate of every core. The traffic report charges each kernel
    max(memory, compute) and sums them, so its time is at least max(total memory, total
    compute); the fitted derates the report may add only add time."""
    return _floor_of(ctx, members, *_compulsory(ctx, members))


def _compulsory(ctx: _Search, members: Sequence[str]) -> tuple[int, int]:
    """(bytes read, bytes written) that any tiling of ``members`` as one group moves from and
    to HBM (``_floor``)."""
    inside = set(members)
    written: set[str] = set()
    read: dict[str, int] = {}
    wrote: dict[str, int] = {}
    for name in members:
        op = ctx.ops[name]
        for ld in op.loads:
            if ld.buffer not in written and ld.buffer not in read and _reads_whole(ctx, op, ld):
                read[ld.buffer] = _device_bytes(ctx, ld.buffer)
        buf = op.store.buffer
        written.add(buf)
        if buf in ctx.outputs or any(r not in inside for r in ctx.readers.get(buf, ())):
            # a piece of a concatenation writes its region, not the whole buffer: counted whole,
            # the floor of [copy] was above its own untiled estimate (25.3 against 19.1 us)
            wrote[buf] = min(_device_bytes(ctx, buf), wrote.get(buf, 0) + _store_bytes(ctx, op))
    return sum(read.values()), sum(wrote.values())


def _floor_of(ctx: _Search, members: Sequence[str], reads: int, writes: int) -> Floor:
    """The floor of ``members`` moving at least ``reads`` and ``writes`` bytes of HBM."""
    memory = (reads + writes) / HBM_BYTES_PER_NS + HBM_TURNAROUND_NS_PER_BYTE * min(reads, writes)
    return Floor(time_ns=max(memory, _compute_floor(ctx, members)), hbm_bytes=reads + writes)


def _store_bytes(ctx: _Search, op: Op) -> int:
    """The least HBM bytes ``op``'s store writes: its buffer's device bytes, or where it
    writes a region of the buffer short of the whole axis (``store_region``: a piece of a
    concatenation), the region's elements unpadded."""
    btype = ctx.buffers[op.store.buffer].type
    sizes, whole = [r.size for r in op.ranges], [d.size for d in btype.dims]
    if (len(sizes) == len(whole) and all(isinstance(n, int) for n in sizes + whole)
            and any(n < m for n, m in zip(sizes, whole)) and store_region(op, btype.dims) is not None):
        return math.prod(sizes) * FORMATS[ctx.machine.device_format(btype.dtype)].nbytes
    return _device_bytes(ctx, op.store.buffer)


def _compute_floor(ctx: _Search, members: Sequence[str]) -> float:
    """A lower bound on the compute time of ``members``: their matmuls' MACs at the peak rate
    of every core."""
    macs = sum(math.prod(int(d.size) for d in iteration_dims(op)) for op in (ctx.ops[m] for m in members)
               if isinstance(op, Reduction) and op.fn == "matmul")
    return macs / (MACS_PER_NS_PER_CORE * ctx.machine.cores)


def segment_bound(graph: Graph, machine: Machine, ops: Sequence[str]) -> float:
    """The lower bound (ns) the search screens the segment ``ops`` of ``graph`` with
    (``_bound``): no tiling of them as one group is estimated faster."""
    return segment_floor(graph, machine, ops).time_ns


def segment_floor(graph: Graph, machine: Machine, ops: Sequence[str]) -> Floor:
    """The floor (``_floor``) of the segment ``ops`` of ``graph``: no tiling of them as one
    group is estimated faster or moves fewer HBM bytes."""
    ctx = _Search(graph=graph, machine=machine, options=SearchOptions(), ops=graph.op_table(),
                  buffers=graph.buffer_table(), readers=_readers(graph),
                  outputs=frozenset(o.buffer for o in graph.outputs))
    return _floor(ctx, ops)


def _reads_whole(ctx: _Search, op: Op, load: Load) -> bool:
    key = (op.name, load.buffer, load.index)
    hit = ctx.wholes.get(key)
    if hit is None:
        hit = ctx.wholes[key] = _whole_load(op, load, ctx.buffers[load.buffer])
    return hit


def _whole_load(op: Op, load: Load, buffer: Buffer) -> bool:
    """Whether ``load`` reads every element of ``buffer``: its index is the buffer's row-major
    offset with one iteration dim of the buffer dim's size per dim (a view that slices, steps
    or repeats a dim is not counted)."""
    sizes = {d.name: int(d.size) for d in iteration_dims(op)}
    strides = row_major_strides(tuple(int(d.size) for d in buffer.type.dims))
    want = {st: int(d.size) for d, st in zip(buffer.type.dims, strides) if int(d.size) > 1}
    if len(want) != sum(1 for d in buffer.type.dims if int(d.size) > 1):
        return False
    got: dict[int, int] = {}
    for term, coeff in load.index.as_coefficients_dict().items():
        if not isinstance(term, sympy.Symbol):
            if term != 1 or coeff != 0:
                return False
            continue
        if not coeff.is_Integer or int(coeff) in got or term.name not in sizes:
            return False
        got[int(coeff)] = sizes[term.name]
    return got == want


# -- one segment, solved once per structure ---------------------------------------------------------
def _solve(ctx: _Search, members: Sequence[str], hoist: bool = False) -> GroupSearch:
    """The best tiling of ``members`` as one group (``_fit``; ``hoist``: levels on dims some
    ops do not iterate are weighed too, ``_tileable_dims``), memoised by the structure of
    their subgraph: names canonicalised, so a repeated block or head is solved once."""
    sub = _subgraph(ctx, members)
    canon, names = _canonical(sub)
    key = ("hoist", _structure(canon)) if hoist else _structure(canon)
    hit = ctx.memo.get(key)
    if hit is None:
        local = _local(ctx, canon)
        hit = ctx.memo[key] = _fit(local, [op.name for op in canon.ops], hoist)
    else:
        ctx.tally["reused"] += 1
    return _renamed(hit, names)


def _local(ctx: _Search, canon: Graph) -> _Search:
    """The search of a segment's canonical subgraph, sharing ``ctx``'s memo, tally and
    verification."""
    return _Search(graph=canon, machine=ctx.machine, options=ctx.options, ops=canon.op_table(),
                   buffers=canon.buffer_table(), readers=_readers(canon),
                   outputs=frozenset(o.buffer for o in canon.outputs), memo=ctx.memo, tally=ctx.tally,
                   verify=ctx.verify)


def _solve_headed(ctx: _Search, members: Sequence[str], tiled: int, levels: tuple[Level, ...]) -> Candidate:
    """``members`` judged with their first ``tiled`` ops one group at ``levels`` and the rest
    untiled after it, memoised by structure like ``_solve``."""
    sub = _subgraph(ctx, members)
    canon, names = _canonical(sub)
    to_canon = {real: c for c, real in names.items()}
    at = tuple(replace(lv, dims=tuple(to_canon[d] for d in lv.dims)) for lv in levels)
    key = ("headed", tiled, at, _structure(canon))
    hit = ctx.memo.get(key)
    if hit is None:
        local = _local(ctx, canon)
        ops = [op.name for op in canon.ops]
        cand = _judge(local, ops, at, canon, tiled=tiled)
        hit = ctx.memo[key] = GroupSearch(consumer=ops[tiled - 1], ops=tuple(ops[:tiled]), candidates=(cand,),
                                          chosen=0)
    else:
        ctx.tally["reused"] += 1
    return _renamed(hit, names).choice


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
        record = _solve(ctx, members)
        # the best candidate may spill where a slower one fits: a producer is left out only
        # when no tiling of the group fits
        if any(c.verdict == "fits" for c in record.candidates) or len(members) == 1:
            return record
        members = members[1:]  # nothing fits with every producer: leave the farthest out


def _grow_producers(ctx: _Search, members: list[str]) -> GroupSearch:
    """max-size: the consumer's best tiling, then producers (nearest first) while it still fits."""
    best = _solve(ctx, members[-1:])
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
def _fit(ctx: _Search, members: Sequence[str], hoist: bool = False) -> GroupSearch:
    judge = _Judge(ctx, _floor(ctx, members))
    try:
        _walk(ctx, judge, members, hoist)
    except _Unbeatable:
        pass  # a candidate at the floor's time: nothing judged after it is estimated faster
    best = min(range(len(judge.tried)), key=lambda i: judge.tried[i].rank)
    return GroupSearch(consumer=members[-1], ops=tuple(members),
                       candidates=tuple(c.candidate for c in judge.tried), chosen=best)


def _walk(ctx: _Search, judge: _Judge, members: Sequence[str], hoist: bool = False) -> None:
    """Shrink, grow back, refine, then each other dim alone, the online and the accumulation
    tries: the candidates ``judge`` records (``_fit`` picks the best of them)."""
    ops = [ctx.ops[m] for m in members]
    dims = _tileable_dims(ops, hoist)
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
        floor = judge.compute_floor(members)
        walk: _Walk | None = _Walk(min(t.rank for t in judge.tried), floor=floor)
        rereads = 0
        for c in (c for c in counts[first] if c > chosen.get(first, 1)):
            cand = judge(members, levels({**chosen, first: c}))
            went = _walked(walk, _rank(cand), floor)
            # Where the group fits untiled, a count that re-reads an operand (more HBM bytes
            # than the group's floor) small enough for the machine's LX may lose where a finer
            # one, leaving LX room for the operand's copy, wins: past _REREADS such counts the
            # walk goes on. The gelu MLP fp16 S=333 D=512 F=2048 on 32 cores: untiled 43.2 us,
            # S:2 70.4 (both weights, 4 MiB, re-read per tile), S:3 34.7 (both copied into LX
            # once). (The S=2048, D=4096 block's projections re-read 90 MB: not walked past.)
            lx = ctx.machine.cores * ctx.machine.lx_bytes
            if (went is None and not chosen and rereads < _REREADS and cand.verdict != "refused"
                    and judge.floor is not None and 0 < (cand.hbm_bytes - judge.floor.hbm_bytes) / (c - 1) <= lx):
                rereads += 1
                continue
            walk = went
            if walk is None:
                break
    # Each other dim alone: shrinking stops at the first dim with a count that fits, so the
    # whole-stick columns of a pointwise x[R, C] (every row in each tile, a stick-wide tile
    # for all cores) were never weighed against its row tiles (7-52 % faster at 4,093 x 256
    # on 32 cores). From the coarsest count until one fits, then finer while it improves;
    # after 3 counts that spill, the coarsest of the rest that fits, by binary search, as the
    # first dim walks every count to its first fit: y = silu(x @ w1 + b1) on 3 cores and
    # 64 KiB spills at F:2 to F:5 and wins at F:8 (46.4 us against 84.1 untiled). Spilling
    # estimates need not fall on the way (each finer F tile reads x again: 83.1, 85.4,
    # 87.8 us), so they do not gate the leap as they do the online dims'. (A sigmoid read by
    # three outputs through a neg each, [1023, 1500] on 64 KiB: N:2, 3, 4 spill and N:12
    # fits, 200.8 us against the rows' S:16 at 216.7.)
    # A dim the shrink tiled only under the finest counts of dims before it that never fit
    # is walked alone too, count by count until one fits (up to 6 misses): a dim that never
    # fits does not pin the others, and fitting is not monotone (no binary search). Walking
    # every count cost the captured LayerNorm-MLP 215 candidates, 6 misses 193, for the
    # same plan (88 on main). GQA attention fp16 S=197 on 16 cores and 128 KiB: no count of its kv-head or
    # query-head dim fits, S fits under both at their finest (S:7, 21.0 us); alone S:2 to S:8
    # spill (the key reduction split across cores), S:13 fits at 9.59 us against 12.22
    # untiled, S:16 spills again.
    for d, _ in dims:
        if d != first and counts[d]:
            if d in chosen:
                _coarse_to_fine(judge, members, counts[d], partial(_alone_on, levels, d), limit=2 * _MISSES)
            else:
                _coarse_to_fine(judge, members, counts[d], partial(_alone_on, levels, d), leap="spilled")
    _try_online(ctx, judge, members, ops, chosen, levels)
    _try_accumulation(ctx, judge, members, ops)


def _alone_on(levels: Callable[[Mapping[str, int]], tuple[Level, ...]], dim: str, count: int) -> tuple[Level, ...]:
    return levels({dim: count})


def _try_online(ctx: _Search, judge: _Judge, members: Sequence[str], ops: Sequence[Op], chosen: Mapping[str, int],
                levels: Callable[[Mapping[str, int]], tuple[Level, ...]]) -> None:
    """Judge tiling the reduction dim of a softmax in the group (an online softmax: its max,
    sum and value product carried across the tiles), innermost, alone and under the output
    tiling found: it reads k and v of an attention once where query tiles re-read them.
    Counts from the coarsest up until one fits (leaping by binary search after 3 that do not,
    whatever their estimates: a leap once taken only while finer tiles spilled less never
    reached the fit at N:25 of the softmax over 50,257 columns, whose spilling estimates rise),
    then finer while the estimate improves. Alone, the value product's accumulator and partial
    hold its whole output, as a K-accumulation's do: where they must leave LX and one round
    trip of them keeps every count from beating the best found (``_accumulation_floor``),
    no count is judged (the S=2048, D=4096 block's attention: 3 candidates of 3.4-6.0 ms
    against its best 0.61 ms)."""
    for dim, size in _online_dims(ctx, ops):
        counts = _counts(ctx, ops, dim, size)
        leaving = [op for op in ops if isinstance(op, Reduction) and op.fn in ("sum", "matmul")
                   and any(d.name == dim for d in op.reduction_ranges) and _accumulator_leaves_lx(ctx.machine, op)]
        for base in ({}, dict(chosen)) if chosen else ({},):
            outer = levels(base)
            if not outer and leaving and _accumulation_floor(ctx, members, leaving).time_ns >= _best_time(judge):
                continue
            _coarse_to_fine(judge, members, counts, partial(_innermost, outer, dim), leap="spilled")


def _best_time(judge: _Judge) -> float:
    """The least estimated time of the candidates ``judge`` judged (refusals aside)."""
    return min((t.candidate.time_ns for t in judge.tried if t.candidate.verdict != "refused"), default=math.inf)


def _innermost(outer: tuple[Level, ...], dim: str, count: int) -> tuple[Level, ...]:
    return outer + (Level(count=count, dims=(dim,), source="auto"),)


_MISSES = 3
# The counts of the outermost dim's refinement that lose and re-read an operand past which it
# goes on (``_walk``).
_REREADS = 1
# The misses after which an accumulation's walk leaps to the coarsest count that fits
# (``_try_accumulation``): 2, where a dim's takes 3 (it gave up there before the leap: a third
# gave the S=2048, D=4096 block the same plan and estimate for more compiles).
_ACCUMULATION_MISSES = 2


# A walk to finer counts goes on past counts that tie its best (the same estimated time and
# HBM bytes, more iterations), past at most this many in a row: a tie is no sign that finer tiles
# cannot pay. y = x * sigmoid(x), fp32 x[10007, 64] on 13 cores and 64 KiB ties at R:4 and R:5
# (65.94 us, x read by both ops from HBM) and wins at R:8 (51.09 us: x's LX copy fits). Only
# where the tie's HBM bytes take longer than the group's least compute (``_compute_floor``):
# finer tiles save bytes (an operand's copy fits), not MACs, and the matmul groups of the
# S=2048, D=4096 transformer block tie at their compute (9 compiles, none of them a gain).
_TIES = 2


@dataclass(frozen=True, slots=True)
class _Walk:
    """A walk to finer counts: the best rank judged so far, the ties to it in a row since,
    and the group's least compute time (ns)."""

    best: tuple[int, float, int, int]
    ties: int = 0
    floor: float = 0.0


def _walked(walk: _Walk | None, rank: tuple[int, float, int, int], floor: float) -> _Walk | None:
    """The walk after judging a count of rank ``rank``; None: stop (the count is worse than
    the best, a tie at the group's compute, or the last of ``_TIES`` ties in a row)."""
    if walk is None or rank < walk.best:
        return _Walk(rank, floor=floor)
    if rank[:3] == walk.best[:3] and walk.ties < _TIES and rank[2] / HBM_BYTES_PER_NS > floor:
        return replace(walk, ties=walk.ties + 1)
    return None


# Whether a count walk (``_coarse_to_fine``) that met ``limit`` counts that do not fit leaps
# to the coarsest of the rest that fits: never, or whenever something spilled.
Leap = Literal["never", "spilled"]


def _coarse_to_fine(judge: _Judge, members: Sequence[str], counts: Sequence[int],
                    levels: Callable[[int], tuple[Level, ...]], limit: int = _MISSES, leap: Leap = "never",
                    spare: frozenset[str] = frozenset()) -> None:
    """Judge the counts from the coarsest up until one fits, then finer while the estimate
    improves. After ``limit`` counts that do not fit, give up (the counts of a large dim
    that never fits would each be compiled), or, as ``leap`` says, find the coarsest of the
    rest that fits by binary search (finer tiles need less LX) and go on from there: the
    online softmax over 50,257 columns with fp32 casts on 32 cores fits from 25 tiles, after
    2, 4 and 7 spilled at rising estimates (1,149, 1,339 and 1,462 us: the cast result sliced
    differently by its readers) and 8, 13 and 16 too; the hidden dim of a silu MLP's first
    matmul, bias and silu on 3 cores and 64 KiB fits from 8 tiles, its 5th count, after 2, 3,
    4 and 5 spilled. A count "fits" here when every intermediate but those of ``spare`` gets
    LX (``_Judge.fits``): an accumulation's accumulator and partials keep their size at every
    count, so whether they spill says nothing of the counts to come."""
    walk: _Walk | None = None
    misses = 0
    refusals: set[str] = set()
    k = 0
    while k < len(counts):
        cand = judge(members, levels(counts[k]))
        if not judge.fits(members, levels(counts[k]), spare):
            # refused (tiles too small for whole sticks, ...) or spilling: a finer count may
            # fit, and spilling estimates need not fall as the tiles shrink -- but a refusal
            # given word for word at two counts does not depend on the count
            if cand.verdict == "refused":
                if cand.reason in refusals:
                    break
                refusals.add(cand.reason)
            misses += 1
            if misses < limit:
                k += 1
                continue
            if leap == "never" or walk is not None or len(refusals) == misses:
                break
            rest = counts[k + 1:]
            found = _first(rest, lambda c: judge.fits(members, levels(c), spare))
            if found is None:
                break
            k, leap = k + 1 + found, "never"
            continue
        walk = _walked(walk, _rank(cand), judge.compute_floor(members))
        if walk is None:
            break
        k += 1


def _try_accumulation(ctx: _Search, judge: _Judge, members: Sequence[str], ops: Sequence[Op]) -> None:
    """Judge tiling the reduction dim of a sum or matmul in the group (a K-accumulation: the
    partial results summed into an accumulator across the tiles) when the ops before it
    produce that dim as an output dim: the mlp's second matmul over the hidden dim, whose
    producers (the first matmul, its bias, gelu) then walk the hidden dim with it. Each weight
    is read once, where a token tiling re-reads both per tile; the copy of the tokens and the
    finish (the cast, the bias add writing y) run in the loop's first and last iterations
    (``fspyre.stages.guards.guard_boundaries``). Loop fission puts the readers of the sum
    after the loop. Counts from the coarsest up until one fits, then finer while the estimate
    improves.
    An accumulator (the result of a reduction over the dim, its partials or its peeled part)
    keeps its size at every count, so one in HBM at the coarsest count is taken to stay
    there: the walk is given up when one round trip of it (``_accumulation_floor``) keeps
    every count from beating the best found -- as it is, before the coarsest count is judged,
    when the shapes alone say the accumulator or its partial is in HBM at every count
    (``_accumulator_leaves_lx``). An accumulator in HBM whose round trip is cheap does not end
    the walk, nor make a count a miss (``_coarse_to_fine``'s ``spare``): the Frobenius norm
    sum(x * x) of fp16 x[4096, 64] on 4 cores and 32 KiB keeps its partial sums in HBM at
    every count, and R:8 (x * x in LX) takes 3.54 us against 16.99 untiled.
    Any other miss may depend on the count: after ``_ACCUMULATION_MISSES`` the walk leaps to
    the coarsest count whose other intermediates get LX, by binary search (``leap``), as the
    output dims' walks do. x + fc2(gelu(fc1(LayerNorm(x)))) fp32 [3, 37, 96], F=300 on 5
    cores and 64 KiB spills at F:2 (two ops slice the hidden activation differently) and fits
    from F:3; |x| read by a sum and an amax over its 5,003 rows (fp16, 257 columns, 9 cores and
    64 KiB) keeps |x| in HBM at R:2 to R:5 (104 us, as untiled) and in LX from R:8 (22.11 us):
    the walk gave up after R:3 (docs/tiling.md, "Why auto missed a plan")."""
    for dim, size in _accumulation_dims(ops):
        counts = _counts(ctx, ops, dim, size)
        if not counts:
            continue
        reductions = [op for op in ops if isinstance(op, Reduction) and any(d.name == dim for d in op.reduction_ranges)]
        # Sums and matmuls whose accumulator or partial is in HBM at every count, which then
        # makes a round trip every tile: where that traffic keeps every count from beating the
        # best found, none is judged; else the walk stops at the coarsest count
        leaving = [op for op in reductions if op.fn in ("sum", "matmul") and _accumulator_leaves_lx(ctx.machine, op)]
        if leaving and _accumulation_floor(ctx, members, leaving).time_ns >= _best_time(judge):
            continue
        at = partial(_innermost, (), dim)
        spilled = judge.judged(members, at(counts[0]))[1]
        # the reductions whose accumulator the coarsest count left in HBM: one round trip of
        # them against the best found (the coarsest count's own candidate too)
        held = [op for op in reductions if any(_of(name, frozenset({op.store.buffer})) for name in spilled)]
        if leaving or held and _accumulation_floor(ctx, members, held, spilled).time_ns >= _best_time(judge):
            continue
        _coarse_to_fine(judge, members, counts, at, _ACCUMULATION_MISSES, leap="spilled",
                        spare=frozenset(op.store.buffer for op in reductions))


# Bytes of an element of a tiled reduction's accumulator and of its partial: float32 or int32
# (``fspyre.stages.loop_tree``, "Tiled reductions").
_ACCUMULATOR_BYTES = 4


def _accumulator_leaves_lx(machine: Machine, op: Reduction) -> bool:
    """Whether ``op`` tiled over a reduction dim as the group's one level (as
    ``_try_accumulation`` judges it) keeps its accumulator or its partial in HBM at every
    count, from shapes alone. Both hold the reduction's whole output at 4 bytes an element
    whatever the count, and both are live at once (the accumulator from its fill before the
    loop to its finish after it, the partial from the partial op to the combine): in LX they
    take at least their elements' bytes over the cores together, so when that exceeds every
    core's LX one of them is in HBM (property-tested against compiled accumulations,
    tests/tiling/test_count_walks.py)."""
    return 2 * _ACCUMULATOR_BYTES * _elements(op) > machine.lx_bytes * machine.cores


def _elements(op: Op) -> int:
    return math.prod(int(d.size) for d in op.ranges)


def _accumulation_floor(ctx: _Search, members: Sequence[str], leaving: Sequence[Reduction],
                        spilled: Sequence[str] | None = None) -> Floor:
    """A lower bound on the estimated time and HBM bytes of ``members`` as one group tiled
    over a reduction dim of ``leaving`` (reductions whose accumulator or partial is in HBM:
    ``_accumulator_leaves_lx``), at any count: the segment's compulsory bytes (``_floor``)
    and, for each of them, one round trip of its output at 4 bytes an element -- a partial in
    HBM is written and read back by the combine in every tile, an accumulator in HBM is read
    and written by it. (One tile at least: ``tile`` may round a count's tiles up to whole
    sticks until the level makes no loop.) Given the intermediates a candidate ``spilled``
    (``_try_accumulation``), a reduction none of whose partial or accumulator is among them
    left its output or a part of it in HBM: written by the finish and read by its reader in
    the group, one round trip at its device bytes where those are fewer."""
    trips = sum(_trip(ctx, op, spilled) for op in leaving)
    reads, writes = _compulsory(ctx, members)
    return _floor_of(ctx, members, reads + trips, writes + trips)


def _trip(ctx: _Search, op: Reduction, spilled: Sequence[str] | None) -> int:
    """The bytes each way of one round trip of ``op``'s result through HBM (``_accumulation_floor``)."""
    accumulated = _ACCUMULATOR_BYTES * _elements(op)
    kinds = (f"{op.store.buffer}_part", f"{op.store.buffer}_acc")
    if spilled is None or any(name.startswith(kinds) for name in spilled):
        return accumulated
    return min(accumulated, _device_bytes(ctx, op.store.buffer))


def accumulation_floor(graph: Graph, machine: Machine, ops: Sequence[str], dim: str) -> Floor | None:
    """The floor (``_accumulation_floor``) of the segment ``ops`` of ``graph`` as one group
    tiled over the reduction dim ``dim`` alone, at any count; None when no sum or matmul over
    ``dim`` keeps its accumulator or partial in HBM (the segment's floor, ``segment_floor``,
    holds)."""
    ctx = _Search(graph=graph, machine=machine, options=SearchOptions(), ops=graph.op_table(),
                  buffers=graph.buffer_table(), readers=_readers(graph),
                  outputs=frozenset(o.buffer for o in graph.outputs))
    leaving = [op for op in (ctx.ops[name] for name in ops) if isinstance(op, Reduction)
               and op.fn in ("sum", "matmul") and any(d.name == dim for d in op.reduction_ranges)
               and _accumulator_leaves_lx(machine, op)]
    if not leaving:
        return None
    return _accumulation_floor(ctx, ops, leaving)


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


def _tileable_dims(ops: Sequence[Op], hoist: bool = False) -> list[tuple[str, int]]:
    """The consumer's output dims (outermost first) that every op of the group iterates as an
    output dim: a level on any other dim would re-run an op every iteration or split a
    reduction whose result the group reads. With ``hoist``, also those under which the ops
    that do not iterate them are loop-invariant (``_invariant_under``)."""
    return [(d.name, d.size) for d in ops[-1].ranges
            if d.size > 1 and (_invariant_under(ops, d.name, d.size) if hoist else
                               all(any(r.name == d.name and r.size == d.size for r in op.ranges) for op in ops))]


def _invariant_under(ops: Sequence[Op], dim: str, size: int) -> bool:
    """Whether every op of the group that does not iterate ``dim`` (of ``size``) as an output
    dim is loop-invariant under a level on it: it does not iterate the dim at all (no
    reduction over it), is the group's only writer of its result and reads nothing an op
    iterating the dim writes. Hoisting (``fspyre.stages.hoisting``) then runs it once before
    the loop, its result kept for every iteration, as a hint over such a group has it: a
    causal mask's gt(mask[S, T]) in the attention of H heads."""
    varying: set[str] = set()  # buffers written per iteration of the level
    writers: dict[str, int] = {}
    for op in ops:
        writers[op.store.buffer] = writers.get(op.store.buffer, 0) + 1
    for op in ops:
        if any(r.name == dim and r.size == size for r in op.ranges):
            varying.add(op.store.buffer)
        elif (any(r.name == dim for r in iteration_dims(op)) or writers[op.store.buffer] > 1
              or any(ld.buffer in varying for ld in op.loads)):
            return False
    return True


def _counts(ctx: _Search, ops: Sequence[Op], dim: str, size: int) -> list[int]:
    """Counts > 1 of ``dim`` whose tiles are whole sticks wherever ``dim`` is a buffer's stick
    dim (the unit-stride dim of a load or store): the counts dividing ``size`` into whole
    sticks, and the tailed counts (``tile`` peels the remainder, docs/tiling.md "Tails") of
    tiles of ``stick * 2**k`` elements and of ``2**k`` tiles of ``size / 2**k`` rounded up to
    whole sticks. The tailed ones are offered beside the divisors, not only when no divisor
    exists: 2,047 rows (23 x 89) divide only into tiles of 89 or 23 rows, and 8 tiles of 256
    (a tail of 255) feed 16 cores better than either (docs/tiling.md, "Counts")."""
    var = sympy.Symbol(dim, integer=True, nonnegative=True)
    stick = 1
    for op in ops:
        accesses: tuple[Load | Store, ...] = (*op.loads, op.store)
        for access in accesses:
            btype = ctx.buffers[access.buffer].type
            if btype.dims and btype.dims[-1].size > 1 and access.index.coeff(var) == 1:
                stick = max(stick, elems_per_stick(btype.dtype))
    # tiles of whole sticks: the counts dividing size / stick (found by trial division up to
    # its square root, not by walking the dim's elements)
    exact = {c for c in _divisors(size // stick) if c > 1} if size % stick == 0 else set()
    # at most 2 log2(size) tailed counts: the tile sizes, not the dim's elements, are walked
    tiles = {stick << k for k in range(size.bit_length())}
    tiles |= {-(-size // (stick << k)) * stick for k in range(1, size.bit_length())}
    return sorted(exact | {-(-size // t) for t in tiles if t < size})


def _divisors(n: int) -> list[int]:
    small, large = [], []
    k = 1
    while k * k <= n:
        if n % k == 0:
            small.append(k)
            if k * k != n:
                large.append(n // k)
        k += 1
    return small + large[::-1]


# -- judging one candidate ------------------------------------------------------------------------
def _rank(cand: Candidate) -> tuple[int, float, int, int]:
    """Refused last, then estimated time (equal to a femtosecond is a tie: such times differ
    only by float summation order), HBM bytes, iterations."""
    return int(cand.verdict == "refused"), round(cand.time_ns, 6), cand.hbm_bytes, cand.iterations


@dataclass(frozen=True, slots=True)
class _Tried:
    candidate: Candidate
    rank: tuple[int, float, int, int]


class _Unbeatable(Exception):
    """Raised by a ``_Judge`` given a floor when a candidate reaches it: the walks stop."""


class _Judge:
    """Compiles candidates of one group and remembers each verdict (a search's scratch state,
    local to one ``_fit`` call). Given the group's ``floor`` (``_floor``), it raises
    ``_Unbeatable`` once a candidate is estimated at the floor's time: every candidate is
    estimated at least that (the property tests), so none judged after it is faster. At the
    floor's time with the floor's HBM bytes (the attention's untiled segment of the S=2048
    block) none ranks before it at all; a compute-bound one (a projection's F:6 at its MACs'
    time) could only tie it with fewer bytes, which the walks then go on to look for no more
    (the S=2048 block's F:8, same bytes; on the search benchmark's 26 graphs every plan kept
    its estimate and HBM bytes)."""

    def __init__(self, ctx: _Search, floor: Floor | None = None) -> None:
        self.ctx = ctx
        self.floor = floor
        self.tried: list[_Tried] = []
        self._memo: dict[tuple, tuple[Candidate, tuple[str, ...]]] = {}
        # one subgraph per membership: the stages verify a graph once, the same object again not
        self._subgraphs: dict[tuple[str, ...], Graph] = {}

    def compute_floor(self, members: Sequence[str]) -> float:
        """The least compute time of ``members`` (``_compute_floor``)."""
        return _compute_floor(self.ctx, members)

    def __call__(self, members: Sequence[str], levels: tuple[Level, ...]) -> Candidate:
        return self.judged(members, levels)[0]

    def judged(self, members: Sequence[str], levels: tuple[Level, ...]) -> tuple[Candidate, tuple[str, ...]]:
        """The candidate and the intermediates it left in HBM (``_judged``)."""
        key = (tuple(members), levels)
        if key not in self._memo:
            sub = self._subgraphs.get(key[0])
            if sub is None:
                sub = self._subgraphs[key[0]] = _subgraph(self.ctx, members)
            cand, spilled = self._memo[key] = _judged(self.ctx, members, levels, sub)
            self.tried.append(_Tried(candidate=cand, rank=_rank(cand)))
            if self.floor is not None and self.floor.reached(cand):
                raise _Unbeatable
        return self._memo[key]

    def fits(self, members: Sequence[str], levels: tuple[Level, ...], spare: frozenset[str] = frozenset()) -> bool:
        """Whether ``members`` at ``levels`` compiled with every intermediate in LX but those
        of ``spare`` (buffers, and the partials and peeled parts named after them: ``_of``)."""
        cand, spilled = self.judged(members, levels)
        return cand.verdict != "refused" and all(_of(name, spare) for name in spilled)


_IN_HBM = " in HBM"  # a spilling candidate's reason: the first intermediate left in HBM, then why


def _of(name: str, buffers: frozenset[str]) -> bool:
    """Whether the intermediate ``name`` is one of ``buffers`` or a part named after one (a
    tiled reduction's partial, its peeled part: ``<buffer>_...``)."""
    return name in buffers or any(name.startswith(f"{b}_") for b in buffers)


def _judge(ctx: _Search, members: Sequence[str], levels: tuple[Level, ...], sub: Graph | None = None,
           tiled: int | None = None) -> Candidate:
    """``members`` compiled as one group at ``levels`` (or only their first ``tiled``, the
    rest untiled after it)."""
    return _judged(ctx, members, levels, sub, tiled)[0]


def _judged(ctx: _Search, members: Sequence[str], levels: tuple[Level, ...], sub: Graph | None = None,
            tiled: int | None = None) -> tuple[Candidate, tuple[str, ...]]:
    """``_judge``'s candidate and the intermediates it left in HBM (the candidate's reason
    names the first)."""
    ctx.tally["compiled"] += 1
    sub = _subgraph(ctx, members) if sub is None else sub
    group = tuple(members[:tiled])
    plan = TilingPlan(order=tuple(members), groups=(Group(ops=group, levels=levels),) if levels else ())
    try:
        # a level over a reduction dim that ops of the group read the result of: loop fission
        plan = split_at_tiled_reductions(sub, plan, ctx.options.online)
        placed = place_copies(tile(sub, plan, ctx.options.online), ctx.machine, ResidencyOptions(
            enabled=ctx.options.residency, split=ctx.options.split, allocation=ctx.options.allocation,
            verify=ctx.verify))
        tree, alloc = placed.tree, placed.allocation
        if ctx.verify:
            verify_program(placed.program)  # a candidate compile would refuse is refused here
        report = placed.report or traffic_report(placed.program)
    except FspyreError as err:
        return Candidate(levels=levels, verdict="refused", reason=str(err).splitlines()[0]), ()
    kept = {o.buffer for o in sub.outputs} | set(sub.inputs)
    spilled = [b.name for b in tree.buffers if b.name not in kept and alloc.buffers[b.name].memory != "lx"]
    reason = ""
    if spilled:
        placement = alloc.buffers[spilled[0]]
        reason = f"{spilled[0]}{_IN_HBM}" + (f" ({placement.reason})" if placement.reason else "")
    return Candidate(levels=levels, verdict="spills" if spilled else "fits", reason=reason,
                     time_ns=report.time_ns, hbm_bytes=report.hbm_bytes), tuple(spilled)
