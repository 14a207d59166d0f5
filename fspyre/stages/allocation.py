"""Stage ``allocate``: LoopTree + SplitPlan + machine -> Allocation (HBM and LX addresses)."""

from __future__ import annotations

from dataclasses import dataclass

from fspyre.ir.frozen import FrozenMap
from fspyre.ir.looptree import LoopTree
from fspyre.ir.plans import Allocation, Placement, SplitPlan
from fspyre.machine.layout import stick_layout
from fspyre.machine import formats
from fspyre.machine.spyre import HBM_ALIGN, Machine


@dataclass(frozen=True, slots=True, kw_only=True)
class AllocationOptions:
    lx_planning: bool = False


def _align(n: int, a: int = HBM_ALIGN) -> int:
    return -(-n // a) * a


def device_bytes(buffer_type, machine: Machine) -> int:
    fmt = formats.FORMATS[machine.device_format(buffer_type.dtype)]
    return stick_layout(buffer_type.shape, fmt.elems_per_stick).nbytes


def allocate(tree: LoopTree, splits: SplitPlan, machine: Machine,
             options: AllocationOptions = AllocationOptions()) -> Allocation:
    """Everything in HBM: kernel arguments (inputs, then outputs) first, then a pool of
    intermediates, each 128-byte aligned."""
    table = tree.buffer_table()
    args = list(tree.inputs) + [o.buffer for o in tree.outputs if o.buffer not in tree.inputs]
    args = list(dict.fromkeys(args))
    placements: dict[str, Placement] = {}
    addr = 0
    for i, name in enumerate(args):
        size = device_bytes(table[name].type, machine)
        placements[name] = Placement(memory="hbm", address=addr, nbytes=size, arg_index=i)
        addr = _align(addr + size)
    for b in tree.buffers:
        if b.name not in placements:
            size = device_bytes(b.type, machine)
            placements[b.name] = Placement(memory="hbm", address=addr, nbytes=size)
            addr = _align(addr + size)
    return Allocation(buffers=FrozenMap(placements), hbm_bytes=addr)
