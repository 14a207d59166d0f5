"""Per-op access analysis: how each op of a LoopTree addresses its tensors on a machine.

For every op: its iteration dims, the enclosing loop counts, each dim's size before tiling,
and per tensor operand (loads in operand order, then the store) the buffer's stick layout and
the device coordinates of its index (full-size buffers over the full ranges, tile buffers over
the tile). ``divide_work`` computes it once and carries it in ``SplitPlan.accesses``;
``allocate`` and ``emit_program`` read it from there (the MLIR tiling-result pattern: the
stage output carries what later stages need) instead of deriving it again.

The record depends only on the tree and the machine, never on the splits, so it is derived
data: it is not serialized, and a stage handed a split plan made for another tree or machine
(or loaded from JSON) recomputes it (``access_plan``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import sympy

from fspyre.ir.frozen import FrozenMap
from fspyre.ir.graph import Dim, Load, Op, iteration_dims
from fspyre.ir.looptree import LoopTree, OpNode, TileStep, TreeBuffer, loop_counts, op_nodes
from fspyre.ir.plans import SplitPlan
from fspyre.machine import formats
from fspyre.machine.indexing import free_names
from fspyre.machine.layout import StickLayout, device_coordinates, stick_layout
from fspyre.machine.spyre import Machine


@dataclass(frozen=True, slots=True, kw_only=True)
class Access:
    """One tensor operand of an op as the program will address it: the buffer's stick layout
    and the device coordinates of its index (full-size buffers over the full ranges, tile
    buffers over the tile), exactly as the emitted ``TensorArg`` carries them."""

    buffer: str
    is_write: bool
    index: sympy.Expr  # size-1 dims substituted by 0
    layout: StickLayout
    coords: tuple[sympy.Expr, ...]
    # per enclosing loop, outermost first: the tile steps of that loop that move this full
    # buffer's address (none for a tile buffer, which never moves)
    moves: tuple[tuple[TileStep, ...], ...]
    # per enclosing loop: how far one iteration moves the access in the buffer's row-major
    # elements (0 where the loop does not move it), judged on the index before size-1 dims
    # are dropped, as ``moves`` is; an index not linear in the moving variables gives its
    # symbolic step as text, so only the same expression compares equal
    element_steps: tuple[int | str, ...] = ()

    @property
    def advances(self) -> bool:
        """A full buffer whose address moves with an enclosing loop."""
        return any(self.moves)


@dataclass(frozen=True, slots=True, kw_only=True)
class OpAccess:
    """One op's accesses. ``dims`` is the iteration space as the program lists it (dims of
    size > 1, in order); ``full`` each iteration dim's size before tiling; ``tensors`` the
    loads in operand order, then the store."""

    node: OpNode
    counts: tuple[int, ...]  # enclosing loop counts, outermost first
    dims: tuple[Dim, ...]
    full: FrozenMap[str, int]
    tensors: tuple[Access, ...]


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class AccessPlan:
    """Every op's accesses for one tree on one machine (compared by identity: it is derived)."""

    tree: LoopTree
    machine: Machine
    layouts: FrozenMap[str, StickLayout]
    ops: FrozenMap[str, OpAccess]


def buffer_layout(buffer: TreeBuffer, machine: Machine) -> StickLayout:
    fmt = formats.FORMATS[machine.device_format(buffer.type.dtype)]
    return stick_layout(buffer.type.shape, fmt.elems_per_stick)


def op_dims(op: Op) -> tuple[Dim, ...]:
    """The op's iteration space as the program lists it: dims of size > 1, in order."""
    return tuple(d for d in iteration_dims(op) if d.size > 1)


def full_sizes(node: OpNode, counts: Sequence[int]) -> dict[str, int]:
    """Each iteration dim's range over all iterations of the enclosing loops: the per-tile
    size plus, per enclosing loop that moves it, ``count - 1`` steps (a whole range when the
    loops divide it; a peeled tail's op covers only its remainder, its index starting at the
    tail's offset)."""
    sizes = {d.name: d.size for d in iteration_dims(node.op)}
    for level, count in zip(node.tiling, counts):
        for step in level:
            if step.dim in sizes:
                sizes[step.dim] += (count - 1) * step.extent
    return sizes


