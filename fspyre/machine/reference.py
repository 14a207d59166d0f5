"""The untiled reference semantics of a graph: every op over its whole ranges, on host-order
buffers, with each store rounded to the buffer's device format (docs/semantics.md).

This is what the machine-model interpreter must reproduce from bytes; both use the same
index evaluator and the same numeric functions, and nothing else."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from fspyre.ir.graph import Graph, Load, Op, Reduction, iteration_dims
from fspyre.machine import formats, numerics
from fspyre.machine.hostio import check_inputs, device_values, to_host
from fspyre.machine.indexing import compile_index
from fspyre.machine.spyre import Machine, spyre


def open_grid(sizes: list[int], starts: list[int] | None = None) -> list[np.ndarray]:
    """One int64 arange per axis, shaped to broadcast against the others (like np.ix_)."""
    n = len(sizes)
    starts = starts or [0] * n
    return [
        (np.arange(size, dtype=np.int64) + start).reshape([size if i == j else 1 for j in range(n)])
        for i, (size, start) in enumerate(zip(sizes, starts))
    ]


def evaluate(graph: Graph, inputs: Mapping[str, object], machine: Machine | None = None) -> dict[str, np.ndarray]:
    """Run ``graph`` untiled on host buffers; returns ``{output name: host array}``."""
    machine = machine or spyre()
    buffers = graph.buffer_table()
    host = check_inputs({n: buffers[n].type for n in graph.inputs}, inputs)
    values: dict[str, np.ndarray] = {
        n: device_values(host[n], buffers[n].type.dtype, machine).ravel() for n in graph.inputs
    }
    for op in graph.ops:
        values[op.store.buffer] = _run_op(op, values, buffers, machine)
    return {
        out.name: to_host(values[out.buffer].reshape(buffers[out.buffer].type.shape), buffers[out.buffer].type.dtype)
        for out in graph.outputs
    }


def _run_op(op: Op, values: dict[str, np.ndarray], buffers, machine: Machine) -> np.ndarray:
    dims = iteration_dims(op)
    syms = [d.symbol for d in dims]
    grid = open_grid([d.size for d in dims])
    grid_shape = tuple(d.size for d in dims)
    operands, dtypes = [], []
    for o in op.operands:
        if isinstance(o, Load):
            idx = compile_index(o.index, syms)(*grid)
            operands.append(values[o.buffer][idx])
            dtypes.append(buffers[o.buffer].type.dtype)
        else:
            operands.append(o.value)
    out_type = buffers[op.store.buffer].type
    ctype = numerics.compute_dtype(out_type.dtype, dtypes)
    if isinstance(op, Reduction):
        nout = len(op.ranges)
        axes = tuple(range(nout, len(dims)))
        count = int(np.prod([d.size for d in op.reduction_ranges]))
        result = numerics.reduce(op.fn, operands, axes, ctype, count, grid_shape, op.correction)
        result = np.broadcast_to(result, grid_shape[:nout])
    else:
        result = numerics.pointwise(op.fn, operands, ctype, grid_shape)
    fmt = formats.FORMATS[machine.device_format(out_type.dtype)]
    out = np.zeros(out_type.numel, dtype=result.dtype)
    out_syms = [d.symbol for d in op.ranges]
    sidx = compile_index(op.store.index, out_syms)(*open_grid([d.size for d in op.ranges]))
    out[np.broadcast_to(sidx, result.shape)] = result
    if out_type.dtype == "bool":
        out = numerics.bool_store(out)
    return formats.round_to(out, fmt)
