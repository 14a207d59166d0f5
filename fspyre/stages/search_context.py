"""What one ``search_tiling`` call shares between the search (``tiling_search``) and the
correction of its plan in the whole program (``plan_correction``): the search's options
(``SearchOptions``) and state (``_Search``, with its memo keyed by a segment's structure:
``_subgraph``, ``_canonical``, ``_structure``), the plan its groups make (``_plan``), what
ops cost untiled in the hinted program (``_in_place``), and the whole graph compiled under a
plan (``_compiled``).

The underscored names are the search's own: only those two modules use them."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, get_args

from fspyre.errors import FspyreError, TilingError
from fspyre.ir.frozen import FrozenMap, require_fields
from fspyre.ir.graph import (
    Buffer,
    Dim,
    Graph,
    HintScope,
    Load,
    Op,
    Output,
    Reduction,
    Scalar,
    TensorType,
    iteration_dims,
    sym,
)
from fspyre.ir.kinds import FUSE_MODES, FuseMode
from fspyre.ir.looptree import LoopTree
from fspyre.ir.plans import Candidate, Group, GroupSearch, TilingPlan
from fspyre.machine.formats import FORMATS
from fspyre.machine.layout import stick_layout
from fspyre.machine.report import TrafficReport, traffic_report
from fspyre.machine.rules import device_bytes
from fspyre.machine.spyre import HBM_BYTES_PER_NS, Machine
from fspyre.stages.allocation import AllocationOptions
from fspyre.stages.arguments import verified
from fspyre.stages.loop_tree import tile
from fspyre.stages.online_softmax import OnlineOptions
from fspyre.stages.program import verify_program
from fspyre.stages.residency import Residency, ResidencyOptions, place_copies
from fspyre.stages.split_plan import SplitOptions
from fspyre.stages.tiling_plan import split_at_tiled_reductions

# How the max-producers search chooses groups (``SearchOptions.strategy``).
Strategy = Literal["dp", "greedy"]
STRATEGIES: tuple[Strategy, ...] = get_args(Strategy)


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
    ``strategy`` (max-producers only): "dp" chooses the groups of each run together, by
    dynamic programming over its contiguous segments of at most ``window`` ops (and each
    consumer's whole producer chain) for the least estimated time of the run; "greedy" is the
    seed's pass, one consumer at a time in reverse order, a producer left out only when no
    tiling of the group fits.
    ``residency``, ``online``, ``split`` and ``allocation`` are the options the downstream
    stages will run with: each candidate is judged as it would be compiled."""

    fuse: FuseMode = "max-producers"  # which producers join a consumer's loop (above)
    strategy: Strategy = "dp"  # "dp": the time-first search over segments; "greedy": the seed's pass
    window: int = 8  # the DP's longest segment of contiguous ops
    patience: int = 2  # the DP stops weighing a consumer's segments after this many judged in a row gain nothing
    residency: bool = True  # judge each candidate with keep_resident's LX copies, as compile will run it
    online: OnlineOptions = OnlineOptions()  # the online-softmax rewrite the candidates are tiled with
    split: SplitOptions = SplitOptions()  # the work division each candidate is judged under
    allocation: AllocationOptions = AllocationOptions()  # the allocation each candidate is judged under

    def __post_init__(self) -> None:
        require_fields(self, TilingError)
        if self.fuse not in FUSE_MODES:
            raise TilingError(f"fuse={self.fuse!r}: use one of {', '.join(FUSE_MODES)}")
        if self.strategy not in STRATEGIES:
            raise TilingError(f"strategy={self.strategy!r}: use one of {', '.join(STRATEGIES)}")
        if not isinstance(self.window, int) or isinstance(self.window, bool) or self.window < 1:
            raise TilingError(f"window={self.window!r}: the most ops of a segment the search weighs must be an "
                              f"integer >= 1")
        if not isinstance(self.patience, int) or isinstance(self.patience, bool) or self.patience < 1:
            raise TilingError(f"patience={self.patience!r}: the segments judged in a row without a gain before the "
                              f"search stops weighing a consumer's segments must be an integer >= 1")


@dataclass(frozen=True, slots=True, kw_only=True)
class _Search:
    graph: Graph
    machine: Machine
    options: SearchOptions
    ops: Mapping[str, Op]
    buffers: Mapping[str, Buffer]
    readers: Mapping[str, tuple[str, ...]]
    outputs: frozenset[str]
    # the hinted plan's op order, and op -> its place in it
    order: tuple[str, ...] = ()
    position: Mapping[str, int] = field(default_factory=dict)
    # The judgements of one search_tiling call, by structural key (``_structure``): a segment
    # repeated elsewhere in the graph (the next transformer block) is solved once.
    memo: dict[tuple, GroupSearch] = field(default_factory=dict)
    # (op, buffer, index) -> whether the load reads the whole buffer (``_whole_load``): the
    # bounds of the segments ending at each op ask it of the same loads again and again
    wholes: dict[tuple, bool] = field(default_factory=dict)
    # op -> (time, HBM bytes) it costs untiled in the hinted program as a whole (``_alone``)
    untiled: Mapping[str, tuple[float, int]] = field(default_factory=dict)
    # (in_context, run) -> the DP's runner-up plans of the run: (cost above the plan chosen, records)
    runner_ups: dict[tuple, tuple[tuple[float, tuple[GroupSearch, ...]], ...]] = field(default_factory=dict)
    tally: Counter[str] = field(default_factory=Counter)  # compiled / screened / reused
    # verify each candidate's program, division and allocation: only when the program of the
    # plan found without it was refused
    verify: bool = False
    # credit each DP segment with its candidate of least change in the hinted program
    # (``_in_context``): the second pass, when the whole program disagrees with the first
    in_context: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class _Compiled:
    tree: LoopTree
    placed: Residency
    report: TrafficReport


