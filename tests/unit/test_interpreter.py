"""The machine-model interpreter: its error reports for illegal accesses, and agreement with
the reference evaluator (and with plain numpy) on specific graphs over several core counts."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

import fspyre
from fspyre.errors import ExecutionError
from fspyre.ir.frozen import FrozenMap
from fspyre.ir.program import LoopSpec, Program, even_core_spaces, op_specs
from fspyre.machine import formats, interpreter
from fspyre.machine.formats import FORMATS, round_to
from fspyre.machine.interpreter import RunOptions, run_program
from fspyre.machine.spyre import spyre
from fspyre.testing import has_reduction, inputs_for

CORES = (1, 3, 8, 32)


def build(fn, name="t") -> fspyre.Graph:
    g = fspyre.GraphBuilder(name)
    fn(g)
    return g.build()


def add_graph() -> fspyre.Graph:
    def body(g):
        A, B = g.dim("A", 4), g.dim("B", 64)
        x = g.input("x", (A, B), "float32")
        y = g.neg(x)
        g.output("z", g.abs(y))

    return build(body)


# -- error reports -----------------------------------------------------------------------------


def with_arg(program: Program, op_index: int, position: int, **changes) -> Program:
    """``program`` with one TensorArg of one OpSpec replaced (the program is frozen)."""
    specs = op_specs(program)
    spec = specs[op_index]
    args = list(spec.args)
    args[position] = dataclasses.replace(args[position], **changes)
    new = dataclasses.replace(spec, args=tuple(args))

    def swap(body):
        return tuple(new if s is spec else dataclasses.replace(s, body=swap(s.body)) if isinstance(s, LoopSpec) else s
                     for s in body)

    return dataclasses.replace(program, body=swap(program.body))


def compiled(graph, cores=4):
    return fspyre.compile(graph, machine=spyre(cores=cores), tiling="none").program


def test_out_of_bounds_read_names_op_tensor_core_and_address():
    program = compiled(add_graph())
    bad = with_arg(program, 0, 0, memory="hbm", address=program.hbm_bytes)
    with pytest.raises(ExecutionError) as info:
        run_program(bad, inputs_for(add_graph()))
    msg = str(info.value)
    spec = op_specs(program)[0]
    pattern = rf"op {spec.name} tensor x core \d+: address (0x[0-9a-f]+) is outside HBM \({program.hbm_bytes} bytes\)"
    m = re.fullmatch(pattern, msg)
    assert m and int(m.group(1), 16) >= program.hbm_bytes, msg


def test_out_of_bounds_write_names_the_output_tensor():
    program = compiled(add_graph())
    out = op_specs(program)[1].args[-1]
    bad = with_arg(program, 1, len(op_specs(program)[1].args) - 1, memory="hbm", address=program.hbm_bytes * 4)
    with pytest.raises(ExecutionError, match=rf"tensor {out.name} core \d+: address 0x[0-9a-f]+ is outside HBM"):
        run_program(bad, inputs_for(add_graph()))


def test_never_written_read_names_op_tensor_core_and_address():
    program = compiled(add_graph(), cores=1)
    first = op_specs(program)[0]
    # the first op reads the graph output's HBM segment, which only the last op writes
    out = program.kernel_args[-1]
    target = out.address
    bad = with_arg(program, 0, 0, memory="hbm", address=target, arg_index=out.arg_index)
    with pytest.raises(ExecutionError) as info:
        run_program(bad, inputs_for(add_graph()))
    msg = str(info.value)
    assert f"op {first.name} tensor x core 0: reads HBM address {target:#x}, which was never written" == msg


def test_an_argument_tensor_stays_inside_the_argument_its_arg_index_names():
    """The runtime hands the kernel one base per argument: a tensor moved into another
    argument's bytes without its arg_index, or renumbered, reads outside its own argument."""
    program = compiled(add_graph(), cores=1)
    first = op_specs(program)[0]
    out = program.kernel_args[-1]
    moved = with_arg(program, 0, 0, memory="hbm", address=out.address)
    message = (rf"op {first.name} tensor x core 0: address 0x[0-9a-f]+ is outside kernel argument 0 "
               r"\(bytes 0x0\.\.0x[0-9a-f]+\), which its arg_index names")
    with pytest.raises(ExecutionError, match=message):
        run_program(moved, inputs_for(add_graph()))
    renumbered = with_arg(program, 0, 0, arg_index=out.arg_index)
    with pytest.raises(ExecutionError, match=rf"outside kernel argument {out.arg_index} "):
        run_program(renumbered, inputs_for(add_graph()))
    intermediate = with_arg(program, 0, 0, arg_index=-1)
    with pytest.raises(ExecutionError, match=r"is inside kernel argument x .* but the tensor is an intermediate"):
        run_program(intermediate, inputs_for(add_graph()))


