"""Numeric rules (docs/semantics.md) against independent references: numpy written from each
op's definition, and torch eager in float32. ``fspyre.evaluate`` shares ``numerics`` with the
interpreter, so agreement between those two alone proves nothing about these rules."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fspyre
from fspyre.ir.graph import POINTWISE_FNS
from fspyre.machine import formats, numerics
from fspyre.machine.spyre import spyre

VALUES = np.random.default_rng(7).uniform(-4.0, 4.0, 4096).astype(np.float32)
# every value kind each function meets: exponents where np.power has 0-d fast paths, zeros,
# signed infinities, NaN, tiny and huge numbers
VALUES[:16] = [2.0, 0.5, -1.0, 0.0, -0.0, 1.0, 3.0, -2.0, np.inf, -np.inf, np.nan, 1e-30, 1e30, -0.5, 1e-5, 88.0]


def _bits(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float32).view(np.uint32)


@pytest.mark.parametrize("fn", sorted(numerics.POINTWISE))
def test_pointwise_result_does_not_depend_on_operand_shape(fn):
    """The same element computed as a 0-d op, a one-element array, a broadcast scalar or
    inside a 4096-element array gives the same bits (numpy takes different kernels by
    operand shape: np.power with a 0-d exponent of 2, 0.5 or -1 is square/sqrt/reciprocal)."""
    arity = POINTWISE_FNS[fn]
    rng = np.random.default_rng(1)
    ops = [VALUES] + [rng.permutation(VALUES) for _ in range(arity - 1)]
    if fn == "pow":  # bases positive so most results are finite; exponents hit the fast-path values
        ops = [np.abs(VALUES) + np.float32(0.01), np.resize(np.float32([2.0, 0.5, -1.0, 3.0, -0.5]), 4096)]
    ctype = np.dtype(np.float32)
    whole = numerics.pointwise(fn, ops, ctype, (4096,))
    for i in range(0, 4096, 97):
        scalar_like = [o[i].reshape(()) for o in ops]
        assert _bits(numerics.pointwise(fn, scalar_like, ctype, ()))[()] == _bits(whole[i]), (fn, i)
        one = [o[i:i + 1] for o in ops]
        assert _bits(numerics.pointwise(fn, one, ctype, (1,)))[0] == _bits(whole[i]), (fn, i)
        # a one-element operand broadcast against a row, as a one-row tile of a [rows, cols] op
        row = [ops[0][i:i + 8]] + [o[i:i + 1].reshape(1, 1) for o in ops[1:]]
        want = numerics.pointwise(fn, [ops[0][i:i + 8]] + [np.broadcast_to(o[i], 8).copy() for o in ops[1:]],
                                  ctype, (8,))
        got = numerics.pointwise(fn, row, ctype, (1, 8)).reshape(8)
        assert np.array_equal(_bits(got), _bits(want)), (fn, i)


def _pow_graph() -> fspyre.ir.graph.Graph:
    g = fspyre.GraphBuilder("pow_rows")
    A, B = g.dim("A", 32), g.dim("B", 64)
    a = g.input("a", (A, B), "float32")
    # b is [A, 1]: one stick per row, so a one-row tile is whole sticks
    b = g.squeeze(g.input("b", (A, g.dim("O", 1)), "float32"), "O")
    with g.hint(slices={"A": 32}):  # one row per tile: the exponent is one element per tile
        y = g.pow(a, b)
    g.output("y", y)
    return g.build()


@pytest.mark.parametrize("cores", [1, 32])
def test_pow_on_one_row_tiles_is_bit_exact(cores):
    rng = np.random.default_rng(0)
    inputs = {"a": rng.uniform(0.01, 3.0, (32, 64)).astype(np.float32),
              "b": np.array([2.0, 0.5, -1.0, 3.0] * 8, np.float32).reshape(32, 1)}
    graph = _pow_graph()
    report = fspyre.check(graph, inputs, machine=spyre(cores=cores))
    assert report.exact and report.equal, str(report)
    # independent: the exact power, rounded once to float32, is within one float32 ulp
    got = fspyre.run(fspyre.compile(graph, machine=spyre(cores=cores)), inputs)["y"]
    exact = np.power(inputs["a"].astype(np.float64), inputs["b"].astype(np.float64))
    assert np.all(np.abs(got - exact) <= np.spacing(np.abs(exact).astype(np.float32)))


# --- bool buffers hold 0 / 1 ----------------------------------------------------------------------

def _both(graph, inputs, cores=4):
    """(evaluate, run) outputs for the same inputs."""
    comp = fspyre.compile(graph, machine=spyre(cores=cores))
    return fspyre.evaluate(graph, inputs), fspyre.run(comp, inputs)


def test_cast_to_bool_and_back_is_zero_or_one_as_in_torch():
    g = fspyre.GraphBuilder("bool_round_trip")
    A, B = g.dim("A", 8), g.dim("B", 64)
    x = g.input("x", (A, B), "float16")
    g.output("y", g.cast(g.cast(x, "bool"), "float32"))
    g.output("n", g.sum(g.cast(x, "bool"), ["A", "B"]))
    graph = g.build()
    xs = np.random.default_rng(3).integers(-3, 4, (8, 64)).astype(np.float16)
    want_y = torch.from_numpy(xs).to(torch.bool).to(torch.float32).numpy()
    want_n = int(np.count_nonzero(xs))
    for outs in _both(graph, {"x": xs}):
        assert np.array_equal(outs["y"], want_y)
        assert int(outs["n"]) == want_n


def test_bool_arithmetic_follows_torch():
    """torch keeps bool + bool and bool * bool in bool: logical or / and; the stored value is
    value != 0."""
    g = fspyre.GraphBuilder("bool_ops")
    A = g.dim("A", 128)
    p = g.input("p", (A,), "bool")
    q = g.input("q", (A,), "bool")
    g.output("s", g.add(p, q))
    g.output("m", g.mul(p, q))
    g.output("f", g.cast(g.add(p, q), "float32"))
    graph = g.build()
    rng = np.random.default_rng(5)
    inputs = {"p": rng.integers(0, 2, 128).astype(bool), "q": rng.integers(0, 2, 128).astype(bool)}
    tp, tq = torch.from_numpy(inputs["p"]), torch.from_numpy(inputs["q"])
    for outs in _both(graph, inputs):
        assert np.array_equal(outs["s"], (tp + tq).numpy())
        assert np.array_equal(outs["m"], (tp * tq).numpy())
        assert np.array_equal(outs["f"], (tp + tq).to(torch.float32).numpy())


def test_bool_store_counts_nan_as_true():
    assert numerics.bool_store(np.float32([0.0, -0.0, 2.5, -3.0, np.nan, np.inf])).tolist() == [0, 0, 1, 1, 1, 1]


# --- -inf under DLFloat16 -----------------------------------------------------------------------

def _masked_softmax(rows: int, cols: int, *, constant_fill: bool) -> fspyre.ir.graph.Graph:
    g = fspyre.GraphBuilder("masked_softmax")
    R, C = g.dim("R", rows), g.dim("C", cols)
    x = g.input("x", (R, C), "float16")
    keep = g.input("keep", (R, C), "bool")
    if constant_fill:  # the -inf comes from a full() buffer, as a running-max initial value does
        s = g.where(keep, x, g.constant(-np.inf, "float16", (R, C)))
    else:
        s = g.where(keep, x, -np.inf)
    with g.hint(slices={"R": 2}):
        m = g.amax(s, ["C"], keepdim=True)
        e = g.exp(g.sub(s, m))
        y = g.div(e, g.sum(e, ["C"], keepdim=True))
    g.output("y", y)
    return g.build()


@pytest.mark.parametrize("constant_fill", [False, True])
def test_minus_inf_mask_softmax_equals_torch(constant_fill):
    rows, cols = 64, 128
    rng = np.random.default_rng(11)
    # rows offset by different constants, so a softmax that ignored its row max would differ
    x = (rng.uniform(-2, 2, (rows, cols)) + rng.uniform(-6, 6, (rows, 1))).astype(np.float16)
    keep = np.tril(np.ones((rows, cols), bool), k=10)  # causal: every row keeps at least one column
    graph = _masked_softmax(rows, cols, constant_fill=constant_fill)
    inputs = {"x": x, "keep": keep}
    tx = torch.from_numpy(formats.round_to(x.astype(np.float32), formats.SEN169_FP16))
    want = torch.softmax(tx.masked_fill(~torch.from_numpy(keep), float("-inf")), dim=-1).numpy()
    for outs in _both(graph, inputs, cores=8):
        y = outs["y"].astype(np.float32)
        assert not np.isnan(y).any()
        assert np.all(y[~keep] == 0.0)
        # each stored intermediate is DLFloat16: a few 2^-9 relative roundings of e, sum and y
        assert np.all(np.abs(y - want) <= 4 * 2.0**-9 * want + 2.0**-24)
    assert fspyre.check(graph, inputs, machine=spyre(cores=8)).equal


# --- a float scalar promotes an int comparison to float32, as in torch ---------------------------

def test_int_tensor_compared_with_a_float_scalar_compares_in_float():
    g = fspyre.GraphBuilder("int_vs_float")
    A = g.dim("A", 64)
    x = g.input("x", (A,), "int32")
    g.output("lt", g.lt(x, 2.5))
    g.output("eq", g.eq(x, 2.0))
    g.output("ne", g.ne(x, 0.25))
    graph = g.build()
    xs = np.arange(-32, 32, dtype=np.int32)
    inputs = {"x": xs}
    want = {"lt": xs < 2.5, "eq": xs == 2.0, "ne": xs != 0.25}  # numpy, from the definitions
    assert fspyre.check(graph, inputs).equal
    got = fspyre.run(fspyre.compile(graph, machine=spyre(cores=4)), inputs)
    ref = fspyre.evaluate(graph, inputs)
    for name, w in want.items():
        assert np.array_equal(got[name], w) and np.array_equal(ref[name], w), name


def _same(x: np.ndarray, y: np.ndarray) -> bool:
    """Bit for bit, a zero's sign included; NaN by position (its payload is not fspyre's meaning)."""
    nan = np.isnan(x)
    return bool(np.array_equal(nan, np.isnan(y)) and np.array_equal(_bits(x[~nan]), _bits(y[~nan])))


@pytest.mark.parametrize("fn", ["add", "mul", "maximum", "minimum", "eq", "ne"])
def test_commutative_fns_commute_bit_for_bit(fn):
    """The operand order of a commutative fn is no corruption only if swapping the operands
    gives the same bits: maximum and minimum order -0 below +0 (numpy's return the second
    operand of two equal zeros, so max(+0, -0) and max(-0, +0) differ in sign)."""
    rng = np.random.default_rng(3)
    a = np.concatenate([VALUES, np.float32([0.0, -0.0, 0.0, -0.0, np.inf, -np.inf])])
    b = np.concatenate([rng.permutation(VALUES), np.float32([-0.0, 0.0, 0.0, -0.0, -np.inf, np.inf])])
    b[:512] = a[:512]  # ties
    ctype = np.dtype(np.float32)
    ab = numerics.pointwise(fn, [a, b], ctype, a.shape)
    ba = numerics.pointwise(fn, [b, a], ctype, a.shape)
    assert _same(np.asarray(ab, np.float32), np.asarray(ba, np.float32))
    if fn in ("maximum", "minimum"):  # two zeros: -0 only where the fn picks the smaller
        zeros = (a == 0) & (b == 0)
        want_neg = (np.signbit(a) & np.signbit(b)) if fn == "maximum" else (np.signbit(a) | np.signbit(b))
        assert np.array_equal(np.signbit(ab[zeros]), want_neg[zeros])
        # and scalar operands follow the same rule
        for x, y in ((0.0, -0.0), (-0.0, 0.0)):
            r = numerics.pointwise(fn, [np.float32(x), np.float32(y)], ctype, ())
            assert bool(np.signbit(r)) == (fn == "minimum")


@pytest.mark.parametrize("fn", ["amax", "amin"])
def test_amax_and_amin_of_zeros_do_not_depend_on_the_order(fn):
    """A row of +0 and -0 reduces to the same zero in every order and split: the reduction
    and its pairwise combine across tiles and cores (``REDUCE_COMBINE``) agree."""
    rng = np.random.default_rng(5)
    ctype = np.dtype(np.float32)
    for _ in range(50):
        row = rng.choice(np.float32([0.0, -0.0, -1.0 if fn == "amax" else 1.0]), size=16)
        whole = numerics.reduce(fn, [row[None, :]], (1,), ctype, 16, (1, 16), 0)
        perm = rng.permutation(row)
        k = int(rng.integers(1, 16))
        parts = [numerics.reduce(fn, [p[None, :]], (1,), ctype, len(p), (1, len(p)), 0) for p in (perm[:k], perm[k:])]
        combined = numerics.pointwise(numerics.REDUCE_COMBINE[fn], parts, ctype, (1,))
        assert _same(np.asarray(whole, np.float32), np.asarray(combined, np.float32)), (row, k)
