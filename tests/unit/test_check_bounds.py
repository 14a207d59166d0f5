"""``check``'s own bound where the float32 error model stops holding (docs/semantics.md, "What
check promises"): a NaN a store holds, and products whose partials leave float32's range.

Each property compares ``evaluate_with_bounds`` with an independent computation written here
from the op's definition in numpy (float64 for the exact value, float32 in an order the
docs allow for the machine's), and requires ``check`` to agree with itself (the reference
against itself is EQUAL) and with that computation (any legal order is within the bound)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import fspyre
from fspyre.check import compare
from fspyre.machine.hostio import device_values
from fspyre.machine.reference import evaluate_with_bounds
from fspyre.machine.spyre import spyre
from fspyre.testing import numpy_ref as R

ROWS, COLS = 4, 64
_FNS = ("sum", "mean", "prod", "amax", "amin")


def _reduce_graph(fn: str, dtype: str, slices: dict | None = None):
    g = fspyre.GraphBuilder(f"{fn}_{dtype}")
    R, C = g.dim("R", ROWS), g.dim("C", COLS)
    x = g.input("x", (R, C), dtype)
    with g.hint(slices=slices or {}):
        g.output("y", getattr(g, fn)(x, ["C"]))
    return g.build()


def _matmul_graph(dtype: str):
    g = fspyre.GraphBuilder(f"matmul_{dtype}")
    M, K, N = g.dim("M", ROWS), g.dim("K", COLS), g.dim("N", 64)
    a, b = g.input("a", (M, K), dtype), g.input("b", (K, N), dtype)
    g.output("y", g.matmul(a, b))
    return g.build()


def _host(values: np.ndarray, dtype: str) -> np.ndarray:
    return values.astype(np.float32) if dtype == "bfloat16" else values.astype(dtype)


@settings(max_examples=25, deadline=None)
@given(fn=st.sampled_from(_FNS + ("matmul",)), dtype=st.sampled_from(["bfloat16", "float16", "float32"]),
       fp16=st.sampled_from(["SEN169_FP16", "IEEE_FP16"]), seed=st.integers(0, 2**16),
       nans=st.lists(st.tuples(st.integers(0, ROWS - 1), st.integers(0, COLS - 1)), min_size=1, max_size=3))
def test_a_stored_nan_is_equal_to_itself_and_to_an_independent_reference(fn, dtype, fp16, seed, nans):
    machine = spyre(fp16_format=fp16)
    rng = np.random.default_rng(seed)
    x = np.round(rng.standard_normal((ROWS, COLS)) * 64) / 64  # 8 significant bits: exact in every format
    for r, c in nans:
        x[r, c] = np.nan
    if fn == "matmul":
        graph = _matmul_graph(dtype)
        b = rng.standard_normal((COLS, 64))
        inputs = {"a": _host(x, dtype), "b": _host(b, dtype)}
        independent = np.isnan(x) @ np.ones((COLS, 64)) > 0  # a row with a NaN term is NaN in every column
    else:
        graph = _reduce_graph(fn, dtype)
        inputs = {"x": _host(x, dtype)}
        independent = np.isnan(x).any(axis=1)  # NaN propagates through every fn here in any order
    ref, bounds = evaluate_with_bounds(graph, inputs, machine)
    assert np.array_equal(np.isnan(np.asarray(ref["y"], np.float64)), independent)
    bound = np.zeros(ROWS) if bounds["y"] is None else bounds["y"]  # None: bit-exact (amax, amin)
    assert not np.isnan(bound).any()
    assert np.all(np.isfinite(bound[independent]))  # NaN must match NaN there, not "anything"
    assert compare(graph, ref, ref, bounds).equal
    if fn in ("sum", "mean", "amax", "amin"):  # and so does numpy_ref, from the op's definition
        host = inputs["x"].astype(np.float64)
        want = R.reduce(fn, R.exact(["R", "C"], host, dtype), ["C"], ["R"], False, dtype, machine.fp16_format)
        assert R.accept(ref["y"], want).all()
    report = fspyre.check(graph, inputs, machine=machine, tiling="none")
    assert report.equal, str(report)


def _ordered_prod(values: np.ndarray, rng: np.random.Generator) -> np.float32:
    """The float32 product of ``values`` in a random order the docs allow: any association of
    any permutation (tiles, cores and their combination are special cases)."""
    parts = [np.float32(v) for v in rng.permutation(values)]
    with np.errstate(all="ignore"):
        while len(parts) > 1:
            i = int(rng.integers(len(parts) - 1))
            parts[i:i + 2] = [np.float32(parts[i] * parts[i + 1])]
    return parts[0]


_WIDE = st.builds(lambda m, e, s: s * m * 2.0**e, st.floats(1.0, 2.0), st.integers(-100, 100), st.sampled_from([-1, 1]))


@settings(max_examples=60, deadline=None)
@given(values=st.lists(_WIDE, min_size=COLS, max_size=COLS), seed=st.integers(0, 2**16))
def test_a_float32_product_in_any_legal_order_is_within_the_bound(values, seed):
    graph = _reduce_graph("prod", "float32")
    x = np.tile(np.asarray(values, np.float32), (ROWS, 1))
    ref, bounds = evaluate_with_bounds(graph, {"x": x})
    rng = np.random.default_rng(seed)
    got = np.array([_ordered_prod(x[r], rng) for r in range(ROWS)])
    exact = np.prod(x[0].astype(np.float64))
    for r in range(ROWS):
        want, bound = float(ref["y"][r]), float(bounds["y"][r])
        if np.isinf(bound):  # some order leaves float32's range: any value
            assert np.prod(np.abs(x[0][np.abs(x[0]) > 1]).astype(np.float64)) >= np.finfo(np.float32).max / 2
            continue
        assert abs(float(got[r]) - want) <= bound, (got[r], want, bound)
        if abs(exact) < 2.0**100:  # the exact product, in float64, also within (one side's share)
            assert abs(exact - want) <= bound
    assert compare(graph, ref, ref, bounds).equal
    tiled = fspyre.check(_reduce_graph("prod", "float32", slices={"C": 2}), {"x": x}, machine=spyre(cores=4),
                         tiling="hints")
    assert tiled.equal, str(tiled)


def test_the_issue_s_overflowing_product_is_not_called_wrong():
    # partials of 2^100 · 2^100 overflow float32 in one order (inf) and not in another (≈ 1)
    x = np.ones((ROWS, COLS), np.float32)
    x[:, :2] = 2.0**100
    x[:, 2:4] = 2.0**-100
    graph = _reduce_graph("prod", "float32")
    ref, bounds = evaluate_with_bounds(graph, {"x": x})
    rng = np.random.default_rng(1)
    orders = {float(_ordered_prod(x[0], rng)) for _ in range(64)}
    assert np.inf in orders and any(np.isfinite(v) for v in orders)  # the orders really differ
    assert np.all(np.isinf(bounds["y"]))
    # a product whose partials stay inside float32's range keeps its relative bound
    x[:, :2] = 2.0**50
    x[:, 2:4] = 2.0**-50
    ref, bounds = evaluate_with_bounds(graph, {"x": x})
    assert np.all(bounds["y"] < 1e-5 * np.abs(ref["y"]))


# Any value a store can meet: signed zeros, signed infinities, NaN, tiny and huge numbers and
# ordinary ones; a row may hold several of them.
_SPECIAL = st.one_of(st.sampled_from([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-30, -1e30, 65504.0, 2.0**-20]),
                     st.floats(-4.0, 4.0, width=32))


@settings(max_examples=40, deadline=None)
@given(fn=st.sampled_from(_FNS + ("matmul",)), dtype=st.sampled_from(["bfloat16", "float16", "float32"]),
       fp16=st.sampled_from(["SEN169_FP16", "IEEE_FP16"]), row=st.lists(_SPECIAL, min_size=COLS, max_size=COLS),
       seed=st.integers(0, 2**16), slices=st.sampled_from([1, 2, 4]), cores=st.sampled_from([1, 4]))
def test_check_agrees_with_itself_and_numpy_float64_on_special_values_in_any_legal_order(
        fn, dtype, fp16, row, seed, slices, cores):
    """Rows of special values, reduced whole by ``evaluate`` and tiled ``slices`` ways over
    ``cores`` cores by the machine: the reference is EQUAL to itself (a NaN bound never makes it
    unequal), the machine's result is EQUAL to it, and both are within numpy's float64 value of
    the op's definition plus numpy_ref's own bound (NaN where it is NaN)."""
    machine = spyre(cores=cores, fp16_format=fp16)
    rng = np.random.default_rng(seed)
    x = np.stack([rng.permutation(np.asarray(row, np.float64)) for _ in range(ROWS)])
    host = _host(x, dtype)
    # what the device holds once the host copies the row in (DLFloat16 has no infinity: ±inf
    # saturates to ±8573157376, docs/semantics.md), as numpy_ref reads it
    x = np.asarray(device_values(host, dtype, machine), np.float64)
    if fn == "matmul":
        graph = _matmul_graph(dtype)
        b = np.asarray(_host(np.round(rng.standard_normal((COLS, 64)) * 8) / 8, dtype), np.float64)
        inputs = {"a": _host(x, dtype), "b": _host(b, dtype)}
        want = R.matmul(R.exact(["M", "K"], x, dtype), R.exact(["K", "N"], b, dtype), "K", ["M", "N"], dtype, fp16)
        tiled = graph if slices == 1 else _hinted(graph, {"K": slices})
    else:
        graph = _reduce_graph(fn, dtype)
        inputs = {"x": _host(x, dtype)}
        want = R.reduce(fn, R.exact(["R", "C"], x, dtype), ["C"], ["R"], False, dtype, fp16)
        tiled = _reduce_graph(fn, dtype, slices={"C": slices} if slices > 1 else None)
    ref, bounds = evaluate_with_bounds(graph, inputs, machine)
    assert compare(graph, ref, ref, bounds).equal  # check agrees with itself
    if bounds["y"] is not None:
        assert not np.isnan(bounds["y"]).any()
    got = fspyre.run(fspyre.compile(tiled, machine=machine, tiling="hints"), inputs)
    assert compare(graph, got, ref, bounds).equal  # any legal order: tiles, cores
    # The host array holds what its dtype can: a device value past float16's range comes back
    # as +-inf (docs/semantics.md), so magnitudes are compared where the host can hold them
    # (with a factor 2 of room for the rounding at the edge) and signs of infinity past that.
    top = float(np.finfo(np.float32 if dtype == "bfloat16" else dtype).max)
    finite = np.isfinite(want.value) & np.isfinite(want.err) & (np.abs(want.value) < min(1e30, top / 2))
    beyond = np.isfinite(want.value) & (np.abs(want.value) > 2 * top)
    for out in (ref["y"], got["y"]):  # numpy in float64, from the definition, with its own bound
        assert np.array_equal(np.isnan(np.asarray(out, np.float64)), np.isnan(want.value)), (out, want.value)
        assert R.accept(out, want)[finite].all()
        assert np.array_equal(np.asarray(out, np.float64)[beyond], np.sign(want.value[beyond]) * np.inf)


def _hinted(graph, slices):
    """``graph`` (one matmul) with its op under a hint scope of ``slices``."""
    g = fspyre.GraphBuilder(graph.name)
    M, K, N = g.dim("M", ROWS), g.dim("K", COLS), g.dim("N", 64)
    dtype = graph.buffer_table()["a"].type.dtype
    a, b = g.input("a", (M, K), dtype), g.input("b", (K, N), dtype)
    with g.hint(slices=slices):
        g.output("y", g.matmul(a, b))
    return g.build()
