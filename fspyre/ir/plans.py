"""Plans between stages: the tiling plan (hints -> groups), the split plan (work across
cores) and the allocation (where each buffer lives). All frozen data."""

from __future__ import annotations

from dataclasses import dataclass, field

from fspyre.errors import AllocationError, TilingError, WorkDivisionError
from fspyre.ir.frozen import FrozenMap, require_int, require_map, require_tuple
from fspyre.ir.graph import Op, iteration_dims
from fspyre.ir.kinds import FUSE_MODES, MEMORIES, VERDICTS, FuseMode, Memory, Verdict


# -- tiling plan ----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class Level:
    """One counted loop of ``count`` iterations.

    By name (hints, and the embedder's named form): every op of the group that iterates one
    of ``dims`` with size > 1 divides it by ``count``; an op iterating none of them is
    loop-invariant at this level. ``op_dims``, when not empty (the embedder's positional
    form, where index 0 may name a different dim in each op), lists each op's tiled dims
    instead, ops it omits being loop-invariant; ``dims`` is then their union, for printing.
    ``source`` says where the level came from ("hint scope 1 slices={'B': 4}"), for reports.
    """

    count: int
    dims: tuple[str, ...]
    op_dims: FrozenMap[str, tuple[str, ...]] = field(default_factory=FrozenMap)
    source: str = ""

    def __post_init__(self) -> None:
        where = f" ({self.source})" if self.source else ""
        require_tuple(self.dims, f"loop level{where}: dims", TilingError, str)
        require_map(self.op_dims, f"loop level{where}: op_dims", TilingError)
        if not isinstance(self.count, int) or isinstance(self.count, bool) or self.count < 1:
            raise TilingError(
                f"loop level over {list(self.dims)}{where}: count {self.count!r} must be an integer >= 1"
            )
        if not self.dims:
            raise TilingError(f"loop level with count {self.count}{where} names no dim to tile")
        for op, names in self.op_dims.items():
            missing = [n for n in names if n not in self.dims]
            if missing:
                raise TilingError(
                    f"loop level over {list(self.dims)}{where}: op {op} tiles {missing}, "
                    f"which the level's dims do not list"
                )

    def tiled_dims(self, op: Op) -> tuple[str, ...]:
        """The dims of ``op`` this level divides (empty: the op is loop-invariant here)."""
        if self.op_dims:
            return self.op_dims.get(op.name, ())
        iterated = {d.name for d in iteration_dims(op) if d.size > 1}
        return tuple(d for d in self.dims if d in iterated)


@dataclass(frozen=True, slots=True, kw_only=True)
class Group:
    """Contiguous ops (in ``TilingPlan.order``) sharing the loop nest ``levels``, outermost first.

    ``depths[op]``, for an op that runs under only the outer ``depths[op]`` levels (an op of
    an outer hint scope next to a nested one), puts it in the body of level ``depths[op] - 1``,
    before or after the inner loops; ops it omits run under every level. Along the group's
    ops the depths rise to the innermost ops and fall after them (docs/tiling.md, "Outer-scope
    ops around a nested scope")."""

    ops: tuple[str, ...]
    levels: tuple[Level, ...]
    depths: FrozenMap[str, int] = field(default_factory=FrozenMap)

    def __post_init__(self) -> None:
        require_tuple(self.ops, "a group's ops", TilingError, str, non_empty=True)
        require_tuple(self.levels, f"group of {list(self.ops)}: levels", TilingError, Level)
        require_map(self.depths, f"group of {list(self.ops)}: depths", TilingError)
        for op, depth in self.depths.items():
            if op not in self.ops:
                raise TilingError(f"group of {list(self.ops)}: depths names op {op!r:.60}, which is not in the group")
            if not isinstance(depth, int) or isinstance(depth, bool) or not 1 <= depth < len(self.levels):
                raise TilingError(f"group of {list(self.ops)}: op {op} runs under {depth!r:.60} levels; a depth must "
                                  f"be an integer from 1 to {len(self.levels) - 1} (ops under all levels are not "
                                  f"listed)")
        shape = [self.depth(op) for op in self.ops]
        peak = shape.index(len(self.levels)) if len(self.levels) in shape else None
        if self.depths and (peak is None or shape[:peak] != sorted(shape[:peak])
                            or shape[peak:] != sorted(shape[peak:], reverse=True)
                            or len(self.levels) in shape[peak + shape[peak:].count(len(self.levels)):]):
            raise TilingError(f"group of {list(self.ops)}: depths {shape} must rise to one run of ops under all "
                              f"{len(self.levels)} levels and fall after it (an op between two inner runs would need "
                              f"two sibling loops)")

    def depth(self, op: str) -> int:
        """The number of the group's levels (outermost first) ``op`` runs under."""
        return self.depths.get(op, len(self.levels))


