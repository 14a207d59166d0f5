"""keep_resident's pins: a buffer that must be in HBM and that later top-level ops read is
written into LX for them and copied to HBM once, where the allocator keeps that LX buffer."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from fspyre.errors import FspyreError
from fspyre.ir.frozen import FrozenMap
from fspyre.ir.graph import HintScope, Load, Pointwise, Store
from fspyre.ir.looptree import LoopTree, Node, OpNode, TreeBuffer, op_nodes
from fspyre.ir.plans import Allocation, SplitPlan
from fspyre.machine.spyre import Machine
from fspyre.stages.allocation import allocate
from fspyre.stages.split_plan import divide_work
from fspyre.stages.trials import Trial, TrialJudge, better, fresh_name

if TYPE_CHECKING:
    from fspyre.stages.residency import ResidencyOptions


def pinned(unchanged: Trial, machine: Machine, options: ResidencyOptions, judge: TrialJudge) -> Trial:
    """A buffer that must be in HBM (a graph output, a buffer a loop reads tile by tile, ...)
    and that later top-level ops read is written into LX for them and copied to HBM once,
    where the allocator keeps that LX buffer (the anchor pins an intermediate that is also a
    graph output in LX with an HBM clone); otherwise they read back what was just written."""
    pins = _pins(unchanged.tree, unchanged.split, unchanged.allocation)
    no_room = set(unchanged.allocation.no_room)
    if options.allocation.lx_solver == "greedy" and all(p.buffer in no_room for p in pins):
        # Each pin would meet the greedy solver where its buffer did: at the same point of the
        # sweep (the pin copies go in after their writers, so no lifetime crosses another's
        # start), the same size and in-place parents, the same buffers live at the same
        # addresses as long as no earlier pin was placed -- so no room for any of them. Wide
        # DAGs (thousands of intermediates spilled for room) would re-divide and re-allocate
        # the whole tree to find that out.
        return unchanged
    while pins:
        pinned = _pin(unchanged.tree, pins)
        try:
            split = divide_work(pinned, machine, options.split)
        except FspyreError:
            return unchanged  # a pin's work division was refused: leave the tree as it was
        alloc = allocate(pinned, split, machine, options.allocation)
        kept = [p for p in pins if alloc.buffers[p.name].memory == "lx"]
        if len(kept) == len(pins):
            done = Trial(tree=pinned, split=split, allocation=alloc)
            return done if better(done, unchanged, judge) else unchanged
        pins = kept  # the rest did not fit (or are sliced differently by a reader): without them
    return unchanged


@dataclass(frozen=True, slots=True, kw_only=True)
class _Pin:
    name: str  # the LX buffer the writer stores into (and, with "_out", the copy to HBM)
    buffer: str  # the graph output
    writer: str
    split: FrozenMap[str, int]  # the writer's work division, which the copy must repeat


def pin_sites(tree: LoopTree) -> list[OpNode]:
    """Top-level writers of a full buffer that later top-level ops read, storing it whole with
    its own contiguous index (so an LX buffer and the copy would share the writer's
    iteration), last first: the writers a pin could take, wherever the allocator puts their
    buffers. Readers inside loops keep reading the HBM buffer: a loop advances through it, and
    an LX buffer never advances."""
    table = tree.buffer_table()
    # an accumulator is written again after its fill (by its combine, inside the loop): a pin
    # of the fill would hand later readers the identity instead of the sum
    writes = Counter(n.op.store.buffer for n in op_nodes(tree))
    read_later: set[str] = set()
    sites: list[OpNode] = []
    for node in reversed(tree.body):
        if not isinstance(node, OpNode):
            continue
        b = node.op.store.buffer
        if (b in read_later and writes[b] == 1 and table[b].scope == "full"
                and node.op.store.index == table[b].type.contiguous_index()
                and set(table[b].type.names) <= {d.name for d in node.op.ranges}):
            sites.append(node)
        read_later |= {ld.buffer for ld in node.op.loads}
    return sites


def pin_buffers(tree: LoopTree) -> set[str]:
    """The pins of ``tree`` (``_pin``): the LX buffers a top-level op writes for the later
    top-level readers, each copied to its HBM buffer by the op ``<pin>_out``."""
    top = [n for n in tree.body if isinstance(n, OpNode)]
    copies = {n.name: n.op.loads[0].buffer for n in top if n.op.fn == "copy"}
    return {n.op.store.buffer for n in top if copies.get(f"{n.op.store.buffer}_out") == n.op.store.buffer}


def unpinned(tree: LoopTree, names: set[str]) -> LoopTree:
    """``tree`` without the pins ``names``: the writer writes the HBM buffer again and the
    readers read it there, as before ``_pin``."""
    outs = {n.op.loads[0].buffer: n for n in tree.body
            if isinstance(n, OpNode) and n.name in {f"{p}_out" for p in names}}
    back = {p: out.op.store.buffer for p, out in outs.items()}
    scopes = {h for out in outs.values() for h in out.op.hints}
    body: list[Node] = []
    for node in tree.body:
        if not isinstance(node, OpNode):
            body.append(node)
            continue
        if node.name in {out.name for out in outs.values()}:
            continue
        op = node.op
        operands: Any = tuple(Load(buffer=back[o.buffer], index=o.index) if isinstance(o, Load) and o.buffer in back
                              else o for o in op.operands)
        store = Store(buffer=back[op.store.buffer], index=op.store.index) if op.store.buffer in back else op.store
        body.append(node if operands == op.operands and store == op.store
                    else replace(node, op=replace(op, operands=operands, store=store)))
    return replace(tree, body=tuple(body), buffers=tuple(b for b in tree.buffers if b.name not in back),
                   hints=tuple(h for h in tree.hints if h.id not in scopes))


def _pins(tree: LoopTree, split: SplitPlan, allocation: Allocation) -> list[_Pin]:
    """The pin sites (``pin_sites``) whose buffer the allocation left in HBM."""
    table = tree.buffer_table()
    taken = {b.name for b in tree.buffers} | {n.name for n in op_nodes(tree)}
    pins: list[_Pin] = []
    for node in pin_sites(tree):
        b = node.op.store.buffer
        if allocation.buffers[b].memory == "hbm":
            pins.append(_Pin(name=fresh_name(f"{b}_pin", taken), buffer=b, writer=node.name,
                             split=FrozenMap((d, k) for d, k in split.ops[node.name].splits.items()
                                             if d in table[b].type.names)))
    return pins[::-1]


def _pin(tree: LoopTree, pins: Sequence[_Pin]) -> LoopTree:
    table = tree.buffer_table()
    of_buffer = {p.buffer: p for p in pins}
    first = max((h.id for h in tree.hints), default=-1) + 1
    scopes = tuple(HintScope(id=first + i, work_div=p.split) for i, p in enumerate(pins))
    by_writer = {p.writer: (p, scope) for p, scope in zip(pins, scopes)}
    body: list[Node] = []
    for node in tree.body:
        if not isinstance(node, OpNode):
            body.append(node)
            continue
        op = node.op
        # a redirect keeps a load a load, so a reduction's operands stay loads
        operands: Any = tuple(Load(buffer=of_buffer[o.buffer].name, index=o.index)
                              if isinstance(o, Load) and o.buffer in of_buffer else o for o in op.operands)
        pinned = by_writer.get(op.name)
        store = op.store if pinned is None else Store(buffer=pinned[0].name, index=op.store.index)
        body.append(node if operands == op.operands and pinned is None
                    else replace(node, op=replace(op, operands=operands, store=store)))
        if pinned is not None:
            p, scope = pinned
            btype = table[p.buffer].type
            index = btype.contiguous_index()
            body.append(OpNode(op=Pointwise(
                name=f"{p.name}_out", fn="copy", operands=(Load(buffer=p.name, index=index),), ranges=btype.dims,
                store=Store(buffer=p.buffer, index=index), hints=(scope.id,))))
    buffers: list[TreeBuffer] = []
    for b in tree.buffers:
        buffers.append(b)
        if b.name in of_buffer:
            buffers.append(TreeBuffer(name=of_buffer[b.name].name, type=b.type))
    return replace(tree, body=tuple(body), buffers=tuple(buffers), hints=tree.hints + scopes)
