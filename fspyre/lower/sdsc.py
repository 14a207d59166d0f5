"""Per-op SDSC JSON: one JSON-ready dict per OpSpec, keyed ``sdsc_{idx}.json``.

``idx`` is the OpSpec's depth-first index, the same number the bundle's ``sdsc_execute``
names; each tensor's ``address.symbol_id`` is the id the bundle binds to that tensor's
operand. Everything else is the OpSpec written out: iteration space, the core -> slice
mapping (the anchor's rule: first symbol of the iteration space fastest), per-core byte
offsets from the tensor's base and per-loop byte advances. The schema is documented in
docs/sdsc-schema.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import sympy

from fspyre.errors import LoweringError
from fspyre.ir.program import ArgOperand, LoopSpec, OpSpec, Program, TensorArg, op_fn, op_specs, walk_specs
from fspyre.ir.symbolic import is_symbolic
from fspyre.lower.bundle import (
    BundlePlan,
    Execute,
    level_advance,
    op_label,
    plan_bundle,
    tensor_base,
)
from fspyre.machine import formats
from fspyre.machine.indexing import compile_index
from fspyre.machine.rules import core_slices, device_bytes, row_major_strides

SCHEMA = "fspyre.sdsc/3"  # 2: "runs" (an op of its loop's first or last iteration only); 3: op_info "rows", "cols"


def sdsc_json(program: Program) -> dict[str, dict]:
    plan = plan_bundle(program)
    loops = [s.count for s, _ in walk_specs(program.body) if isinstance(s, LoopSpec)]
    specs = op_specs(program)
    out = {
        ex.filename: op_json(spec, ex, plan, loops)
        for spec, ex in zip(specs, plan.executes(), strict=True)
    }
    # a symbolic program's counts, sizes and offsets are expressions in its symbolic sizes,
    # written as text (``"128*|S| + 49152"``); a concrete program's JSON has none
    return _expressions_as_text(out) if program.symbolic is not None else out  # type: ignore[return-value]


def _expressions_as_text(value: object) -> object:
    if isinstance(value, sympy.Basic):
        return int(value) if value.is_Integer else str(value)
    if isinstance(value, dict):
        return {k: _expressions_as_text(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_expressions_as_text(v) for v in value]
    return value


def core_offsets(spec: OpSpec, t: TensorArg) -> list[int]:
    """Bytes from the tensor's base to the first element of each core's slice (its
    ``core_spaces`` starts).

    LX tensors get 0 on every core: each core's scratchpad holds its own slice at the tensor's
    LX address (the interpreter's model)."""
    if t.memory == "lx":
        return [0] * spec.cores
    syms = list(spec.iteration_space)
    if any(is_symbolic(x) for space in spec.core_spaces for x, _ in space) or any(map(is_symbolic, t.device_size)):
        return _symbolic_core_offsets(spec, t)
    starts = np.array([[start for start, _ in space] for space in spec.core_spaces], dtype=np.int64)  # [core, symbol]
    strides = row_major_strides(t.device_size)
    offset = np.zeros(spec.cores, dtype=np.int64)
    for coord, stride in zip(t.device_coordinates, strides):
        offset = offset + np.asarray(compile_index(coord, syms)(*starts.T), dtype=np.int64) * stride
    return [int(v) for v in offset * formats.FORMATS[t.device_dtype].nbytes]


def _symbolic_core_offsets(spec: OpSpec, t: TensorArg) -> list:
    """``core_offsets`` of a symbolic program's op: expressions in its symbolic sizes."""
    strides = row_major_strides(t.device_size)
    nbytes = formats.FORMATS[t.device_dtype].nbytes
    out = []
    for space in spec.core_spaces:
        at = {s: start for s, (start, _) in zip(spec.iteration_space, space)}
        offset = sum((sympy.sympify(c).xreplace(at) * stride for c, stride in zip(t.device_coordinates, strides)),
                     sympy.Integer(0))
        out.append(sympy.expand(offset * nbytes))
    return out


def op_json(spec: OpSpec, ex: Execute, plan: BundlePlan, loop_counts: list[int]) -> dict:
    slices = core_slices([split for _, split in spec.iteration_space.values()])
    depth = len(ex.loops)
    tensors = []
    for i, t in enumerate(spec.args):
        base = tensor_base(spec, t, plan.regions)
        tensors.append({
            "name": t.name,
            "role": "input" if t.is_input else "output",
            "operand": i,
            "arg_index": t.arg_index,
            "device_dtype": t.device_dtype,
            "device_size": list(t.device_size),
            "device_coordinates": [str(c) for c in t.device_coordinates],
            "allocation": {t.memory: t.address},
            "address": {
                "symbol_id": ex.symbol_ids[i],
                "value": f"%{base.name}",
                "base": base.kind,
                "offset": base.offset,
            },
            "core_offsets": core_offsets(spec, t),
            "tile_advance": list(level_advance(spec, t, depth)),
            "bytes": device_bytes(t.device_size, formats.FORMATS[t.device_dtype].nbytes),
        })
    tiled = list(spec.tiled_symbols) or [()] * depth
    if len(tiled) != depth:
        raise LoweringError(
            f"op {op_label(spec)}: tiled_symbols has {len(tiled)} levels inside {depth} loops; "
            f"give one tuple of symbols per enclosing loop, outermost first"
        )
    return {
        "schema": SCHEMA,
        "file": ex.filename,
        "index": ex.index,
        "op": spec.op,
        "name": spec.name,
        "is_reduction": spec.is_reduction,
        # "first" / "last": the bundle runs this op only in that iteration of its innermost loop
        "runs": spec.runs,
        "loops": [
            {"loop": k, "induction_var": f"%i_{k}", "count": loop_counts[k], "tiled_symbols": [str(s) for s in syms]}
            for k, syms in zip(ex.loops, tiled, strict=True)
        ],
        "iteration_space": {
            str(s): {"size": size, "split": split, "per_core": max(ext), "slices": list(ext)}
            for (s, (size, split)), ext in zip(spec.iteration_space.items(), spec.slice_extents)
        },
        "cores": spec.cores,
        "core_to_slice": [[int(v) for v in row] for row in slices],
        "core_spaces": [{str(s): [start, n] for s, (start, n) in zip(spec.iteration_space, space)}
                        for space in spec.core_spaces],
        "tensors": tensors,
        "op_info": {k: jsonable(v) for k, v in anchor_op_info(spec).items()},
    }


def anchor_op_info(spec: OpSpec) -> dict[str, object]:
    """The anchor's ``op_info`` dict of an op (Python values; ``jsonable`` makes them JSON):
    ``fn``, ``operands`` as ``("arg", i)`` / ``("scalar", v)`` pairs and ``compute``; ``store``
    for a bool output; ``reduced`` and ``count`` for a reduction, ``correction`` for var;
    ``rows`` and ``cols`` for a batchmatmul (its operands' roles)."""
    info, fn = spec.op_info, op_fn(spec.op)
    out: dict[str, object] = {
        "fn": fn,
        "operands": tuple(("arg", o.index) if isinstance(o, ArgOperand) else ("scalar", o.value)
                          for o in info.operands),
        "compute": info.compute,
    }
    if info.bool_store:
        out["store"] = "bool"
    if spec.is_reduction:
        out["reduced"] = info.reduced
        out["count"] = info.count
        if fn == "var":
            out["correction"] = info.correction
    if fn == "matmul":  # the operand roles: the first operand is the [.., M, K] one, the second [.., K, N]
        out["rows"] = info.rows
        out["cols"] = info.cols
    return out


def jsonable(value: object) -> object:
    """op_info values as strict JSON: symbols and expressions as strings, tuples as lists,
    non-finite floats as the strings "inf", "-inf", "nan" (JSON has no literal for them)."""
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        return jsonable(value.item())
    if isinstance(value, sympy.Basic):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [jsonable(v) for v in value]
    return str(value)
