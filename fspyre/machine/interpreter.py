"""The machine-model interpreter: runs a Program on simulated Spyre memories.

One HBM byte space and one LX byte space per core. Every tensor access goes through the
program's own data: device coordinates, device sizes, allocations and loop advances turn
each core's slice of the iteration space into byte addresses, and values are encoded to and
decoded from the device formats at those bytes. Nothing is re-derived from the graph, so a
wrong coordinate, stride, split or allocation shows up as wrong numbers or as an
ExecutionError naming the op, tensor, core and address.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from fspyre.errors import ExecutionError
from fspyre.ir.graph import Dim, TensorType
from fspyre.ir.program import KernelArg, LoopSpec, OpSpec, Program, Spec, TensorArg
from fspyre.machine import formats, numerics
from fspyre.machine.hostio import check_inputs, compute_values, to_host
from fspyre.machine.indexing import compile_index
from fspyre.machine.layout import device_coordinates, row_major_strides, stick_layout
from fspyre.machine.memcheck import core_slices, lx_box
from fspyre.machine.reference import open_grid

_VIEW = {1: np.uint8, 2: np.uint16, 4: np.uint32}
_SHIFT = {1: 0, 2: 1, 4: 2}


class Memory:
    """A byte space with a written-bit per byte. (The interpreter's own state: mutable by
    design.) Storage is allocated on first use: most cores' LX stays untouched."""

    def __init__(self, name: str, size: int) -> None:
        self.name = name
        self.size = size
        self._data: np.ndarray | None = None
        self._written: np.ndarray | None = None

    @property
    def data(self) -> np.ndarray:
        if self._data is None:
            self._data = np.zeros(self.size, dtype=np.uint8)
            self._written = np.zeros(self.size, dtype=np.uint8)
        return self._data

    @property
    def written(self) -> np.ndarray:
        self.data
        assert self._written is not None
        return self._written

    def _index(self, addrs: np.ndarray, nbytes: int, what: str) -> np.ndarray:
        """Element indices into the ``nbytes``-wide view, after bounds and alignment checks."""
        if addrs.size == 0:
            return addrs
        lo, hi = int(addrs.min()), int(addrs.max()) + nbytes
        if lo < 0 or hi > self.size:
            bad = lo if lo < 0 else hi - nbytes
            raise ExecutionError(f"{what}: address {bad:#x} is outside {self.name} ({self.size} bytes)")
        if lo % nbytes:
            raise ExecutionError(f"{what}: address {lo:#x} is not aligned to {nbytes} bytes in {self.name}")
        return addrs >> _SHIFT[nbytes]

    def read(self, addrs: np.ndarray, fmt: formats.DataFormat, what: str, check_written: bool) -> np.ndarray:
        idx = self._index(addrs, fmt.nbytes, what)
        view = _VIEW[fmt.nbytes]
        if check_written and idx.size:
            seen = self.written.view(view)[idx]
            full = np.iinfo(view).max
            if seen.min() != full:
                first = int(np.asarray(addrs)[np.nonzero(seen != full)][0])
                raise ExecutionError(f"{what}: reads {self.name} address {first:#x}, which was never written")
        return formats.decode(self.data.view(view)[idx], fmt)

    def write(self, addrs: np.ndarray, values: np.ndarray, fmt: formats.DataFormat, what: str) -> None:
        idx = self._index(addrs, fmt.nbytes, what)
        view = _VIEW[fmt.nbytes]
        self.data.view(view)[idx] = formats.encode(values, fmt)
        self.written.view(view)[idx] = np.iinfo(view).max


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOptions:
    check_written: bool = True  # reading a byte nobody wrote is an error, not a silent zero


@dataclass(frozen=True, slots=True, kw_only=True)
class MachineState:
    """The memories after a run, for reports and memory checks."""

    hbm: Memory
    lx: tuple[Memory, ...]