def test_misaligned_address():
    program = compiled(add_graph(), cores=2)
    base = op_specs(program)[0].args[0].address
    bad = with_arg(program, 0, 0, memory="hbm", address=base + 2)
    with pytest.raises(ExecutionError, match=rf"tensor x core \d+: address {base + 2:#x} is not aligned to 4 bytes"):
        run_program(bad, inputs_for(add_graph()))


def test_lx_address_outside_a_core_lx():
    program = compiled(add_graph(), cores=2)
    bad = with_arg(program, 1, 0, memory="lx", address=program.lx_bytes)
    with pytest.raises(ExecutionError, match=r"tensor \w+ core \d+: address 0x[0-9a-f]+ is outside LX of core \d+"):
        run_program(bad, inputs_for(add_graph()))


def test_program_with_fewer_cores_than_its_splits():
    program = compiled(add_graph(), cores=8)
    spec = op_specs(program)[0]
    assert spec.cores > 1
    with pytest.raises(ExecutionError, match=rf"op {spec.name}: splits need {spec.cores} cores, the program has 1"):
        run_program(dataclasses.replace(program, cores=1), inputs_for(add_graph()))


def test_check_written_can_be_turned_off_and_then_unwritten_bytes_read_as_zero():

    program = compiled(add_graph(), cores=1)
    out = program.kernel_args[-1]
    bad = with_arg(program, 0, 0, memory="hbm", address=out.address, arg_index=out.arg_index)
    outs, _ = run_program(bad, inputs_for(add_graph()), RunOptions(check_written=False))
    assert np.all(outs["z"] == 0)


@pytest.mark.parametrize(
    "inputs, match",
    [
        ({}, r"inputs: missing \['x'\]"),
        ({"x": np.zeros((4, 64), np.float32), "w": np.zeros(1)}, r"unexpected \['w'\]"),
        ({"x": np.zeros((64, 4), np.float32)}, r"input x: shape \[64, 4\] but the graph declares \[4, 64\]"),
        ({"x": np.zeros((4, 64), np.complex64)}, "input x: dtype complex64 cannot be used as float32"),
    ],
)
def test_bad_inputs_are_reported(inputs, match):
    comp = fspyre.compile(add_graph(), machine=spyre(cores=2), tiling="none")
    with pytest.raises(ExecutionError, match=match):
        fspyre.run(comp, inputs)
    with pytest.raises(ExecutionError, match=match):
        fspyre.evaluate(add_graph(), inputs)


# -- agreement on specific graphs -------------------------------------------------------------


def agree(graph, cores=CORES, seed=0, fp16_format="IEEE_FP16", inputs=None):
    """run == evaluate for each core count (bit-exact without reductions); returns evaluate's result."""
    inputs = inputs_for(graph, seed) if inputs is None else inputs
    ref = None
    for c in cores:
        machine = spyre(cores=c, fp16_format=fp16_format)
        comp = fspyre.compile(graph, machine=machine, tiling="none")
        got = fspyre.run(comp, inputs)
        ref = fspyre.evaluate(graph, inputs, machine)
        if has_reduction(graph):
            report = fspyre.check(graph, inputs, machine=machine, tiling="none", comp=comp)
            assert report.equal, f"cores={c}\n{report}"
        else:
            for name in ref:
                assert got[name].dtype == ref[name].dtype and got[name].shape == ref[name].shape
                assert np.array_equal(got[name], ref[name], equal_nan=got[name].dtype.kind == "f"), f"{name} cores={c}"
    return inputs, ref


def f16(x):
    """float32 values rounded as an IEEE float16 store rounds them."""
    return np.asarray(x, np.float32).astype(np.float16)


