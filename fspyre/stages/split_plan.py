"""Stage ``divide_work``: LoopTree + machine -> SplitPlan (each op's work across cores)."""

from __future__ import annotations

from dataclasses import dataclass

from fspyre.ir.frozen import FrozenMap
from fspyre.ir.looptree import LoopTree, op_nodes
from fspyre.ir.plans import OpSplit, SplitPlan
from fspyre.machine.spyre import Machine


@dataclass(frozen=True, slots=True, kw_only=True)
class SplitOptions:
    pass


def _largest_divisor(n: int, at_most: int) -> int:
    return max(d for d in range(1, min(n, at_most) + 1) if n % d == 0)


def divide_work(tree: LoopTree, machine: Machine, options: SplitOptions = SplitOptions()) -> SplitPlan:
    """Even division: output dims in order, each split by the largest divisor of its size that
    the remaining cores allow. Stick dims are split in whole sticks (64 elements of fp16)."""
    plans = {}
    for node in op_nodes(tree):
        op, rem = node.op, machine.cores
        splits: dict[str, int] = {}
        last = op.ranges[-1].name if op.ranges else None
        for d in op.ranges:
            if d.size == 1:
                continue
            unit = 64 if d.name == last else 1
            if d.size % unit:
                splits[d.name] = 1
                continue
            s = _largest_divisor(d.size // unit, rem)
            splits[d.name] = s
            rem //= s
        for d in op.reduction_ranges:
            if d.size > 1:
                splits[d.name] = 1
        cores = 1
        for v in splits.values():
            cores *= v
        plans[op.name] = OpSplit(splits=FrozenMap(splits), cores=cores)
    return SplitPlan(ops=FrozenMap(plans))
