"""Plans between stages: the tiling plan (hints -> groups), the split plan (work across
cores) and the allocation (where each buffer lives). All frozen data."""

from __future__ import annotations

from dataclasses import dataclass, field

from fspyre.errors import AllocationError, TilingError
from fspyre.ir.frozen import FrozenMap


# -- tiling plan ----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class Level:
    """One counted loop: ``count`` iterations; every op of the group that iterates one of
    ``dims`` divides it by ``count`` (an op iterating none is loop-invariant at this level)."""

    count: int
    dims: tuple[str, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.count, int) or self.count < 1:
            raise TilingError(f"loop level over {list(self.dims)}: count {self.count!r} must be an integer >= 1")
        if not self.dims:
            raise TilingError(f"loop level with count {self.count} names no dim to tile")


@dataclass(frozen=True, slots=True, kw_only=True)
class Group:
    """Contiguous ops (in ``TilingPlan.order``) sharing the loop nest ``levels``, outermost first."""

    ops: tuple[str, ...]
    levels: tuple[Level, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class TilingPlan:
    order: tuple[str, ...]  # every op of the graph, in the order the program runs them
    groups: tuple[Group, ...] = ()
    warnings: tuple[str, ...] = ()


# -- split plan -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class OpSplit:
    """How one op's (per-tile) iteration space is divided: ``splits[dim]`` slices per dim,
    listed in iteration-space order; cores map to slices with the first dim fastest."""

    splits: FrozenMap[str, int]
    cores: int  # cores the op runs on = product of splits

    def __post_init__(self) -> None:
        prod = 1
        for v in self.splits.values():
            prod *= v
        if prod != self.cores:
            raise TilingError(f"split {dict(self.splits)} uses {prod} cores, not {self.cores}")


@dataclass(frozen=True, slots=True, kw_only=True)
class SplitPlan:
    ops: FrozenMap[str, OpSplit]
    notes: tuple[str, ...] = ()


# -- allocation -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """Where a buffer lives. HBM: ``address`` is a byte address in device memory and
    ``arg_index`` >= 0 for kernel arguments. LX: ``address`` is the same on every core and
    ``nbytes`` is the per-core footprint."""

    memory: str  # "hbm" | "lx"
    address: int
    nbytes: int
    arg_index: int = -1

    def __post_init__(self) -> None:
        if self.memory not in ("hbm", "lx"):
            raise AllocationError(f"placement memory {self.memory!r} must be 'hbm' or 'lx'")
        if self.address < 0 or self.address % 128:
            raise AllocationError(f"{self.memory} address {self.address} must be a non-negative multiple of 128")


@dataclass(frozen=True, slots=True, kw_only=True)
class Allocation:
    buffers: FrozenMap[str, Placement]
    hbm_bytes: int
    lx_peak_bytes: int = 0
    notes: tuple[str, ...] = field(default=())