def _linear(terms: Sequence[tuple[np.ndarray | int, int]], base: int) -> np.ndarray:
    """``base + sum(coord * weight)`` over broadcast coordinate arrays. Terms of equal shape
    are summed first so only one add runs at the full grid size."""
    by_shape: dict[tuple[int, ...], np.ndarray | int] = {}
    for coord, weight in terms:
        c = np.asarray(coord)
        by_shape[c.shape] = by_shape.get(c.shape, 0) + c * weight
    parts = sorted(by_shape.values(), key=np.size)
    out: np.ndarray | int = base
    for p in parts:
        out = out + p
    return np.asarray(out)


@functools.lru_cache(maxsize=64)
def _kernel_addresses(arg: KernelArg) -> np.ndarray:
    """Byte address of every host element (host row-major order) of a kernel argument."""
    fmt = formats.FORMATS[arg.device_dtype]
    layout = stick_layout(arg.host_shape, fmt.elems_per_stick)
    if layout.device_size != arg.device_size:
        raise ExecutionError(
            f"kernel arg {arg.name}: device size {list(arg.device_size)} is not the stick layout "
            f"{list(layout.device_size)} of host shape {list(arg.host_shape)}"
        )
    t = TensorType(dims=tuple(Dim(f"h{i}", s) for i, s in enumerate(arg.host_shape)), dtype=arg.dtype)
    syms = [d.symbol for d in t.dims if d.size > 1]
    coords = device_coordinates(layout, t.contiguous_index(), {d.symbol: d.size for d in t.dims})
    grid = open_grid([d.size for d in t.dims if d.size > 1])
    strides = row_major_strides(layout.device_size)
    addrs = _linear([(compile_index(c, syms)(*grid), st * fmt.nbytes) for c, st in zip(coords, strides)], arg.address)
    shape = tuple(d.size for d in t.dims if d.size > 1)
    out = np.broadcast_to(addrs, shape).reshape(-1)
    out.setflags(write=False)
    return out


def run_program(program: Program, inputs: Mapping[str, object], options: RunOptions = RunOptions()
                ) -> tuple[dict[str, np.ndarray], MachineState]:
    types = {a.name: TensorType(dims=tuple(Dim(f"h{i}", s) for i, s in enumerate(a.host_shape)), dtype=a.dtype)
             for a in program.kernel_args if a.is_input}
    host = check_inputs(types, inputs)
    state = MachineState(
        hbm=Memory("HBM", program.hbm_bytes),
        lx=tuple(Memory(f"LX of core {c}", program.lx_bytes) for c in range(program.cores)),
    )
    for arg in program.kernel_args:
        if arg.is_input:
            fmt = formats.FORMATS[arg.device_dtype]
            vals = compute_values(host[arg.name], arg.dtype).reshape(-1)
            state.hbm.write(_kernel_addresses(arg), vals, fmt, f"copy-in of {arg.name}")
    _run_body(program.body, (), state, program, options)
    outs = {}
    for arg in program.kernel_args:
        if not arg.is_input:
            fmt = formats.FORMATS[arg.device_dtype]
            vals = state.hbm.read(_kernel_addresses(arg), fmt, f"copy-out of {arg.name}", options.check_written)
            outs[arg.name] = to_host(vals.reshape(arg.host_shape), arg.dtype)
    return outs, state


def _run_body(body: tuple[Spec, ...], iters: tuple[int, ...], state: MachineState, program: Program,
              options: RunOptions) -> None:
    for spec in body:
        if isinstance(spec, LoopSpec):
            for i in range(spec.count):
                _run_body(spec.body, iters + (i,), state, program, options)
        else:
            _run_op(spec, iters, state, program, options)