def _compiled(options: SearchOptions, machine: Machine, graph: Graph, plan: TilingPlan) -> _Compiled | None:
    """The whole graph compiled under ``plan`` as the pipeline compiles it (None: refused)."""
    try:
        tree = tile(graph, plan, options.online)
        placed = place_copies(tree, machine, ResidencyOptions(
            enabled=options.residency, split=options.split, allocation=options.allocation))
        # the program compile would hand on: a plan whose program its verifier refuses is refused
        # (remembered as verified: the pipeline's check of the program handed on is then free)
        verified(verify_program, placed.program)
    except FspyreError:
        return None
    return _Compiled(tree=tree, placed=placed, report=placed.report or traffic_report(placed.program))


def _whole(report: TrafficReport) -> tuple[float, int]:
    return round(report.time_ns, 6), report.hbm_bytes


def _plan(ctx: _Search, hinted: TilingPlan, records: Sequence[GroupSearch]) -> TilingPlan:
    """The hinted plan with the tiled groups of ``records`` (``hinted`` itself when none is)."""
    tiled = tuple(Group(ops=r.ops, levels=r.choice.levels) for r in records if r.choice.levels)
    if not tiled:
        return hinted
    # a searched accumulation's readers run after its loop (loop fission), as _judge compiled them
    searched = split_at_tiled_reductions(ctx.graph, TilingPlan(order=hinted.order, groups=tiled), ctx.options.online)
    position = {name: i for i, name in enumerate(searched.order)}
    groups = sorted(hinted.groups + searched.groups, key=lambda g: position[g.ops[0]])
    # loop fission may run a pass's ops in another order than the graph's: take its order
    return TilingPlan(order=searched.order, groups=tuple(groups), warnings=hinted.warnings,
                      notes=hinted.notes + searched.notes)


def _in_place(ctx: _Search, members: Sequence[str]) -> tuple[float, int]:
    """What ``members`` cost untiled in the hinted program as a whole."""
    t, b = 0.0, 0
    for m in members:
        mt, mb = ctx.untiled.get(m, (0.0, 0))
        t, b = t + mt, b + mb
    return t, b


def _charged(ctx: _Search, members: Sequence[str]) -> tuple[float, int]:
    """What a tiled group of ``members`` replaces in the hinted program: their ops untiled
    (``_in_place``), less what the group costs its free neighbours, the ops just before it
    that cost nothing there (``_free_reads``). Such an op's result stays in LX for its readers
    in the hinted program; a group reading it tile by tile has it written to HBM first
    (charged at the fitted bandwidth: a lower bound). Without it the DP scored a layernorm's
    free mean(h) and h - mean alike in the group and out of it (h = x + a an output, fp16
    x[4093, 256], 11 cores, 256 KiB: [hc*hc .. + beta] T:2 119.92 us as a whole, against
    93.92 with mean and sub in the loop)."""
    t, b = _in_place(ctx, members)
    spilled = sum(_device_bytes(ctx, buf) for buf in _free_reads(ctx, members))
    return t - spilled / HBM_BYTES_PER_NS, b - spilled


def _free_reads(ctx: _Search, members: Sequence[str]) -> list[str]:
    """The buffers ``members`` read that their free neighbours write: the contiguous ops just
    before them in the plan's order (at most ``window``) that cost nothing in the hinted
    program."""
    at = ctx.position.get(members[0])
    if at is None:
        return []
    free: set[str] = set()
    k = at - 1
    while k >= max(at - ctx.options.window, 0) and ctx.untiled.get(ctx.order[k]) == (0.0, 0):
        free.add(ctx.ops[ctx.order[k]].store.buffer)
        k -= 1
    if not free:
        return []
    return list(dict.fromkeys(ld.buffer for m in members for ld in ctx.ops[m].loads if ld.buffer in free))


def _device_bytes(ctx: _Search, buffer: str) -> int:
    """A buffer's bytes in HBM, padded sticks included (every buffer takes the default stick
    layout, ``fspyre.stages.access.buffer_layout``)."""
    btype = ctx.buffers[buffer].type
    fmt = FORMATS[ctx.machine.device_format(btype.dtype)]
    return device_bytes(stick_layout(btype.shape, fmt.elems_per_stick).device_size, fmt.nbytes)


