"""The issue's examples end to end: program shape, advances derived by hand from the stick
layout, and equality with the untiled program on the machine-model interpreter."""

from __future__ import annotations

import numpy as np
import pytest
import sympy
from tiling_examples import EXAMPLES, canonical, matmul_m, nested_reduction

import fspyre
from fspyre.check import REDUCTION_RTOL
from fspyre.ir.graph import sym
from fspyre.ir.program import LoopSpec, OpSpec, op_specs
from fspyre.testing import inputs_for
from fspyre.testing.hints import tiles_a_reduction

ONE = fspyre.machine.spyre(cores=1)
FULL = fspyre.machine.spyre(cores=32)


def runs(graph, machine):
    inputs = inputs_for(graph, 3)
    tiled = fspyre.compile(graph, machine)
    untiled = fspyre.compile(graph, machine, tiling="none")
    return tiled, fspyre.run(tiled, inputs), fspyre.run(untiled, inputs)


def max_rel_diff(graph, got, want) -> dict[str, float]:
    out = {}
    for o in graph.outputs:
        a, b = got[o.name].astype(np.float64), want[o.name].astype(np.float64)
        out[o.name] = float(np.abs(a - b).max() / max(1.0, np.abs(b).max()))
    return out


# -- the canonical example, read field by field -----------------------------------------------
def test_canonical_program():
    comp = fspyre.compile(canonical(), FULL)
    (outer,) = comp.program.body
    assert isinstance(outer, LoopSpec) and outer.count == 2
    (inner,) = outer.body
    assert isinstance(inner, LoopSpec) and inner.count == 4
    add, mul = inner.body
    assert (add.op, mul.op) == ("add", "mul")
    A, B = sym("A"), sym("B")
    for spec in (add, mul):
        assert [(s, size) for s, (size, _) in spec.iteration_space.items()] == [(A, 512), (B, 1024)]
        assert spec.tiled_symbols == ((A,), (B,))
    args = {t.name: t for spec in (add, mul) for t in spec.args}
    # a, b, c and z advance through their full [1024, 4096] stick layouts, device [64, 1024, 64]:
    #   outer level (A, 512 rows): 512 rows x 64 elements x 2 bytes            =    65,536 bytes
    #   inner level (B, 1024 cols): 1024 / 64 = 16 sticks x 1024 rows x 128 B  = 2,097,152 bytes
    # (the seed lists row-major 4,194,304 and 2,048, which its own layout contradicts)
    for name in ("a", "b", "c", "buf1"):
        assert args[name].device_size == (64, 1024, 64)
        assert args[name].tile_advance == (65_536, 2_097_152)
        assert args[name].memory == "hbm"
    assert args["buf1"].arg_index == 3 and not args["buf1"].is_input
    # y lives in one tile at a fixed address
    y = args["buf0"]
    assert y.device_size == (16, 512, 64) and y.tile_advance == (0, 0) and y.arg_index == -1
    assert y.device_coordinates == (sympy.floor(B / 64), A, sympy.Mod(B, 64))
    assert comp.stages["loop_tree"].buffer_table()["buf0"].scope == "tile"


def test_canonical_equals_untiled():
    graph = canonical()
    _, got, want = runs(graph, FULL)
    assert np.array_equal(got["z"], want["z"])
    assert fspyre.check(graph).equal


def test_no_hints_compile_as_untiled():
    g = fspyre.GraphBuilder("plain")
    g.dim("A", 64)
    x = g.input("x", ["A"], "float16")
    g.output("y", g.exp(x))
    graph = g.build()
    assert fspyre.compile(graph).program == fspyre.compile(graph, tiling="none").program
    assert all(isinstance(s, OpSpec) for s in fspyre.compile(graph).program.body)