@dataclass(frozen=True, slots=True, kw_only=True)
class TilingPlan:
    order: tuple[str, ...]  # every op of the graph, in the order the program runs them
    groups: tuple[Group, ...] = ()
    warnings: tuple[str, ...] = ()
    # What the plan did to honour the hints that the user did not write: loop fission of a
    # group whose ops read a reduction it tiles over its reduction dim (docs/tiling.md).
    notes: tuple[str, ...] = ()

    def __repr__(self) -> str:
        def group(g: Group) -> str:
            ops = g.ops[0] if len(g.ops) == 1 else f"{g.ops[0]}..{g.ops[-1]}"
            return ops + "".join(f" {'/'.join(lv.dims)}:{lv.count}" for lv in g.levels)

        groups = "; ".join(map(group, self.groups[:4]))
        more = f"; +{len(self.groups) - 4} more" if len(self.groups) > 4 else ""
        return f"TilingPlan({len(self.order)} ops, {len(self.groups)} groups: {groups}{more})"

    def __post_init__(self) -> None:
        require_tuple(self.order, "tiling plan: order", TilingError, str)
        require_tuple(self.groups, "tiling plan: groups", TilingError, Group)
        require_tuple(self.warnings, "tiling plan: warnings", TilingError, str)
        require_tuple(self.notes, "tiling plan: notes", TilingError, str)


# -- split plan -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class OpSplit:
    """How one op's (per-tile) iteration space is divided: ``splits[dim]`` slices per dim,
    listed in iteration-space order; cores map to slices with the first dim fastest.

    ``stick_elems[dim]`` is the elements-per-stick a stick dim is split in (its splits count
    whole sticks); ``span_splits`` are the minimum splits the per-core span limit forced;
    ``output_coeffs`` / ``reduction_coeffs`` are the anchor's index-coefficient-keyed form
    (coefficient of the dim in the write index / first read index -> slices, 1s dropped).

    ``slices[dim]``, for every dim split in more than one slice, is the element extent of
    each slice in order: the per-core iteration spaces (core ``c`` takes, per dim, the slice
    ``fspyre.machine.rules.core_slices`` gives it). Shares are ceil and floor, so a split need
    not divide its dim (``fspyre.machine.rules.slice_extents``)."""

    splits: FrozenMap[str, int]
    cores: int  # cores the op runs on = product of splits
    slices: FrozenMap[str, tuple[int, ...]] = field(default_factory=FrozenMap)
    stick_elems: FrozenMap[str, int] = field(default_factory=FrozenMap)
    span_splits: FrozenMap[str, int] = field(default_factory=FrozenMap)
    output_coeffs: FrozenMap[int, int] = field(default_factory=FrozenMap)
    reduction_coeffs: FrozenMap[int, int] = field(default_factory=FrozenMap)
    hinted: bool = False  # a work_div hint decided the splits

    def __post_init__(self) -> None:
        for name in ("splits", "slices", "stick_elems", "span_splits", "output_coeffs", "reduction_coeffs"):
            require_map(getattr(self, name), f"op split: {name}", WorkDivisionError)
        prod = 1
        for dim, v in self.splits.items():
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise TilingError(f"split of dim {dim}: {v!r} must be an integer >= 1")
            prod *= v
        if prod != self.cores:
            raise TilingError(f"split {dict(self.splits)} uses {prod} cores, not {self.cores}")
        for dim, eps in self.stick_elems.items():
            if type(eps) is not int or eps < 1:
                raise WorkDivisionError(f"op split: stick_elems of dim {dim} {eps!r:.40} must be an integer >= 1 "
                                        f"(elements per stick)")
        for dim, ext in self.slices.items():
            if (not isinstance(ext, tuple) or len(ext) != self.splits.get(dim, 1)
                    or not all(type(x) is int and x >= 1 for x in ext)):
                raise WorkDivisionError(f"op split: slices of dim {dim} {ext!r:.60} must be {self.splits.get(dim, 1)} "
                                        f"positive integer extents, one per slice of its split")

    def extents(self, dim: str, size: int) -> tuple[int, ...]:
        """The element extents of ``dim``'s slices (the whole ``size`` when unsplit)."""
        return self.slices.get(dim, (size,))


