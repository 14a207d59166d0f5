"""Traffic and time report of a Program: HBM and LX bytes per op and per program, compulsory
bytes, traffic ratio, LX peak per core, cores used, and the anchor's analytic time estimate
(torch-spyre ``cost_model.py::predict_ops``: a fitted one-directional HBM peak, a read/write
turnaround cost per byte, and a sustained matmul rate per core).

Bytes are counted from the program alone, with the interpreter's rules: an op touches, per
loop iteration, the box its device coordinates span over all its cores (whole sticks, so
stick-padded device bytes), and repeats that every iteration of its enclosing loops. Every
access the program makes is counted, each time it makes it: a tensor two ops read is read
twice unless the program itself keeps it in LX.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import sympy

from fspyre.errors import ExecutionError
from fspyre.ir.program import KernelArg, OpSpec, Program, op_fn
from fspyre.ir.report import KernelEstimate, OpTraffic, TrafficReport
from fspyre.machine.cost_model import (
    LX_SPILL_EXP,
    LX_SPILL_WS,
    MATMUL_LX_SPILL_EXP,
    MATMUL_LX_SPILL_WS,
    MATMUL_TILE_EFF_MAX,
    MATMUL_TILE_H0,
    PT_EXP,
    PT_ROWS0,
    REDUCTION_BW_BASE,
    REDUCTION_BW_RISE,
    REDUCTION_ROWS0,
    SPILL_AREA0,
    SPILL_MAX,
    SPILL_SLOPE,
    SPLIT_AREA0,
    SPLIT_LONG_US,
    SPLIT_SHORT_US,
    TILE_COLS0,
    TILE_EFF0,
    TILE_H0,
    core_underuse,
    lx_spill_derate,
    matmul_spill_factor,
    pt_efficiency,
    reduction_bandwidth_derate,
    split_penalty_ns,
    tile_efficiency,
)
from fspyre.machine.formats import FORMATS
from fspyre.machine.rules import (
    box_bytes,
    coord_bounds,
    device_bytes,
    lx_box,
    program_timeline,
    reduced_symbols,
    writing_cores,
)
from fspyre.machine.spyre import (
    HBM_BYTES_PER_NS,
    HBM_TURNAROUND_NS_PER_BYTE,
    MACS_PER_NS_PER_CORE,
)

ASSUMPTIONS = (
    "HBM bytes: the stick-padded device box each op touches per loop iteration (union over its cores), "
    "times the iterations of its enclosing loops (an op of a loop's first or last iteration only: of the loops "
    "outside that one); graph inputs and outputs at their device size",
    "every HBM access of every op is counted each time the op runs: nothing is assumed to be cached or "
    "cloned into LX unless the program does it",
    "all cores reading the same HBM bytes in one op count them once (the anchor's fitted model charges a "
    "broadcast operand at its own size)",
    "a kernel is a top-level op or a top-level loop nest, with the ops of its loops' first and last iterations; "
    "LX traffic is free and not timed",
    f"memory time = (R + W) / {HBM_BYTES_PER_NS:g} B/ns + {HBM_TURNAROUND_NS_PER_BYTE} ns/B x min(R, W) over the "
    "whole program (fitted one-directional peak and read/write turnaround), charged to each kernel by its "
    "share of the bytes, so the same bytes cost the same whatever the kernel boundaries",
    "time terms from the anchor's fitted model (torch-spyre cost_model.py predict_ops; fitted: pointwise 8.5 % RMS, "
    "reduction 7.2 %, matmul 26-40 %), each only adding time to max(bytes at the peak, MACs at the sustained rate); "
    "a bandwidth derate divides the bytes' time at the peak, not their share of the turnaround, so that fewer bytes "
    "never cost more:",
    f"compute time only for matmul: the MACs of the core with the largest slice / ({MACS_PER_NS_PER_CORE:g} "
    f"MAC/ns/core x PT efficiency min(1, (M/m / {PT_ROWS0})^{PT_EXP})), M/m the rows of the result per core "
    "(the extents on that core of the result's non-stick dims the left operand has and the right one lacks), "
    "tiled or not; other ops are memory bound",
    f"tile height, an op over a tile of an HBM tensor (one that covers part of it: the anchor's coarse-tiled "
    f"kernels): HBM bandwidth x min(1, (h / {TILE_H0})^0.5 (cols / {TILE_COLS0})^0.38), below {TILE_EFF0} the "
    f"gentler {TILE_EFF0} (raw / {TILE_EFF0})^0.1; a matmul x min({MATMUL_TILE_EFF_MAX}, (M/m / "
    f"{MATMUL_TILE_H0:g})^0.68); cols = the elements per core, in whole sticks, of the op's largest HBM tensor along "
    "the dim its sticks run (the per-core slice of that symbol), h = that tensor's per-core box bytes / the bytes "
    "of one row of cols",
    f"LX spill, an op over a tile of an HBM tensor: bandwidth x (cap / ws)^exp when the per-core working set ws = 2 "
    f"x the largest HBM tensor's per-core box passes cap ({LX_SPILL_WS >> 10} KiB, exp {LX_SPILL_EXP}; a matmul "
    f"{MATMUL_LX_SPILL_WS >> 20} MiB, exp {MATMUL_LX_SPILL_EXP}); each term from the op's shape alone, so an op "
    "costs the same in whatever kernel it runs",
    "core under-use: an op on k of the machine's C cores moves its bytes at g(k) / g(C) of the rate, g the anchor's "
    "row-reduction share by cores {1: .11, 2: .22, 4: .43, 8: .54, 16: .54, 32: 1} interpolated log-linearly (the "
    "anchor fits g for row reductions only; fspyre assumes every op's DMA scales alike); matmul compute already "
    "counts the MACs of the busiest core",
    f"a kernel of one non-matmul reduction over R rows (its output elements): bandwidth x min(1, "
    f"({REDUCTION_BW_BASE:g} + {REDUCTION_BW_RISE:g} e^(-R / {REDUCTION_ROWS0:g})) / {HBM_BYTES_PER_NS:g})",
    f"matmul operand spill: + (HBM bytes of both operands) x min({SPILL_MAX}, {SPILL_SLOPE} log2(max(1, area / "
    f"{SPILL_AREA0}))) / {HBM_BYTES_PER_NS:g} B/ns, area = (M/m)(N/n) of the result per core per tile",
    f"matmul split penalty: + max(0, area - {SPLIT_AREA0}) ({SPLIT_LONG_US:g} max(0, log2(long / 8)) + "
    f"{SPLIT_SHORT_US:g} max(0, log2(short / 16))) us per run, long and short the larger and smaller of the result's "
    "row and column core splits",
    "re-reads of a loop-invariant operand are counted as the program makes them, at the full rate (the anchor "
    "charges the excess at 0.85x; fspyre keeps time >= bytes at the peak)",
    "kernel time = max(memory, compute) + split penalty; program time = sum over kernels; no fill or launch cost",
)


def _stick_box_bytes(lows: np.ndarray, highs: np.ndarray, device_size: tuple[int, ...], elem_bytes: int) -> int:
    """Bytes of the box from ``lows`` to ``highs``, whole sticks in the stick dim."""
    return device_bytes([int(n) for n in highs[:-1] - lows[:-1] + 1] + [device_size[-1]], elem_bytes)


def _arg_bytes(arg: KernelArg) -> int:
    return device_bytes(arg.device_size, FORMATS[arg.device_dtype].nbytes)


@dataclass(frozen=True, slots=True, kw_only=True)
class _OpBytes:
    """What one run of an op touches, from its shape alone (no names or addresses), and the
    shape quantities the fitted time terms read (``cost_model``)."""

    hbm_read: int
    hbm_write: int
    lx_read: int
    lx_write: int
    lx_boxes: tuple[tuple[int, np.ndarray], ...]  # (argument position, bytes per core) of each LX argument
    macs: int
    core_macs: int
    # the largest HBM argument's tile on one core: rows of ``cols`` elements (whole sticks),
    # its bytes, and whether the op covers only part of some HBM tensor (a tile of it)
    rows: float = 0.0
    cols: int = 0
    core_box: int = 0
    partial: bool = False
    # a matmul: its rows (M) and columns (N) per core, their core splits, the HBM bytes of its operands
    mm_rows: int = 0
    mm_cols: int = 0
    mm_splits: tuple[int, int] = (1, 1)
    mm_operand_bytes: int = 0
    reduced_rows: int = 0  # a non-matmul reduction: the rows it reduces (its output elements)


def _op_bytes(spec: OpSpec) -> _OpBytes:
    syms = list(spec.iteration_space)
    sizes = [s for s, _ in spec.iteration_space.values()]
    splits = [p for _, p in spec.iteration_space.values()]
    extents = spec.slice_extents
    reduced = reduced_symbols(spec)
    writers = writing_cores(splits, [s in reduced for s in syms])
    matmul = op_fn(spec.op) == "matmul"
    hr = hw = lr = lw = 0
    lx_boxes = []
    rows, cols, core_box, partial = 0.0, 0, 0, False
    operand_bytes = 0
    for k, arg in enumerate(spec.args):
        is_write = k == len(spec.args) - 1
        elem = FORMATS[arg.device_dtype].nbytes
        lows, highs = coord_bounds(arg.device_coordinates, syms, extents)
        cores = writers if is_write else np.ones(len(writers), dtype=bool)
        if arg.memory == "hbm":
            lo, hi = lows[cores].min(axis=0), highs[cores].max(axis=0)
            nbytes = _stick_box_bytes(lo, hi, arg.device_size, elem)
            if is_write:
                hw += nbytes
            else:
                hr += nbytes
                if matmul and k < 2:
                    operand_bytes += nbytes
            _, ext = lx_box(lows, highs, arg.device_size)
            box = int((box_bytes(ext, elem) * cores).max())
            if box > core_box:
                core_box = box
                eps = arg.device_size[-1]  # rows are whole sticks, as their bytes are counted
                cols = -(-_row_elements(arg.device_coordinates[-1], syms, extents) // eps) * eps
                rows = box / (cols * elem)
            partial = partial or nbytes < device_bytes(arg.device_size, elem)
        else:
            low, ext = lx_box(lows, highs, arg.device_size)
            per_core = box_bytes(ext, elem) * cores
            lx_boxes.append((k, per_core))
            moved = int(per_core.sum())
            if is_write:
                lw += moved
            else:
                lr += moved
    mm_rows = mm_cols = 0
    mm_splits = (1, 1)
    if matmul:
        (m_syms, n_sym) = _matmul_dims(spec)
        at = {s: i for i, s in enumerate(syms)}
        mm_rows = math.prod(max(extents[at[s]]) for s in m_syms)
        mm_cols = max(extents[at[n_sym]]) if n_sym is not None else 1
        mm_splits = (math.prod(splits[at[s]] for s in m_syms), splits[at[n_sym]] if n_sym is not None else 1)
    reduced_rows = (math.prod(n for s, n in zip(syms, sizes) if s not in reduced)
                    if reduced and not matmul else 0)
    return _OpBytes(hbm_read=hr, hbm_write=hw, lx_read=lr, lx_write=lw, lx_boxes=tuple(lx_boxes),
                    macs=math.prod(sizes) if matmul else 0,
                    core_macs=max(math.prod(e for _, e in space) for space in spec.core_spaces) if matmul else 0,
                    rows=rows, cols=cols, core_box=core_box, partial=partial, mm_rows=mm_rows, mm_cols=mm_cols,
                    mm_splits=mm_splits,                    mm_operand_bytes=operand_bytes, reduced_rows=reduced_rows)


def _row_elements(stick: sympy.Expr, syms: list[sympy.Symbol], extents) -> int:
    """Elements of a tensor's row on the core with the widest slice: the extent of the symbol
    its stick coordinate walks (1 when no symbol walks it: one value per stick)."""
    free = [s for s in stick.free_symbols if s in syms]
    return math.prod(max(extents[syms.index(s)]) for s in free) if free else 1


def _matmul_dims(spec: OpSpec) -> tuple[list[sympy.Symbol], sympy.Symbol | None]:
    """A matmul's row symbols (M: in the result and the left operand, not the right one) and
    its column symbol (N: the result's stick)."""
    out = spec.args[-1].device_coordinates
    left = frozenset().union(*(c.free_symbols for c in spec.args[0].device_coordinates))
    right = frozenset().union(*(c.free_symbols for c in spec.args[1].device_coordinates))
    n = next(iter(out[-1].free_symbols & set(spec.iteration_space)), None)
    produced = frozenset().union(*(c.free_symbols for c in out))
    return [s for s in spec.iteration_space if s in produced and s in left and s not in right and s != n], n


@dataclass(frozen=True, slots=True)
class _OpTerms:
    """The fitted terms of one run of an op shape (``cost_model``), exact: ``slowdown`` (1 /
    the product of its bandwidth derates) multiplies its bytes' time at the peak (not their
    share of the turnaround); the others are per run."""

    slowdown: Fraction
    spill_bytes: Fraction
    compute: Fraction
    split: Fraction


_ZERO, _ONE = Fraction(0), Fraction(1)


def _op_terms(b: _OpBytes, used: int, cores: int) -> _OpTerms:
    """From the op's shape alone, so an op costs the same in whatever kernel it runs (a tail
    op joined to its loop's last iteration or run after the loop, a copy hoisted into a loop's
    first iteration or run before it). The tile derates apply to an op over a tile of some HBM
    tensor: the anchor fitted them on coarse-tiled kernels; its untiled kernels stream their
    tensors through LX as the backend likes."""
    matmul = b.macs > 0
    derate = core_underuse(used, cores)
    if b.core_box and b.partial:
        derate *= (tile_efficiency(b.mm_rows if matmul else b.rows, b.cols, matmul)
                   * lx_spill_derate(2 * b.core_box, matmul))
    if not matmul:
        return _OpTerms(slowdown=1 / Fraction(derate), spill_bytes=_ZERO, compute=_ZERO, split=_ZERO)
    area = b.mm_rows * b.mm_cols
    return _OpTerms(slowdown=1 / Fraction(derate),
                    spill_bytes=b.mm_operand_bytes * Fraction(matmul_spill_factor(area)),
                    compute=b.core_macs / (Fraction(MACS_PER_NS_PER_CORE) * Fraction(pt_efficiency(b.mm_rows))),
                    split=Fraction(split_penalty_ns(area, *b.mm_splits)))


_SHAPES: dict[tuple, _OpBytes] = {}
_SHAPES_MAX = 1 << 14


def traffic_report(program: Program) -> TrafficReport:
    """The program carries every size the report needs, so no machine is passed. A symbolic
    program's bytes and times are expressions in its sizes: the report is of one size, so it is
    refused with the call that gives it (``instantiate``), not estimated at a guess."""
    if program.symbolic is not None:
        record = program.symbolic
        sizes = {d.name: n for d, n in zip(record.dims, record.witnesses[0])}
        raise ExecutionError(
            f"traffic_report: program {program.name} is symbolic in {', '.join(d.name for d in record.dims)}; "
            f"report it at one size: traffic_report(fspyre.stages.symbolic.instantiate(program, {sizes}))")
    ops, _ = program_timeline(program)
    out: list[OpTraffic] = []
    kernels: dict[int, list[tuple[OpTraffic, _OpBytes]]] = {}
    lx_peak = np.zeros(program.cores, dtype=np.int64)
    kernel_of: dict[tuple, int] = {}  # a top-level loop (its id) or a top-level op (its time)
    # Ops of one shape (a chain's, a fan-out's: keep_resident and the tiling search estimate
    # many candidate programs) touch the same bytes wherever their tensors are: computed once
    # per shape (``_SHAPES``).
    shapes = _SHAPES
    if len(shapes) >= _SHAPES_MAX:
        shapes.clear()  # bounded: a cleared table only costs the shapes again
    for t, spec, chain, counts in ops:
        # a guarded op runs once per iteration of the loops outside its innermost one
        iters = math.prod(counts[:-1] if spec.runs != "every" else counts)
        shape = (spec.op, spec.iteration_space, spec.core_spaces, frozenset(reduced_symbols(spec)),
                 tuple((a.device_coordinates, a.device_size, a.device_dtype, a.memory) for a in spec.args))
        b = shapes.get(shape)
        if b is None:
            b = shapes[shape] = _op_bytes(spec)
        for k, per_core in b.lx_boxes:
            n = min(len(per_core), program.cores)
            lx_peak[:n] = np.maximum(lx_peak[:n], (spec.args[k].address + per_core[:n]) * (per_core[:n] > 0))
        row = OpTraffic(name=spec.name or spec.op, op=op_fn(spec.op), kernel=kernel_of.setdefault(
                            ("loop", chain[0]) if chain else ("op", t), len(kernel_of)),
                        iterations=iters, cores=spec.cores, hbm_read=b.hbm_read * iters, hbm_write=b.hbm_write * iters,
                        lx_read=b.lx_read * iters, lx_write=b.lx_write * iters, macs=b.macs * iters,
                        core_macs=b.core_macs * iters)
        out.append(row)
        kernels.setdefault(row.kernel, []).append((row, b))
    estimates = []
    total_r, total_w = sum(o.hbm_read for o in out), sum(o.hbm_write for o in out)
    # Turnaround is a property of the program's read/write mix; charging it per kernel would make
    # a split into read-only and write-only kernels look free of it at equal bytes.
    turnaround_per_byte = (Fraction(HBM_TURNAROUND_NS_PER_BYTE) * min(total_r, total_w) / (total_r + total_w)
                           if total_r + total_w else Fraction(0))
    per_byte = 1 / Fraction(HBM_BYTES_PER_NS) + turnaround_per_byte
    total = Fraction(0)
    terms: dict[int, _OpTerms] = {}  # per op shape (its _OpBytes)
    for index, members in kernels.items():
        rows = [o for o, _ in members]
        r, w = sum(o.hbm_read for o in rows), sum(o.hbm_write for o in rows)
        # bytes summed exactly per slowdown (most ops of a kernel share one), then timed
        by_slowdown: dict[Fraction, int] = {}
        spill = compute = split = _ZERO
        for o, b in members:
            x = terms.get(id(b))
            if x is None:
                x = terms[id(b)] = _op_terms(b, o.cores, program.cores)
            by_slowdown[x.slowdown] = by_slowdown.get(x.slowdown, 0) + o.hbm_read + o.hbm_write
            if b.macs:
                spill += x.spill_bytes * o.iterations
                compute += x.compute * o.iterations
                split += x.split * o.iterations
        peak = per_byte * (r + w)
        # the derates slow the bytes' transfer at the peak; the turnaround, a share of the whole
        # program's, is left as it is, so fewer bytes anywhere never cost more time
        mem = peak if by_slowdown.keys() == {_ONE} else (
            sum(k * n for k, n in by_slowdown.items()) / Fraction(HBM_BYTES_PER_NS) + turnaround_per_byte * (r + w))
        if spill:
            mem += spill / Fraction(HBM_BYTES_PER_NS)
        if len(members) == 1 and members[0][1].reduced_rows:  # a kernel of one row reduction
            mem /= Fraction(reduction_bandwidth_derate(members[0][1].reduced_rows, HBM_BYTES_PER_NS))
        total += max(mem, compute) + split
        estimates.append(KernelEstimate(index=index, ops=tuple(o.name for o in rows), hbm_read=r, hbm_write=w,
                                        macs=sum(o.macs for o in rows), memory_ns=float(mem),
                                        compute_ns=float(compute), split_ns=float(split),
                                        peak_memory_ns=float(peak)))
    comp_r = sum(_arg_bytes(a) for a in program.kernel_args if a.is_input)
    comp_w = sum(_arg_bytes(a) for a in {a.buffer: a for a in program.kernel_args
                                                       if not a.is_input}.values())
    return TrafficReport(
        program=program.name, ops=tuple(out), kernels=tuple(estimates), compulsory_read=comp_r,
        compulsory_write=comp_w, lx_peak_per_core=tuple(int(x) for x in lx_peak),
        cores_used=max((o.cores for o in out), default=0), cores=program.cores, time_ns=float(total),
        assumptions=ASSUMPTIONS,
    )
