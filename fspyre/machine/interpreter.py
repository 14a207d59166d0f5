"""The machine-model interpreter: runs a Program on simulated Spyre memories.

One HBM byte space and one LX byte space per core. Every tensor access goes through the
program's own data: device coordinates, device sizes, allocations and loop advances turn
each core's slice of the iteration space into byte addresses, and values are encoded to and
decoded from the device formats at those bytes. Nothing is re-derived from the graph, so a
wrong coordinate, stride, split or allocation shows up as wrong numbers or as an
ExecutionError naming the op, tensor, core and address.

How it is fast without changing that meaning (docs/semantics.md, "The interpreter"):

- An op's cores read all their operands before any core writes (the rule of the per-core
  model), so the reads of all cores are one access over the op's whole iteration grid, and the
  writes another. Core identity only matters for LX (each core has its own LX, stacked here
  into one array of ``cores * lx_bytes``), for split reductions (partials combined in slice
  order) and for error reports (recomputed core by core when a check fails).
- Each tensor access is planned once per (program, op): its byte addresses over the grid are
  analysed into a strided view (``base + sum(i_k * stride_k)`` after splitting axes at stick
  and core boundaries), or kept as an index array when they are not affine. A loop iteration
  only offsets the view by the tensor's ``tile_advance``; bounds are the plan's min/max plus
  that offset.
- Written marks stay per byte (exact read-before-write detection) and are set and checked
  through the same views as the data; memories are reused by the next run without zeroing,
  each run marking with its own number (``_Spare``).
- A large op whose blocks are independent runs block by block (``Blocking``): every read is
  checked for the whole op first, then each cache-sized block of the grid is decoded,
  computed, encoded and stored, so no memory-sized temporaries pass through RAM.
- Values convert through tables (``formats``): decoding a 2-byte format, encoding DLFloat16,
  copying float16 host arrays in and out; an exact unary op between 2-byte formats (a copy)
  is one gather of its output bits (``OpPlan.recode``), or none when the bits hold none of the
  few patterns the table changes. A matmul's operands decode in the memory's order
  (``_memory_order``), as the GEMM takes them.
- A store of the same bits to every core's LX (``Spread``) writes one copy, records that the
  others are the same, and makes the other cores' copies when something reads or overwrites
  their bytes (``_Copies``); a region every core holds its own copy of is read by decoding
  one copy when such a record covers it, else by comparing the copies' bits and decoding one
  when they agree (``Replicated``); a large decoded read is remembered until a store touches
  its bytes.

What it reads is what the device reads: the operation from ``OpSpec.op``, each kernel
argument's tensor inside the argument its ``arg_index`` names (bounds per allocation), device
coordinates inside their device dims (tests/machine/test_corruptions.py).
"""

from __future__ import annotations

import functools
import itertools
import math
import mmap
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np

from fspyre.errors import ExecutionError
from fspyre.ir import kinds
from fspyre.ir.frozen import require_fields
from fspyre.ir.graph import POINTWISE_FNS, REDUCTION_OPERANDS, Dim, TensorType
from fspyre.ir.program import KernelArg, LoopSpec, OpSpec, Program, ScalarOperand, Spec, TensorArg, op_fn
from fspyre.machine import formats, numerics
from fspyre.machine.formats import STICK_BYTES
from fspyre.machine.hostio import check_inputs, device_bits, host_array
from fspyre.machine.indexing import compile_index, free_names
from fspyre.machine.layout import device_coordinates, stick_layout
from fspyre.machine.rules import core_slices, lx_box, open_grid, program_timeline, row_major_strides

_VIEW = {1: np.uint8, 2: np.uint16, 4: np.uint32}


def _zeros(size: int) -> np.ndarray:
    """``size`` zero bytes whose pages are zeroed on first touch, 4 KiB at a time. (numpy asks
    for transparent huge pages on a large array, and the first touch of each 2 MiB page then
    zeroes all of it: the LX of 32 cores is 52 MB, of which a small graph touches a few KB
    per core -- 10 ms per run, a sixth of a BertLayer's.)"""
    if size == 0:
        return np.zeros(0, dtype=np.uint8)
    return np.frombuffer(mmap.mmap(-1, size), dtype=np.uint8)


class Memory:
    """A byte space with a written mark per byte: byte ``b`` was written when ``written[b] ==
    mark`` (0xFF; a recycled memory's run number, ``_Spare``). (The interpreter's own state:
    mutable by design.) ``data``/``written`` may be slices of a larger space (the stacked LX)."""

    def __init__(self, name: str, size: int, data: np.ndarray | None = None,
                 written: np.ndarray | None = None, mark: int = 0xFF) -> None:
        self.name = name
        self.size = size
        self.data = _zeros(size) if data is None else data
        self.written = _zeros(size) if written is None else written
        self.mark = mark
        # an element of 1, 2 or 4 bytes all written, read as one unsigned integer
        self.full = {1: mark, 2: mark * 0x0101, 4: mark * 0x01010101}


@dataclass(slots=True, eq=False)
class _Spare:
    """The memory of a finished run whose state nobody keeps (``run_outputs``), handed to the
    next run of the same shape: storing into pages already mapped costs about a third of
    faulting fresh zero pages in, and zeroing what a run wrote costs as much as writing it (a
    tiled BertLayer copies its weights into every core's LX: some 45 MB of stores and as many
    written marks per run). So nothing is zeroed between checked runs: each marks the bytes it
    writes with the next ``mark`` (1, 2, ... 255, then the marks are zeroed and start again),
    which every older mark is below, so a byte reads as written exactly when this run wrote
    it; and a checked run reads no data byte it did not write. A run without written marks
    (``checks="fast"``, which reads unwritten bytes as zeros) zeroes the data first, and a run
    whose memories are kept (``run_program``) starts from zeros and marks 0xFF."""

    data: np.ndarray
    written: np.ndarray
    rows: int  # LX: one row per core
    end: np.ndarray  # per row: the bytes some run may have written there
    mark: int


_SPARES: list[_Spare] = []
_SPARES_MAX = 2  # the newest few: a machine's HBM and LX


def _memory(name: str, size: int, rows: int, check_written: bool, keep: bool) -> tuple[Memory, np.ndarray]:
    """A memory of ``size`` bytes in ``rows`` rows for a run (``_Spare``), and the bytes of each
    row a previous run may have written there."""
    spare = next((s for s in _SPARES if s.data.size == size and s.rows == rows), None) if size else None
    if spare is None:
        return Memory(name, size, mark=0xFF if keep else 1), np.zeros(rows, np.int64)
    _SPARES.remove(spare)

    def zero(arr: np.ndarray) -> None:
        per_row = arr.reshape(rows, -1)
        for row in np.nonzero(spare.end)[0]:
            per_row[row, :spare.end[row]] = 0

    mark = spare.mark
    if keep:
        zero(spare.data)
        zero(spare.written)
        mark = 0xFF
    elif not check_written:
        zero(spare.data)  # the written marks are left alone: this run sets none
    elif mark == 0xFF:
        zero(spare.written)
        mark = 1
    else:
        mark += 1
    return Memory(name, size, spare.data, spare.written, mark), spare.end


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOptions:
    # Reading a byte nobody wrote is an error, not a silent zero. Off (``checks="fast"``), no
    # written bits are kept at all: same results on every program that passes with it on.
    check_written: bool = True
    # Record, per op execution, the HBM sticks its accesses touched (the ground truth the
    # traffic report is checked against). Off by default: it costs a pass over every address.
    trace_hbm: bool = False
    # Grid points per block when a large op runs block by block (``Blocking``); 0 runs every
    # op whole. Results and reports do not depend on it (tests run tiny blocks to prove so).
    block: int = 1 << 14
    # A store of the same bits to every core's LX (``Spread``) writes one copy and makes the
    # others when something reads or overwrites them (``_Copies``); False makes them at the
    # store. Results, memories and reports do not depend on it (tests compare the two).
    lazy_copies: bool = True

    def __post_init__(self) -> None:
        require_fields(self, ExecutionError)
        if self.block < 0:
            raise ExecutionError(f"RunOptions: block={self.block}; use 0 (no blocks) or a positive count of points")


@dataclass(frozen=True, slots=True, kw_only=True)
class HbmTrace:
    """HBM bytes one op touched, as whole 128-byte sticks: per execution (one per iteration of
    its enclosing loops, in execution order), each operand access counted on its own and the
    sticks of one access counted once however many cores touch them."""

    index: int  # the op's position in program order (memcheck.program_timeline)
    name: str
    reads: tuple[int, ...]
    writes: tuple[int, ...]

    @property
    def hbm_read(self) -> int:
        return sum(self.reads)

    @property
    def hbm_write(self) -> int:
        return sum(self.writes)


@dataclass(frozen=True, slots=True, kw_only=True)
class MachineState:
    """The memories after a run, for reports and memory checks."""

    hbm: Memory
    lx: tuple[Memory, ...]
    hbm_trace: tuple[HbmTrace, ...] | None = None  # with ``RunOptions(trace_hbm=True)``, per op in program order


# -- access plans ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Pattern:
    """Element positions of one access over a grid, relative to a base element offset: a
    strided view (``dims``: (size, element stride) per view axis, axes in grid order, each
    grid axis split into one or more view axes) or an index array (``index``)."""

    shape: tuple[int, ...]  # the grid shape the values have
    dims: tuple[tuple[int, int], ...] | None
    index: np.ndarray | None
    start: int  # element offset of grid point 0 (strided) / added to index (gather)
    lo: int  # min and max element offset touched, relative to the same base
    hi: int
    aligned: bool = True  # False: some address is not a whole element (always reported)
    # strided: the view's shape and byte strides (``dims`` as numpy takes them, elements of
    # ``nbytes``), so a view costs one constructor call per access
    view_shape: tuple[int, ...] = ()
    view_strides: tuple[int, ...] = ()
    nbytes: int = 1
    axis_dims: tuple[tuple[tuple[int, int], ...], ...] = ()  # strided: ``dims`` grouped by grid axis
    # strided: the view axes with the grid axes in the order the memory runs (``_memory_order``),
    # () when that is the grid order
    order: tuple[int, ...] = ()


def _memory_order(groups: Sequence[Sequence[tuple[int, int]]]) -> tuple[int, ...]:
    """A permutation of the view axes of a strided access, whose (size, stride) view axes come
    in ``groups``, one per grid axis: the grid axis along which the memory runs finest moved
    last, the others in their order, each keeping its view axes together and in order. A
    decode reading the view in this order walks the memory's runs instead of striding across
    them, and its values, put back into grid order (``_decode``), reshape to the grid without
    a copy. () when that axis is last already. Only for the operands of a matmul, whose GEMM
    takes a matrix in either layout (b kept in the device's (N/64, K, N%64) sticks decodes into
    a row-major [K, N]); any other op computes in grid order, and a transposed operand would
    cost it a copy (so would batch axes out of their order, even for the GEMM)."""
    finest = {k: min((abs(st) for n, st in g if n > 1 and st), default=None) for k, g in enumerate(groups)}
    moving = [k for k, f in finest.items() if f is not None]
    if not moving:
        return ()
    last = min(moving, key=lambda k: (finest[k], -k))
    if last == moving[-1]:
        return ()
    starts = list(itertools.accumulate((len(g) for g in groups), initial=0))
    grid = [k for k in range(len(groups)) if k != last] + [last]
    return tuple(v for k in grid for v in range(starts[k], starts[k + 1]))