def _subgraph(ctx: _Search, members: Sequence[str]) -> Graph:
    """The group's ops as a graph of their own: what they read from outside is an input, what
    they write that is read outside (or is a graph output) is an output. A buffer several of
    them write (the regions of a concatenation) is one buffer and one output: listed once per
    writer, the subgraph was refused ("duplicate buffer names") and no segment holding two
    pieces of a concatenation was ever weighed."""
    inside = set(members)
    written: dict[str, None] = {}  # in order of their first writer
    inputs: list[str] = []
    outputs: list[str] = []
    for name in members:
        op = ctx.ops[name]
        for ld in op.loads:
            if ld.buffer not in written and ld.buffer not in inputs:
                inputs.append(ld.buffer)
        buf = op.store.buffer
        if buf in written:
            continue
        written[buf] = None
        if buf in ctx.outputs or any(r not in inside for r in ctx.readers.get(buf, ())):
            outputs.append(buf)
    names = inputs + list(written)
    return Graph(
        name=ctx.graph.name, buffers=tuple(ctx.buffers[n] for n in names), inputs=tuple(inputs),
        ops=tuple(ctx.ops[m] for m in members), outputs=tuple(Output(name=b, buffer=b) for b in outputs),
        hints=ctx.graph.hints,
    )


_CANON = re.compile(r"(?<![A-Za-z0-9])_[bod]\d+_")


def _canonical(sub: Graph) -> tuple[Graph, dict[str, str]]:
    """``sub`` with its buffers named ``_b0_, _b1_, ...``, its ops ``_o0_, ...`` and its dims
    ``_d0_, ...`` in order of appearance (a captured model names dims after its layers'
    parameters), and the map back to the real names."""
    rename = {b.name: f"_b{k}_" for k, b in enumerate(sub.buffers)}
    ops = {op.name: f"_o{k}_" for k, op in enumerate(sub.ops)}
    dims: dict[str, str] = {}
    for b in sub.buffers:
        for d in b.type.dims:
            dims.setdefault(d.name, f"_d{len(dims)}_")
    for op in sub.ops:
        for d in iteration_dims(op):
            dims.setdefault(d.name, f"_d{len(dims)}_")
    symbols = {sym(n): sym(c) for n, c in dims.items()}

    def dim(d: Dim) -> Dim:
        return Dim(dims[d.name], d.size)

    def btype(t: TensorType) -> TensorType:
        return replace(t, dims=tuple(dim(d) for d in t.dims))

    def operand(o: Load | Scalar) -> Load | Scalar:
        return replace(o, buffer=rename[o.buffer], index=o.index.xreplace(symbols)) if isinstance(o, Load) else o

    def op_of(op: Op) -> Op:
        store = replace(op.store, buffer=rename[op.store.buffer], index=op.store.index.xreplace(symbols))
        new = replace(op, name=ops[op.name], store=store, ranges=tuple(dim(d) for d in op.ranges),
                      operands=tuple(operand(o) for o in op.operands))  # type: ignore[misc]
        if isinstance(new, Reduction):
            new = replace(new, reduction_ranges=tuple(dim(d) for d in new.reduction_ranges))
        return new

    def scope(h: HintScope) -> HintScope:
        return replace(h, slices=FrozenMap({dims.get(k, k): v for k, v in h.slices.items()}),
                       work_div=FrozenMap({dims.get(k, k): v for k, v in h.work_div.items()}))

    canon = Graph(name=sub.name, buffers=tuple(Buffer(name=rename[b.name], type=btype(b.type)) for b in sub.buffers),
                  inputs=tuple(rename[n] for n in sub.inputs), ops=tuple(op_of(op) for op in sub.ops),
                  outputs=tuple(Output(name=rename[o.buffer], buffer=rename[o.buffer]) for o in sub.outputs),
                  hints=tuple(scope(h) for h in sub.hints))
    back = {v: k for k, v in rename.items()} | {v: k for k, v in ops.items()} | {v: k for k, v in dims.items()}
    return canon, back


def _structure(canon: Graph) -> tuple:
    """What a judgement depends on: the ops (kinds, fns, shapes, index expressions, hint
    scopes), the buffers' types, which are inputs and outputs; the machine and options are
    those of the whole search."""
    return (canon.buffers, canon.inputs, canon.ops, canon.outputs, canon.hints)


def _renamed(record: GroupSearch, names: Mapping[str, str]) -> GroupSearch:
    def real(text: str) -> str:
        return _CANON.sub(lambda m: names.get(m.group(0), m.group(0)), text)

    def candidate(c: Candidate) -> Candidate:
        levels = tuple(replace(lv, dims=tuple(names.get(d, d) for d in lv.dims)) for lv in c.levels)
        return replace(c, levels=levels, reason=real(c.reason))

    return replace(record, consumer=names[record.consumer], ops=tuple(names[o] for o in record.ops),
                   candidates=tuple(candidate(c) for c in record.candidates))
