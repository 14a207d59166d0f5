"""Memory-safety check of a Program: overlapping live allocations, LX overflow, out-of-bounds
accesses, LX slices a consumer reads differently from how its producer wrote them, and reads
of never-written bytes.

It checks against the machine's rules in ``fspyre.machine.rules`` (core slices, coordinate
bounds, LX boxes, lifetimes), the ones the ``allocate`` stage plans with, so whatever the
allocator puts in LX passes this check. It only reads programs: it neither plans nor runs
them (``fspyre.check.check_memory_and_run`` adds an interpreter run).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np

from fspyre.errors import ExecutionError
from fspyre.ir.kinds import Memory
from fspyre.ir.program import LoopSpec, OpSpec, Program, TensorArg
from fspyre.machine import formats
from fspyre.machine.rules import (
    box_bytes,
    coord_bounds,
    device_bytes,
    live_chain,
    live_intervals,
    lx_box,
    moved_within,
    program_timeline,
    reduced_symbols,
    row_major_strides,
    writing_cores,
)

# -- the report --------------------------------------------------------------------------------

IssueKind = Literal["overlap", "lx_overflow", "out_of_bounds", "lx_slice_mismatch", "unwritten_read", "execution"]


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryIssue:
    """One finding. ``kind``: overlap | lx_overflow | out_of_bounds | lx_slice_mismatch |
    unwritten_read | execution. ``core`` is -1 for HBM."""

    kind: IssueKind
    op: str
    tensor: str
    core: int
    memory: Memory
    address: int
    message: str

    def __str__(self) -> str:
        where = f"{self.memory}" + (f" core {self.core}" if self.core >= 0 else "")
        return f"[{self.kind}] op {self.op} tensor {self.tensor} {where} address {self.address:#x}: {self.message}"


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryReport:
    program: str
    issues: tuple[MemoryIssue, ...]
    lx_high_water: tuple[int, ...]  # per core: highest LX byte used + 1
    hbm_bytes: int

    @property
    def clean(self) -> bool:
        return not self.issues

    def __str__(self) -> str:
        peak = max(self.lx_high_water, default=0)
        head = (f"memory check {self.program}: {'CLEAN' if self.clean else f'{len(self.issues)} issue(s)'} "
                f"(HBM {self.hbm_bytes} B, LX high water {peak} B per core)")
        return "\n".join([head] + [f"  {i}" for i in self.issues])


@dataclass(frozen=True, slots=True, kw_only=True)
class _Access:
    time: int
    spec: OpSpec
    arg: TensorArg
    is_write: bool
    cores: np.ndarray  # bool per core of the op: does this core perform the access
    lows: np.ndarray
    highs: np.ndarray
    counts: tuple[int, ...]


def program_accesses(program: Program) -> tuple[list[_Access], dict[str, tuple[int, int]], int]:
    """Every tensor access of the program with its per-core coordinate bounds, the lifetime
    of every tensor, and the number of ops (program time runs over ``range(n)``)."""
    ops, spans = program_timeline(program)
    accesses: list[_Access] = []
    uses: dict[str, list[tuple[int, tuple[int, ...]]]] = {}
    for t, spec, chain, counts in ops:
        syms = list(spec.iteration_space)
        splits = [p for _, p in spec.iteration_space.values()]
        reduced = reduced_symbols(spec)
        writers = writing_cores(splits, [s in reduced for s in syms])
        extents = spec.slice_extents
        for k, arg in enumerate(spec.args):
            is_write = k == len(spec.args) - 1
            lows, highs = coord_bounds(arg.device_coordinates, syms, extents)
            accesses.append(_Access(time=t, spec=spec, arg=arg, is_write=is_write,
                                    cores=writers if is_write else np.ones(len(writers), dtype=bool),
                                    lows=lows, highs=highs, counts=counts))
            uses.setdefault(arg.name, []).append((t, live_chain(chain, spec.runs)))
    return accesses, live_intervals(uses, spans), len(ops)


def _elem(arg: TensorArg) -> int:
    return formats.FORMATS[arg.device_dtype].nbytes


def _name(spec: OpSpec) -> str:
    return spec.name or spec.op


def check_memory(program: Program) -> MemoryReport:
    """Check every allocation and access of ``program`` statically (reads of never-written
    bytes need a run: ``fspyre.check.check_memory_and_run``)."""
    accesses, live, nops = program_accesses(program)
    issues: list[MemoryIssue] = []
    whole = (0, max(nops, 1))
    kernel_inputs = {a.buffer for a in program.kernel_args if a.is_input}
    for a in program.kernel_args:
        live[a.buffer] = whole  # arguments exist for the whole kernel

    def issue(kind: IssueKind, acc: _Access, core: int, address: int, message: str) -> None:
        issues.append(MemoryIssue(kind=kind, op=_name(acc.spec), tensor=acc.arg.name, core=core,
                                  memory=acc.arg.memory, address=int(address), message=message))

    by_tensor: dict[str, list[_Access]] = {}
    for acc in accesses:
        by_tensor.setdefault(acc.arg.name, []).append(acc)
    lx_bytes: dict[str, np.ndarray] = {}  # LX tensor -> per-core footprint (0 where unused)
    where: dict[str, tuple[Memory, int, int]] = {}  # tensor -> (memory, address, device bytes)

    # an unrolled program (no loops: fspyre.lower.unroll) reads each tile of a tensor at its own
    # base inside the tensor; a looped program places every access of a tensor at one address
    unrolled = not any(isinstance(s, LoopSpec) for s in program.body)

    def within(first: TensorArg, acc: _Access) -> bool:
        if not (unrolled and moved_within(first, acc.arg)):
            return False
        lo, hi = _hbm_span(acc)
        return first.address <= acc.arg.address + lo and acc.arg.address + hi <= first.address + device_bytes(
            first.device_size, _elem(first))

    for name, accs in by_tensor.items():
        first = accs[0].arg
        moved = [acc.arg for acc in accs if acc.arg.address != first.address and moved_within(first, acc.arg)]
        if unrolled and moved:  # the allocation starts at the lowest tile's base
            first = min([first, *moved], key=lambda t: t.address)
        where[name] = (first.memory, first.address, device_bytes(first.device_size, _elem(first)))
        for acc in accs:
            arg = acc.arg
            if (arg.memory, arg.address) != (first.memory, first.address) and not within(first, acc):
                issue("overlap", acc, -1, arg.address,
                      f"placed at {arg.memory} {arg.address:#x} here but at {first.memory} {first.address:#x} "
                      f"in op {_name(accs[0].spec)}; every access of a tensor must use one allocation")
            _check_bounds(program, acc, issue, lx_bytes, first.address)
        _check_dataflow(name, accs, name in kernel_inputs, issue)

    issues += _overlaps(accesses, live, where, lx_bytes)
    high = np.zeros(program.cores, dtype=np.int64)
    for name, per_core in lx_bytes.items():
        used = per_core > 0
        high[used] = np.maximum(high[used], where[name][1] + per_core[used])
    return MemoryReport(program=program.name, issues=tuple(issues), lx_high_water=tuple(int(h) for h in high),
                        hbm_bytes=program.hbm_bytes)


def _hbm_span(acc: _Access) -> tuple[int, int]:
    """The bytes an HBM access reaches over all its cores and loop iterations, from its address."""
    arg, elem = acc.arg, _elem(acc.arg)
    cores = np.nonzero(acc.cores)[0]
    strides = np.array(row_major_strides(arg.device_size), dtype=np.int64)
    lo = int((acc.lows[cores] @ strides).min()) * elem
    hi = int((acc.highs[cores] @ strides).max()) * elem + elem
    moves = [(n - 1) * a for n, a in zip(acc.counts, arg.tile_advance)]
    return lo + sum(m for m in moves if m < 0), hi + sum(m for m in moves if m > 0)


def _check_bounds(program: Program, acc: _Access, issue, lx_bytes: dict[str, np.ndarray], base: int) -> None:
    """``base``: where the tensor's allocation starts (an unrolled program's access may start inside it)."""
    arg = acc.arg
    size = np.array(arg.device_size, dtype=np.int64)
    cores = np.nonzero(acc.cores)[0]
    bad = np.nonzero(np.any((acc.lows[cores] < 0) | (acc.highs[cores] >= size), axis=1))[0]
    if len(bad):
        c = int(cores[bad[0]])
        issue("out_of_bounds", acc, c, arg.address,
              f"device coordinates span {acc.lows[c].tolist()}..{acc.highs[c].tolist()} outside device size "
              f"{list(arg.device_size)}")
        return
    elem = _elem(arg)
    if arg.memory == "hbm":
        lo, hi = _hbm_span(acc)
        end = base + device_bytes(arg.device_size, elem)
        if arg.address + lo < base or arg.address + hi > end:
            issue("out_of_bounds", acc, -1, arg.address + hi - elem,
                  f"accesses bytes [{arg.address + lo:#x}, {arg.address + hi:#x}) over all loop iterations, outside "
                  f"its allocation [{base:#x}, {end:#x}); check tile_advance {list(arg.tile_advance)}")
        elif end > program.hbm_bytes:
            issue("out_of_bounds", acc, -1, base,
                  f"allocation [{base:#x}, {end:#x}) ends past HBM ({program.hbm_bytes} bytes)")
        return
    _, ext = lx_box(acc.lows, acc.highs, arg.device_size)
    # an access walking LX slots reaches its last slot in the last iteration of its loops
    if any(a < 0 for a in arg.tile_advance):
        issue("out_of_bounds", acc, -1, arg.address,
              f"LX tile_advance {list(arg.tile_advance)} steps below the allocation at LX {arg.address:#x}")
        return
    reach = sum((n - 1) * a for n, a in zip(acc.counts, arg.tile_advance))
    nbytes = (box_bytes(ext, elem) + reach) * acc.cores
    have = lx_bytes.setdefault(arg.name, np.zeros(program.cores, dtype=np.int64))
    n = min(len(nbytes), program.cores)
    have[:n] = np.maximum(have[:n], nbytes[:n])
    over = np.nonzero(arg.address + nbytes > program.lx_bytes)[0]
    if len(over):
        c = int(over[0])
        issue("lx_overflow", acc, c, arg.address,
              f"needs {int(nbytes[c])} bytes at LX {arg.address:#x} on core {c}, past the {program.lx_bytes}-byte LX")


def _check_dataflow(name: str, accs: list[_Access], is_input: bool, issue) -> None:
    """Reads follow a write (or the tensor is a kernel input). In LX every access after the
    first write must use, on each of its cores, the box the latest earlier write left there."""
    writes = [a for a in accs if a.is_write]
    for acc in accs:
        before = [w for w in writes if w.time < acc.time]
        if not acc.is_write and not before and not is_input:
            issue("unwritten_read", acc, -1, acc.arg.address,
                  "reads a tensor no earlier op writes and that is not a kernel input")
            continue
        if acc.arg.memory != "lx" or not before:
            continue
        w = before[-1]
        wl, we = lx_box(w.lows, w.highs, w.arg.device_size)
        rl, re_ = lx_box(acc.lows, acc.highs, acc.arg.device_size)
        verb = "writes" if acc.is_write else "reads"
        for core in np.nonzero(acc.cores)[0]:
            c = int(core)
            if c >= len(w.cores) or not w.cores[c]:
                if acc.is_write:
                    continue  # a later writer may cover more cores
                issue("lx_slice_mismatch", acc, c, acc.arg.address,
                      f"core {c} reads its LX copy, but op {_name(w.spec)} ({w.spec.cores} cores) never "
                      f"wrote it on core {c}; split both ops the same way or keep {name} in HBM")
                return
            if not (np.array_equal(wl[c], rl[c]) and np.array_equal(we[c], re_[c])):
                issue("lx_slice_mismatch", acc, c, acc.arg.address,
                      f"core {c} {verb} the LX box at {rl[c].tolist()} extent {re_[c].tolist()}, but op "
                      f"{_name(w.spec)} wrote the box at {wl[c].tolist()} extent {we[c].tolist()} there; split "
                      f"both ops the same way or keep {name} in HBM")
                return


def _in_place(a: str, b: str, live: Mapping[str, tuple[int, int]], accesses_at: Mapping[int, list[_Access]],
              where: Mapping[str, tuple[str, int, int]]) -> bool:
    """``b`` takes over ``a``'s slot at ``a``'s last use: one op reads ``a`` there, element for
    element where it writes ``b``, and nothing else of the two lives at once."""
    ea, sb = live[a][1], live[b][0]
    if ea != sb + 1 or where[a][1] != where[b][1]:
        return False
    accs = accesses_at.get(sb, [])
    store = [x for x in accs if x.is_write and x.arg.name == b]
    loads = [x for x in accs if not x.is_write and x.arg.name == a]
    if not store or not loads:
        return False
    s = store[0].arg
    return all(x.arg.device_coordinates == s.device_coordinates and x.arg.device_size == s.device_size
               for x in loads)


def _overlaps(accesses: list[_Access], live: Mapping[str, tuple[int, int]],
              where: Mapping[str, tuple[Memory, int, int]], lx_bytes: Mapping[str, np.ndarray]) -> list[MemoryIssue]:
    accesses_at: dict[int, list[_Access]] = {}
    for acc in accesses:
        accesses_at.setdefault(acc.time, []).append(acc)
    spaces: dict[int, list[tuple[int, int, str]]] = {-1: []}  # core (-1 = HBM) -> (lo, hi, name)
    for name, (mem, addr, nbytes) in where.items():
        if mem == "hbm":
            spaces[-1].append((addr, addr + nbytes, name))
        else:
            for c, n in enumerate(lx_bytes.get(name, ())):
                if n:
                    spaces.setdefault(c, []).append((addr, addr + int(n), name))
    out, checked = [], set()
    for core, items in spaces.items():
        key = tuple(sorted(items))
        if core >= 0 and key in checked:
            continue  # a core laid out like one already checked has the same overlaps
        checked.add(key)
        # Sweep in time: each buffer is compared only with the buffers alive when it is born.
        alive: list[tuple[int, int, str]] = []
        for lo, hi, b in sorted(items, key=lambda x: live[x[2]][0]):
            sb, eb = live[b]
            alive = [x for x in alive if live[x[2]][1] > sb]
            for lo2, hi2, a in alive:
                if lo2 >= hi or lo >= hi2:
                    continue
                if core >= 0 and (_in_place(a, b, live, accesses_at, where)
                                  or _in_place(b, a, live, accesses_at, where)):
                    continue
                op = next((_name(x.spec) for x in accesses_at.get(sb, []) if x.arg.name == b), "?")
                memory: Memory = "hbm" if core < 0 else "lx"
                out.append(MemoryIssue(
                    kind="overlap", op=op, tensor=b, core=core, memory=memory, address=max(lo, lo2),
                    message=f"{b} [{lo:#x}, {hi:#x}) live {list(live[b])} overlaps {a} [{lo2:#x}, {hi2:#x}) live "
                            f"{list(live[a])} in {memory.upper()}" + (f" on core {core}" if core >= 0 else "")))
            alive.append((lo, hi, b))
    return out


def execution_issue(err: ExecutionError) -> MemoryIssue:
    """An interpreter's ExecutionError as a finding, from the error's structured fields."""
    return MemoryIssue(kind="execution", op=err.op or "?", tensor=err.tensor or "?", core=err.core,
                       memory=err.memory or "hbm", address=max(err.address, 0), message=str(err))
