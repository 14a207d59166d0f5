"""The untiled reference semantics of a graph: every op over its whole ranges, on host-order
buffers, with each store rounded to the buffer's device format (docs/semantics.md).

This is what the machine-model interpreter must reproduce from bytes; both use the same
index evaluator and the same numeric functions, and nothing else."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from fspyre.errors import ExecutionError
from fspyre.ir.graph import Graph, Load, Op, Reduction, Scalar, iteration_dims
from fspyre.machine import formats, numerics
from fspyre.machine.hostio import check_inputs, device_values, to_host
from fspyre.machine.indexing import compile_index
from fspyre.machine.rules import open_grid
from fspyre.machine.spyre import Machine


def evaluate(graph: Graph, inputs: Mapping[str, object], machine: Machine | None = None) -> dict[str, np.ndarray]:
    """Run ``graph`` untiled on host buffers; returns ``{output name: host array}``."""
    from fspyre.pipeline import require_graph, require_machine
    from fspyre.stages.symbolic import concrete_graph

    machine = require_machine(machine, "evaluate")
    graph = require_graph(graph, "evaluate", machine)
    graph = concrete_graph(graph, inputs)  # a symbolic dim takes the size the inputs give it
    return _evaluate(graph, inputs, machine, bounds=False)[0]


def evaluate_with_bounds(graph: Graph, inputs: Mapping[str, object], machine: Machine | None = None
                         ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray | None]]:
    """``evaluate`` plus, per output element, a bound on how far any legal compilation of the
    graph (any tiling, any core count) may be from it: None for an output every compilation
    computes bit for bit. The bound starts at each reduction (summation order) and is carried
    through every later op and store (docs/semantics.md, "What check promises")."""
    from fspyre.pipeline import require_graph, require_machine
    from fspyre.stages.symbolic import concrete_graph

    machine = require_machine(machine, "evaluate_with_bounds")
    graph = require_graph(graph, "evaluate_with_bounds", machine)
    graph = concrete_graph(graph, inputs)
    return _evaluate(graph, inputs, machine, bounds=True)


def _evaluate(graph: Graph, inputs: Mapping[str, object], machine: Machine, bounds: bool):
    buffers = graph.buffer_table()
    host = check_inputs({n: buffers[n].type for n in graph.inputs}, inputs)
    values: dict[str, np.ndarray] = {
        n: device_values(host[n], buffers[n].type.dtype, machine).ravel() for n in graph.inputs
    }
    errors: dict[str, np.ndarray | None] = {n: None for n in graph.inputs}
    producers = {op.store.buffer: op for op in graph.ops}
    for op in graph.ops:
        softmax = _softmax_sum(op, producers, buffers, machine) if bounds else None
        values[op.store.buffer], errors[op.store.buffer] = _run_op(op, values, errors if bounds else None,
                                                                   buffers, machine, softmax)
    outs, out_bounds = {}, {}
    for out in graph.outputs:
        t = buffers[out.buffer].type
        outs[out.name] = to_host(values[out.buffer].reshape(t.shape), t.dtype)
        err = errors[out.buffer]
        fmt = machine.device_format(t.dtype)
        out_bounds[out.name] = None if err is None else numerics.host_bound(
            values[out.buffer], err, fmt, t.dtype).reshape(t.shape)
    return outs, out_bounds


def _softmax_sum(op: Op, producers: Mapping[str, Op], buffers, machine: Machine) -> tuple[str, str] | None:
    """(device format of d, of e) when ``op`` is a softmax's denominator ``sum(e)``, ``e =
    exp(d)``, ``d = s − amax(s)`` over the same one dim: the shape the online rewrite
    (fspyre.stages.online_softmax) may compute with a running max, whose bound is
    ``numerics.online_sum_bound``. None otherwise."""
    if not (isinstance(op, Reduction) and op.fn == "sum" and len(op.reduction_ranges) == 1
            and isinstance(op.operands[0], Load)):
        return None
    e = producers.get(op.operands[0].buffer)
    if not (e is not None and e.fn == "exp" and isinstance(e.operands[0], Load)):
        return None
    d = producers.get(e.operands[0].buffer)
    if not (d is not None and d.fn == "sub"):
        return None
    x, row_max = d.operands
    if not (isinstance(x, Load) and isinstance(row_max, Load)):
        return None
    m = producers.get(row_max.buffer)
    if not (isinstance(m, Reduction) and m.fn == "amax" and isinstance(m.operands[0], Load)
            and m.operands[0].buffer == x.buffer
            and [r.name for r in m.reduction_ranges] == [op.reduction_ranges[0].name]):
        return None
    formats_ = tuple(machine.device_format(buffers[b].type.dtype) for b in (d.store.buffer, e.store.buffer))
    if any(buffers[b].type.dtype not in ("float16", "bfloat16", "float32") for b in (d.store.buffer, e.store.buffer)):
        return None
    return formats_  # type: ignore[return-value]


def _run_op(op: Op, values: dict[str, np.ndarray], errors: dict[str, np.ndarray | None] | None, buffers,
            machine: Machine, softmax: tuple[str, str] | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    dims = iteration_dims(op)
    syms = [d.symbol for d in dims]
    grid = open_grid([d.size for d in dims])
    grid_shape = tuple(d.size for d in dims)
    operands, dtypes, errs = [], [], []
    for o in op.operands:
        if isinstance(o, Load):
            idx = compile_index(o.index, syms)(*grid)
            operands.append(values[o.buffer][idx])
            dtypes.append(buffers[o.buffer].type.dtype)
            err = None if errors is None else errors[o.buffer]
            errs.append(None if err is None else err[idx])
        else:
            operands.append(o.value)
            errs.append(None)
    out_type = buffers[op.store.buffer].type
    ctype = numerics.compute_dtype(out_type.dtype, dtypes, [o.value for o in op.operands if isinstance(o, Scalar)])
    bound = None
    if isinstance(op, Reduction):
        nout = len(op.ranges)
        axes = tuple(range(nout, len(dims)))
        count = int(np.prod([d.size for d in op.reduction_ranges]))
        if op.fn == "gather" and (miss := numerics.gather_misses(operands, axes, grid_shape)):
            raise ExecutionError(f"op {op.name} (gather): {miss}")
        result = numerics.reduce(op.fn, operands, axes, ctype, count, grid_shape, op.correction)
        result = np.broadcast_to(result, grid_shape[:nout])
        if errors is not None and softmax is not None and ctype.kind == "f":
            bound = numerics.online_sum_bound(operands[0], errs[0], axes[0], count, grid_shape, *softmax)
        elif errors is not None:
            bound = numerics.reduce_bound(op.fn, operands, errs, axes, ctype, count, grid_shape, result,
                                          op.correction)
    else:
        result = numerics.pointwise(op.fn, operands, ctype, grid_shape)
        if errors is not None:
            bound = numerics.pointwise_bound(op.fn, operands, errs, grid_shape)
    fmt = machine.device_format(out_type.dtype)
    out_syms = [d.symbol for d in op.ranges]
    sidx = np.broadcast_to(compile_index(op.store.index, out_syms)(*open_grid([d.size for d in op.ranges])),
                           result.shape)
    # a buffer several ops write, each its region (GraphBuilder.concat), keeps what the earlier wrote
    earlier = values.get(op.store.buffer)
    out = np.zeros(out_type.numel, dtype=result.dtype) if earlier is None else earlier.astype(result.dtype)
    out[sidx] = result
    before = None if errors is None or earlier is None else errors.get(op.store.buffer)
    if bound is not None or before is not None:
        err = np.zeros(out_type.numel)
        if bound is not None:
            # an undefined error (inf - inf in a fully masked row) bounds nothing: infinite, not NaN
            err[sidx] = np.broadcast_to(np.where(np.isnan(bound), np.inf, bound), result.shape)
        bound = numerics.store_bound(out, err, fmt, out_type.dtype)
        if before is not None and bound is not None:  # the earlier writers' regions keep the bound their stores gave
            kept = np.ones(out_type.numel, dtype=bool)
            kept[sidx] = False
            bound = np.where(kept, before, bound)
    if out_type.dtype == "bool":
        out = numerics.bool_store(out)
    return formats.round_to(out, formats.FORMATS[fmt]), bound
