"""Every field the device reads is read by the oracle: one corruption at a time, planted in
every field of every node of compiled programs (a few graphs, tiled and untiled, several core
counts), is caught by ``verify_program``, by the interpreter (an ``ExecutionError``) or by a
numeric change of the outputs.

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
from collections import Counter

import numpy as np
import pytest
import sympy
from replica_programs import edit_specs, insert_after, replicated_matmul, with_cores

import fspyre
from fspyre.errors import ExecutionError, FspyreError
from fspyre.ir.frozen import FrozenMap
from fspyre.ir.program import LoopSpec, OpSpec, Program, TensorArg, even_core_spaces, op_fn, op_specs
from fspyre.machine.indexing import compile_index
from fspyre.machine.interpreter import run_program
from fspyre.machine.rules import open_grid
from fspyre.machine.spyre import spyre
from fspyre.stages.program import verify_program
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
    if arg.address >= 128:
        yield "address", {"address": arg.address - 128}
    yield "memory", {"memory": "lx" if mem == "hbm" else "hbm"}
    for level, a in enumerate(arg.tile_advance):
        adv = list(arg.tile_advance)
        adv[level] = 2 * a if a else 128
        yield "tile_advance", {"tile_advance": tuple(adv)}


def _inside(coord, space: FrozenMap, size: int) -> bool:
    """``coord`` stays below ``size`` over the op's whole iteration space."""
    values = compile_index(coord, list(space))(*open_grid([n for n, _ in space.values()]))
    return int(np.max(values)) < size


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
        if split > 1:
            yield "split", respace((size, 1))
        if size % (2 * split) == 0 and split * 2 <= 32:
            yield "split", respace((size, split * 2))
        yield "size", respace((size * 2, split))
        if size // 2 >= split and (size // 2) % split == 0:
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
        if spec.count > 1:
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
