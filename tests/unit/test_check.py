"""``fspyre.check``'s per-element bound: planted wrong programs are NOT EQUAL, legal tilings
and core counts stay EQUAL (docs/semantics.md, "What check promises").

Inputs defeat invariances: softmax rows are offset by different constants (a softmax using
the wrong row max or a constant output is then visibly wrong), amax inputs are all negative
(a 0 identity would win), outputs are small (softmax over 256 columns is at most ~0.02)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fspyre
from fspyre.check import REDUCTION_RTOL, compare
from fspyre.machine.reference import evaluate_with_bounds
from fspyre.machine.spyre import spyre

ROWS, COLS = 32, 1024


def softmax_graph(variant: str = "ok", dtype: str = "float16", slices: dict | None = None) -> fspyre.ir.graph.Graph:
    g = fspyre.GraphBuilder("softmax")
    R, C = g.dim("R", ROWS), g.dim("C", COLS)
    x = g.input("x", (R, C), dtype)
    with g.hint(slices=slices or {}):
        if variant == "wrong_max":  # one max for the whole tensor instead of one per row
            m = g.amax(x, ["R", "C"])
        else:
            m = g.amax(x, ["C"], keepdim=True)
        e = g.exp(g.sub(x, m))
        if variant == "wrong_dtype":  # an intermediate silently in float16
            e = g.cast(g.cast(e, "float16"), dtype)
        s = g.sum(e, ["C"], keepdim=True)
        if variant == "half_range":  # twice the sum over one half of the row
            halves = g.sum(g.reshape(e, ["R", g.dim("H", 2), g.dim("W", COLS // 2)]), ["W"])
            s = g.mul(g.amin(halves, ["H"]), 2.0)
        y = g.div(e, s)
        if variant == "constant":
            y = g.add(g.mul(y, 0.0), 1.0 / 1024)
    g.output("y", y)
    return g.build()


def softmax_inputs(seed: int, dtype=np.float16) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    offsets = rng.uniform(-12.0, 12.0, (ROWS, 1))  # rows offset by different constants
    return {"x": (rng.uniform(-1.0, 1.0, (ROWS, COLS)) + offsets).astype(dtype)}


@pytest.mark.parametrize("variant", ["constant", "wrong_max", "half_range", "wrong_dtype"])
def test_planted_wrong_softmax_is_not_equal(variant):
    dtype = "float32" if variant == "wrong_dtype" else "float16"
    inputs = softmax_inputs(1, np.float32 if dtype == "float32" else np.float16)
    good = softmax_graph(dtype=dtype)
    ref, bounds = evaluate_with_bounds(good, inputs)
    bad = fspyre.run(fspyre.compile(softmax_graph(variant, dtype=dtype), machine=spyre(cores=4)), inputs)
    # independent: torch's softmax in float32 on the same device-rounded inputs
    want = torch.softmax(torch.from_numpy(inputs["x"].astype(np.float32)), dim=-1).numpy()
    assert np.abs(ref["y"].astype(np.float64) - want).max() < 0.01 * want.max()
    diff = np.abs(bad["y"].astype(np.float64) - ref["y"].astype(np.float64))
    diff = np.nan_to_num(diff, nan=np.inf)
    if variant != "wrong_max":  # the old rule rtol·max(1, max|ref|) took every one but NaNs
        assert np.nanmax(diff) <= REDUCTION_RTOL[dtype] * max(1.0, float(np.abs(ref["y"]).max()))
    report = compare(good, bad, ref, bounds)
    assert not report.equal, str(report)


def test_planted_amax_with_zero_identity_is_not_equal():
    g = fspyre.GraphBuilder("amax_neg")
    R, C = g.dim("R", 32), g.dim("C", 128)
    x = g.input("x", (R, C), "float16")
    g.output("m", g.mul(g.amax(x, ["C"]), 1e-3))
    good = g.build()
    x_np = -np.random.default_rng(2).uniform(0.5, 3.0, (32, 128)).astype(np.float16)  # all negative
    ref, bounds = evaluate_with_bounds(good, {"x": x_np})
    assert np.array_equal(ref["m"], (x_np.max(axis=1).astype(np.float32) * np.float32(1e-3)).astype(np.float16)
                          ) or np.allclose(ref["m"], x_np.max(axis=1) * 1e-3, rtol=2**-8)
    bad = {"m": np.maximum(ref["m"], 0).astype(np.float16)}  # an amax that started from 0
    assert not compare(good, bad, ref, bounds).equal
    assert compare(good, ref, ref, bounds).equal


@pytest.mark.parametrize("cores", [1, 3, 32])
@pytest.mark.parametrize("slices", [{}, {"R": 4}, {"R": 16}])
def test_legit_softmax_tilings_are_equal(cores, slices):
    graph = softmax_graph(slices=slices)
    for seed in range(3):
        report = fspyre.check(graph, softmax_inputs(seed), machine=spyre(cores=cores))
        assert report.equal, str(report)


def _recip_matmul() -> fspyre.ir.graph.Graph:
    g = fspyre.GraphBuilder("recip_matmul")
    M, K, N = g.dim("M", 64), g.dim("K", 320), g.dim("N", 64)
    a = g.input("a", (M, K), "float16")
    w = g.input("w", (K, N), "float16")
    g.output("y", g.reciprocal(g.matmul(a, w)))
    return g.build()


def test_reduction_then_amplifying_op_is_equal_on_32_cores():
    """reciprocal(matmul(a, w)), K = 320, 32 cores: near-zero matmul results amplify the
    summation-order difference; the propagated bound covers it for every seed."""
    graph = _recip_matmul()
    comp = fspyre.compile(graph, machine=spyre(cores=32))
    for seed in range(20):
        report = fspyre.check(graph, seed=seed, machine=spyre(cores=32), comp=comp)
        assert report.equal, f"seed {seed}: {report}"


def test_pointwise_bound_is_zero_and_reduction_bound_is_small():
    graph = softmax_graph()
    inputs = softmax_inputs(0)
    ref, bounds = evaluate_with_bounds(graph, inputs)
    y = ref["y"].astype(np.float64)
    # a few float16 ulps of each element, not of the largest one
    assert np.all(bounds["y"] <= 8 * 2.0**-10 * np.abs(y) + 2.0**-24 * 4)
    g = fspyre.GraphBuilder("pw")
    A = g.dim("A", 64)
    x = g.input("x", (A,), "float16")
    g.output("y", g.exp(x))
    pw = g.build()
    assert evaluate_with_bounds(pw, {"x": np.zeros(64, np.float16)})[1]["y"] is None


def _online_softmax():
    g = fspyre.GraphBuilder("online_softmax")  # tiled over N: the running max and sum of the online rewrite
    M, N = g.dim("M", 32), g.dim("N", 256)
    x = g.input("x", (M, N), "float16")
    with g.hint(slices={"N": 2}):
        e = g.exp(g.sub(x, g.amax(x, ["N"], keepdim=True)))
        g.output("y", g.div(e, g.sum(e, ["N"], keepdim=True)))
    graph = g.build()
    return graph, fspyre.compile(graph, machine=spyre(cores=4), tiling="hints")


def _replace_op(comp, name: str, **info):
    from dataclasses import replace

    from fspyre.ir.program import LoopSpec, OpSpec

    def edit(body):
        return tuple(replace(s, body=edit(s.body)) if isinstance(s, LoopSpec) else
                     replace(s, op_info=replace(s.op_info, **info)) if isinstance(s, OpSpec) and s.name == name
                     else s for s in body)
    return replace(comp, program=replace(comp.program, body=edit(comp.program.body)))


def test_a_running_max_that_reduces_nothing_is_refused():
    # issue 22: with op_info.reduced emptied the running max took one column's value and
    # check said EQUAL on its default inputs (softmax hides the shift)
    from fspyre.errors import ExecutionError

    graph, comp = _online_softmax()
    with pytest.raises(ExecutionError, match="not in op_info.reduced"):
        fspyre.check(graph, comp=_replace_op(comp, "buf0", reduced=()))


def test_check_s_second_run_catches_what_softmax_s_shift_invariance_hides():
    # the running max starting at 0 instead of -inf: exact wherever a row's max is above 0, as
    # on the default inputs; rows shifted far below 0 underflow
    from fspyre.ir.program import ScalarOperand
    from fspyre.machine.hostio import random_inputs
    from fspyre.machine.interpreter import run_program

    graph, comp = _online_softmax()
    bad = _replace_op(comp, "buf0_fill", operands=(ScalarOperand(value=0.0),))
    inputs = random_inputs({"x": graph.buffer_table()["x"].type}, 0)
    ref, bounds = evaluate_with_bounds(graph, inputs)
    assert compare(graph, run_program(bad.program, inputs)[0], ref, bounds).equal  # hidden on these
    assert fspyre.check(graph, comp=comp).equal
    assert not fspyre.check(graph, comp=bad).equal


def test_an_output_of_another_shape_is_refused_not_broadcast():
    # a loaded tree may declare an output's kept axis elsewhere, or drop it: no index records
    # a dim of size 1, so the program runs, and its output must not be broadcast against the graph's
    g = fspyre.GraphBuilder("rowsum")
    r, c = g.dim("R", 8), g.dim("C", 64)
    x = g.input("x", (r, c), "float32")
    g.output("s", g.sum(x, ["C"], keepdim=True))
    graph = g.build()
    machine = spyre(cores=1)
    inputs = {"x": np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)}
    ref, bounds = evaluate_with_bounds(graph, inputs, machine)
    assert compare(graph, ref, ref, bounds).equal
    for shape in ((1, 8), (8,), (8, 1, 1)):
        with pytest.raises(fspyre.errors.ExecutionError, match=rf"compare rowsum: output s has shape "
                                                               rf"\[{', '.join(map(str, shape))}\] where the graph's "
                                                               rf"has \[8, 1\]"):
            compare(graph, {"s": ref["s"].reshape(shape)}, ref, bounds)