# -- every example equals untiled --------------------------------------------------------------
@pytest.mark.parametrize("name", [n for n in EXAMPLES if n != "canonical"])
def test_examples_equal_untiled(name):
    """Exact on one core unless a reduction dim is tiled (matmul aside, below); on 32 cores
    work division may split reductions differently, so float reductions agree within
    REDUCTION_RTOL (docs/tiling.md, Numerics)."""
    graph = EXAMPLES[name]()
    for machine in (ONE, FULL):
        comp, got, want = runs(graph, machine)
        reassociated = tiles_a_reduction(comp.stages["loop_tree"]) or name.startswith("matmul") or machine.cores > 1
        for o in graph.outputs:
            if reassociated:
                rel = max_rel_diff(graph, got, want)[o.name]
                assert rel <= REDUCTION_RTOL["float16"], (name, machine.cores, rel)
            else:
                assert np.array_equal(got[o.name], want[o.name]), (name, machine.cores)
        assert fspyre.check(graph, machine=machine, comp=comp).equal


def test_matmul_m_tiling_is_bit_exact_on_one_core():
    graph = matmul_m()
    _, got, want = runs(graph, ONE)
    assert np.array_equal(got["c"], want["c"])


def test_nested_reduction_program():
    comp = fspyre.compile(nested_reduction(), FULL)
    (outer,) = comp.program.body
    (inner,) = outer.body  # the fill and the finish run in the inner loop's first and last iterations
    fill, scale, partial, combine, finish = inner.body
    assert (fill.op, finish.op) == ("full", "cast") and inner.count == 4
    assert (fill.runs, scale.runs, finish.runs) == ("first", "every", "last")
    assert (scale.op, partial.op, combine.op) == ("mul", "sum", "add")
    assert partial.tiled_symbols == ((sym("A"),), (sym("K"),))
    assert combine.tiled_symbols == ((sym("A"),), ())
    x = scale.args[0]
    # x [128, 1024] fp16 -> device [16, 128, 64]; A moves 64 rows: 64 x 128 B; K moves 256
    # columns = 4 sticks of 128 rows x 128 B
    assert x.device_size == (16, 128, 64) and x.tile_advance == (8_192, 65_536)
    assert scale.args[-1].tile_advance == (0, 0)  # x * 0.5 lives in one tile
    out = finish.args[-1]
    assert out.tile_advance == (128, 0) and out.memory == "hbm"  # r [128] -> device [2, 64]: 64 elements x 2 B


@pytest.mark.parametrize("fn", ["sum", "mean", "prod", "amax", "amin"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "int32"])
def test_every_tiled_reduction_agrees(fn, dtype):
    g = fspyre.GraphBuilder(f"{fn}_{dtype}")
    g.dim("A", 128)  # the [A] result advances under A: 2 in tiles of 64, whole sticks of every dtype
    g.dim("K", 512)
    x = g.input("x", ["A", "K"], dtype)
    with g.hint(slices={"A": 2}):
        with g.hint(slices={"K": 4}):
            r = g.reduce(fn, x, ["K"])
    g.output("r", r)
    graph = g.build()
    comp, got, want = runs(graph, ONE)
    assert tiles_a_reduction(comp.stages["loop_tree"])
    out_dtype = graph.buffer_table()[graph.outputs[0].buffer].type.dtype
    if fn in ("amax", "amin") or out_dtype == "int32":
        assert np.array_equal(got["r"], want["r"], equal_nan=True)  # order-free: exact
    else:
        assert max_rel_diff(graph, got, want)["r"] <= REDUCTION_RTOL[out_dtype]


def test_batch_dim_tiled_down_to_one_element():
    """N tiled by its size: each tile has N = 1, a dim the iteration space drops, yet every
    full-size tensor indexed by N must still advance (the anchor's squeezed advance)."""
    g = fspyre.GraphBuilder("squeeze")
    g.dim("N", 4)
    g.dim("A", 64)
    g.dim("B", 128)
    x = g.input("x", ["N", "A", "B"], "float16")
    bias = g.input("bias", ["B"], "float16")
    with g.hint(slices={"N": 4}):
        y = g.add(x, bias)
        z = g.mul(y, y)
    g.output("z", z)
    graph = g.build()
    comp, got, want = runs(graph, FULL)
    assert np.array_equal(got["z"], want["z"])
    add = next(s for s in op_specs(comp.program) if s.op == "add")
    x_arg = add.args[0]
    # x [4, 64, 128] -> device [64, 2, 4, 64] (the first host dim sits next to the stick):
    # one step of N is one stick, 128 bytes
    assert x_arg.device_size == (64, 2, 4, 64) and x_arg.tile_advance == (128,)
    assert add.args[1].tile_advance == (0,)  # bias is loop-invariant


