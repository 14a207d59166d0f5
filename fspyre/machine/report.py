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

from fspyre.ir.program import KernelArg, OpSpec, Program, op_fn
from fspyre.ir.report import KernelEstimate, OpTraffic, TrafficReport
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
    f"compute time only for matmul: the MACs of the core with the largest slice (MACs / cores when the split "
    f"is even) / {MACS_PER_NS_PER_CORE:g} MAC/ns/core (PT efficiency 1); "
    "other ops are memory bound",
    "kernel time = max(memory, compute); program time = sum over kernels; no split penalty, fill or launch cost",
)


def _stick_box_bytes(lows: np.ndarray, highs: np.ndarray, device_size: tuple[int, ...], elem_bytes: int) -> int:
    """Bytes of the box from ``lows`` to ``highs``, whole sticks in the stick dim."""
    return device_bytes([int(n) for n in highs[:-1] - lows[:-1] + 1] + [device_size[-1]], elem_bytes)


def _arg_bytes(arg: KernelArg) -> int:
    return device_bytes(arg.device_size, FORMATS[arg.device_dtype].nbytes)


@dataclass(frozen=True, slots=True, kw_only=True)
class _OpBytes:
    """What one run of an op touches, from its shape alone (no names or addresses)."""

    hbm_read: int
    hbm_write: int
    lx_read: int
    lx_write: int
    lx_boxes: tuple[tuple[int, np.ndarray], ...]  # (argument position, bytes per core) of each LX argument
    macs: int
    core_macs: int


def _op_bytes(spec: OpSpec) -> _OpBytes:
    syms = list(spec.iteration_space)
    sizes = [s for s, _ in spec.iteration_space.values()]
    splits = [p for _, p in spec.iteration_space.values()]
    extents = spec.slice_extents
    reduced = reduced_symbols(spec)
    writers = writing_cores(splits, [s in reduced for s in syms])
    hr = hw = lr = lw = 0
    lx_boxes = []
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
        else:
            low, ext = lx_box(lows, highs, arg.device_size)
            per_core = box_bytes(ext, elem) * cores
            lx_boxes.append((k, per_core))
            moved = int(per_core.sum())
            if is_write:
                lw += moved
            else:
                lr += moved
    matmul = op_fn(spec.op) == "matmul"
    return _OpBytes(hbm_read=hr, hbm_write=hw, lx_read=lr, lx_write=lw, lx_boxes=tuple(lx_boxes),
                    macs=math.prod(sizes) if matmul else 0,
                    core_macs=max(math.prod(e for _, e in space) for space in spec.core_spaces) if matmul else 0)


def traffic_report(program: Program) -> TrafficReport:
    """The program carries every size the report needs, so no machine is passed."""
    ops, _ = program_timeline(program)
    out: list[OpTraffic] = []
    kernels: dict[int, list[OpTraffic]] = {}
    lx_peak = np.zeros(program.cores, dtype=np.int64)
    kernel_of: dict[tuple, int] = {}  # a top-level loop (its id) or a top-level op (its time)
    # Ops of one shape (a chain's, a fan-out's: keep_resident estimates each candidate program)
    # touch the same bytes wherever their tensors are: computed once per shape.
    shapes: dict[tuple, _OpBytes] = {}
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
        kernels.setdefault(row.kernel, []).append(row)
    estimates = []
    total_r, total_w = sum(o.hbm_read for o in out), sum(o.hbm_write for o in out)
    # Turnaround is a property of the program's read/write mix; charging it per kernel would make
    # a split into read-only and write-only kernels look free of it at equal bytes.
    turnaround_per_byte = (Fraction(HBM_TURNAROUND_NS_PER_BYTE) * min(total_r, total_w) / (total_r + total_w)
                           if total_r + total_w else Fraction(0))
    per_byte = 1 / Fraction(HBM_BYTES_PER_NS) + turnaround_per_byte
    total = Fraction(0)
    for index, rows in kernels.items():
        r, w = sum(o.hbm_read for o in rows), sum(o.hbm_write for o in rows)
        mem = per_byte * (r + w)
        compute = sum(Fraction(o.core_macs) for o in rows if o.macs) / Fraction(MACS_PER_NS_PER_CORE)
        total += max(mem, compute)
        estimates.append(KernelEstimate(index=index, ops=tuple(o.name for o in rows), hbm_read=r, hbm_write=w,
                                        macs=sum(o.macs for o in rows), memory_ns=float(mem),
                                        compute_ns=float(compute)))
    comp_r = sum(_arg_bytes(a) for a in program.kernel_args if a.is_input)
    comp_w = sum(_arg_bytes(a) for a in {a.buffer: a for a in program.kernel_args
                                                       if not a.is_input}.values())
    return TrafficReport(
        program=program.name, ops=tuple(out), kernels=tuple(estimates), compulsory_read=comp_r,
        compulsory_write=comp_w, lx_peak_per_core=tuple(int(x) for x in lx_peak),
        cores_used=max((o.cores for o in out), default=0), cores=program.cores, time_ns=float(total),
        assumptions=ASSUMPTIONS,
    )