def test_bias_of_one_dim_broadcasts_onto_two():
    def body(g):
        A, B = g.dim("A", 6), g.dim("B", 130)
        x = g.input("x", (A, B), "float16")
        bias = g.input("bias", (B,), "float16")
        g.output("y", g.add(x, bias))
        g.output("yt", g.mul(bias, g.permute(x, ("B", "A"))))

    ins, ref = agree(build(body))
    x, bias = ins["x"].astype(np.float32), ins["bias"].astype(np.float32)
    np.testing.assert_array_equal(ref["y"], f16(x + bias[None, :]))
    np.testing.assert_array_equal(ref["yt"], f16(bias[:, None] * x.T))


def test_permute_views_of_three_dims():
    def body(g):
        A, B, C = g.dim("A", 3), g.dim("B", 5), g.dim("C", 64)
        x = g.input("x", (A, B, C), "float32")
        y = g.input("y", (C, A, B), "float32")
        g.output("s", g.sub(g.permute(x, ("C", "A", "B")), y))
        g.output("p", g.neg(g.permute(x, (2, 0, 1))))

    ins, ref = agree(build(body))
    np.testing.assert_array_equal(ref["s"], ins["x"].transpose(2, 0, 1) - ins["y"])
    np.testing.assert_array_equal(ref["p"], -ins["x"].transpose(2, 0, 1))


def test_reshape_views_merge_and_split():
    def body(g):
        A, B, C = g.dim("A", 3), g.dim("B", 4), g.dim("C", 64)
        x = g.input("x", (A, B, C), "float16")
        F = g.dim("F", 12)
        merged = g.reshape(x, (F, C))
        g.output("m", g.exp(merged))
        P, Q = g.dim("P", 6), g.dim("Q", 2)  # splits B in the middle: still whole old strides
        g.output("s", g.abs(g.reshape(merged, (P, Q, C))))
        G = g.dim("G", 768)
        g.output("flat", g.neg(g.reshape(x, (G,))))

    ins, ref = agree(build(body))
    x = ins["x"].astype(np.float32)
    np.testing.assert_array_equal(ref["m"], f16(np.exp(x.reshape(12, 64))))
    np.testing.assert_array_equal(ref["s"], f16(np.abs(x.reshape(6, 2, 64))))
    np.testing.assert_array_equal(ref["flat"], f16(-x.reshape(768)))


@pytest.mark.parametrize(
    "shape, middle, new, dtype",
    [
        ((3, 4, 64), (12, 64), (2, 6, 64), "float16"),  # regroups across the old A|B boundary
        ((2, 100), (200,), None, "float16"),  # merges a padded stick dim
        ((2, 3), (6,), None, "float32"),  # merges a stick dim shorter than a stick
        ((4, 64), (256,), (8, 32), "float16"),  # splits a stick dim below the stick size
    ],
)
def test_reshapes_the_layout_cannot_address_are_refused_not_miscomputed(shape, middle, new, dtype):
    """Either the view runs correctly or fspyre refuses it with an FspyreError; never wrong values."""
    g = fspyre.GraphBuilder("t")
    names = [f"D{i}" for i in range(len(shape))]
    for n, size in zip(names, shape):
        g.dim(n, size)
    try:
        x = g.input("x", names, dtype)
        y = g.reshape(x, [g.dim(f"M{i}", s) for i, s in enumerate(middle)])
        if new is not None:
            y = g.reshape(y, [g.dim(f"N{i}", s) for i, s in enumerate(new)])
        g.output("y", g.neg(y))
        graph = g.build()
        inputs = inputs_for(graph)
        comp = fspyre.compile(graph, machine=spyre(cores=2), tiling="none")
        got = fspyre.run(comp, inputs)["y"]
    except fspyre.FspyreError as err:
        assert "reshape" in str(err) or "stick" in str(err), str(err)
        return
    # the device holds the input in its own format (DLFloat16 for float16): compare to that
    fmt = FORMATS[spyre().device_format(dtype)]
    held = round_to(inputs["x"].astype(np.float32), fmt).astype(inputs["x"].dtype)
    np.testing.assert_array_equal(got, -held.reshape(new or middle))