@dataclass(frozen=True, slots=True, kw_only=True)
class SplitPlan:
    ops: FrozenMap[str, OpSplit]
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()  # dropped work_div hints (docs/tiling.md, "Hint warnings")
    # The per-op access analysis divide_work made (fspyre.stages.access.AccessPlan), handed on
    # to allocate and emit_program. Derived from the tree and machine alone, so it is neither
    # compared, printed nor serialized; a stage recomputes it when it is absent.
    accesses: object = field(default=None, compare=False, repr=False, metadata={"derived": True})

    def __repr__(self) -> str:
        cores = max((s.cores for s in self.ops.values()), default=0)
        return f"SplitPlan({len(self.ops)} ops on up to {cores} cores)"

    def __post_init__(self) -> None:
        require_map(self.ops, "split plan: ops", WorkDivisionError)
        for name, split in self.ops.items():
            if not isinstance(split, OpSplit):
                raise WorkDivisionError(f"split plan: op {name} maps to a {type(split).__name__}, not an OpSplit")


# -- allocation -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """Where a buffer lives. HBM: ``address`` is a byte address in device memory and
    ``arg_index`` >= 0 for kernel arguments. LX: ``address`` is the same on every core and
    ``nbytes`` is the per-core footprint (128-byte aligned).

    ``advances``: an LX buffer that loops walk through (a region kept in LX across sibling
    loops, docs/tiling.md, "LX residency") holds one slot per iteration of those loops; per op
    using it, the byte step of its address per iteration of each enclosing loop, outermost
    first (``TensorArg.tile_advance``). Empty for every other buffer."""

    memory: Memory
    address: int
    nbytes: int
    arg_index: int = -1
    live: tuple[int, int] = (0, 0)  # [first, last + 1) in program time (op index); loops included
    reason: str = ""  # why an intermediate is not in LX
    in_place_of: str = ""  # the LX buffer whose slot this one takes over at its last use
    advances: FrozenMap[str, tuple[int, ...]] = field(default_factory=FrozenMap)

    def __post_init__(self) -> None:
        if self.memory not in MEMORIES:
            raise AllocationError(f"placement memory {self.memory!r} must be one of {list(MEMORIES)}")
        require_int(self.address, f"{self.memory} address", AllocationError, 0)
        if self.address % 128:
            raise AllocationError(f"{self.memory} address {self.address} must be a non-negative multiple of 128")
        require_int(self.nbytes, f"{self.memory} placement at {self.address}: nbytes", AllocationError, 0)
        require_int(self.arg_index, f"{self.memory} placement at {self.address}: arg_index", AllocationError, -1)
        if (not isinstance(self.live, tuple) or len(self.live) != 2 or not all(isinstance(t, int) for t in self.live)
                or not 0 <= self.live[0] <= self.live[1]):
            raise AllocationError(f"{self.memory} placement at {self.address}: live {self.live!r:.60} must be a "
                                  f"(first, last + 1) pair of op indices, first <= last + 1")
        require_map(self.advances, f"{self.memory} placement at {self.address}: advances", AllocationError)
        if self.advances and self.memory != "lx":
            raise AllocationError(f"hbm placement at {self.address}: advances are for LX slots; an HBM buffer "
                                  f"advances by its layout")
        for op, steps in self.advances.items():
            require_tuple(steps, f"lx placement at {self.address}: advances of op {op}", AllocationError, int)
            if any(s < 0 or s % 128 for s in steps):
                raise AllocationError(f"lx placement at {self.address}: op {op} advances by {list(steps)} bytes; "
                                      f"LX slots are non-negative multiples of 128 bytes")


@dataclass(frozen=True, slots=True, kw_only=True)
class Allocation:
    buffers: FrozenMap[str, Placement]
    hbm_bytes: int
    lx_peak_bytes: int = 0
    notes: tuple[str, ...] = field(default=())
    # The intermediates LX could hold but the solver found no room for (their placements say
    # so in words): keep_resident reads it to skip pins that cannot fit either. A function of
    # the placements' reasons, so neither compared nor serialized.
    no_room: tuple[str, ...] = field(default=(), compare=False, repr=False, metadata={"derived": True})

    def __repr__(self) -> str:
        lx = sum(p.memory == "lx" for p in self.buffers.values())
        return (f"Allocation({len(self.buffers)} buffers: {len(self.buffers) - lx} in HBM ({self.hbm_bytes} B), "
                f"{lx} in LX (peak {self.lx_peak_bytes} B per core))")

    def __post_init__(self) -> None:
        require_map(self.buffers, "allocation: buffers", AllocationError)
        for name, p in self.buffers.items():
            if not isinstance(p, Placement):
                raise AllocationError(f"allocation: buffer {name} maps to a {type(p).__name__}, not a Placement")
        require_int(self.hbm_bytes, "allocation: hbm_bytes", AllocationError, 0)
        require_int(self.lx_peak_bytes, "allocation: lx_peak_bytes", AllocationError, 0)


# -- tiling search ----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """One tiling of one group that the search judged by compiling it.

    ``verdict`` is "fits" (every intermediate of the group got LX), "spills" (it compiled, but
    an intermediate lives in HBM: ``reason`` names it) or "refused" (a stage refused it:
    ``reason`` is the first line of its error). ``time_ns`` and ``hbm_bytes`` are the traffic
    report's figures for the group alone (-1 when refused)."""

    levels: tuple[Level, ...]
    verdict: Verdict
    reason: str = ""
    time_ns: float = -1.0
    hbm_bytes: int = -1

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise TilingError(f"candidate verdict {self.verdict!r} must be one of {list(VERDICTS)}")

    @property
    def iterations(self) -> int:
        n = 1
        for lv in self.levels:
            n *= lv.count
        return n