def op_accesses(node: OpNode, counts: Sequence[int], table: Mapping[str, TreeBuffer], machine: Machine,
                layouts: Mapping[str, StickLayout] | None = None) -> tuple[Access, ...]:
    """Loads in operand order, then the store."""
    return _op_access(node, tuple(counts), table, machine, layouts).tensors


def _op_access(node: OpNode, counts: tuple[int, ...], table: Mapping[str, TreeBuffer], machine: Machine,
               layouts: Mapping[str, StickLayout] | None) -> OpAccess:
    op = node.op
    dims = op_dims(op)
    unit = {d.symbol: 0 for d in iteration_dims(op) if d.size == 1}
    full = full_sizes(node, counts)
    out = []
    refs = [(o.buffer, o.index, False) for o in op.operands if isinstance(o, Load)] + [
        (op.store.buffer, op.store.index, True)]
    for name, index, is_write in refs:
        b = table[name]
        lay = layouts[name] if layouts is not None else buffer_layout(b, machine)
        # A dim tiled down to one element per tile leaves the iteration space but still moves
        # the address, so the advance is judged on the index before size-1 dims are dropped.
        names = free_names(index)
        moves = tuple(tuple(s for s in level if b.scope == "full" and s.dim in names) for level in node.tiling)
        steps = tuple(_element_step(index, level) for level in moves)
        index = index.subs(unit) if unit else index
        ranges = {d.symbol: (full[d.name] if b.scope == "full" else d.size) for d in dims}
        coords = device_coordinates(lay, index, ranges)
        out.append(Access(buffer=name, is_write=is_write, index=index, layout=lay, coords=coords, moves=moves,
                          element_steps=steps))
    return OpAccess(node=node, counts=counts, dims=dims, full=FrozenMap(full), tensors=tuple(out))


def analyze_accesses(tree: LoopTree, machine: Machine) -> AccessPlan:
    table = tree.buffer_table()
    layouts = FrozenMap((b.name, buffer_layout(b, machine)) for b in tree.buffers)
    counts = loop_counts(tree)
    ops = FrozenMap((n.name, _known_access(n, tuple(counts[n.name]), table, machine, layouts))
                    for n in op_nodes(tree))
    return AccessPlan(tree=tree, machine=machine, layouts=layouts, ops=ops)


# An op's accesses by everything they are made from: the node, its loops' counts, the buffers
# it names and the machine (whose formats give the layouts). A tiling search and
# keep_resident's copy trials analyse the same node in many trees. Bounded: a cleared table
# only costs the analyses again.
_ANALYSED: dict[tuple, OpAccess] = {}
_ANALYSED_MAX = 1 << 14


def _known_access(node: OpNode, counts: tuple[int, ...], table: Mapping[str, TreeBuffer], machine: Machine,
                  layouts: Mapping[str, StickLayout]) -> OpAccess:
    op = node.op
    named = tuple(table[o.buffer] for o in op.operands if isinstance(o, Load)) + (table[op.store.buffer],)
    key = (node, counts, named, machine)
    found = _ANALYSED.get(key)
    if found is None:
        if len(_ANALYSED) >= _ANALYSED_MAX:
            _ANALYSED.clear()
        found = _ANALYSED[key] = _op_access(node, counts, table, machine, layouts)
    return found


def access_plan(tree: LoopTree, splits: SplitPlan, machine: Machine) -> AccessPlan:
    """The accesses ``divide_work`` recorded in ``splits`` when they were made for this very
    tree and machine; otherwise computed afresh."""
    known = splits.accesses
    if isinstance(known, AccessPlan) and known.tree is tree and known.machine == machine:
        return known
    return analyze_accesses(tree, machine)


def _element_step(index: sympy.Expr, steps: Sequence[TileStep]) -> int | str:
    """How far one iteration of a loop moving ``steps`` moves ``index`` (0 for none)."""
    if not steps:
        return 0
    extent = {s.dim: s.extent for s in steps}
    moved = {v: v + extent[v.name] for v in index.free_symbols if v.name in extent}
    step = sympy.expand(index.xreplace(moved) - index)
    return int(step) if step.is_Integer else str(step)