def test_squeezed_intermediate_read_inside_the_loop():
    """An intermediate written before the loop and read in it, advancing only through a dim
    tiled down to one element: it must stay in HBM (LX tensors never advance)."""
    g = fspyre.GraphBuilder("squeeze_intermediate")
    g.dim("N", 2)
    g.dim("B", 64)
    x = g.input("x", ["N", "B"], "float16")
    y = g.neg(x)
    with g.hint(slices={"N": 2}):
        z = g.exp(y)
    g.output("z", z)
    graph = g.build()
    _, got, want = runs(graph, FULL)
    assert np.array_equal(got["z"], want["z"])


def test_stick_misaligned_tile_is_rounded_up_with_a_warning():
    """B: 16 on 512 fp16 columns would be tiles of 32 elements, half sticks: the tile is rounded
    up to 64 (8 iterations) and the warning names the op, dim, both counts and why."""
    g = fspyre.GraphBuilder("g")
    g.dim("A", 64)
    g.dim("B", 512)
    x = g.input("x", ["A", "B"], "float16")
    with g.hint(slices={"B": 16}):
        y = g.exp(x)
    g.output("y", y)
    graph = g.build()
    with pytest.warns(fspyre.FspyreWarning) as caught:
        comp = fspyre.compile(graph)
    msg = " ".join(str(w.message) for w in caught)
    for part in ("op buf0: level 0 (hint scope 0 slices={'B': 16}) tiles dim B (range 512) in 8 tiles of 64",
                 "8 iterations instead of the hinted 16", "a tile of 32 would move x (float16[A=64, B=512]) by 32",
                 "64-element sticks", "Hint count 8"):
        assert part in msg, msg
    assert [s.count for s in comp.program.body if hasattr(s, "count")] == [8]
    assert fspyre.check(graph, comp=comp).equal


def test_fp32_tiles_of_half_a_half_stick_are_fine():
    """fp32 sticks hold 32 elements, so 32-element tiles advance by whole sticks."""
    g = fspyre.GraphBuilder("g")
    g.dim("A", 64)
    g.dim("B", 512)
    x = g.input("x", ["A", "B"], "float32")
    with g.hint(slices={"B": 16}):
        y = g.exp(x)
    g.output("y", y)
    _, got, want = runs(g.build(), FULL)
    assert np.array_equal(got["y"], want["y"])


@pytest.mark.parametrize("fn", ["sum", "mean", "prod", "var"])
@pytest.mark.parametrize("reduced", [["B"], ["C"], ["B", "C"]])
def test_tiling_an_output_dim_keeps_a_reduction_bit_exact(fn, reduced):
    """Tiling only an output dim must not change any reduction's summation order. x[B, C, A]
    tiled on the innermost A used to be summed over B and C in another order than the whole
    tensor (numpy's order follows memory layout): sum off by 8e-4, var by 5e-6."""
    g = fspyre.GraphBuilder("lead_reduce")
    for name, size in (("A", 64), ("B", 128), ("C", 96)):
        g.dim(name, size)
    x = g.input("x", ["B", "C", "A"], "float32")
    with g.hint(slices={"A": 2}):
        r = g.reduce(fn, x, reduced, correction=1 if fn == "var" else 0)
    g.output("r", r)
    graph = g.build()
    inputs = inputs_for(graph, 3)
    if fn == "prod":  # keep a product of thousands of factors finite and nonzero
        inputs = {k: (1 + v / 4096).astype(v.dtype) for k, v in inputs.items()}
    tiled = fspyre.run(fspyre.compile(graph, ONE, tiling="hints"), inputs)["r"]
    untiled = fspyre.run(fspyre.compile(graph, ONE, tiling="none"), inputs)["r"]
    np.testing.assert_array_equal(tiled, untiled)