def _addresses(arg: TensorArg, syms, grid, iters: tuple[int, ...], core: int, spec: OpSpec,
               state: MachineState) -> tuple[Memory, np.ndarray, str]:
    fmt = formats.FORMATS[arg.device_dtype]
    coords = [np.asarray(compile_index(c, syms)(*grid)) for c in arg.device_coordinates]
    what = f"op {spec.name or spec.op} tensor {arg.name} core {core}"
    if arg.memory == "hbm":
        strides = row_major_strides(arg.device_size)
        base = arg.address + sum(i * a for i, a in zip(iters, arg.tile_advance))
        return state.hbm, _linear([(c, st * fmt.nbytes) for c, st in zip(coords, strides)], base), what
    # LX: each core holds its own slice, laid out row-major over the slice's extent per device
    # dim (whole sticks in the stick dim), at the same LX address on every core.
    box_lo = np.array([[int(c.min()) if c.size else 0 for c in coords]])
    box_hi = np.array([[int(c.max()) if c.size else 0 for c in coords]])
    lo_arr, ext_arr = lx_box(box_lo, box_hi, arg.device_size)  # the one rule, shared with memcheck
    lows, extents = lo_arr[0].tolist(), ext_arr[0].tolist()
    strides = row_major_strides(extents)
    base = arg.address - sum(lo * st for lo, st in zip(lows, strides)) * fmt.nbytes
    return state.lx[core], _linear([(c, st * fmt.nbytes) for c, st in zip(coords, strides)], base), what


def _run_op(spec: OpSpec, iters: tuple[int, ...], state: MachineState, program: Program, options: RunOptions) -> None:
    if spec.cores > program.cores:
        raise ExecutionError(
            f"op {spec.name or spec.op}: splits need {spec.cores} cores, the program has {program.cores}"
        )
    syms = list(spec.iteration_space)
    sizes = [size // split for size, split in spec.iteration_space.values()]
    info = spec.op_info
    fn = str(info["fn"])
    ctype = np.dtype(str(info["compute"]))
    reduced = set(info.get("reduced", ()))
    red_pos = [i for i, s in enumerate(syms) if s in reduced]
    out_pos = [i for i, s in enumerate(syms) if s not in reduced]
    out_syms = [syms[i] for i in out_pos]
    out_arg = spec.args[-1]
    out_fmt = formats.FORMATS[out_arg.device_dtype]
    groups: dict[tuple[int, ...], list[tuple[tuple[int, ...], int, np.ndarray, list]]] = {}
    for core, slices in enumerate(core_slices([split for _, split in spec.iteration_space.values()]).tolist()):
        starts = [sl * n for sl, n in zip(slices, sizes)]
        grid = open_grid(sizes, starts)
        grid_shape = tuple(sizes)
        operands = []
        for kind, v in info["operands"]:
            if kind == "scalar":
                operands.append(v)
                continue
            arg = spec.args[v]
            mem, addrs, what = _addresses(arg, syms, grid, iters, core, spec, state)
            operands.append(mem.read(addrs, formats.FORMATS[arg.device_dtype], what, options.check_written))
        if spec.is_reduction:
            axes = tuple(red_pos)
            if red_pos != list(range(len(out_pos), len(syms))):
                raise ExecutionError(f"op {spec.name}: reduction symbols must follow output symbols")
            result = np.broadcast_to(
                numerics.reduce(fn, operands, axes, ctype, int(info["count"]), grid_shape,
                                int(info.get("correction", 0))),
                tuple(sizes[i] for i in out_pos),
            )
        else:
            result = numerics.pointwise(fn, operands, ctype, grid_shape)
        out_grid = [grid[i].reshape([sizes[i] if j == k else 1 for k in range(len(out_pos))])
                    for j, i in enumerate(out_pos)]
        key = tuple(slices[i] for i in out_pos)
        rkey = tuple(slices[i] for i in red_pos)
        groups.setdefault(key, []).append((rkey, core, result, out_grid))
    for parts in groups.values():
        parts.sort(key=lambda p: p[0])
        _, core, acc, out_grid = parts[0]
        if len(parts) > 1 and fn == "var":
            raise ExecutionError(
                f"op {spec.name}: var cannot combine partial results across cores; do not split its reduction"
            )
        for _, _, part, _ in parts[1:]:
            acc = numerics.combine(fn, acc, part)  # cores sharing an output slice: in slice order
        if info.get("store") == "bool":
            acc = numerics.bool_store(acc)
        mem, addrs, what = _addresses(out_arg, out_syms, out_grid, iters, core, spec, state)
        addrs = np.broadcast_to(addrs, acc.shape)
        mem.write(addrs.reshape(-1), np.ascontiguousarray(acc).reshape(-1), out_fmt, what)