def _decode(raw: np.ndarray, fmt: formats.DataFormat, order: tuple[int, ...], shape: tuple[int, ...]) -> np.ndarray:
    """The values of the view ``raw`` over the grid ``shape``, decoded in the view axis ``order``
    (``_memory_order``) and returned in grid order (strided as decoded)."""
    if not order:
        return formats.decode(raw, fmt).reshape(shape)  # C order: the reshape is free
    return formats.decode(raw.transpose(order), fmt).transpose(np.argsort(order)).reshape(shape)


def _positions(p: Pattern) -> np.ndarray:
    """Element offsets of every grid point of ``p`` (grid order, flat), relative to its base."""
    if p.dims is None:
        return np.asarray(p.index).reshape(-1)
    elems = np.full((), p.start, np.int64)
    for size, stride in p.dims:
        elems = elems[..., None] + np.arange(size, dtype=np.int64) * stride
    return elems.reshape(-1)


def _split_line(line: np.ndarray) -> list[tuple[int, int]] | None:
    """``line`` as a nest of affine runs: [(size, stride), ...] outermost first, or None."""
    n = line.size
    if n == 1:
        return [(1, 0)]
    d = np.diff(line)
    if (d == d[0]).all():
        return [(n, int(d[0]))]
    for q in range(n // 2, 1, -1):  # the largest affine inner run first
        if n % q:
            continue
        rows = line.reshape(n // q, q)
        inner = np.diff(rows, axis=1)
        if not (inner == inner[0, 0]).all():
            continue
        outer = _split_line(rows[:, 0])
        if outer is not None:
            return outer + [(q, int(inner[0, 0]))]
    return None


def _pattern(addr: np.ndarray, shape: tuple[int, ...], nbytes: int, ordered: bool = False) -> Pattern:
    """Plan the access whose byte addresses are ``addr`` (broadcastable to ``shape``);
    ``ordered``: its values decode in the memory's order (``Pattern.order``)."""
    addr = np.asarray(addr, dtype=np.int64)
    addr = addr.reshape((1,) * (len(shape) - addr.ndim) + addr.shape)
    if addr.size == 0:
        return Pattern(shape=shape, dims=None, index=np.zeros(shape, np.int64), start=0, lo=0, hi=-1)
    lo, hi = int(addr.min()), int(addr.max())
    if lo % nbytes:  # addresses then are not whole elements: the per-core pass reports it
        return Pattern(shape=shape, dims=None, index=None, start=0, lo=0, hi=0, aligned=False)
    elem = addr // nbytes
    dims: list[tuple[int, int]] = []
    axis_dims: list[tuple[tuple[int, int], ...]] = []
    for k, size in enumerate(shape):
        split = [(size, 0)]
        if elem.shape[k] > 1:
            found = _split_line(elem[tuple(slice(None) if j == k else 0 for j in range(elem.ndim))])
            if found is None:
                dims = []
                break
            split = found
        dims.extend(split)
        axis_dims.append(tuple(split))
    if dims:
        start = int(elem.reshape(-1)[0])
        expect = np.full((), start, np.int64)
        for i, (s, st) in enumerate(dims):
            expect = expect[..., None] + np.arange(s, dtype=np.int64) * st
        if np.array_equal(expect, np.broadcast_to(elem, shape).reshape([s for s, _ in dims])):
            return Pattern(shape=shape, dims=tuple(dims), index=None, start=start, lo=lo // nbytes, hi=hi // nbytes,
                           view_shape=tuple(s for s, _ in dims), view_strides=tuple(st * nbytes for _, st in dims),
                           nbytes=nbytes, axis_dims=tuple(axis_dims),
                           order=_memory_order(axis_dims) if ordered else ())
    return Pattern(shape=shape, dims=None, index=np.broadcast_to(elem, shape), start=0,
                   lo=lo // nbytes, hi=hi // nbytes)


def _sum_terms(terms: Sequence[tuple[np.ndarray | int, int]], base: int) -> np.ndarray:
    """``base + sum(coord * weight)`` over broadcast coordinate arrays; equal shapes first."""
    by_shape: dict[tuple[int, ...], np.ndarray | int] = {}
    for coord, weight in terms:
        c = np.asarray(coord)
        by_shape[c.shape] = by_shape.get(c.shape, 0) + c * weight
    out: np.ndarray | int = base
    for p in sorted(by_shape.values(), key=np.size):
        out = out + p
    return np.asarray(out)


@dataclass(frozen=True, slots=True)
class Access:
    """One tensor operand of an op, for all cores of the op at once."""

    arg: TensorArg | KernelArg  # a kernel argument at copy-in and copy-out
    fmt: formats.DataFormat
    lx: bool
    pattern: Pattern
    advance: tuple[int, ...]  # byte step per enclosing loop iteration (HBM; LX: from slot to slot)
    core_range: np.ndarray | None  # LX: [cores, 2] local byte min/max per core (bounds per core)
    # LX: every core's addresses inside its LX and aligned at the first iteration (known when
    # the access is planned; an access walking LX slots is checked again per iteration
    # against ``lx_span``)
    lx_ok: bool = True
    replicated: Replicated | None = None
    spread: Spread | None = None  # LX store: the same bytes to several cores (``_spread``)
    # HBM: the bytes of the kernel argument the tensor's arg_index names, which every access
    # must stay inside (the runtime hands the kernel one base per argument); None for an
    # intermediate, which must stay outside every argument
    region: tuple[int, int] | None = None
    lx_span: tuple[int, int] = (0, 0)  # LX: bytes lo..hi any core touches, in its own LX, at offset 0 (``_span``)


@dataclass(frozen=True, slots=True)
class Replicated:
    """A load from LX along grid axes the tensor's coordinates do not use but the op splits
    across cores: its addresses move along such an axis only from one core's slice to the next
    (each core holds its own copy of a region and reads it whole). The load reads the view
    with the points of a slice collapsed (``shape``/``strides``); when every slice holds the
    same bits, the values do not depend on those axes and are decoded once (size 1 along them),
    else they are spread back over the points."""

    shape: tuple[int, ...]  # the view with each replicated axis's points collapsed to 1
    strides: tuple[int, ...]
    slice_axes: tuple[int, ...]  # the view axes of the slices, compared for equal bits
    same_shape: tuple[int, ...]  # the values when all slices are equal: the grid, 1 along replicated axes
    cores: frozenset[int]  # the cores whose LX the load reads
    order: tuple[int, ...] = ()  # the view axes of one slice in memory order (``_memory_order``)


@dataclass(frozen=True, slots=True)
class Spread:
    """An LX store that puts one region on several cores: the grid axes it splits across cores
    are not in the tensor's coordinates (one point per core, the same local addresses on
    each), every other axis is whole on each core, and each core's elements fill its local
    bytes ``lo``..``hi`` without a gap. When the stored bits do not vary along those axes
    (``_store``), every core of ``cores`` then holds the same bytes there, all written: the
    ``_Machine.replicas`` record a load of that region trusts instead of comparing the copies."""

    axes: tuple[int, ...]  # the grid axes the cores differ along
    cores: frozenset[int]
    lo: int
    hi: int


@dataclass(slots=True, eq=False)
class _Copies:
    """The copies a ``Spread`` store has not made yet (interpreter state, mutable): the bytes
    ``spread.lo``..``spread.hi`` of the LX of ``cores`` are to equal those of ``source``, which
    the store wrote. Any store touching those bytes first makes them all (it may leave some of
    them); a read of them makes those of the cores it reads (a covered replicated read: of the
    cores of its first slice, the source's as a rule)."""

    spread: Spread
    source: int
    cores: set[int]


def _replicated(p: Pattern, axes: Sequence[int], cores: frozenset[int], ordered: bool) -> Replicated | None:
    """``axes``: the grid axes to try (split across cores, not used by the coordinates);
    ``cores``: those the load touches; ``ordered``: as ``_pattern``'s."""
    if p.dims is None or not p.aligned or not axes:
        return None
    shape: list[int] = []
    strides: list[int] = []
    slice_axes: list[int] = []
    same: list[int] = []
    one_slice: list[tuple[tuple[int, int], ...]] = []  # the view dims of the first slice, per grid axis
    for k, (n, dims) in enumerate(zip(p.shape, p.axis_dims)):
        if k in axes and n > 1 and dims[0][1] != 0 and all(st == 0 for _, st in dims[1:]):
            slice_axes.append(len(shape))
            shape += [dims[0][0]] + [1] * (len(dims) - 1)
            strides += [dims[0][1] * p.nbytes] + [0] * (len(dims) - 1)
            same.append(1)
            one_slice.append(((1, 0),) * len(dims))
        else:
            shape += [size for size, _ in dims]
            strides += [st * p.nbytes for _, st in dims]
            same.append(n)
            one_slice.append(dims)
    if not slice_axes:
        return None
    return Replicated(shape=tuple(shape), strides=tuple(strides), slice_axes=tuple(slice_axes),
                      same_shape=tuple(same), cores=cores, order=_memory_order(one_slice) if ordered else ())


def _spread(p: Pattern, sizes: tuple[int, ...], splits: tuple[int, ...], copies: Sequence[int],
            core_range: np.ndarray, nb: int) -> Spread | None:
    """The ``Spread`` of an LX store, or None. ``copies``: its grid axes split across cores
    and not used by the coordinates."""
    axes = [k for k, s in enumerate(splits) if s > 1]
    if p.dims is None or not p.aligned or not axes or any(k not in copies or sizes[k] != splits[k] for k in axes):
        return None
    touched = np.nonzero(core_range[:, 0] <= core_range[:, 1])[0]
    if touched.size < 2 or not (core_range[touched] == core_range[touched[0]]).all():
        return None
    lo, hi = (int(x) for x in core_range[touched[0]])
    # without a gap: the strides of the other axes, finest first, are the running products
    # of the sizes before them (each element once, the run exactly filling lo..hi)
    reach = 1
    for n, st in sorted((d for k, dims in enumerate(p.axis_dims) if k not in axes for d in dims if d[0] > 1),
                        key=lambda d: abs(d[1])):
        if st != reach:
            return None
        reach *= n
    if reach * nb != hi - lo + nb:
        return None
    return Spread(axes=tuple(axes), cores=frozenset(int(c) for c in touched), lo=lo, hi=hi + nb)


@dataclass(frozen=True, slots=True)
class BlockedAccess:
    """An access cut like its op's grid (``Blocking``): where each block's elements are."""

    outer: tuple[tuple[tuple[int, int], ...], ...]  # view dims of each grid axis before the cut one
    cut: tuple[tuple[int, int], ...] | None  # view dims of the cut axis; None where the access has size 1 there
    tail_shape: tuple[int, ...]  # view shape and byte strides of the axes after the cut one
    tail_strides: tuple[int, ...]
    values_tail: tuple[int, ...]  # the access's grid shape after the cut axis


@dataclass(frozen=True, slots=True)
class Blocking:
    """A large op run block by block: grid axis ``axis`` cut into runs of ``step`` points,
    every axis before it one index at a time, so each block's decoded operands, result and
    encoded bits stay in the CPU cache instead of passing through memory-sized arrays. Only
    for ops whose blocks are independent (pointwise; reductions cut along an output axis)
    and whose accesses are all strided with ``step`` dividing their runs along ``axis``."""

    axis: int
    step: int
    outer: tuple[int, ...]  # grid sizes of the axes before ``axis``
    size: int  # grid size along ``axis``
    operands: tuple[BlockedAccess | None, ...]  # None for scalars
    out: BlockedAccess
    lx_overlap: bool  # an LX operand shares bytes with the LX output on some core
    # per operand: it reads exactly the elements the output writes, point for point, and no
    # two points share one (an in-place op: block k writes only what block k read)
    in_place: tuple[bool, ...]


@dataclass(frozen=True, slots=True)
class OpPlan:
    spec: OpSpec
    syms: tuple
    sizes: tuple[int, ...]  # full size per symbol
    splits: tuple[int, ...]
    fn: str
    ctype: np.dtype
    red_pos: tuple[int, ...]
    out_pos: tuple[int, ...]
    operands: tuple  # ("scalar", value) | ("tensor", Access)
    out: Access
    blocking: Blocking | None = None
    bool_store: bool = False  # the output is a bool buffer: it holds 0 or 1 (docs/semantics.md)
    # an exact unary op between 2-byte formats: the output bits of each of the 65,536 input
    # patterns (``_recode_table``), so a copy moves bits instead of decoding and encoding
    recode: np.ndarray | None = None
    # the patterns ``recode`` changes, when there are at most ``_FEW_MOVED`` of them (a copy
    # between the same formats: DLFloat16's second NaN code, or none): bits holding none of
    # them are their own result, and the gather is skipped (``_recoded``)
    recode_moved: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class _Where:
    """The access an error report is about: its text opens the message, its fields go into
    the ExecutionError's structured fields."""

    text: str
    op: str = ""
    tensor: str = ""
    core: int = -1
    memory: kinds.Memory | Literal[""] = ""

    def __str__(self) -> str:
        return self.text

    def error(self, message: str, address: int) -> ExecutionError:
        return ExecutionError(f"{self.text}: {message}", op=self.op, tensor=self.tensor, core=self.core,
                              memory=self.memory, address=address)


def _what(spec: OpSpec, arg: TensorArg, core: int) -> _Where:
    name = spec.name or spec.op
    return _Where(f"op {name} tensor {arg.name} core {core}", op=name, tensor=arg.name, core=core,
                  memory=arg.memory)


def _core_addresses(arg: TensorArg, syms, space: Sequence[tuple[int, int]], iters) -> np.ndarray:
    """Byte addresses one core touches over its ``space`` ((start, extent) per symbol): the
    per-core model, kept for LX boxes of uneven splits and error reports."""
    fmt = formats.FORMATS[arg.device_dtype]
    grid = open_grid([n for _, n in space], [start for start, _ in space])
    coords = [np.asarray(compile_index(c, syms)(*grid)) for c in arg.device_coordinates]
    moved = sum(i * a for i, a in zip(iters, arg.tile_advance))
    if arg.memory == "hbm":
        strides = row_major_strides(arg.device_size)
        return _sum_terms([(c, st * fmt.nbytes) for c, st in zip(coords, strides)], arg.address + moved)
    # LX: each core holds its own slice, laid out row-major over the slice's extent per device
    # dim (whole sticks in the stick dim), at the same LX address on every core.
    box_lo = np.array([[int(c.min()) if c.size else 0 for c in coords]])
    box_hi = np.array([[int(c.max()) if c.size else 0 for c in coords]])
    lo_arr, ext_arr = lx_box(box_lo, box_hi, arg.device_size)  # the one rule, shared with memcheck
    lows, extents = lo_arr[0].tolist(), ext_arr[0].tolist()
    strides = row_major_strides(extents)
    base = arg.address + moved - sum(lo * st for lo, st in zip(lows, strides)) * fmt.nbytes
    return _sum_terms([(c, st * fmt.nbytes) for c, st in zip(coords, strides)], base)


def _plan_access(arg: TensorArg, spec: OpSpec, syms, sizes: tuple[int, ...], splits: tuple[int, ...],
                 cores: Sequence[int], slices: np.ndarray, spaces: Sequence[Sequence[tuple[int, int]]],
                 lx_bytes: int, store: bool, regions: Mapping[int, tuple[int, int, str]],
                 ordered: bool = False) -> Access:
    """``cores`` touch the grid ``syms``/``sizes`` (full sizes), each its slice ``slices[core]``,
    which covers ``spaces[core]`` ((start, extent) per symbol).
    A load keeps the size-1 axes its addresses do not vary along (numpy broadcasts the values);
    a store covers the whole grid, as every core stores every element of its slice. A load
    ``ordered`` decodes in the memory's order (``_memory_order``)."""
    fmt = formats.FORMATS[arg.device_dtype]
    nb = fmt.nbytes
    _check_coordinates(arg, spec, syms, sizes)
    region = None
    if arg.arg_index >= 0:
        region = regions.get(arg.arg_index)
        if region is None or arg.memory != "hbm":
            name = spec.name or spec.op
            raise ExecutionError(
                f"op {name} tensor {arg.name}: arg_index {arg.arg_index} names no kernel argument "
                f"(the program's are {sorted(regions)})" if region is None else
                f"op {name} tensor {arg.name}: an LX tensor cannot be kernel argument {arg.arg_index}",
                op=name, tensor=arg.name, memory=arg.memory)
    if arg.memory == "hbm":
        grid = open_grid(list(sizes))
        coords = [compile_index(c, syms)(*grid) for c in arg.device_coordinates]
        strides = row_major_strides(arg.device_size)
        addr = _sum_terms([(c, st * nb) for c, st in zip(coords, strides)], arg.address)
        shape = tuple(sizes) if store else (1,) * (len(sizes) - addr.ndim) + addr.shape
        return Access(arg=arg, fmt=fmt, lx=False, pattern=_pattern(addr, shape, nb, ordered),
                      advance=tuple(arg.tile_advance), core_range=None,
                      region=None if region is None else region[:2])
    # LX: per core, its own box; stacked LX puts core c at c * lx_bytes.
    planned = _lx_addresses(arg, syms, sizes, splits, cores, slices, lx_bytes, store) if spec.even else None
    full, core_range = planned if planned is not None else _lx_addresses_per_core(
        arg, syms, sizes, splits, cores, spaces, lx_bytes, store)
    r = core_range
    lx_ok = bool(((r[:, 1] < r[:, 0]) | ((r[:, 0] >= 0) & (r[:, 1] + nb <= lx_bytes) & (r[:, 0] % nb == 0))).all())
    pattern = _pattern(full, full.shape, nb, ordered)
    used = frozenset().union(*map(free_names, arg.device_coordinates))
    copies = [k for k, s in enumerate(syms) if splits[k] > 1 and s.name not in used]
    on = r[:, 0] <= r[:, 1]
    touched = r[on]
    span = (int(touched[:, 0].min()), int(touched[:, 1].max()) + nb) if touched.size else (0, 0)
    return Access(arg=arg, fmt=fmt, lx=True, pattern=pattern, advance=tuple(arg.tile_advance), core_range=core_range,
                  lx_ok=lx_ok,
                  replicated=None if store else _replicated(pattern, copies, frozenset(np.nonzero(on)[0].tolist()),
                                                            ordered),
                  spread=_spread(pattern, sizes, splits, copies, r, nb) if store and lx_ok else None, lx_span=span)


def _check_coordinates(arg: TensorArg, spec: OpSpec, syms, sizes: tuple[int, ...]) -> None:
    """Each device coordinate stays inside its device dim over the op's grid (before any
    loop advance): the tensor's own bounds, which in LX -- laid out over each core's box --
    are the only thing a shifted coordinate changes."""
    grid = open_grid(list(sizes))
    for d, (c, n) in enumerate(zip(arg.device_coordinates, arg.device_size)):
        v = np.asarray(compile_index(c, syms)(*grid))
        lo, hi = (int(v.min()), int(v.max())) if v.size else (0, 0)
        if lo < 0 or hi >= n:
            name = spec.name or spec.op
            raise ExecutionError(f"op {name} tensor {arg.name}: device coordinate {d} ({c}) runs over {lo}..{hi}, "
                                 f"outside its device size {n}", op=name, tensor=arg.name, memory=arg.memory)


def _lx_addresses_per_core(arg: TensorArg, syms, sizes: tuple[int, ...], splits: tuple[int, ...],
                           cores: Sequence[int], spaces: Sequence[Sequence[tuple[int, int]]], lx_bytes: int,
                           store: bool) -> tuple[np.ndarray, np.ndarray]:
    """Byte addresses in the stacked LX over the grid (size 1 along the axes a load does not
    vary along) and each core's local [min, max] ([0, -1]: none): the per-core model, one
    core at a time (what uneven slices run on)."""
    core_range = np.tile(np.array([[0, -1]], dtype=np.int64), (len(spaces), 1))  # [0, -1]: touches nothing
    per_core = {core: _core_addresses(arg, syms, spaces[core], ()) for core in cores}
    # an axis the addresses vary along, or the core does (its own LX), is kept at full size
    varies = [store or splits[k] > 1 or any(a.ndim == len(sizes) and a.shape[k] > 1 for a in per_core.values())
              for k in range(len(sizes))]
    full = np.zeros([n if v else 1 for n, v in zip(sizes, varies)], dtype=np.int64)
    for core, a in per_core.items():
        box = tuple(slice(start, start + n) if v else slice(None) for (start, n), v in zip(spaces[core], varies))
        full[box] = (a + core * lx_bytes).reshape((1,) * (len(sizes) - a.ndim) + a.shape)
        core_range[core] = (int(a.min()), int(a.max())) if a.size else (0, -1)
    return full, core_range


def _lx_addresses(arg: TensorArg, syms, sizes: tuple[int, ...], splits: tuple[int, ...],
                  cores: Sequence[int], slices: np.ndarray, lx_bytes: int, store: bool
                  ) -> tuple[np.ndarray, np.ndarray] | None:
    """What ``_lx_addresses_per_core`` gives, for all cores at once: the coordinates over the
    whole grid, viewed as (slice, point in slice) per axis, give every core's box and layout
    by reductions over the point axes. None when ``cores`` do not hold one slice each."""
    r = len(sizes)
    local = [n // s for n, s in zip(sizes, splits)]
    owner = np.full(splits, -1, dtype=np.int64)  # the core at each slice position
    for c in cores:
        pos = tuple(int(i) for i in slices[c])
        if owner[pos] >= 0:
            return None
        owner[pos] = c
    if (owner < 0).any():
        return None
    nb = formats.FORMATS[arg.device_dtype].nbytes
    grid = open_grid(list(sizes))
    coords = [np.asarray(compile_index(c, syms)(*grid), dtype=np.int64) for c in arg.device_coordinates]
    coords = [c.reshape((1,) * (r - c.ndim) + c.shape) for c in coords]

    def split(x: np.ndarray) -> np.ndarray:  # (slice, point) per axis, 1 where x does not vary
        return x.reshape([d for k in range(r) for d in ((splits[k], local[k]) if x.shape[k] > 1 else (1, 1))])

    points = tuple(range(1, 2 * r, 2))
    parts = [split(c) for c in coords]
    lo = np.stack([np.broadcast_to(c.min(axis=points), splits).reshape(-1) for c in parts], axis=-1)
    hi = np.stack([np.broadcast_to(c.max(axis=points), splits).reshape(-1) for c in parts], axis=-1)
    lows, ext = lx_box(lo, hi, arg.device_size)  # per slice position, row-major over splits
    # row-major over each slice's extents: stride d is the product of the extents after d
    strides = np.cumprod(np.concatenate([np.ones((len(ext), 1), np.int64), ext[:, :0:-1]], axis=1), axis=1)[:, ::-1]
    base = arg.address - (lows * strides).sum(axis=1) * nb
    at_slice = [d for k in range(r) for d in (splits[k], 1)]  # a per-slice value, spread over its points
    addr: np.ndarray = np.reshape(base, at_slice)
    for dim, part in enumerate(parts):
        addr = addr + part * (strides[:, dim] * nb).reshape(at_slice)
    core_range = np.tile(np.array([[0, -1]], dtype=np.int64), (len(slices), 1))
    flat_owner = owner.reshape(-1)
    core_range[flat_owner, 0] = np.broadcast_to(addr.min(axis=points), splits).reshape(-1)
    core_range[flat_owner, 1] = np.broadcast_to(addr.max(axis=points), splits).reshape(-1)
    varies = [store or splits[k] > 1 or any(c.shape[k] > 1 for c in coords) for k in range(r)]
    stacked = addr + (owner * lx_bytes).reshape(at_slice)
    shape = [d for k in range(r) for d in ((splits[k], local[k]) if varies[k] else (1, 1))]
    full = np.broadcast_to(stacked, shape).reshape([n if v else 1 for n, v in zip(sizes, varies)])
    return full, core_range


def _plan_op(spec: OpSpec, program: Program, block: int, regions: Mapping[int, tuple[int, int, str]]) -> OpPlan:
    syms = tuple(spec.iteration_space)
    sizes = tuple(size for size, _ in spec.iteration_space.values())
    splits = tuple(split for _, split in spec.iteration_space.values())
    info = spec.op_info
    name = spec.name or spec.op
    # The device runs ``spec.op``: the operation comes from it (op_info says only how), so a
    # wrong op computes something else or is refused.
    fn = op_fn(spec.op)
    arity = POINTWISE_FNS.get(fn, 1) if fn not in REDUCTION_OPERANDS else REDUCTION_OPERANDS[fn]
    if (fn not in POINTWISE_FNS and fn not in REDUCTION_OPERANDS) or spec.is_reduction != (fn in REDUCTION_OPERANDS):
        raise ExecutionError(f"op {name}: program op {spec.op!r} with is_reduction={spec.is_reduction} is not an "
                             f"operation the machine runs", op=name)
    if len(info.operands) != arity:
        raise ExecutionError(f"op {name}: {spec.op} takes {arity} operands, op_info gives {len(info.operands)}",
                             op=name)
    *ins, last = spec.args
    moving = [a for a in spec.args if spec.runs != "every" and a.tile_advance and a.tile_advance[-1] != 0]
    if moving:
        raise ExecutionError(f"op {name} runs only in the {spec.runs} iteration of its innermost loop, but tensor "
                             f"{moving[0].name} advances {moving[0].tile_advance[-1]} bytes per iteration there; "
                             f"a guarded op's tensors do not move with that loop", op=name)
    if fn not in REDUCTION_OPERANDS:
        # a pointwise op writes each output element once: a symbol its output does not use
        # can only spread the op over cores, one point each (a copy into every core's LX)
        used = frozenset().union(*map(free_names, last.device_coordinates))
        for s, (size, split) in spec.iteration_space.items():
            if s.name not in used and size != split:
                raise ExecutionError(f"op {name}: symbol {s} (size {size}, split {split}) is not in its output's "
                                     f"coordinates, so every one of its points writes the same elements", op=name)
    else:
        # what a reduction reduces is read off ``op_info`` (``reduced``, ``count``) by the
        # device, and off the output's coordinates by the layout: they must say the same, or
        # one output element would take several points' values (a symbol neither reduced nor
        # in the output) or several elements one partial (a reduced symbol the output varies
        # along), and mean/var would divide by the wrong count
        used = frozenset().union(*map(free_names, last.device_coordinates))
        reduced_names = {s.name for s in info.reduced}
        for s, (size, split) in spec.iteration_space.items():
            if (s.name in reduced_names) == (s.name in used) and (size > 1 or s.name in reduced_names):
                why = "the output varies along it" if s.name in used else "the output does not use it"
                listed = "" if s.name in reduced_names else "not "
                raise ExecutionError(f"op {name}: symbol {s} (size {size}) is {listed}in op_info.reduced "
                                     f"{sorted(reduced_names)}, but {why}", op=name)
        count = math.prod(size for s, (size, _) in spec.iteration_space.items() if s.name in reduced_names)
        if info.count != count:
            raise ExecutionError(f"op {name}: op_info.count is {info.count}, but it reduces "
                                 f"{sorted(reduced_names)}: {count} elements per output", op=name)
    if last.is_input or not all(a.is_input for a in ins):
        raise ExecutionError(f"op {name}: the device reads its inputs, then writes its last arg; is_input is "
                             f"{[a.is_input for a in spec.args]}", op=name)
    reduced = set(info.reduced)
    red_pos = tuple(i for i, s in enumerate(syms) if s in reduced)
    out_pos = tuple(i for i, s in enumerate(syms) if s not in reduced)
    slices = core_slices(list(splits))
    spaces = spec.core_spaces
    all_cores = range(len(slices))
    operands: list[tuple[str, Any]] = []
    for o in info.operands:
        if isinstance(o, ScalarOperand):
            operands.append(("scalar", o.value))
        else:
            # a GEMM takes its operands in either layout: they decode in the memory's order;
            # every other op computes in grid order (a transposed operand would cost it a copy)
            operands.append(("tensor", _plan_access(spec.args[o.index], spec, syms, sizes, splits, all_cores, slices,
                                                    spaces, program.lx_bytes, store=False, regions=regions,
                                                    ordered=fn == "matmul")))
    # the output: with a split reduction, the core holding slice 0 of every reduced symbol
    # stores the value combined in slice order
    writers = [c for c in all_cores if all(slices[c][i] == 0 for i in red_pos)]
    out_slices = slices[:, list(out_pos)] if out_pos else np.zeros((len(slices), 0), np.int64)
    out_spaces = [tuple(space[i] for i in out_pos) for space in spaces]
    out = _plan_access(spec.args[-1], spec, tuple(syms[i] for i in out_pos), tuple(sizes[i] for i in out_pos),
                       tuple(splits[i] for i in out_pos), writers, out_slices, out_spaces, program.lx_bytes,
                       store=True, regions=regions)
    ctype = np.dtype(info.compute)
    if ctype.kind in "iu":
        limits = np.iinfo(ctype)
        for kind, v in operands:
            if kind == "scalar" and not limits.min <= v <= limits.max:  # NaN fails both
                raise ExecutionError(f"op {name}: scalar operand {v} does not fit its compute type {ctype}", op=name)
    bool_store = info.bool_store
    recode, moved = None, None
    if fn in numerics.EXACT_POINTWISE and len(operands) == 1 and operands[0][0] == "tensor":
        src = operands[0][1].fmt
        # (not an int32 op reading a float format: its operand is checked for integers first)
        if src.nbytes == 2 and out.fmt.nbytes == 2 and not (ctype.kind in "iu" and src.is_float):
            recode, moved = _recode_table(fn, ctype.str, bool_store, src.name, out.fmt.name)
    return OpPlan(spec=spec, syms=syms, sizes=sizes, splits=splits, fn=fn, ctype=ctype, red_pos=red_pos,
                  out_pos=out_pos, operands=tuple(operands), out=out,
                  blocking=None if fn == "matmul" else _plan_blocking(sizes, len(out_pos), operands, out, block),
                  bool_store=bool_store, recode=recode, recode_moved=moved)


# A recode table changing at most this many patterns is checked for them (one pass over the
# bits each) instead of gathered (``OpPlan.recode_moved``).
_FEW_MOVED = 2


def _recoded(table: np.ndarray, moved: tuple[int, ...] | None, raw: np.ndarray) -> np.ndarray:
    """``table[raw]`` for a ``_recode_table`` and the patterns it changes (None: many): ``raw``
    itself when it holds none of them, else gathered."""
    if moved is not None and not any((raw == p).any() for p in moved):
        return raw
    return formats.lookup16(table, raw)


@functools.lru_cache(maxsize=None)
def _recode_table(fn: str, ctype: str, bool_store: bool, src: kinds.DeviceFormat,
                  dst: kinds.DeviceFormat) -> tuple[np.ndarray, tuple[int, ...] | None]:
    """The bits a unary ``fn`` stores for each 2-byte pattern it reads: the op computed on every
    pattern's value (``_pointwise``). Exact (correctly rounded) fns only, so that each result
    is the one the op gives in any array, and a gather computes the op. With it, the patterns
    the table changes when they are few (``OpPlan.recode_moved``), else None."""
    values = formats.decode(np.arange(1 << 16, dtype=np.uint16), formats.FORMATS[src])
    with np.errstate(all="ignore"):  # every pattern, NaN included, whether the program holds it or not
        result = _pointwise(fn, ctype=np.dtype(ctype), bool_store=bool_store, values=[values], sizes=values.shape)
    table = formats.encode(result, formats.FORMATS[dst])
    table.setflags(write=False)
    moved = np.nonzero(table != np.arange(1 << 16, dtype=table.dtype))[0]
    return table, (tuple(int(p) for p in moved) if moved.size <= _FEW_MOVED else None)


def _plan_blocking(sizes: tuple[int, ...], n_out: int, operands: Sequence[tuple[str, Any]],
                   out: Access, block: int) -> Blocking | None:
    """Cut the grid into blocks of at most ``block`` points; None when the op should run
    whole: small (under 4 blocks), or its blocks would be under an eighth of ``block`` (the
    per-block Python, about 20 numpy calls, would dominate)."""
    total = math.prod(sizes)
    if not block or total < 4 * block:
        return None
    axis = next(a for a in range(len(sizes)) if math.prod(sizes[a + 1:]) <= block)
    if axis >= n_out:  # a block would cut a reduction
        return None
    accs = [v for kind, v in operands if kind == "tensor"] + [out]
    if any(a.pattern.dims is None or not a.pattern.aligned for a in accs):
        return None
    if 4 * max((math.prod(a.pattern.shape) for a in accs[:-1]), default=1) <= total:
        # the operands do not vary along most of the grid (a copy into every core's LX, say):
        # whole, the op computes at the operands' size and only the store spreads the bits
        return None
    runs = [a.pattern.axis_dims[axis][-1][0] for a in accs if a.pattern.shape[axis] > 1]
    g = math.gcd(*runs) if runs else sizes[axis]
    inner = math.prod(sizes[axis + 1:])
    step = max((d for d in range(1, g + 1) if g % d == 0 and d * inner <= block), default=1)
    if 8 * step * inner < block:
        return None

    def cut(acc: Access) -> BlockedAccess:
        p = acc.pattern
        tail = [d for dims in p.axis_dims[axis + 1:] for d in dims]
        return BlockedAccess(outer=p.axis_dims[:axis], cut=p.axis_dims[axis] if p.shape[axis] > 1 else None,
                             tail_shape=tuple(n for n, _ in tail), tail_strides=tuple(st * p.nbytes for _, st in tail),
                             values_tail=p.shape[axis + 1:])

    in_place = tuple(kind == "tensor" and _same_places(v, out) for kind, v in operands)
    lx_overlap = False
    for (kind, v), same in zip(operands, in_place):
        if kind == "tensor" and v.lx and out.lx and (any(v.advance) or any(out.advance)):
            lx_overlap = True  # slots walked by the loops: the ranges below are those of the first iteration
        elif kind == "tensor" and v.lx and out.lx and not same:
            a, b = v.core_range, out.core_range
            assert a is not None and b is not None  # LX accesses have per-core ranges
            both = (a[:, 0] <= a[:, 1]) & (b[:, 0] <= b[:, 1])
            lx_overlap |= bool((both & (a[:, 0] < b[:, 1] + out.fmt.nbytes)
                                & (b[:, 0] < a[:, 1] + v.fmt.nbytes)).any())
    return Blocking(axis=axis, step=step, outer=sizes[:axis], size=sizes[axis],
                    operands=tuple(cut(v) if kind == "tensor" else None for kind, v in operands),
                    out=cut(out), lx_overlap=lx_overlap, in_place=in_place)


def _same_places(a: Access, out: Access) -> bool:
    """``a`` reads, at every grid point, the element ``out`` writes there (same memory, width
    and strided pattern; compared at equal offsets), and ``out`` writes each element once."""
    p, q = a.pattern, out.pattern
    if q.dims is None or (a.lx, a.fmt.nbytes, p.shape, p.dims, p.start) != (out.lx, out.fmt.nbytes, q.shape,
                                                                             q.dims, q.start):
        return False
    # one element per point: each axis's stride clears the extent of the axes finer than it
    reach = 0
    for n, st in sorted(((n, abs(st)) for n, st in q.dims if n > 1), key=lambda d: d[1]):
        if st <= reach:
            return False
        reach += (n - 1) * st
    return True


def _kernel_type(arg: KernelArg) -> TensorType:
    return TensorType(dims=tuple(Dim(f"h{i}", s) for i, s in enumerate(arg.host_shape)), dtype=arg.dtype)


def _plan_kernel_arg(arg: KernelArg) -> Pattern:
    """Element positions of every host element (host row-major order) of a kernel argument."""
    fmt = formats.FORMATS[arg.device_dtype]
    layout = stick_layout(arg.host_shape, fmt.elems_per_stick)
    if layout.device_size != arg.device_size:
        raise ExecutionError(
            f"kernel arg {arg.name}: device size {list(arg.device_size)} is not the stick layout "
            f"{list(layout.device_size)} of host shape {list(arg.host_shape)}", tensor=arg.name, memory="hbm"
        )
    if tuple(layout.stride_map) != tuple(arg.stride_map):
        raise ExecutionError(
            f"kernel arg {arg.name}: stride map {list(arg.stride_map)} is not the stick layout's "
            f"{list(layout.stride_map)} of host shape {list(arg.host_shape)}", tensor=arg.name, memory="hbm")
    t = _kernel_type(arg)
    syms = [d.symbol for d in t.dims if d.size > 1]
    coords = device_coordinates(layout, t.contiguous_index(), {d.symbol: d.size for d in t.dims})
    shape = tuple(d.size for d in t.dims if d.size > 1)
    grid = open_grid(list(shape))
    strides = row_major_strides(layout.device_size)
    addr = _sum_terms([(compile_index(c, syms)(*grid), st * fmt.nbytes) for c, st in zip(coords, strides)],
                      arg.address)
    return _pattern(addr, shape, fmt.nbytes)


@dataclass(frozen=True, slots=True)
class _ProgramPlan:
    ops: Mapping[int, OpPlan]  # id(OpSpec) -> plan (the program holds the specs alive)
    kernel: tuple[Pattern, ...]
    block: int  # RunOptions.block the op plans cut their grids by
    regions: Mapping[int, tuple[int, int, str]]  # arg_index -> HBM bytes [lo, hi) and name of the argument


def _kernel_regions(program: Program) -> dict[int, tuple[int, int, str]]:
    """Each kernel argument's HBM bytes, by arg_index: where the runtime puts it. (Its own
    product of the device size, not the compiler's byte count: the oracle's second computation.)"""
    regions: dict[int, tuple[int, int, str]] = {}
    for k in program.kernel_args:
        region = (k.address, k.address + math.prod(k.device_size) * formats.FORMATS[k.device_dtype].nbytes, k.name)
        first = regions.setdefault(k.arg_index, region)
        if first[:2] != region[:2]:
            raise ExecutionError(f"kernel arg {k.name}: arg_index {k.arg_index} is also {first[2]} at bytes "
                                 f"{first[0]}..{first[1]}; one argument has one place", tensor=k.name, memory="hbm")
    return regions


_PLANS: OrderedDict[tuple[int, int], tuple[Program, _ProgramPlan]] = OrderedDict()
_PLAN_CACHE_SIZE = 16


def _program_plan(program: Program, block: int) -> _ProgramPlan:
    """Plans are a pure function of the (frozen) program and the block size: cached for the
    last few programs, keyed by identity and holding the program so the id stays its own."""
    key = (id(program), block)
    hit = _PLANS.get(key)
    if hit is not None and hit[0] is program:
        _PLANS.move_to_end(key)
        return hit[1]
    ops: dict[int, OpPlan] = {}
    kernel = tuple(_plan_kernel_arg(a) for a in program.kernel_args)
    # op plans fill in lazily, in execution order
    plan = _ProgramPlan(ops=ops, kernel=kernel, block=block, regions=_kernel_regions(program))
    _PLANS[key] = (program, plan)
    while len(_PLANS) > _PLAN_CACHE_SIZE:
        _PLANS.popitem(last=False)
    return plan


# -- execution ---------------------------------------------------------------------------------


class _Machine:
    """HBM and the stacked LX of all cores, with element views per width."""

    def __init__(self, program: Program, check_written: bool, keep: bool, lazy_copies: bool = True) -> None:
        self.check_written = check_written
        self.lazy_copies = lazy_copies
        self.lx_bytes = program.lx_bytes
        # end of the bytes a store may have reached (``recycle``): in HBM; in the LX of every
        # core (an ordinary store's, counted for all: one comparison per store); and per core,
        # beyond that, where only some cores' LX is written (a spread store's own copy, the
        # copies and marks made later, what earlier runs wrote)
        hbm, hbm_end = _memory("HBM", program.hbm_bytes, 1, check_written, keep)
        self.hbm, self.hbm_end = hbm, int(hbm_end[0])
        lx, lx_row_end = _memory("LX", program.cores * program.lx_bytes, program.cores, check_written, keep)
        self.lx_end = 0
        self.lx_row_end: list[int] = lx_row_end.tolist()
        self.lx_all = lx
        self.lx = tuple(Memory(f"LX of core {c}", program.lx_bytes,
                               lx.data[c * program.lx_bytes:(c + 1) * program.lx_bytes],
                               lx.written[c * program.lx_bytes:(c + 1) * program.lx_bytes], lx.mark)
                        for c in range(program.cores))
        self._views: dict[tuple[int, int, bool], np.ndarray] = {}
        # trace_hbm: id(OpSpec) -> ([read bytes], [written bytes]) per execution
        self.trace: dict[int, tuple[list[int], list[int]]] | None = None
        self._stick_counts: dict[tuple[int, int], int] = {}
        # large decoded reads: (id(Access), offset) -> (lx, first byte, end byte, values),
        # dropped when a store touches those bytes (``_read``)
        self.decoded: dict[tuple[int, int], tuple[bool, int, int, np.ndarray]] = {}
        self.regions: tuple[tuple[int, int, str], ...] = ()  # the kernel arguments' HBM bytes
        # LX regions one store put on several cores, untouched since (``Spread``)
        self.replicas: list[Spread] = []
        # records whose written marks are not set yet: the bytes are written (in this run, for
        # good, whatever stores follow), so the marks are set only when something other than a
        # load the record covers looks at them (``settle``)
        self.unmarked: list[Spread] = []
        # copies a Spread store has not made yet, made when something reads or overwrites
        # their bytes (``make_copies``), and the LX bytes lo..hi they lie in on their cores
        self.uncopied: list[_Copies] = []
        self.uncopied_span = (0, 0)

    def copies_due(self, lo: int, hi: int) -> bool:
        """Some copy not made yet may share a byte with LX bytes ``lo``..``hi``."""
        return bool(self.uncopied) and self.uncopied_span[0] < hi and lo < self.uncopied_span[1]

    def copies_pending(self, u: _Copies) -> None:
        """A spread store left the copies ``u`` to make."""
        self.uncopied.append(u)
        a, b = self.uncopied_span if len(self.uncopied) > 1 else (u.spread.lo, u.spread.hi)
        self.uncopied_span = (min(a, u.spread.lo), max(b, u.spread.hi))

    def stored(self, acc: Access, offset: int, rows: range | None = None) -> None:
        """A store of ``acc`` at ``offset`` (in LX on the cores ``rows``; by default counted for
        every core): remembered reads of its bytes are stale, and the bytes are the next run's
        to zero if it needs zeros there (``_Spare``)."""
        lo, hi = _span(acc, offset)
        if self.decoded:
            self.forget(acc.lx, lo, hi)
        if acc.lx:
            if self.copies_due(lo, hi):  # the bytes the store leaves must hold their copies
                self.make_copies(lo, hi)
            if self.replicas:  # the span is the union over cores: a store to one core's copy ends it
                self.replicas = [t for t in self.replicas if not (t.lo < hi and lo < t.hi)]
            if rows is None:
                self.lx_end = max(self.lx_end, hi)
            else:
                self.wrote(rows, hi)
        else:
            self.hbm_end = max(self.hbm_end, hi)

    def wrote(self, rows: Iterable[int], hi: int) -> None:
        """Bytes below ``hi`` of the LX of cores ``rows`` may hold data or marks (``_Spare``)."""
        ends = self.lx_row_end
        for row in rows:
            if ends[row] < hi:
                ends[row] = hi

    def recycle(self) -> None:
        """Hand the memories to the next run (``_Spare``). Only for a machine whose state
        nobody keeps."""
        ends = (np.array([self.hbm_end], np.int64), np.maximum(np.array(self.lx_row_end, np.int64), self.lx_end))
        for mem, rows, end in ((self.hbm, 1, ends[0]), (self.lx_all, len(self.lx), ends[1])):
            if mem.size:
                _SPARES.insert(0, _Spare(data=mem.data, written=mem.written, rows=rows, end=end, mark=mem.mark))
        del _SPARES[_SPARES_MAX:]

    def settle(self, lo: int, hi: int) -> None:
        """Set the written marks of the replica records that share a byte with LX bytes
        ``lo``..``hi`` (on some core): before any check or report reads those marks, and at the
        end of a run whose memories are kept."""
        keep = []
        for t in self.unmarked:
            if t.lo < hi and lo < t.hi:
                for core in t.cores:
                    self.lx_all.written[core * self.lx_bytes + t.lo:core * self.lx_bytes + t.hi] = self.lx_all.mark
                self.wrote(t.cores, t.hi)
            else:
                keep.append(t)
        self.unmarked = keep

    def make_copies(self, lo: int, hi: int, cores: range | None = None) -> None:
        """Make the copies not made yet (``_Copies``) on ``cores`` (default: all) that share a
        byte with LX bytes ``lo``..``hi``: before anything reads or overwrites them, and at the
        end of a run whose memories are kept."""
        keep = []
        lx, data = self.lx_bytes, self.lx_all.data
        for u in self.uncopied:
            t = u.spread
            if t.lo < hi and lo < t.hi:
                todo = u.cores if cores is None else {c for c in u.cores if c in cores}
                src = data[u.source * lx + t.lo:u.source * lx + t.hi]
                for core in sorted(todo):
                    data[core * lx + t.lo:core * lx + t.hi] = src
                self.wrote(todo, t.hi)
                u.cores -= todo
                if not u.cores:
                    continue
            keep.append(u)
        self.uncopied = keep
        if keep:
            self.uncopied_span = (min(u.spread.lo for u in keep), max(u.spread.hi for u in keep))

    def full(self, lx: bool, nbytes: int) -> int:
        """An element of ``nbytes`` all written, as its written marks read (``Memory.full``)."""
        return (self.lx_all if lx else self.hbm).full[nbytes]

    def forget(self, lx: bool, lo: int, hi: int) -> None:
        """Drop the remembered reads that may share a byte with bytes ``lo``..``hi`` of HBM or
        (on some core) of LX (``_span``)."""
        stale = [k for k, (mem, a, b, _) in self.decoded.items() if mem == lx and a < hi and lo < b]
        for k in stale:
            del self.decoded[k]

    def stick_bytes(self, acc: Access, offset: int) -> int:
        """Bytes of the distinct HBM sticks ``acc`` touches ``offset`` elements on. The count
        depends on the offset only modulo a stick, so it is computed once per phase."""
        start = offset * acc.fmt.nbytes
        key = (id(acc), start % STICK_BYTES)
        n = self._stick_counts.get(key)
        if n is None:
            sticks = (_positions(acc.pattern) * acc.fmt.nbytes + key[1]) // STICK_BYTES
            n = int(np.unique(sticks).size) * STICK_BYTES if sticks.size else 0
            self._stick_counts[key] = n
        return n

    def view(self, lx: bool, nbytes: int, written: bool) -> np.ndarray:
        key = (lx, nbytes, written)
        v = self._views.get(key)
        if v is None:
            mem = self.lx_all if lx else self.hbm
            raw = mem.written if written else mem.data
            v = raw[: raw.size // nbytes * nbytes].view(_VIEW[nbytes])
            self._views[key] = v
        return v


def _select(arr: np.ndarray, p: Pattern, offset: int) -> np.ndarray:
    """The elements of ``arr`` (an element view of ``p.nbytes``) at ``p`` + ``offset``: a view
    when strided (numpy refuses one reaching outside ``arr``)."""
    if p.dims is None:
        assert p.index is not None  # an index pattern (Pattern: dims or index)
        return arr[p.index + offset] if offset else arr[p.index]
    return np.ndarray(p.view_shape, arr.dtype, arr, (p.start + offset) * p.nbytes, p.view_strides)


def _load(m: _Machine, acc: Access, offset: int) -> np.ndarray:
    """The bit patterns at the access, once every byte of them was written."""
    p = acc.pattern
    nb = acc.fmt.nbytes
    if acc.lx and m.uncopied:
        lo, hi = _span(acc, offset)
        if m.copies_due(lo, hi):
            m.make_copies(lo, hi, _cores(m, (p.lo + offset) * nb, (p.hi + offset + 1) * nb))
    raw = _select(m.view(acc.lx, nb, False), p, offset)
    if m.check_written and raw.size:
        if acc.lx and m.unmarked:
            m.settle(*_span(acc, offset))
        seen = _select(m.view(acc.lx, nb, True), p, offset)
        if seen.min() != m.full(acc.lx, nb):
            raise _Unwritten
    return raw


def _read(m: _Machine, acc: Access, offset: int) -> np.ndarray:
    """The values at the access (grid shape, size 1 where they do not vary), once every byte
    of them was written. A large read is remembered until a store touches its bytes: the
    same bytes decode to the same values (a loop re-reading a resident region decodes it once)."""
    key = (id(acc), offset)
    hit = m.decoded.get(key)
    if hit is not None:
        return hit[3]
    r = acc.replicated
    if r is None:
        values = _decode(_load(m, acc, offset), acc.fmt, acc.pattern.order, acc.pattern.shape)
    else:
        values = _read_replicated(m, acc, r, offset)
    if values.size >= _REMEMBER:
        m.decoded[key] = (acc.lx, *_span(acc, offset), values)
    return values


def _cores(m: _Machine, lo: int, hi: int) -> range:
    """The cores whose LX holds some of the stacked LX bytes ``lo``..``hi``."""
    return range(lo // m.lx_bytes, (hi - 1) // m.lx_bytes + 1)


def _span(acc: Access, offset: int) -> tuple[int, int]:
    """Bytes ``lo``..``hi`` the access may touch ``offset`` elements on: in HBM, or in LX
    relative to each core's own LX (the union over cores: the stacked range of an LX access
    runs across every core's LX and would meet every other LX access)."""
    if acc.lx:
        lo, hi = acc.lx_span
        return lo + offset * acc.fmt.nbytes, hi + offset * acc.fmt.nbytes
    p, nb = acc.pattern, acc.fmt.nbytes
    return (p.lo + offset) * nb, (p.hi + offset + 1) * nb


# Decoded reads of at least this many values are remembered (``_Machine.decoded``); smaller
# ones decode faster than a store can check the remembered ranges.
_REMEMBER = 1 << 12


def _read_replicated(m: _Machine, acc: Access, r: Replicated, offset: int) -> np.ndarray:
    nb = acc.fmt.nbytes
    start = (acc.pattern.start + offset) * nb
    data = m.view(acc.lx, nb, False)
    raw = np.ndarray(r.shape, data.dtype, data, start, r.strides)
    first = raw[tuple(slice(0, 1) if i in r.slice_axes else slice(None) for i in range(raw.ndim))]
    lo, hi = _span(acc, offset)
    if any(t.lo <= lo and hi <= t.hi and r.cores <= t.cores for t in m.replicas):
        # one store put these bytes on every core the load reads, and no store touched them
        # since (``Spread``): they are written and the same on every core, unread
        if m.copies_due(lo, hi):  # the first slice's cores hold their copies (the store's own, as a rule)
            reach = [(n - 1) * st for n, st in zip(first.shape, first.strides)]
            m.make_copies(lo, hi, _cores(m, start + sum(x for x in reach if x < 0),
                                         start + sum(x for x in reach if x > 0) + nb))
        return _decode(first, acc.fmt, r.order, r.same_shape)
    if m.copies_due(lo, hi):
        p = acc.pattern
        m.make_copies(lo, hi, _cores(m, (p.lo + offset) * nb, (p.hi + offset + 1) * nb))
    if m.check_written and raw.size:
        if m.unmarked:
            m.settle(lo, hi)
        written = m.view(acc.lx, nb, True)
        if np.ndarray(r.shape, written.dtype, written, start, r.strides).min() != m.full(acc.lx, nb):
            raise _Unwritten
    if np.array_equal(raw, np.broadcast_to(first, raw.shape)):
        # every slice holds the same bits: the same values, whichever core reads them
        return _decode(first, acc.fmt, r.order, r.same_shape)
    values = formats.decode(raw, acc.fmt)
    return np.broadcast_to(values, acc.pattern.view_shape).reshape(acc.pattern.shape)


def _store(m: _Machine, acc: Access, offset: int, raw: np.ndarray) -> None:
    """Store bit patterns ``raw`` (broadcastable to the access's grid) and mark them written."""
    p = acc.pattern
    nb = acc.fmt.nbytes
    if p.dims is None:
        m.stored(acc, offset)
        assert p.index is not None  # an index pattern (Pattern: dims or index)
        idx = p.index + offset if offset else p.index
        m.view(acc.lx, nb, False)[idx] = np.broadcast_to(raw, p.shape)
        if m.check_written:
            m.view(acc.lx, nb, True)[idx] = m.full(acc.lx, nb)
        return
    shape = (1,) * (len(p.shape) - raw.ndim) + raw.shape
    if raw.shape != p.shape:
        # into view axes without spreading: a grid axis the bits do not vary along stays 1
        raw = np.ascontiguousarray(raw).reshape(shape)
        if any(n not in (1, size) for n, size in zip(raw.shape, p.shape)):
            raise AssertionError(f"store of {raw.shape} onto the grid {p.shape}")
        raw = raw.reshape([k if n > 1 else 1 for n, dims in zip(raw.shape, p.axis_dims) for k, _ in dims])
    else:
        raw = raw.reshape(p.view_shape)
    spread = acc.spread
    if spread is not None and all(shape[k] == 1 for k in spread.axes):
        first = (p.start + offset) * nb // m.lx_bytes  # the core of the grid's first point
        m.stored(acc, offset, rows=range(first, first + 1))  # the others' copies: ``make_copies``
        _store_spread(m, acc, spread, raw, offset, first)
        return
    m.stored(acc, offset)
    _select(m.view(acc.lx, nb, False), p, offset)[...] = raw
    if m.check_written:
        _select(m.view(acc.lx, nb, True), p, offset)[...] = m.full(acc.lx, nb)


def _store_spread(m: _Machine, acc: Access, spread: Spread, raw: np.ndarray, offset: int, first: int) -> None:
    """The store of bits that do not vary along the cores of a ``Spread`` (``raw``: view
    axes, 1 along those of the cores), ``offset`` elements on (an LX tensor walking its
    slots): into the first core's LX through the access's view; its bytes ``lo``..``hi`` --
    exactly those the store writes on each core -- are the other cores' copies, copied whole
    into their LX when something reads or overwrites them there (``_Copies``; at once without
    ``RunOptions.lazy_copies``). Whatever looks at a core's LX finds its copy, as on the device.
    ``first``: the core of the grid's first point, whose copy the store writes."""
    p, nb = acc.pattern, acc.fmt.nbytes
    if offset:
        spread = replace(spread, lo=spread.lo + offset * nb, hi=spread.hi + offset * nb)
    at_first = tuple(0 if k in spread.axes else slice(None)
                     for k, dims in enumerate(p.axis_dims) for _ in dims)
    _select(m.view(True, nb, False), p, offset)[at_first] = raw[at_first]
    m.copies_pending(_Copies(spread=spread, source=first, cores=set(spread.cores) - {first}))
    if not m.lazy_copies:
        m.make_copies(spread.lo, spread.hi)
    m.replicas.append(spread)  # after ``stored`` ended those the store overlaps
    if m.check_written:
        m.unmarked.append(spread)  # every byte written: the marks when something reads them


def _write(m: _Machine, acc: Access, offset: int, values: np.ndarray) -> None:
    # encoding is elementwise: encode the values as computed, broadcast the bits
    _store(m, acc, offset, formats.encode(values, acc.fmt))


class _Unwritten(Exception):
    """A batched read found an unwritten element: the per-core pass finds which and reports."""


def _in_bounds(m: _Machine, acc: Access, offset: int) -> bool:
    """Every address of the access (all cores), ``offset`` elements on, is inside its memory."""
    p = acc.pattern
    if not p.aligned:
        return False
    if p.hi < p.lo:
        return True
    nb = acc.fmt.nbytes
    if acc.lx:
        if not offset:
            return acc.lx_ok
        lo, hi = _span(acc, offset)  # the slot this iteration picks, on every core
        return acc.lx_ok and lo >= 0 and hi <= m.lx_bytes
    lo, hi = (p.lo + offset) * nb, (p.hi + offset) * nb + nb
    if lo < 0 or hi > m.hbm.size:
        return False
    if acc.region is not None:
        return acc.region[0] <= lo and hi <= acc.region[1]
    return not any(a < hi and lo < b for a, b, _ in m.regions)


def run_program(program: Program, inputs: Mapping[str, object], options: RunOptions = RunOptions()
                ) -> tuple[dict[str, np.ndarray], MachineState]:
    """Run ``program``: its outputs, and the memories afterwards."""
    outs, m, trace = _execute(program, inputs, options, keep=True)
    m.make_copies(0, m.lx_bytes)  # the state shows every copy
    m.settle(0, m.lx_bytes)  # and every written mark
    return outs, MachineState(hbm=m.hbm, lx=m.lx, hbm_trace=trace)


def run_outputs(program: Program, inputs: Mapping[str, object], options: RunOptions = RunOptions()
                ) -> dict[str, np.ndarray]:
    """Run ``program`` for its outputs alone: the memories are recycled for the next run."""
    outs, m, _ = _execute(program, inputs, options, keep=False)
    outs = {k: v.copy() if np.may_share_memory(v, m.hbm.data) else v for k, v in outs.items()}
    m.recycle()
    return outs


def _execute(program: Program, inputs: Mapping[str, object], options: RunOptions, keep: bool
             ) -> tuple[dict[str, np.ndarray], _Machine, tuple[HbmTrace, ...] | None]:
    types = {a.name: _kernel_type(a) for a in program.kernel_args if a.is_input}
    host = check_inputs(types, inputs)
    plan = _program_plan(program, options.block)
    m = _Machine(program, options.check_written, keep, options.lazy_copies)
    m.regions = tuple(plan.regions.values())
    if options.trace_hbm:
        m.trace = {}
    for arg, p in zip(program.kernel_args, plan.kernel):
        if arg.is_input:
            fmt = formats.FORMATS[arg.device_dtype]
            acc = Access(arg=arg, fmt=fmt, lx=False, pattern=p, advance=(), core_range=None)
            _check_kernel_bounds(m, acc, _Where(f"copy-in of {arg.name}", tensor=arg.name, memory="hbm"))
            _store(m, acc, 0, device_bits(host[arg.name], arg.dtype, fmt).reshape(p.shape))
    _run_body(program.body, (), m, program, plan)
    outs = {}
    for arg, p in zip(program.kernel_args, plan.kernel):
        if not arg.is_input:
            fmt = formats.FORMATS[arg.device_dtype]
            acc = Access(arg=arg, fmt=fmt, lx=False, pattern=p, advance=(), core_range=None)
            what = _Where(f"copy-out of {arg.name}", tensor=arg.name, memory="hbm")
            _check_kernel_bounds(m, acc, what)
            try:
                raw = _load(m, acc, 0)
            except _Unwritten:
                addrs = _positions(p) * fmt.nbytes
                _check_written_bytes(m.hbm, addrs, fmt.nbytes, what)
                raise AssertionError("unreachable: the batched check found an unwritten element") from None
            outs[arg.name] = host_array(raw, fmt, arg.dtype).reshape(arg.host_shape)
    trace = None
    if m.trace is not None:
        ops, _ = program_timeline(program)
        trace = tuple(HbmTrace(index=t, name=spec.name or spec.op, reads=tuple(m.trace.get(id(spec), ([], []))[0]),
                               writes=tuple(m.trace.get(id(spec), ([], []))[1])) for t, spec, _, _ in ops)
    return outs, m, trace


def _check_kernel_bounds(m: _Machine, acc: Access, what: _Where) -> None:
    if not _in_bounds(m, acc, 0):
        p, nb = acc.pattern, acc.fmt.nbytes
        _check_bytes(m.hbm, np.array([p.lo * nb, p.hi * nb]), nb, what)


def _check_bytes(mem: Memory, addrs: np.ndarray, nbytes: int, what: _Where) -> None:
    """Bounds and alignment of byte addresses: the report the per-core model gives."""
    if addrs.size == 0:
        return
    lo, hi = int(addrs.min()), int(addrs.max()) + nbytes
    if lo < 0 or hi > mem.size:
        bad = lo if lo < 0 else hi - nbytes
        raise what.error(f"address {bad:#x} is outside {mem.name} ({mem.size} bytes)", bad)
    if lo % nbytes:
        raise what.error(f"address {lo:#x} is not aligned to {nbytes} bytes in {mem.name}", lo)


def _check_region(m: _Machine, acc: Access, addrs: np.ndarray, what: _Where) -> None:
    """HBM bytes stay inside the kernel argument the tensor's arg_index names, and an
    intermediate's outside every argument: per allocation, not per memory."""
    if acc.lx or addrs.size == 0:
        return
    nb = acc.fmt.nbytes
    lo, hi = int(addrs.min()), int(addrs.max()) + nb
    if acc.region is not None:
        a, b = acc.region
        if lo < a or hi > b:
            bad = lo if lo < a else hi - nb
            raise what.error(f"address {bad:#x} is outside kernel argument {acc.arg.arg_index} (bytes {a:#x}..{b:#x}), "
                             f"which its arg_index names", bad)
        return
    for a, b, name in m.regions:
        if a < hi and lo < b:
            bad = max(lo, a)
            raise what.error(f"address {bad:#x} is inside kernel argument {name} (bytes {a:#x}..{b:#x}), but the "
                             f"tensor is an intermediate (arg_index -1)", bad)


def _check_written_bytes(mem: Memory, addrs: np.ndarray, nbytes: int, what: _Where) -> None:
    seen = mem.written[:mem.size // nbytes * nbytes].view(_VIEW[nbytes])[addrs >> (nbytes.bit_length() - 1)]
    bad = np.nonzero(seen != mem.full[nbytes])[0]
    if bad.size:
        at = int(addrs[bad[0]])
        raise what.error(f"reads {mem.name} address {at:#x}, which was never written", at)


def _run_body(body: tuple[Spec, ...], iters: tuple[int, ...], m: _Machine, program: Program,
              plan: _ProgramPlan, first: bool = True, last: bool = True) -> None:
    for spec in body:
        if isinstance(spec, LoopSpec):
            for i in range(spec.count):
                _run_body(spec.body, iters + (i,), m, program, plan, i == 0, i == spec.count - 1)
        else:
            if spec.runs != "every" and not iters:
                raise ExecutionError(f"op {spec.name or spec.op} runs only in the {spec.runs} iteration of its loop, "
                                     f"but sits in no loop", op=spec.name or spec.op)
            if spec.runs == "first" and not first or spec.runs == "last" and not last:
                continue  # a guarded op (OpSpec.runs): one iteration of its innermost loop
            op = plan.ops.get(id(spec))
            if op is None:
                if spec.cores > program.cores:
                    raise ExecutionError(
                        f"op {spec.name or spec.op}: splits need {spec.cores} cores, the program has {program.cores}",
                        op=spec.name or spec.op)
                op = plan.ops[id(spec)] = _plan_op(spec, program, plan.block, plan.regions)  # type: ignore[index]
            _run_op(op, iters, m)


def _offset(acc: Access, iters: tuple[int, ...]) -> int | None:
    """Element offset of the access in this loop iteration; None when not a whole element."""
    off = sum(i * a for i, a in zip(iters, acc.advance))
    return None if off % acc.fmt.nbytes else off // acc.fmt.nbytes


def _run_op(op: OpPlan, iters: tuple[int, ...], m: _Machine) -> None:
    offsets: list[int] = []
    try:
        for kind, v in op.operands:
            if kind == "scalar":
                offsets.append(0)
                continue
            off = _offset(v, iters)
            if off is None or not _in_bounds(m, v, off):
                raise _Unwritten
            offsets.append(off)
        out_off = _offset(op.out, iters)
        blocked = op.blocking is not None and out_off is not None and _independent(op, offsets, out_off)
        # bits, not values, where the op is a gather from its table (unless the copies each
        # core holds are to be compared and decoded once)
        bits = op.recode is not None and op.operands[0][1].replicated is None
        values = [v if kind == "scalar" else _load(m, v, off) if blocked or bits else _read(m, v, off)
                  for (kind, v), off in zip(op.operands, offsets)]
    except _Unwritten:
        _report_reads(op, iters, m)
        raise AssertionError("unreachable: the batched checks failed, the per-core ones did not") from None
    if out_off is None or not _in_bounds(m, op.out, out_off):
        _report_write(op, iters, m)
    assert out_off is not None  # _report_write raised otherwise
    if blocked:
        _run_blocks(op, offsets, out_off, m)
    elif bits:
        assert op.recode is not None  # ``bits`` says so
        _store(m, op.out, out_off,
               _recoded(op.recode, op.recode_moved, values[0]).reshape(op.operands[0][1].pattern.shape))
    else:
        _write(m, op.out, out_off, _compute(op, values, op.sizes))
    if m.trace is not None:
        _trace(op, offsets, out_off, m.trace, m)


def _compute(op: OpPlan, values: list, sizes: tuple[int, ...]) -> np.ndarray:
    """The op's result over a grid of ``sizes`` (the whole grid, or a block of it)."""
    if op.ctype.kind in "iu":
        # an op computes in int32 only when every operand is an int or a bool
        # (numerics.compute_dtype): one reading a value that is no integer is not that op
        for v in values:
            if isinstance(v, np.ndarray) and v.dtype.kind == "f" and not np.all(np.trunc(v) == v):
                bad = v[np.trunc(v) != v].flat[0]
                raise ExecutionError(f"op {op.spec.name or op.spec.op} computes in {op.ctype} but reads the value "
                                     f"{bad}, which is no integer: an int32 op reads ints and bools only",
                                     op=op.spec.name or op.spec.op)
    if op.fn in REDUCTION_OPERANDS:
        result = _reduce(op, values, sizes)
        return numerics.bool_store(result) if op.bool_store else result
    return _pointwise(op.fn, ctype=op.ctype, bool_store=op.bool_store, values=values, sizes=sizes)


def _pointwise(fn: str, *, ctype: np.dtype, bool_store: bool, values: list, sizes: tuple[int, ...]) -> np.ndarray:
    if fn in numerics.EXACT_POINTWISE:
        # computed over the operands' own broadcast shape; the store spreads the bits
        shapes = [np.shape(v) for v in values if isinstance(v, np.ndarray)]
        if shapes:
            sizes = np.broadcast_shapes(*shapes)
    result = numerics.pointwise(fn, values, ctype, sizes)
    return numerics.bool_store(result) if bool_store else result


def _independent(op: OpPlan, offsets: Sequence[int], out_off: int) -> bool:
    """No operand shares a byte with the output, so writing block by block cannot change
    what a later block reads (every read was checked before the first write)."""
    b = op.blocking
    if b is None or b.lx_overlap:
        return False
    out = op.out
    if out.lx:
        return True
    onb = out.fmt.nbytes
    olo, ohi = (out.pattern.lo + out_off) * onb, (out.pattern.hi + out_off + 1) * onb
    for (kind, v), off, same in zip(op.operands, offsets, b.in_place):
        if kind == "tensor" and not v.lx and not (same and off == out_off):
            nb = v.fmt.nbytes
            if (v.pattern.lo + off) * nb < ohi and olo < (v.pattern.hi + off + 1) * nb:
                return False
    return True


def _block_view(arr: np.ndarray, acc: Access, ba: BlockedAccess, offset: int, index: tuple[int, ...],
                r0: int, step: int) -> np.ndarray:
    """The elements of ``acc`` (``offset`` elements on) at the grid block whose axes before the
    cut one are at ``index`` and whose cut axis runs ``r0`` to ``r0 + step``."""
    p = acc.pattern
    pos = p.start + offset
    for i, dims in zip(index, ba.outer):
        for n, st in reversed(dims):
            pos += (i % n) * st
            i //= n
    if ba.cut is None:
        head, strides = 1, 0
    else:
        i = r0
        for n, st in reversed(ba.cut):
            pos += (i % n) * st
            i //= n
        head, strides = step, ba.cut[-1][1] * p.nbytes
    return np.ndarray((head, *ba.tail_shape), arr.dtype, arr, pos * p.nbytes, (strides, *ba.tail_strides))


def _run_blocks(op: OpPlan, offsets: Sequence[int], out_off: int, m: _Machine) -> None:
    b = op.blocking
    assert b is not None
    ones = (1,) * b.axis
    tensors = [(v, ba, off, m.view(v.lx, v.fmt.nbytes, False))
               for (kind, v), ba, off in zip(op.operands, b.operands, offsets) if ba is not None]
    out, oba = op.out, b.out
    onb = out.fmt.nbytes
    m.stored(out, out_off)
    odata, owritten = m.view(out.lx, onb, False), m.view(out.lx, onb, True)
    full = m.full(out.lx, onb)
    for index in itertools.product(*(range(n) for n in b.outer)):
        for r0 in range(0, b.size, b.step):
            if op.recode is not None:  # a gather of the output bits (``OpPlan.recode``)
                (v, ba, off, arr), = tensors
                bits = _recoded(op.recode, op.recode_moved, _block_view(arr, v, ba, off, index, r0, b.step)).reshape(
                    ones + (b.step if ba.cut else 1,) + ba.values_tail)
            else:
                block = [formats.decode(_block_view(arr, v, ba, off, index, r0, b.step), v.fmt)
                         .reshape(ones + (b.step if ba.cut else 1,) + ba.values_tail)
                         for v, ba, off, arr in tensors]
                values = iter(block)
                bits = formats.encode(_compute(op, [v if kind == "scalar" else next(values) for kind, v in op.operands],
                                               ones + (b.step,) + op.sizes[b.axis + 1:]), out.fmt)
            raw = np.broadcast_to(bits, ones + (b.step,) + oba.values_tail)
            _block_view(odata, out, oba, out_off, index, r0, b.step)[...] = raw.reshape((b.step, *oba.tail_shape))
            if m.check_written:
                _block_view(owritten, out, oba, out_off, index, r0, b.step)[...] = full


def _trace(op: OpPlan, offsets: Sequence[int], out_offset: int, trace: dict[int, tuple[list[int], list[int]]],
           m: _Machine) -> None:
    """Record the HBM bytes this iteration of ``op`` read and wrote (``offsets``: the element
    offset of each operand in it, as ``_run_op`` checked them)."""
    reads, writes = trace.setdefault(id(op.spec), ([], []))
    reads.append(sum(m.stick_bytes(v, off) for (kind, v), off in zip(op.operands, offsets)
                     if kind == "tensor" and not v.lx))
    writes.append(0 if op.out.lx else m.stick_bytes(op.out, out_offset))


def _reduce(op: OpPlan, values: list, sizes: tuple[int, ...]) -> np.ndarray:
    """Each core reduces its slice; cores sharing an output slice combine in slice order.
    ``sizes``: the grid (the op's, or a block of it cut along an output axis)."""
    red_split = [op.splits[i] for i in op.red_pos]
    if op.fn == "var" and math.prod(red_split) > 1:
        raise ExecutionError(
            f"op {op.spec.name}: var cannot combine partial results across cores; do not split its reduction",
            op=op.spec.name)
    if list(op.red_pos) != list(range(len(op.out_pos), len(op.syms))):
        raise ExecutionError(f"op {op.spec.name}: reduction symbols must follow output symbols", op=op.spec.name)
    if any(len(set(op.spec.slice_extents[i])) > 1 for i in op.red_pos):
        return _reduce_slices(op, values, sizes)
    # split each reduced axis (size n, split s > 1) into (s, n / s): axes of the partials
    grid: list[int] = []
    axes: list[int] = []
    shapes_of = []
    for i, n in enumerate(sizes):
        s = op.splits[i] if i in op.red_pos else 1
        if s > 1:
            grid += [s, n // s]
        else:
            grid.append(n)
        if i in op.red_pos:
            axes.append(len(grid) - 1)
        shapes_of.append(s)

    def split(v):
        if not isinstance(v, np.ndarray):
            return v
        v = v.reshape((1,) * (len(sizes) - v.ndim) + v.shape)
        shape: list[int] = []
        for i, n in enumerate(v.shape):
            s = shapes_of[i]
            shape += ([s, n // s] if n > 1 else [1, 1]) if s > 1 else [n]
        return v.reshape(shape)

    ops = [split(v) for v in values]
    if op.fn == "gather":  # over every core's part at once: each index names one position in all
        every = tuple(i for i in range(len(grid)) if i >= len(op.out_pos))
        if miss := numerics.gather_misses(ops, every, tuple(grid)):
            raise ExecutionError(f"op {op.spec.name} (gather): {miss}", op=op.spec.name)
    info = op.spec.op_info
    part = numerics.reduce(op.fn, ops, tuple(axes), op.ctype, info.count, tuple(grid), info.correction)
    out_shape = tuple(sizes[i] for i in op.out_pos)
    nsplit = sum(1 for s in red_split if s > 1)
    if not nsplit:
        return part if part.shape == out_shape else np.broadcast_to(part, out_shape)
    part = np.broadcast_to(part, out_shape + tuple(s for s in red_split if s > 1))
    keys = itertools.product(*(range(s) for s in red_split if s > 1))  # slice order; nsplit > 0 of them
    acc = part[(...,) + next(keys)]
    for key in keys:
        acc = numerics.combine(op.fn, acc, part[(...,) + key])
    return acc


def _reduce_slices(op: OpPlan, values: list, sizes: tuple[int, ...]) -> np.ndarray:
    """``_reduce`` for slices of any extents: each slice of the split reduced symbols (the
    part one core reduces) is cut out and reduced, then the parts combine in slice order."""
    split = [i for i in op.red_pos if op.splits[i] > 1]
    extents = op.spec.slice_extents
    full = [v.reshape((1,) * (len(sizes) - v.ndim) + v.shape) if isinstance(v, np.ndarray) else v for v in values]
    count, correction = op.spec.op_info.count, op.spec.op_info.correction
    red_axes = tuple(op.red_pos)
    if op.fn == "gather":  # over every core's part at once: each index names one position in all
        if miss := numerics.gather_misses(full, red_axes, sizes):
            raise ExecutionError(f"op {op.spec.name} (gather): {miss}", op=op.spec.name)
    acc = None
    for key in itertools.product(*(range(op.splits[i]) for i in split)):  # slice order
        cut = [slice(None)] * len(sizes)
        grid = list(sizes)
        for i, k in zip(split, key):
            start = sum(extents[i][:k])
            cut[i] = slice(start, start + extents[i][k])
            grid[i] = extents[i][k]
        parts = [v[tuple(c if n > 1 else slice(None) for c, n in zip(cut, v.shape))]
                 if isinstance(v, np.ndarray) else v for v in full]
        p = numerics.reduce(op.fn, parts, red_axes, op.ctype, count, tuple(grid), correction)
        acc = p if acc is None else numerics.combine(op.fn, acc, p)
    out_shape = tuple(sizes[i] for i in op.out_pos)
    assert acc is not None
    return acc if acc.shape == out_shape else np.broadcast_to(acc, out_shape)


# -- error reports: the per-core model, run only when a batched check failed -------------------


def _core_list(op: OpPlan) -> list[tuple[int, tuple[int, ...]]]:
    return list(enumerate(core_slices(list(op.splits)).tolist()))


def _report_reads(op: OpPlan, iters: tuple[int, ...], m: _Machine) -> None:
    m.settle(0, m.lx_bytes)  # (the report reads written marks, never the copies' bytes)
    for core, space in enumerate(op.spec.core_spaces):
        for kind, acc in op.operands:
            if kind == "scalar":
                continue
            mem = m.lx[core] if acc.lx else m.hbm
            what = _what(op.spec, acc.arg, core)
            addrs = _core_addresses(acc.arg, list(op.syms), space, iters).reshape(-1)
            _check_bytes(mem, addrs, acc.fmt.nbytes, what)
            _check_region(m, acc, addrs, what)
            if m.check_written:
                _check_written_bytes(mem, addrs, acc.fmt.nbytes, what)


def _report_write(op: OpPlan, iters: tuple[int, ...], m: _Machine) -> None:
    out_syms = [op.syms[i] for i in op.out_pos]
    for core, slices in _core_list(op):
        if any(slices[i] for i in op.red_pos):
            continue
        acc, arg = op.out, op.spec.args[-1]
        mem = m.lx[core] if acc.lx else m.hbm
        space = op.spec.core_spaces[core]
        addrs = _core_addresses(arg, out_syms, [space[i] for i in op.out_pos], iters).reshape(-1)
        _check_bytes(mem, addrs, acc.fmt.nbytes, _what(op.spec, arg, core))
        _check_region(m, acc, addrs, _what(op.spec, arg, core))
    raise AssertionError("unreachable: the batched bounds check failed, the per-core one did not")