@dataclass(frozen=True, slots=True, kw_only=True)
class Alternative:
    """A group the search weighed for a consumer (its last op). Times are changes of the
    run's estimated time against running its ops untiled in the hinted program, up to and
    including this consumer: ``bound_ns`` is the best change of the ops before the group plus
    the group's lower bound from its shapes alone; ``choice`` the group's best candidate (None:
    the bound could not beat the best change found, so the group was not judged) and
    ``change_ns`` the change with it."""

    ops: tuple[str, ...]
    bound_ns: float
    choice: Candidate | None = None
    change_ns: float = 0.0

    def __post_init__(self) -> None:
        require_tuple(self.ops, "alternative: ops", TilingError, str, non_empty=True)
        if self.choice is not None and not isinstance(self.choice, Candidate):
            raise TilingError(f"alternative of {list(self.ops)}: choice is a {type(self.choice).__name__}, "
                              f"not a Candidate")


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupSearch:
    """The search for one consumer: the ops fused with it, every candidate tried in order,
    and the chosen one (an index into ``candidates``; its levels are empty when the group
    runs untiled). ``alternatives``: the other groups the dynamic programming weighed for
    this consumer (``fspyre.stages.tiling_search``), this one among them."""

    consumer: str
    ops: tuple[str, ...]
    candidates: tuple[Candidate, ...]
    chosen: int
    alternatives: tuple[Alternative, ...] = ()

    def __post_init__(self) -> None:
        if not 0 <= self.chosen < len(self.candidates):
            raise TilingError(f"group of {self.consumer}: chosen candidate {self.chosen} is not one of "
                              f"{len(self.candidates)} candidates")

    @property
    def choice(self) -> Candidate:
        return self.candidates[self.chosen]


@dataclass(frozen=True, slots=True, kw_only=True)
class TilingSearch:
    """The result of ``search_tiling``: the plan it found and how it found it."""

    plan: TilingPlan
    groups: tuple[GroupSearch, ...]
    fuse: FuseMode
    note: str = ""  # why the searched groups were not used, when they were not
    compiled: int = 0  # candidates judged by compiling them
    reused: int = 0  # segments whose judgement a structurally equal segment gave
    screened: int = 0  # segments not judged: their lower bound could not beat the best found
    rechecked: int = 0  # whole-program compiles weighing the groups again in context (``_corrected``)

    def __repr__(self) -> str:
        judged = sum(len(g.candidates) for g in self.groups)
        return f"TilingSearch(fuse={self.fuse}, {len(self.groups)} groups searched, {judged} candidates judged)"

    def __post_init__(self) -> None:
        if self.fuse not in FUSE_MODES:
            raise TilingError(f"tiling search: fuse {self.fuse!r} must be one of {list(FUSE_MODES)}")
