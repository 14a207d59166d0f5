"""Every field the device reads is read by the oracle: one corruption at a time, planted in
every field of every node of compiled programs (a few graphs, tiled and untiled, several core
counts), is caught by ``verify_program``, by the interpreter (an ``ExecutionError``) or by a
numeric change of the outputs.

``test_every_emitted_field_planted_...`` (the second half of this module) plants every field
the bundle and SDSC JSON write -- the ones below included -- in nine kinds of program and
requires each plant refused, NOT EQUAL, byte-identical on the device, a renamed label only, or
another program computing the same thing for a reason it states -- bit for bit on four input
sets, the last made of signed zeros, ties, a masked row, an infinity and a NaN -- or, for another
division of a float reduction's reduced dims over the cores, the same sum in another order
the semantics allow.

The fields left out are labels the device does not read (a tensor's ``name``, an op's
``name``), the operand order of a commutative op, ``op_info``'s count outside ``mean`` and
``var`` (the only fns that divide by it), and ``tiled_symbols``, which records for printers
and the anchor which symbols a loop tiles: the addresses each loop moves are the tensors'
``tile_advance``, which is planted here. A wrong guard (``runs``) is planted as an op of a
loop's first iteration run in its last and vice versa, and a fill run in every iteration; a
copy of a loop-invariant operand run in every iteration is no corruption (the same values,
more traffic). An LX tensor's ``device_size`` matters only in its
stick dim (each core lays its slice out over its own box) and in its bounds: growing another
dim is harmless to the device too, and so is moving one access's coordinates by a whole stick
or row that stays inside the device size (the box moves with them: a full-scope buffer kept in
LX slots has room to). Nor is computing ``full(0.0)`` in int32 a corruption: the same constant.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter

import numpy as np
import pytest
import sympy
from replica_programs import edit_specs, insert_after, replicated_matmul, with_cores

import fspyre
from fspyre.check import compare
from fspyre.errors import ExecutionError, FspyreError
from fspyre.ir.dtypes import HOST_NUMPY, is_float
from fspyre.ir.frozen import FrozenMap
from fspyre.ir.program import (
    ArgOperand,
    LoopSpec,
    OpSpec,
    Program,
    ScalarOperand,
    TensorArg,
    even_core_spaces,
    op_fn,
    op_specs,
)
from fspyre.lower import bundle_mlir, sdsc_json, unroll
from fspyre.machine.hostio import random_inputs, wide_inputs
from fspyre.machine.indexing import compile_index
from fspyre.machine.interpreter import run_program
from fspyre.machine.memcheck import check_memory
from fspyre.machine.reference import evaluate_with_bounds
from fspyre.machine.rules import core_spaces, open_grid
from fspyre.machine.spyre import spyre
from fspyre.stages.program import verify_program
from fspyre.stages.symbolic import bind_sizes, concrete_graph, instantiate, specialize
from fspyre.testing import inputs_for

# an op renamed to another of the same arity computes something else
_SWAP = {"add": "sub", "sub": "add", "mul": "div", "div": "mul", "exp": "neg", "neg": "exp", "rsqrt": "sqrt",
         "copy": "neg", "gelu": "relu", "sum": "amax", "amax": "sum", "mean": "sum", "batchmatmul": "sum"}

# their operand order is no corruption (matmul sums a*b, each operand at its own coordinates)
_COMMUTATIVE = {"add", "mul", "maximum", "minimum", "eq", "ne", "matmul"}


def _graphs():
    g = fspyre.GraphBuilder("add_mul")
    A, B = g.dim("A", 64), g.dim("B", 256)
    a, b, c = (g.input(n, (A, B), "float16") for n in "abc")
    with g.hint(slices={"A": 2}), g.hint(slices={"B": 2}):
        g.output("z", g.mul(g.add(a, b), c))
    yield g.build()

    g = fspyre.GraphBuilder("softmax")
    M, N = g.dim("M", 32), g.dim("N", 128)
    x = g.input("x", (M, N), "float16")
    with g.hint(slices={"M": 2}):
        e = g.exp(g.sub(x, g.amax(x, ["N"], keepdim=True)))
        g.output("y", g.div(e, g.sum(e, ["N"], keepdim=True)))
    yield g.build()

    g = fspyre.GraphBuilder("online_softmax")  # tiled over N: x kept in LX slots between two loops
    M, N = g.dim("M", 32), g.dim("N", 256)
    x = g.input("x", (M, N), "float16")
    with g.hint(slices={"N": 2}):
        e = g.exp(g.sub(x, g.amax(x, ["N"], keepdim=True)))
        g.output("y", g.div(e, g.sum(e, ["N"], keepdim=True)))
    yield g.build()

    g = fspyre.GraphBuilder("matmul")
    M, K, N = g.dim("M", 32), g.dim("K", 128), g.dim("N", 128)
    a, b = g.input("a", (M, K), "float16"), g.input("b", (K, N), "float16")
    bias = g.input("bias", (N,), "float16")
    with g.hint(slices={"M": 2}):
        g.output("y", g.add(g.matmul(a, b), bias))
    yield g.build()

    g = fspyre.GraphBuilder("matmul_k")  # a K-accumulation: fill, cast and bias add guarded in its loop
    M, K, N = g.dim("M", 32), g.dim("K", 256), g.dim("N", 128)
    a, b = g.input("a", (M, K), "float16"), g.input("b", (K, N), "float16")
    bias = g.input("bias", (N,), "float16")
    with g.hint(slices={"K": 2}):
        g.output("y", g.add(g.matmul(a, b), bias))
    yield g.build()


def _at_witness(x) -> int:
    """``x``, a size that may be an expression in a symbolic size, at the size 192 (for the
    planter's choices only: which plants to make)."""
    return x if type(x) is int else int(sympy.sympify(x).subs({s: 192 for s in sympy.sympify(x).free_symbols}))


def _at(program: Program, target, new) -> Program:
    return edit_specs(program, lambda s: new if s is target else s)


def _arg_changes(arg: TensorArg, space: FrozenMap):
    yield "arg_index", {"arg_index": arg.arg_index + 1}
    yield "arg_index", {"arg_index": -1 if arg.arg_index >= 0 else 0}
    yield "is_input", {"is_input": not arg.is_input}
    other = "IEEE_FP16" if arg.device_dtype == "SEN169_FP16" else "SEN169_FP16"
    yield "device_dtype", {"device_dtype": other}
    if arg.memory == "hbm":
        for d in range(len(arg.device_size) - 1):
            size = tuple(n + 1 if i == d else n for i, n in enumerate(arg.device_size))
            yield "device_size", {"device_size": size}
    coords = arg.device_coordinates
    for d in range(len(coords)):
        moved = tuple(c + 1 if i == d else c for i, c in enumerate(coords))
        if arg.memory == "lx" and d < len(coords) - 1 and _inside(moved[d], space, arg.device_size[d]):
            continue  # the core's LX box moves along: the same addresses
        yield "device_coordinates", {"device_coordinates": moved}
    if len(set(coords)) > 1:
        yield "device_coordinates", {"device_coordinates": coords[1:] + coords[:1]}
    mem = arg.memory
    yield "address", {"address": arg.address + 128}
    if _at_witness(arg.address) >= 128:
        yield "address", {"address": arg.address - 128}
    yield "memory", {"memory": "lx" if mem == "hbm" else "hbm"}
    for level, a in enumerate(arg.tile_advance):
        adv = list(arg.tile_advance)
        adv[level] = 2 * a if _at_witness(a) else 128
        yield "tile_advance", {"tile_advance": tuple(adv)}


def _inside(coord, space: FrozenMap, size: int) -> bool:
    """``coord`` stays below ``size`` over the op's whole iteration space."""
    values = compile_index(coord, list(space))(*open_grid([n for n, _ in space.values()]))
    return int(np.max(values)) < _at_witness(size)


def _spec_plants(spec: OpSpec):
    swap = _SWAP.get(spec.op)
    if swap is not None:
        yield "op", dataclasses.replace(spec, op=swap)
    yield "op", dataclasses.replace(spec, op=spec.op + "_v2")
    yield "is_reduction", dataclasses.replace(spec, is_reduction=not spec.is_reduction)
    space = tuple(spec.iteration_space)
    for sym, (size, split) in spec.iteration_space.items():
        def respace(new, sym=sym):
            # the per-core spaces follow the corrupted split (an even division), as they would
            # in a program whose split was wrong from the start
            space = FrozenMap((s, new if s == sym else v) for s, v in spec.iteration_space.items())
            return dataclasses.replace(spec, iteration_space=space, core_spaces=even_core_spaces(space))
        size_now = _at_witness(size)
        if split > 1:
            yield "split", respace((size, 1))
        if size_now % (2 * split) == 0 and split * 2 <= 32:
            yield "split", respace((size, split * 2))
        yield "size", respace((size * 2, split))
        if type(size) is int and size // 2 >= split and (size // 2) % split == 0:
            yield "size", respace((size // 2, split))
    info, fn = spec.op_info, op_fn(spec.op)
    if not (fn == "full" and [getattr(o, "value", None) for o in info.operands] == [0.0]):  # the same 0 either way
        yield "op_info.compute", dataclasses.replace(spec, op_info=dataclasses.replace(
            info, compute="int32" if info.compute == "float32" else "float32"))
    if fn in ("mean", "var"):  # the only fns the count means something to
        yield "op_info.count", dataclasses.replace(spec, op_info=dataclasses.replace(info, count=info.count * 2))
    if info.reduced:
        kept = tuple(s for s in space if s not in info.reduced)
        yield "op_info.reduced", dataclasses.replace(spec, op_info=dataclasses.replace(info, reduced=kept[-1:]))
    for i, arg in enumerate(spec.args):
        for field, change in _arg_changes(arg, spec.iteration_space):
            args = list(spec.args)
            try:
                args[i] = dataclasses.replace(arg, **change)
            except FspyreError:
                continue  # refused at construction: caught before any program exists
            yield f"arg.{field}", dataclasses.replace(spec, args=tuple(args))
    if len(spec.args) > 2 and fn not in _COMMUTATIVE:
        yield "arg order", dataclasses.replace(spec, args=(spec.args[1], spec.args[0], *spec.args[2:]))


def _kernel_plants(program: Program):
    ks = program.kernel_args

    def with_kernel(i, **change):
        new = list(ks)
        new[i] = dataclasses.replace(ks[i], **change)
        return dataclasses.replace(program, kernel_args=tuple(new))

    for i, k in enumerate(ks):
        yield "kernel.address", with_kernel(i, address=k.address + 128)
        yield "kernel.is_input", with_kernel(i, is_input=not k.is_input)
        yield "kernel.stride_map", with_kernel(i, stride_map=tuple(reversed(k.stride_map)) + (0,))
        yield "kernel.device_size", with_kernel(i, device_size=(k.device_size[0] + 1,) + k.device_size[1:])
        yield "kernel.device_dtype", with_kernel(i, device_dtype="IEEE_FP16" if k.device_dtype == "SEN169_FP16"
                                                 else "SEN169_FP16")
        yield "kernel.name", with_kernel(i, name=k.name + "_")
        yield "kernel.buffer", with_kernel(i, buffer=k.buffer + "_")
    if len({k.arg_index for k in ks}) > 1:
        a, b = ks[0], next(k for k in ks if k.arg_index != ks[0].arg_index)
        swapped = tuple(dataclasses.replace(k, arg_index=b.arg_index) if k.arg_index == a.arg_index else
                        dataclasses.replace(k, arg_index=a.arg_index) if k.arg_index == b.arg_index else k for k in ks)
        yield "kernel.arg_index", dataclasses.replace(program, kernel_args=swapped)
        # the argument order the runtime passes: two arguments' places exchanged
        placed = tuple(dataclasses.replace(k, address=b.address) if k.arg_index == a.arg_index else
                       dataclasses.replace(k, address=a.address) if k.arg_index == b.arg_index else k for k in ks)
        yield "kernel order", dataclasses.replace(program, kernel_args=placed)


def _guard_plants(program: Program, loop: LoopSpec):
    """An op of the loop's first iteration run in its last instead and vice versa (each moved
    to where such an op sits), and a fill run in every iteration. (A copy of a loop-invariant
    operand run in every iteration computes the same values with more traffic: no plant.)"""
    for spec in loop.body:
        if not isinstance(spec, OpSpec) or spec.runs == "every":
            continue
        rest = tuple(x for x in loop.body if x is not spec)
        if spec.runs == "first":
            body = rest + (dataclasses.replace(spec, runs="last"),)
        else:
            body = (dataclasses.replace(spec, runs="first"),) + rest
        yield "runs", _at(program, loop, dataclasses.replace(loop, body=body))
        if spec.runs == "first" and op_fn(spec.op) == "full":
            heads = sum(1 for x in rest if isinstance(x, OpSpec) and x.runs == "first")
            body = rest[:heads] + (dataclasses.replace(spec, runs="every"),) + rest[heads:]
            yield "runs", _at(program, loop, dataclasses.replace(loop, body=body))


def plants(program: Program):
    """(field, corrupted program) for every field of every node of ``program``."""
    for spec in [s for s in _walk(program.body) if isinstance(s, LoopSpec)]:
        yield "loop.count", _at(program, spec, dataclasses.replace(spec, count=spec.count + 1))
        if _at_witness(spec.count) > 1:
            yield "loop.count", _at(program, spec, dataclasses.replace(spec, count=spec.count - 1))
        yield from _guard_plants(program, spec)
    for spec in op_specs(program):
        for field, new in _spec_plants(spec):
            yield field, _at(program, spec, new)
    yield from _kernel_plants(program)
    yield "program.hbm_bytes", dataclasses.replace(program, hbm_bytes=program.hbm_bytes - 128)
    if program.cores > 1:
        yield "program.cores", dataclasses.replace(program, cores=program.cores // 2)


def _walk(body):
    for s in body:
        yield s
        if isinstance(s, LoopSpec):
            yield from _walk(s.body)


def caught(program: Program, inputs, clean) -> str | None:
    """How a corrupted program is caught -- by the oracle itself first, then by the verifier
    ``compile`` runs -- or None."""
    try:
        outs, _ = run_program(program, inputs)
    except FspyreError:
        return "execution error"
    if set(outs) != set(clean) or any(not np.array_equal(outs[n], clean[n], equal_nan=True) for n in clean):
        return "numeric mismatch"
    try:
        verify_program(program)
    except FspyreError:
        return "verifier"
    return None


# Fields the device reads, which the oracle must catch by itself (the rest -- a kernel
# argument's buffer name, the outermost device dim -- only the verifier can: the
# device does not read them, or reads them to the same addresses).
_ORACLE_FIELDS = {"op", "is_reduction", "split", "size", "loop.count", "runs", "arg.arg_index", "arg.is_input",
                  "arg.address", "arg.memory", "arg.device_coordinates", "arg.tile_advance", "arg.device_dtype",
                  "arg order", "kernel.arg_index", "kernel order", "kernel.address", "kernel.stride_map",
                  "kernel.is_input", "kernel.device_size", "program.cores", "program.hbm_bytes"}


@pytest.mark.parametrize("cores", [1, 4])
@pytest.mark.parametrize("tiling", ["none", "hints"])
def test_every_planted_corruption_is_caught(cores, tiling):
    counts: Counter[str] = Counter()
    missed, by_verifier = [], []
    for graph in _graphs():
        program = fspyre.compile(graph, machine=spyre(cores=cores), tiling=tiling).program
        inputs = inputs_for(graph)
        clean, _ = run_program(program, inputs)
        ref = fspyre.evaluate(graph, inputs, spyre(cores=cores))
        assert all(np.allclose(clean[n], ref[n], rtol=1e-2, atol=1e-2) for n in ref)
        for field, bad in plants(program):
            how = caught(bad, inputs, clean)
            counts[how or "missed"] += 1
            if how is None:
                missed.append(f"{graph.name}: {field}")
            elif how == "verifier" and field in _ORACLE_FIELDS:
                by_verifier.append(f"{graph.name}: {field}")
    assert counts["verifier"] and counts["execution error"] and counts["numeric mismatch"]
    assert not missed, f"{len(missed)} of {sum(counts.values())} corruptions pass silently: {missed}"
    assert not by_verifier, f"the oracle runs {len(by_verifier)} corrupted programs as if right: {by_verifier}"


# -- the copies each core holds of one region ---------------------------------------------------
# A weight copied into every core's LX is read as one copy when one store provably put the same
# bytes on every core (interpreter ``Spread``), and the copies are compared otherwise. These
# plants make one core's copy differ -- by a later store, or by that core's copy reading another
# source -- and require exactly that core's output rows to change, as core-by-core execution
# gives: the rows the other cores compute stay bit for bit those of the clean program.


def _replica_program():
    graph, program, copy = replicated_matmul()
    (loop,) = [s for s in program.body if isinstance(s, LoopSpec)]
    mm = next(s for s in loop.body if s.op == "batchmatmul")
    # every core holds b whole, copied in the loop's first iteration; the matmul runs twice
    # over 16 rows, 4 rows per core
    assert copy.iteration_space[next(iter(copy.iteration_space))] == (4, 4) and loop.count == 2
    assert copy in loop.body and copy.runs == "first"
    assert mm.op == "batchmatmul" and [space[0] for space in mm.core_spaces] == [(0, 4), (4, 4), (8, 4), (12, 4)]
    return graph, program, copy


def _rows_of(cores) -> list[int]:
    return [16 * i + 4 * c + r for i in range(2) for c in cores for r in range(4)]


def _expect_rows(program, inputs, changed_b, cores) -> np.ndarray:
    """The clean output, with the rows ``cores`` compute taken from a run where b is ``changed_b``."""
    clean, _ = run_program(program, inputs)
    other, _ = run_program(program, {**inputs, "b": changed_b})
    want = clean["y"].copy()
    rows = _rows_of(cores)
    want[rows] = other["y"][rows]
    assert not np.array_equal(want, clean["y"])  # the plant changes something
    return want


@pytest.mark.parametrize("cores", [1, 3])
def test_a_store_to_some_cores_copies_changes_their_rows_only(cores):
    # b negated into the LX of cores 0..cores-1 after the copy: their copy of b is -b
    graph, program, copy = _replica_program()
    inputs = inputs_for(graph)
    neg = dataclasses.replace(with_cores(copy, cores), op="neg", name="neg_b")
    outs, _ = run_program(insert_after(program, copy, neg), inputs)
    assert np.array_equal(outs["y"], _expect_rows(program, inputs, -inputs["b"], range(cores)))


def test_one_cores_copy_read_from_another_source_changes_its_rows_only():
    # the last core's copy reads b one row on (K + 1, wrapping): the copies differ from the start
    graph, program, copy = _replica_program()
    inputs = inputs_for(graph)
    cores_sym = next(iter(copy.iteration_space))
    src = copy.args[0]
    k = src.device_coordinates[1]
    shifted = dataclasses.replace(src, device_coordinates=(
        src.device_coordinates[0], sympy.Mod(k + sympy.floor(cores_sym / 3), 128), src.device_coordinates[2]))
    bad = _at(program, copy, dataclasses.replace(copy, args=(shifted, copy.args[1])))
    outs, _ = run_program(bad, inputs)
    assert np.array_equal(outs["y"], _expect_rows(program, inputs, np.roll(inputs["b"], -1, axis=0), [3]))


def test_one_cores_copy_never_written_is_reported():
    # the copy runs on cores 0..2 only: core 3 reads bytes nobody wrote
    graph, program, copy = _replica_program()
    with pytest.raises(ExecutionError, match="core 3.*never written"):
        run_program(_at(program, copy, with_cores(copy, 3)), inputs_for(graph))


def test_every_cores_copy_is_written_for_every_other_reader():
    # the copies' written marks (set when something other than the replica read looks, or
    # when the run ends with its memories kept): core 0 copying its b_lx elsewhere reads it
    # written, and the kept state shows every core's copy written
    graph, program, copy = _replica_program()
    inputs = inputs_for(graph)
    src = copy.args[1]
    dst = dataclasses.replace(src, name="b_lx_again", address=1 << 20)
    reader = dataclasses.replace(with_cores(copy, 1), args=(dataclasses.replace(src, is_input=True), dst),
                                 name="b_lx_again_copy")
    clean, clean_state = run_program(program, inputs)
    outs, state = run_program(insert_after(program, copy, reader), inputs)
    assert np.array_equal(outs["y"], clean["y"])
    size = 2 * int(np.prod(src.device_size))
    for kept in (clean_state, state):
        assert all((lx.written[src.address:src.address + size] == 0xFF).all() for lx in kept.lx)
    assert (state.lx[0].written[1 << 20:(1 << 20) + size] == 0xFF).all()
    assert not state.lx[1].written[1 << 20:(1 << 20) + size].any()


# -- every emitted field --------------------------------------------------------------------------
# Every field of OpSpec, TensorArg, OpInfo, LoopSpec, KernelArg and Program that the bundle or
# the SDSC JSON writes, planted one at a time in programs of ten kinds. None may pass silently:
# each is refused (when built, by verify_program, or by the interpreter), or runs NOT EQUAL to
# the reference on the default inputs, on inputs that defeat shift and scale invariances
# (``wide_inputs``), on int32 inputs past float32's exact integers, or on special values
# (``_special_inputs``), or leaves the bundle and the SDSC JSON byte-identical. Names are labels:
# a renamed op, tensor, kernel argument or program must change nothing but that label in them.


def _kinds():
    """(kind, graph, machine, tiling) of the programs planted."""
    for graph in _graphs():
        yield graph.name, graph, spyre(cores=4), "hints"
    g = fspyre.GraphBuilder("tails")  # a count that does not divide its dim: a loop and a peeled tail
    A, B = g.dim("A", 40), g.dim("B", 320)
    x, w = g.input("x", (A, B), "float16"), g.input("w", (A, B), "float16")
    with g.hint(slices={"B": 3}):
        g.output("z", g.sum(g.add(g.mul(x, 0.5), w), ["B"]))
    yield "tails", g.build(), spyre(cores=4), "hints"
    g = fspyre.GraphBuilder("uneven")  # 7 rows over 4 cores, a mean and a var over uneven slices
    A, B = g.dim("A", 7), g.dim("B", 200)
    x = g.input("x", (A, B), "float32")
    g.output("m", g.mean(x, ["B"]))
    g.output("v", g.var(x, ["B"], correction=1))
    yield "uneven", g.build(), spyre(cores=4), "none"
    g = fspyre.GraphBuilder("compare")  # a bool output, a where, an int32 sum
    A, B = g.dim("A", 16), g.dim("B", 128)
    x, y = g.input("x", (A, B), "float16"), g.input("y", (A, B), "float16")
    k = g.input("k", (A, B), "int32")
    gt = g.gt(x, y)
    g.output("gt", gt)
    g.output("w", g.where(gt, x, g.maximum(y, 0.25)))
    g.output("s", g.sum(g.mul(k, 3), ["B"]))
    yield "compare", g.build(), spyre(cores=4), "none"


def _symbolic_kind():
    g = fspyre.GraphBuilder("symbolic")
    S = g.dim("S")
    g.dim("H", 64)
    x, w = g.input("x", ["S", "H"], "float16"), g.input("w", ["H"], "float16")
    with g.hint(slices={"S": S.size // 64}):
        g.output("y", g.mul(g.exp(x), w))
    return g.build()


def _convolution_kind():
    """A grouped 1-d convolution from torch (im2col views and one matmul per group), its tiling
    searched: the group dim tiled one group per iteration leaves the ops' iteration spaces and
    still moves x (a squeezed advance)."""
    import torch
    import torch.nn.functional as F

    from fspyre.frontend import capture

    x = torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(8))
    w = torch.randn(6, 2, 1, generator=torch.Generator().manual_seed(1))
    return capture(lambda x, w: F.conv1d(x, w, None, stride=2, groups=2), (x, w)).graph


def _more_spec_plants(spec: OpSpec):
    """The fields ``_spec_plants`` leaves out: labels, tiled_symbols, every op_info field, the
    operand order of commutative ops, per-core spaces."""
    yield "name", dataclasses.replace(spec, name=spec.name + "_renamed")
    space = tuple(spec.iteration_space)
    for level, syms in enumerate(spec.tiled_symbols):
        def tiled(new, level=level):
            return dataclasses.replace(spec, tiled_symbols=tuple(
                new if i == level else t for i, t in enumerate(spec.tiled_symbols)))
        if syms:
            yield "tiled_symbols", tiled(())
            yield "tiled_symbols", tiled(syms[1:])
        extra = [s for s in space if s not in syms]
        if extra:
            yield "tiled_symbols", tiled(syms + (extra[0],))
            if syms:
                yield "tiled_symbols", tiled((extra[0],))
    info = spec.op_info

    def with_info(**change):
        return dataclasses.replace(spec, op_info=dataclasses.replace(info, **change))
    if info.rows or info.cols:  # a batchmatmul's operand roles
        yield "op_info.rows", with_info(rows=info.cols, cols=info.rows)
        yield "op_info.rows", with_info(rows=(), cols=())
        yield "op_info.rows", with_info(rows=info.rows[1:], cols=info.cols + info.rows[:1])
        yield "op_info.cols", with_info(cols=info.cols[1:])
    yield "op_info.bool_store", with_info(bool_store=not info.bool_store)
    yield "op_info.count", with_info(count=info.count + 1)
    if info.count > 1:
        yield "op_info.count", with_info(count=info.count // 2)
    if info.reduced:
        yield "op_info.reduced", with_info(reduced=())
        yield "op_info.reduced", with_info(reduced=info.reduced[1:])
    kept = [s for s in space if s not in info.reduced]
    if kept:
        yield "op_info.reduced", with_info(reduced=info.reduced + (kept[0],))
    yield "op_info.correction", with_info(correction=info.correction + 1)
    for i, o in enumerate(info.operands):
        if isinstance(o, ScalarOperand):
            v = o.value
            new = (not v) if isinstance(v, bool) else (0.5 if v == 0 else -v if v == v else 1.0)
            if isinstance(v, int) and not isinstance(v, bool):
                new = v + 1
            ops = tuple(ScalarOperand(value=new) if j == i else p for j, p in enumerate(info.operands))
            yield "op_info.operands", with_info(operands=ops)
    refs = [i for i, o in enumerate(info.operands) if isinstance(o, ArgOperand)]
    if len(refs) > 1:
        ops = list(info.operands)
        ops[refs[0]], ops[refs[1]] = ops[refs[1]], ops[refs[0]]
        yield "op_info.operands", with_info(operands=tuple(ops))
    if len(spec.args) > 2 and op_fn(spec.op) in _COMMUTATIVE:
        yield "arg order", dataclasses.replace(spec, args=(spec.args[1], spec.args[0], *spec.args[2:]))
    for i, arg in enumerate(spec.args):
        args = list(spec.args)
        args[i] = dataclasses.replace(arg, name=arg.name + "_renamed")
        yield "arg.name", dataclasses.replace(spec, args=tuple(args))
    if type(spec.cores) is int and spec.cores > 1:
        for k, ext in enumerate(spec.slice_extents):
            if len(ext) > 1 and ext[0] > 1:  # one element moved from the first slice to the second
                moved = [list(e) for e in spec.slice_extents]
                moved[k][0] -= 1
                moved[k][1] += 1
                yield "core_spaces", dataclasses.replace(spec, core_spaces=core_spaces(moved))
            if len(set(ext)) > 1:
                moved = [list(e) for e in spec.slice_extents]
                moved[k].reverse()
                yield "core_spaces", dataclasses.replace(spec, core_spaces=core_spaces(moved))


def every_field_plants(program: Program):
    """(field, corrupted program or an FspyreError raised building it) for every field."""
    def safely(gen):
        while True:
            try:
                item = next(gen)
            except StopIteration:
                return
            except FspyreError as err:  # refused when built: no such program exists
                yield "construction", err
                continue
            yield item
    yield from safely(iter(plants(program)))
    for spec in op_specs(program):
        for field, new in safely(_more_spec_plants(spec)):
            yield field, new if isinstance(new, FspyreError) else _at(program, spec, new)
    for loop in [s for s in _walk(program.body) if isinstance(s, LoopSpec)]:
        # the dims the loop records tiling: one dropped, none, another op symbol, a foreign one
        syms = loop.tiled_symbols
        others = [s for spec in op_specs(program) for s in spec.iteration_space if s not in syms]
        changes = [syms[1:], (), syms + tuple(others[:1]), syms + (sympy.Symbol("Q", integer=True, nonnegative=True),)]
        for new in dict.fromkeys(changes):
            if new != syms:
                yield "loop.tiled_symbols", _at(program, loop, dataclasses.replace(loop, tiled_symbols=new))
        every = [i for i, s in enumerate(loop.body) if isinstance(s, OpSpec) and s.runs == "every"]
        for a, b in zip(every, every[1:]):
            if b == a + 1:  # two neighbouring ops of the body run in the other order
                body = list(loop.body)
                body[a], body[b] = body[b], body[a]
                yield "loop.body", _at(program, loop, dataclasses.replace(loop, body=tuple(body)))
    yield "program.name", dataclasses.replace(program, name=program.name + "_renamed")
    yield "program.lx_bytes", dataclasses.replace(program, lx_bytes=program.lx_bytes // 64)


def _device_text(program: Program) -> tuple[str, str]:
    return bundle_mlir(program), json.dumps(sdsc_json(program), sort_keys=True)


def _special_inputs(types, seed: int) -> dict[str, np.ndarray]:
    """``random_inputs`` with the values that tell an operand order, a zero's sign or a
    masked row apart: about a quarter of each float tensor's elements +0 or -0 (ties of zeros
    in maximum/minimum and their reductions), another eighth repeating their neighbour (ties),
    the first row all -inf (a masked row: a running max that never rises above its start),
    one element of the second row +inf and one of the third NaN."""
    out = random_inputs(types, seed)
    rng = np.random.default_rng(seed + 3)
    for name, t in types.items():
        if not is_float(t.dtype):
            continue
        v = out[name].astype(np.float32)
        flat = v.reshape(-1)
        pick = rng.random(flat.shape)
        flat[pick < 0.125] = 0.0
        flat[(pick >= 0.125) & (pick < 0.25)] = -0.0
        ties = (pick >= 0.25) & (pick < 0.375)
        flat[1:][ties[1:]] = flat[:-1][ties[1:]]
        if t.shape[0] >= 4 and v.ndim > 1:
            v[0] = -np.inf
            v[1].reshape(-1)[0] = np.inf
            v[2].reshape(-1)[-1] = np.nan
        out[name] = v.astype(HOST_NUMPY[t.dtype])
    return out


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit for bit, a zero's sign included; NaN by position (its sign and payload are not part
    of fspyre's meaning: docs/semantics.md)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.kind != "f":
        return bool(np.array_equal(a, b))
    nan = np.isnan(a)
    return bool(np.array_equal(nan, np.isnan(b)) and np.array_equal(a[~nan].view(np.uint8), b[~nan].view(np.uint8)))


def _edge_inputs(types, seed: int) -> dict[str, np.ndarray]:
    """``wide_inputs`` with int32 tensors up to 2^26 in magnitude (float32 holds integers
    exactly only to 2^24: an int op computed in float32 shows)."""
    out = wide_inputs(types, seed)
    rng = np.random.default_rng(seed + 2)
    for name, t in types.items():
        if t.dtype == "int32":
            out[name] = rng.integers(-(2**26), 2**26, size=t.shape, dtype=np.int32)
    return out


# Plants that make another program computing the same thing -- (kind, field, op) and why. Each
# must also pass verify_program and the memory check and run bit for bit as the clean program
# on all three input sets; any other plant that does so is a failure of this test.
_COMMUTES = "the fn commutes bit for bit in the interpreter (maximum and minimum order -0 below +0)"
_DIVISION = "another division of the op's work over the cores: each core computes its own slice of the same elements"
_EQUIVALENT: dict[tuple[str, str, str], str] = {
    ("online_softmax", "op_info.operands", "buf3_fill"):
        "the running sum's first rescale multiplies the fill by alpha = exp(m0 - m1), m0 = -inf the running max's "
        "fill: +0 times any finite fill where m1 is finite (a DLFloat16 x has no -inf), NaN whatever the fill "
        "where m1 = -inf",
    ("compare", "op", "buf0_pin_out"): "neg of a bool stored as a bool (value != 0) is the bool itself",
    ("compare", "op_info.compute", "buf0_pin_out"): "a bool copy: 0 and 1 in either compute type",
    ("compare", "op_info.bool_store", "buf0"): "a comparison's values are 0 and 1 already",
}


def _equivalent(kind: str, field: str, program: Program, bad: Program) -> str | None:
    """Why ``bad`` is another program computing the same thing, or None."""
    if field in ("arg order", "split", "core_spaces", "loop.body", "op_info.operands", "op",
                 "op_info.compute", "op_info.bool_store"):
        old = {id(x) for x in op_specs(program)}
        changed = [x for x in op_specs(bad) if id(x) not in old]
        if field == "loop.body":  # two neighbouring ops of a loop body run in the other order
            loops = [x for x in _walk(bad.body) if isinstance(x, LoopSpec)]
            clean = [x for x in _walk(program.body) if isinstance(x, LoopSpec)]
            for a, b in zip(clean, loops):
                if a.body != b.body:
                    i = next(k for k, (x, y) in enumerate(zip(a.body, b.body)) if x is not y)
                    one, two = a.body[i], a.body[i + 1]
                    if not (_writes(one) & _touches(two) or _writes(two) & _touches(one)):
                        return "the two ops touch no tensor the other writes: they commute"
            return None
        if len({id(x) for x in changed}) != 1:  # (an unrolled program repeats an op that does not move)
            return None
        op = changed[0]
        if field == "arg order":
            return _COMMUTES if op_fn(op.op) in {"add", "mul", "maximum", "minimum", "eq", "ne"} else None
        if field in ("split", "core_spaces"):
            return _DIVISION
        return _EQUIVALENT.get((kind, field, op.name))
    return None


def _writes(spec) -> set[str]:
    return {a.name for a in spec.args if not a.is_input} if isinstance(spec, OpSpec) else {"<loop>"}


def _touches(spec) -> set[str]:
    return {a.name for a in spec.args} if isinstance(spec, OpSpec) else {"<loop>"}


def _judge(kind: str, field: str, program: Program, bad, graph, runs, clean_text) -> str:
    """How a planted corruption is caught, or "silent"."""
    if isinstance(bad, FspyreError):
        return "refused when built"
    try:
        verify_program(bad)
    except FspyreError:
        return "verify_program"
    same_bits = True
    for inputs, ref, bounds, clean in runs:
        try:
            concrete = bad
            if bad.symbolic is not None:
                concrete = instantiate(bad, bind_sizes(bad, inputs))
            outs, _ = run_program(concrete, inputs)
        except FspyreError:
            return "interpreter"
        if set(outs) != set(ref) or not compare(concrete_graph(graph, inputs), outs, ref, bounds).equal:
            return "NOT EQUAL"
        same_bits = same_bits and all(_same_bits(outs[n], clean[n]) for n in clean)
    try:
        text = _device_text(bad)
    except FspyreError:
        return "lowering"
    if text == clean_text:
        return "same device bytes"
    label = _LABELS.get(field)
    if label is not None and tuple(t.replace(label, "") for t in text) == tuple(
            t.replace(label, "") for t in clean_text):
        return "label only"
    why = _equivalent(kind, field, program, bad)
    concrete_bad = bad if bad.symbolic is None else instantiate(bad, bind_sizes(bad, runs[0][0]))
    if why is None or not check_memory(concrete_bad).clean:
        return "silent"
    if same_bits:  # on all four input sets, a zero's sign included
        return "equivalent"
    if why == _DIVISION and _reorders_a_float_reduction(program, bad):
        return "another legal order"
    return "silent"


def _reorders_a_float_reduction(program: Program, bad: Program) -> bool:
    """``bad`` divides one float reduction's reduced dims over the cores otherwise, and nothing
    else: the partial sums combine in another order, which docs/semantics.md allows (and
    check's bound covers), so its bits may differ from the clean program's."""
    old = {x.name: x for x in op_specs(program)}
    changed = [x for x in op_specs(bad) if old.get(x.name) is not x]
    if len({id(x) for x in changed}) != 1 or not changed[0].is_reduction or changed[0].op_info.compute != "float32":
        return False
    new, was = changed[0], old[changed[0].name]
    if list(new.iteration_space) != list(was.iteration_space):
        return False
    moved = {s.name for s, a, b in zip(new.iteration_space, new.slice_extents, was.slice_extents) if a != b}
    return bool(moved) and moved <= {s.name for s in new.op_info.reduced}


# the suffix each label plant appends: a rename changes that label and nothing else
_LABELS = {"name": "_renamed", "arg.name": "_renamed", "program.name": "_renamed", "kernel.name": "_",
           "kernel.buffer": "_"}


@pytest.mark.filterwarnings("ignore::fspyre.FspyreWarning")
def test_every_emitted_field_planted_is_refused_not_equal_or_unchanged_on_the_device():
    counts: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    fields: Counter[str] = Counter()
    silent = []
    cases = [(kind, graph, fspyre.compile(graph, machine=machine, tiling=tiling).program)
             for kind, graph, machine, tiling in _kinds()]
    sym = _symbolic_kind()
    cases.append(("symbolic", sym, fspyre.compile(sym, machine=spyre(cores=4), tiling="hints").program))
    add_mul = next(graph for graph in _graphs() if graph.name == "add_mul")  # every loop unrolled
    cases.append(("unrolled", add_mul, unroll(fspyre.compile(add_mul, machine=spyre(cores=4), tiling="hints").program)))
    conv = _convolution_kind()
    cases.append(("convolution", conv, fspyre.compile(conv, machine=spyre(cores=4)).program))
    for kind, graph, program in cases:
        machine = spyre(cores=program.cores)
        runs = []
        for make in (random_inputs, wide_inputs, _edge_inputs, _special_inputs):
            sized = specialize(graph, {"S": 192}) if program.symbolic is not None else graph
            buffers = sized.buffer_table()
            inputs = make({n: buffers[n].type for n in sized.inputs}, 0)
            ref, bounds = evaluate_with_bounds(sized, inputs, machine)
            concrete = program if program.symbolic is None else instantiate(program, bind_sizes(program, inputs))
            clean, _ = run_program(concrete, inputs)
            assert compare(sized, clean, ref, bounds).equal
            runs.append((inputs, ref, bounds, clean))
        clean_text = _device_text(program)
        for field, bad in every_field_plants(program):
            how = _judge(kind, field, program, bad, graph, runs, clean_text)
            counts[how] += 1
            kinds[kind] += 1
            fields[field] += 1
            if how == "silent":
                silent.append(f"{kind}: {field}")
    total = sum(counts.values())
    print(f"{total} plants over {len(kinds)} program kinds: {dict(counts)}; fields {dict(fields)}")
    assert len(kinds) >= 9 and total >= 600, (len(kinds), total)
    assert counts["verify_program"] and counts["interpreter"] and counts["NOT EQUAL"]
    assert not silent, f"{len(silent)} of {total} plants pass silently: {silent}"


# -- the fields verify_program derives from the rest of the program -------------------------------
# Each plant below changes a field the device reads into one the rest of the program contradicts
# (tests/unit/stage_doors.py found each class running NOT EQUAL with no refusal): verify_program,
# which compile, serialize.loads and every stage door run, must refuse it by the rule named.


def _compiled(name: str) -> Program:
    graph = next(g for g in _graphs() if g.name == name)
    return fspyre.compile(graph, machine=spyre(cores=4), tiling="hints").program


def _spec(program: Program, name: str) -> OpSpec:
    return next(s for s in op_specs(program) if s.name == name)


def _with_arg(program: Program, op: str, tensor: str, **change) -> Program:
    spec = _spec(program, op)
    args = tuple(dataclasses.replace(a, **change) if a.name == tensor else a for a in spec.args)
    return _at(program, spec, dataclasses.replace(spec, args=args))


def _with_runs(program: Program, op: str, runs: str, at: int | None = None) -> Program:
    """``op`` guarded otherwise, moved to body position ``at`` of its loop when given."""
    spec = _spec(program, op)
    loop = next(s for s in _walk(program.body) if isinstance(s, LoopSpec) and spec in s.body)
    body = [s for s in loop.body if s is not spec]
    body.insert(loop.body.index(spec) if at is None else at, dataclasses.replace(spec, runs=runs))
    return _at(program, loop, dataclasses.replace(loop, body=tuple(body)))


def _every_use(program: Program, tensor: str, **change) -> Program:
    def edit(s):
        if not isinstance(s, OpSpec) or all(a.name != tensor for a in s.args):
            return s
        return dataclasses.replace(s, args=tuple(dataclasses.replace(a, **change) if a.name == tensor else a
                                                 for a in s.args))
    return edit_specs(program, edit)


def _with_info(program: Program, op: str, **change) -> Program:
    spec = _spec(program, op)
    return _at(program, spec, dataclasses.replace(spec, op_info=dataclasses.replace(spec.op_info, **change)))


def _exp_program() -> Program:
    g = fspyre.GraphBuilder("exp_mul")
    A, B = g.dim("A", 64), g.dim("B", 128)
    x, y = g.input("x", (A, B), "float16"), g.input("y", (A, B), "float16")
    with g.hint(slices={"A": 2}):
        g.output("z", g.mul(g.exp(x), y))
    return fspyre.compile(g.build(), machine=spyre(cores=4), tiling="hints").program


def _compare_program() -> Program:
    kind, graph, machine, tiling = next(k for k in _kinds() if k[0] == "compare")
    return fspyre.compile(graph, machine=machine, tiling=tiling).program


def _derived_plants():
    """(what, corrupted program, the refusal's words)."""
    mm = _compiled("matmul_k")  # fill first, partial matmul and fold every, finish and bias add last
    yield "an HBM advance zeroed", _with_arg(mm, "buf0", "a", tile_advance=(0,)), "HBM tensor a advances 0 bytes"
    yield "an HBM advance doubled", _with_arg(mm, "buf0", "b", tile_advance=(32768,)), "must be 16384"
    yield ("an LX advance in a loop around every use", _with_arg(mm, "buf0_combine", "buf0_acc", tile_advance=(128,)),
           "encloses every use")
    yield "the fill run in every iteration", _with_runs(mm, "buf0_fill", "every"), "is lost"
    yield "the fold run in the last iteration", _with_runs(mm, "buf0_combine", "last", at=3), "is lost"
    yield "the finish run in every iteration", _with_runs(mm, "buf0_finish", "every"), "is lost"
    loop = next(s for s in mm.body if isinstance(s, LoopSpec))
    yield "the K loop run once", _at(mm, loop, dataclasses.replace(loop, count=1)), "a loop of count 1 tiles"
    online = _compiled("online_softmax")  # x left in LX slots by the first loop for the second
    yield ("one use of an LX region walked otherwise", _with_arg(online, "buf1_again", "x_lx", tile_advance=(0,)),
           "walks its slots")
    yield "LX slots smaller than a core's box", _every_use(online, "x_lx", tile_advance=(1024,)), "would overlap"
    ex = _exp_program()
    yield "exp stored as a bool", _with_info(ex, "buf0", bool_store=True), "computes a float"
    yield "a float16 output stored as a bool", _with_info(ex, "buf1", bool_store=True), "a float16 tensor"
    gt = _compare_program()
    yield "a bool output stored as a float", _with_info(gt, "buf0_pin_out", bool_store=False), "a bool tensor"


@pytest.mark.parametrize("what", [w for w, _, _ in _derived_plants()])
def test_verify_program_refuses_a_device_field_the_program_contradicts(what):
    program, words = next((p, w) for name, p, w in _derived_plants() if name == what)
    with pytest.raises(FspyreError, match=words) as err:
        verify_program(program)
    assert "\n" not in str(err.value)


def test_a_loop_invariant_copy_may_run_in_every_iteration():
    # the same values each time, more traffic: no iteration's work is lost, so it verifies
    graph, program, copy = _replica_program()
    (loop,) = [s for s in program.body if isinstance(s, LoopSpec)]
    heads = sum(1 for s in loop.body if isinstance(s, OpSpec) and s.runs == "first")
    every = _with_runs(program, copy.name, "every", at=heads - 1)  # after the other first-iteration ops
    verify_program(every)
    inputs = inputs_for(graph)
    assert all(np.array_equal(a, b) for a, b in zip(run_program(every, inputs)[0].values(),
                                                    run_program(program, inputs)[0].values()))


def test_a_symbolic_loop_of_one_tile_runs_in_place():
    # at |S| = 64 the loop over S's tiles of 64 runs once: instantiate makes it tile nothing,
    # as a concrete compile runs one tile in place, and it verifies and runs equal
    graph = _symbolic_kind()
    program = fspyre.compile(graph, machine=spyre(cores=4), tiling="hints").program
    (loop,) = [s for s in program.body if isinstance(s, LoopSpec)]
    assert loop.tiled_symbols and type(loop.count) is not int
    concrete = instantiate(program, {"S": 64})
    (one,) = [s for s in concrete.body if isinstance(s, LoopSpec)]
    assert one.count == 1 and one.tiled_symbols == ()
    assert all(t == () for s in op_specs(concrete) for t in s.tiled_symbols)
    verify_program(concrete)
    sized = specialize(graph, {"S": 64})
    inputs = inputs_for(sized)
    ref, bounds = evaluate_with_bounds(sized, inputs, spyre(cores=4))
    assert compare(sized, fspyre.run(program, inputs), ref, bounds).equal


def test_a_graph_storing_a_float_fn_as_a_bool_is_refused():
    g = fspyre.GraphBuilder("exp_bool")
    A = g.dim("A", 64)
    g.output("y", g.exp(g.input("x", (A,), "float16")))
    graph = g.build()
    buffers = tuple(dataclasses.replace(b, type=dataclasses.replace(b.type, dtype="bool"))
                    if b.name == graph.outputs[0].buffer else b for b in graph.buffers)
    with pytest.raises(fspyre.errors.GraphError, match="exp computes a float, but stores into bool"):
        fspyre.ir.graph.verify_graph(dataclasses.replace(graph, buffers=buffers))