def test_keepdim_reductions_broadcast_back():
    def body(g):
        R, C = g.dim("R", 10), g.dim("C", 96)
        x = g.input("x", (R, C), "float32")
        centred = g.sub(x, g.mean(x, ["C"], keepdim=True))
        g.output("c", centred)
        g.output("m", g.amax(x, ["R"], keepdim=True))
        g.output("v", g.var(x, ["C"], keepdim=True))

    ins, ref = agree(build(body))
    x = ins["x"]
    np.testing.assert_allclose(ref["c"], x - x.mean(axis=1, keepdims=True), rtol=0, atol=1e-6)
    np.testing.assert_array_equal(ref["m"], x.max(axis=0, keepdims=True))
    np.testing.assert_allclose(ref["v"], x.var(axis=1, ddof=1, keepdims=True), rtol=1e-5)
    assert ref["m"].shape == (1, 96) and ref["v"].shape == (10, 1)


def test_matmul_with_a_batch_dim():
    def body(g):
        S, M, K, N = g.dim("S", 3), g.dim("M", 16), g.dim("K", 96), g.dim("N", 64)
        a = g.input("a", (S, M, K), "float32")
        b = g.input("b", (S, K, N), "float32")
        g.output("y", g.matmul(a, b, contract="K"))
        w = g.input("w", (K, N), "float32")
        g.output("shared", g.matmul(a, w))

    ins, ref = agree(build(body))
    np.testing.assert_allclose(ref["y"], ins["a"] @ ins["b"], rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(ref["shared"], ins["a"] @ ins["w"], rtol=1e-5, atol=1e-4)


def test_matmul_over_a_dim_neither_operand_varies_along():
    """A contracted dim both operands only broadcast along still counts its extent."""

    def body(g):
        E, J = g.dim("E", 4), g.dim("J", 3)
        x = g.input("x", (fspyre.Dim("E", 1), J), "float32")
        v = g.expand(x, (E, J))
        g.output("y", g.matmul(v, v, contract="E"))

    ins, ref = agree(build(body), cores=(1, 2, 4))
    np.testing.assert_allclose(ref["y"], 4 * ins["x"][0] ** 2, rtol=1e-6)


def test_int32_and_bool_ops():
    def body(g):
        A, B = g.dim("A", 5), g.dim("B", 40)
        i = g.input("i", (A, B), "int32")
        j = g.input("j", (B,), "int32")
        m = g.input("m", (A, B), "bool")
        g.output("sum", g.add(i, j))
        g.output("prod", g.mul(i, g.sub(j, 3)))
        g.output("max", g.maximum(i, j))
        g.output("lt", g.lt(i, j))
        g.output("sel", g.where(m, i, -1))
        g.output("not", g.logical_not(m))
        g.output("count", g.sum(m, ["B"]))
        g.output("ifloat", g.cast(g.div(i, 2), "int32"))

    ins, ref = agree(build(body))
    i, j, m = ins["i"], ins["j"], ins["m"]
    np.testing.assert_array_equal(ref["sum"], i + j)
    np.testing.assert_array_equal(ref["prod"], i * (j - 3))
    np.testing.assert_array_equal(ref["max"], np.maximum(i, j))
    np.testing.assert_array_equal(ref["lt"], i < j)
    np.testing.assert_array_equal(ref["sel"], np.where(m, i, -1))
    np.testing.assert_array_equal(ref["not"], ~m)
    np.testing.assert_array_equal(ref["count"], m.sum(axis=1))
    np.testing.assert_array_equal(ref["ifloat"], np.trunc(i / 2).astype(np.int32))  # toward zero, as torch
    assert ref["sum"].dtype == np.int32 and ref["lt"].dtype == np.bool_ and ref["count"].dtype == np.int32


def test_bfloat16_values_stay_bfloat16():
    def body(g):
        A, B = g.dim("A", 7), g.dim("B", 64)
        x = g.input("x", (A, B), "bfloat16")
        y = g.input("y", (B,), "bfloat16")
        g.output("z", g.mul(g.add(x, y), 3))
        g.output("s", g.sum(x, ["B"]))

    ins, ref = agree(build(body))
    x, y = ins["x"], ins["y"]
    assert ref["z"].dtype == np.float32  # bfloat16 travels as float32 holding bfloat16 values
    bf = formats.round_to(x + y, formats.BF16)
    np.testing.assert_array_equal(ref["z"], formats.round_to(bf * np.float32(3), formats.BF16))
    np.testing.assert_array_equal(formats.round_to(ref["z"], formats.BF16), ref["z"])


def test_dlfloat16_rounding_on_every_store():
    def body(g):
        A = g.dim("A", 128)
        x = g.input("x", (A,), "float16")
        g.output("y", g.mul(x, 1.001))

    ins, ref = agree(build(body), fp16_format="SEN169_FP16")
    dl = formats.FORMATS["SEN169_FP16"]
    x = formats.round_to(ins["x"].astype(np.float32), dl)  # copy-in rounds to DLFloat16
    np.testing.assert_array_equal(ref["y"], formats.round_to(x * np.float32(1.001), dl).astype(np.float16))


@pytest.mark.parametrize("fn", ["gelu", "silu", "exp", "neg", "sigmoid", "tanh"])
def test_zero_dimensional_tensors(fn):
    def body(g):
        x = g.input("x", (), "float32")
        g.output("y", getattr(g, fn)(x))
        g.output("s", g.add(x, g.constant(2.0, "float32")))

    ins, ref = agree(build(body), cores=(1, 4))
    assert ref["y"].shape == () and ref["s"] == ins["x"] + np.float32(2)


# -- planted bugs: a corrupted program is caught, never silently accepted ------------------------


def _tiled(cores=4):
    g = fspyre.GraphBuilder("planted")
    A, B = g.dim("A", 8), g.dim("B", 256)
    a, b = g.input("a", (A, B), "float16"), g.input("b", (A, B), "float16")
    with g.hint(slices={"A": 2}):
        y = g.add(a, b)
        g.output("z", g.mul(y, g.sum(y, ["B"], keepdim=True)))
    graph = g.build()
    return graph, fspyre.compile(graph, machine=spyre(cores=cores), tiling="hints").program


def _replace_spec(program: Program, old, new) -> Program:
    def swap(body):
        return tuple(new if s is old else dataclasses.replace(s, body=swap(s.body)) if isinstance(s, LoopSpec) else s
                     for s in body)

    return dataclasses.replace(program, body=swap(program.body))


def _caught(graph, program, options: RunOptions = RunOptions()) -> bool:
    """An ExecutionError, or outputs that differ from the reference evaluator."""
    inputs = inputs_for(graph)
    try:
        got, _ = run_program(program, inputs, options)
    except ExecutionError:
        return True
    ref = fspyre.evaluate(graph, inputs, spyre(cores=program.cores))
    return any(not np.allclose(got[n], ref[n], rtol=1e-2, atol=1e-2, equal_nan=True) for n in ref)


def _plants(program: Program):
    """(what, corrupted program) for a stride, an address, an advance, a loop count and a split."""
    loop = next(s for s in program.body if isinstance(s, LoopSpec))
    yield "loop count - 1", _replace_spec(program, loop, dataclasses.replace(loop, count=loop.count - 1))
    yield "loop count + 1", _replace_spec(program, loop, dataclasses.replace(loop, count=loop.count + 1))
    for oi, spec in enumerate(op_specs(program)):
        for ai, arg in enumerate(spec.args):
            mem = arg.memory
            yield f"op {oi} arg {ai} address + 1 stick", with_arg(program, oi, ai,
                                                                 memory=mem, address=arg.address + 128)
            # A longer dim 1: every stride outside it grows. Only for HBM: the interpreter lays
            # an LX tensor out over each core's box, not over device_size (issue 9, item 4).
            if mem == "hbm" and len(arg.device_size) > 2:
                size = (arg.device_size[0], arg.device_size[1] + 1) + tuple(arg.device_size[2:])
                yield f"op {oi} arg {ai} stride", with_arg(program, oi, ai, device_size=size)
            if any(arg.tile_advance):
                adv = tuple(2 * a for a in arg.tile_advance)
                yield f"op {oi} arg {ai} advance x2", with_arg(program, oi, ai, tile_advance=adv)
        for sym, (size, split) in spec.iteration_space.items():
            if split > 1:
                space = FrozenMap({s: ((n, 1) if s == sym else (n, k)) for s, (n, k) in spec.iteration_space.items()})
                unsplit = dataclasses.replace(spec, iteration_space=space, core_spaces=even_core_spaces(space))
                yield f"op {oi} split of {sym} -> 1", _replace_spec(program, spec, unsplit)


@pytest.mark.parametrize("options", [RunOptions(), RunOptions(block=16), RunOptions(block=16, check_written=False)],
                         ids=["default", "cut into blocks", "blocks, checks=fast"])
def test_planted_corruptions_are_caught(options):
    """Also when every op is cut into blocks and without written bits: the fast paths do not
    hide a corrupted program."""
    graph, program = _tiled()
    assert not _caught(graph, program, options)
    plants = list(_plants(program))
    kinds = {what.split(" ", 2)[-1] if what.startswith("op") else what for what, _ in plants}
    assert {"loop count - 1", "loop count + 1"} <= kinds and any("stride" in k for k in kinds)
    assert any("advance" in w for w, _ in plants) and any("split" in w for w, _ in plants)
    missed = [what for what, bad in plants if not _caught(graph, bad, options)]
    assert not missed, missed


@pytest.mark.parametrize("tiling", ["none", "hints"])
def test_fast_checks_give_identical_results_on_valid_programs(tiling):
    graph, _ = _tiled()
    for cores in (1, 4):
        program = fspyre.compile(graph, machine=spyre(cores=cores), tiling=tiling)
        inputs = inputs_for(graph)
        full, fast = fspyre.run(program, inputs), fspyre.run(program, inputs, checks="fast")
        for name in full:
            assert np.array_equal(full[name], fast[name], equal_nan=True)


_TWO_BYTE = ("SEN169_FP16", "IEEE_FP16", "BF16")


@pytest.mark.parametrize("fn", ["copy", "cast", "neg", "abs", "relu", "sqrt", "logical_not"])
def test_a_recode_keeps_the_bits_only_where_its_table_does(fn):
    # a copy between the same formats skips its gather when the bits hold none of the few
    # patterns its table changes (DLFloat16's second NaN code 0xFFFF; none in IEEE_FP16):
    # the same bits as the gather, with those patterns present or not
    rng = np.random.default_rng(0)
    for src in _TWO_BYTE:
        for dst in _TWO_BYTE:
            table, moved = interpreter._recode_table(fn, "<f4", fn == "logical_not", src, dst)
            changed = np.nonzero(table != np.arange(1 << 16))[0]
            assert (moved is None) == (changed.size > interpreter._FEW_MOVED)
            if moved is not None:
                assert moved == tuple(changed)
            kept = np.setdiff1d(np.arange(1 << 16, dtype=np.uint16), changed)[::7]
            for bits in (rng.integers(0, 1 << 16, (3, 64, 5), dtype=np.uint16),
                         kept[:kept.size // 2 * 2].reshape(-1, 2)[:, ::-1],  # strided, none of them changed
                         np.full((4, 4), 0xFFFF, np.uint16)):
                got = interpreter._recoded(table, moved, bits)
                assert got.shape == bits.shape and np.array_equal(got, table[bits]), (src, dst)
    assert interpreter._recode_table("copy", "<f4", False, "SEN169_FP16", "SEN169_FP16")[1] == (0xFFFF,)
    assert interpreter._recode_table("copy", "<f4", False, "IEEE_FP16", "IEEE_FP16")[1] == ()


def test_values_decode_in_memory_order_into_the_grid():
    # a view whose grid axes run against the memory (b of a matmul in the device's sticks,
    # (N/64, K, N%64), viewed as [N, K]) decodes in the memory's order: the same values as the
    # decode in grid order, laid out K-major
    fmt = FORMATS["SEN169_FP16"]
    rng = np.random.default_rng(0)
    mem = rng.integers(0, 1 << 16, (4, 96, 64), dtype=np.uint16)
    view = mem.transpose(0, 2, 1)  # view axes N/64, N%64, K: two grid axes (N, K)
    groups = [((4, 96 * 64), (64, 1)), ((96, 64),)]
    order = interpreter._memory_order(groups)
    assert order == (2, 0, 1)
    got = interpreter._decode(view, fmt, order, (256, 96))
    assert np.array_equal(got, formats.decode(view, fmt).reshape(256, 96), equal_nan=True)
    assert got.strides == (4, 256 * 4)  # [K, N] row-major, without a copy after the decode
    assert interpreter._memory_order([((4, 64),), ((8, 1),)]) == ()  # already in memory order
    # only the finest axis moves: the others (batch axes of a batched matmul, size-1 and
    # broadcast axes) keep their order, whatever their strides
    assert interpreter._memory_order([((1, 0),), ((5, 1),), ((3, 0),), ((6, 5),)]) == (0, 2, 3, 1)
    assert interpreter._memory_order([((2, 64), (4, 2048)), ((1, 0),), ((64, 1),), ((16, 128),)]) == (0, 1, 2, 4, 3)
