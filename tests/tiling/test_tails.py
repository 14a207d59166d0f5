"""Tails (issue 13, docs/tiling.md "Tails"): a count that does not divide its dim, and a tile
that is not whole sticks, compile to a loop of whole tiles and a peeled tail, and run equal
to the untiled program and to numpy computing the graph from its definition
(fspyre/testing/numpy_ref.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import fspyre
from fspyre.check import REDUCTION_RTOL
from fspyre.ir.looptree import Loop, OpNode, Peel, walk
from fspyre.ir.program import LoopSpec, OpSpec
from fspyre.ir.serialize import dumps, loads
from fspyre.machine.memcheck import check_memory
from fspyre.machine.report import traffic_report
from fspyre.stages.tiling_search import SearchOptions, search_tiling
from fspyre.testing import examples
from fspyre.testing import numpy_ref as R

SETTINGS = settings(max_examples=examples(40), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
pytestmark = pytest.mark.filterwarnings("ignore::fspyre.FspyreWarning")


def quarters(rng: np.random.Generator, shape, lo: int = -8, hi: int = 8) -> np.ndarray:
    """Multiples of 1/4 in [lo/4, hi/4): exact in every float format, so inputs carry no error."""
    return (rng.integers(lo, hi, shape) / 4).astype(np.float32)


def scaled_sum(rows: int, cols: int, levels, dtype: str = "float16", fn: str | None = None):
    """y = 0.5 x + w over [A=rows, B=cols]; the output is y * x, or ``fn`` of y over B. Each
    (dim, count) of ``levels`` is one nested hint scope, outermost first."""
    g = fspyre.GraphBuilder("tails")
    g.dim("A", rows)
    g.dim("B", cols)
    x = g.input("x", ["A", "B"], dtype)
    w = g.input("w", ["A", "B"], dtype)
    scopes = [g.hint(slices={d: c}) for d, c in levels]
    for s in scopes:
        s.__enter__()
    y = g.add(g.mul(x, 0.5), w)
    out = g.mul(y, x) if fn is None else g.reduce(fn, y, ["B"])
    for s in reversed(scopes):
        s.__exit__(None, None, None)
    g.output("z", out)
    return g.build()


def numpy_reference(graph, inputs, fn: str | None, fmt: str) -> R.Ref:
    dtype = graph.buffer_table()["x"].type.dtype
    shape = graph.buffer_table()["x"].type.shape
    x = R.exact(["A", "B"], inputs["x"], dtype)
    w = R.exact(["A", "B"], inputs["w"], dtype)
    half = R.pointwise("mul", [x, 0.5], ["A", "B"], shape, dtype, fmt)
    y = R.pointwise("add", [half, w], ["A", "B"], shape, dtype, fmt)
    if fn is None:
        return R.pointwise("mul", [y, x], ["A", "B"], shape, dtype, fmt)
    return R.reduce(fn, y, ["B"], ["A"], False, dtype, fmt)


def agree(graph, tiled, untiled, inputs, fn, machine) -> None:
    got, want = tiled["z"].astype(np.float64), untiled["z"].astype(np.float64)
    dtype = graph.buffer_table()["x"].type.dtype
    if fn in (None, "amax", "amin"):  # the same operations on the same values
        assert np.array_equal(got, want)
    else:  # a reassociated float32 sum, rounded once (docs/tiling.md, "Numerics")
        tol = REDUCTION_RTOL[dtype] * max(1.0, float(np.abs(want).max()))
        assert float(np.abs(got - want).max()) <= tol
    ref = numpy_reference(graph, inputs, fn, machine.fp16_format)
    assert R.accept(tiled["z"], ref).all()


def compile_and_run(graph, machine, inputs):
    comp = fspyre.compile(graph, machine, tiling="hints")
    tree = comp.stages["loop_tree"]
    assert loads(dumps(tree)) == tree
    assert check_memory(comp.program).clean
    return comp, fspyre.run(comp, inputs)


def tails(tree) -> list[OpNode]:
    return [n for n, _ in walk(tree.body) if isinstance(n, OpNode) and n.origin]


# -- the example ---------------------------------------------------------------------
def test_a_count_of_3_on_100_rows_peels_a_tail():
    """A: 3 on 100 rows: tiles of ceil(100 / 3) = 34, a loop of 2, and a tail of 32 rows that
    starts at row 68; its ops are copies of the loop's, named apart, pointing at their origin."""
    graph = scaled_sum(100, 128, [("A", 3)])
    machine = fspyre.machine.spyre(cores=4)
    rng = np.random.default_rng(0)
    inputs = {"x": quarters(rng, (100, 128)), "w": quarters(rng, (100, 128))}
    comp, got = compile_and_run(graph, machine, inputs)
    assert not comp.warnings  # 3 iterations, as hinted
    loop, *rest = comp.stages["loop_tree"].body
    assert isinstance(loop, Loop) and loop.count == 2 and [(s.dim, s.extent) for s in loop.steps] == [("A", 34)]
    assert [n.op.ranges[0].size for n in loop.body] == [34, 34, 34]
    assert [(n.origin, n.peeled, n.op.ranges[0].size) for n in rest] == [
        (o, (Peel(dim="A", start=68),), 32) for o in ("buf0", "buf1", "buf2")]
    assert len({n.name for n in rest} | {n.name for n in loop.body}) == 6
    # the program: the loop, whose last iteration runs the tail's three ops after the body
    # (keep_resident joins the ops after a loop to it), after the copy of the tail's rows of x
    # into LX that the tail's two reads of x share, as the body's share theirs; bundle.mlir
    # guards them by %i_0 == 1
    (spec_loop,) = comp.program.body
    assert isinstance(spec_loop, LoopSpec) and spec_loop.count == 2
    spec_tail = [s for s in spec_loop.body if s.runs == "last"]
    assert [s.name for s in spec_tail] == ["x_lx1_copy"] + [n.name for n in rest]
    assert all(isinstance(s, OpSpec) for s in spec_tail)
    assert spec_loop.body[-4:] == tuple(spec_tail)  # after every op of the body
    assert [s.name for s in spec_loop.body[:4]] == ["x_lx_copy", "buf0", "buf1", "buf2"]
    assert traffic_report(comp.program).traffic_ratio == 1.0  # x, w read once, z written once
    mlir = comp.bundle_mlir
    assert "%loop_last_0 = arith.constant 1 : index" in mlir
    assert mlir.count("arith.cmpi eq, %i_0, %loop_last_0") == 4
    untiled = fspyre.run(fspyre.compile(graph, machine, tiling="none"), inputs)
    agree(graph, got, untiled, inputs, None, machine)


def test_tail_ops_address_the_rows_after_the_loop():
    """The tail's full-buffer indices start at row 68 (68 x 128 elements), its per-tile
    buffer (y, read only inside the nest) at the tile's start: the tail uses part of it."""
    graph = scaled_sum(100, 128, [("A", 3)])
    tree = fspyre.compile(graph, fspyre.machine.spyre(cores=4), tiling="hints").stages["loop_tree"]
    table = tree.buffer_table()
    mul_tail = next(n for n in tails(tree) if n.origin == "buf0")
    (load,) = [o for o in mul_tail.op.operands if hasattr(o, "buffer")]
    assert str(load.index) == "128*A + B + 8704"
    assert table["buf0"].scope == "tile" and table["buf0"].type.shape == (34, 128)
    assert str(mul_tail.op.store.index) == "128*A + B"


# -- properties --------------------------------------------------------------------------------
@st.composite
def tail_levels(draw, reduced: bool):
    """One or two nested levels on A and/or B with counts that need not divide; when B is
    reduced, A levels come first (an output level inside a reduction level is refused)."""
    dims = draw(st.lists(st.sampled_from("AB"), min_size=1, max_size=2))
    if reduced:
        dims = sorted(dims)
    return [(d, draw(st.integers(2, 7))) for d in dims]


@SETTINGS
@given(st.data(), st.integers(2, 130), st.integers(2, 200), st.sampled_from(["float16", "bfloat16", "float32"]),
       st.sampled_from([None, "sum", "mean", "amax", "amin"]), st.sampled_from([1, 3, 32]))
def test_tails_agree_with_untiled_and_numpy(data, rows, cols, dtype, fn, cores):
    levels = data.draw(tail_levels(fn is not None), label="levels")
    graph = scaled_sum(rows, cols, levels, dtype, fn)
    machine = fspyre.machine.spyre(cores=cores)
    rng = np.random.default_rng(rows * 1000 + cols)
    inputs = {"x": quarters(rng, (rows, cols)), "w": quarters(rng, (rows, cols))}
    comp, got = compile_and_run(graph, machine, inputs)
    untiled = fspyre.run(fspyre.compile(graph, machine, tiling="none"), inputs)
    agree(graph, got, untiled, inputs, fn, machine)


@pytest.mark.parametrize("fn", ["sum", "mean", "prod", "amax", "amin"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "int32"])
def test_reductions_tiled_with_a_tail_on_the_reduced_dim(fn, dtype):
    """K: 3 on 100 columns: whole-stick tiles (64 of 2-byte formats, 64 of 4-byte ones after
    rounding 34 up to 32-element sticks), the partial and combine of the tail after the loop,
    the finish after both; mean scales by 1/100, the whole range."""
    g = fspyre.GraphBuilder(f"tail_{fn}_{dtype}")
    g.dim("A", 8)
    g.dim("K", 100)
    x = g.input("x", ["A", "K"], dtype)
    with g.hint(slices={"K": 3}):
        r = g.reduce(fn, x, ["K"])
    g.output("r", r)
    graph = g.build()
    rng = np.random.default_rng(1)
    values = rng.integers(-2, 3, (8, 100)) if dtype == "int32" else quarters(rng, (8, 100))
    if fn == "prod":  # keep products representable: mostly ones, a few halves and twos
        values = rng.choice(np.array([0.5, 1.0, 1.0, 1.0, 2.0, -1.0]), (8, 100)).astype(np.float32)
        if dtype == "int32":
            values = rng.choice(np.array([1] * 8 + [-1, 2]), (8, 100))  # far from int32 wrapping
    inputs = {"x": values}
    machine = fspyre.machine.spyre(cores=4)
    comp, got = compile_and_run(graph, machine, inputs)
    tree = comp.stages["loop_tree"]
    names = [n.op.name for n, _ in walk(tree.body) if isinstance(n, OpNode)]
    assert names[0].endswith("_fill") and names[-1].endswith("_finish")
    assert any(n.origin and n.op.name.startswith("buf0_combine") for n in tails(tree))
    want = fspyre.run(fspyre.compile(graph, machine, tiling="none"), inputs)["r"].astype(np.float64)
    have = got["r"].astype(np.float64)
    out_dtype = graph.buffer_table()[graph.outputs[0].buffer].type.dtype
    if fn in ("amax", "amin") or out_dtype == "int32":  # exact in any order
        assert np.array_equal(have, want)
    else:  # a float mean of int32 is scaled once by 1/100, untiled divides: an ulp apart
        assert np.abs(have - want).max() <= REDUCTION_RTOL[out_dtype] * max(1.0, np.abs(want).max())
    ref = R.reduce(fn, R.exact(["A", "K"], values, dtype), ["K"], ["A"], False, dtype, machine.fp16_format)
    assert R.accept(got["r"], ref).all()


def test_nested_levels_on_one_dim_with_tails_on_both():
    """A: 3 then A: 2 on 100 rows: outer tiles of 34 (a loop of 2, a tail of 32), inner tiles
    of 17: the outer loop's tile runs an inner loop of 2, the outer tail an inner loop of 1
    (in place) and an inner tail of 15."""
    graph = scaled_sum(100, 64, [("A", 3), ("A", 2)])
    machine = fspyre.machine.spyre(cores=2)
    rng = np.random.default_rng(3)
    inputs = {"x": quarters(rng, (100, 64)), "w": quarters(rng, (100, 64))}
    comp, got = compile_and_run(graph, machine, inputs)
    tree = comp.stages["loop_tree"]
    rows = sorted((n.op.ranges[0].size, tuple((p.dim, p.start) for p in n.peeled))
                  for n in tails(tree) if n.origin.startswith("buf1"))
    assert rows == [(15, (("A", 68), ("A", 85))), (17, (("A", 68),))]
    outer = tree.body[0]
    assert isinstance(outer, Loop) and outer.count == 2 and isinstance(outer.body[0], Loop)
    assert outer.body[0].count == 2
    untiled = fspyre.run(fspyre.compile(graph, machine, tiling="none"), inputs)
    agree(graph, got, untiled, inputs, None, machine)


def test_sub_stick_tiles_warn_with_the_count_used():
    """B: 4 on 200 fp16 columns asks for tiles of 50 elements, not whole 64-element sticks:
    rounded up to 64, a loop of 3 and a tail of 8 -- 4 iterations as hinted, no warning;
    B: 3 (tiles of 67 -> 128) runs 2 iterations and says so."""
    rng = np.random.default_rng(4)
    inputs = {"x": quarters(rng, (6, 200)), "w": quarters(rng, (6, 200))}
    machine = fspyre.machine.spyre(cores=4)
    for count, used, warned in ((4, 4, False), (3, 2, True)):
        graph = scaled_sum(6, 200, [("B", count)])
        with pytest.warns(fspyre.FspyreWarning) if warned else _no_warning():
            comp, got = compile_and_run(graph, machine, inputs)
        if warned:
            (text,) = comp.warnings
            for part in ("op buf0", "dim B (range 200)", f"{used} iterations instead of the hinted {count}",
                         "64-element sticks", f"Hint count {used}"):
                assert part in text, text
        untiled = fspyre.run(fspyre.compile(graph, machine, tiling="none"), inputs)
        agree(graph, got, untiled, inputs, None, machine)


class _no_warning:
    def __enter__(self):
        import warnings

        self._ctx = warnings.catch_warnings()
        self._ctx.__enter__()
        warnings.simplefilter("error", fspyre.FspyreWarning)

    def __exit__(self, *exc):
        return self._ctx.__exit__(*exc)


def test_the_search_tries_tails_when_no_count_divides():
    """97 rows (prime) under a small LX: the only dividing count makes tiles of one row, so
    the search also judges tiles of 49, 25, 14, ... rows (counts 2, 4, 7, ...) with a peeled
    tail, shrinking until one fits (the tail keeps its loop's buffers in LX); whatever it
    picks runs equal to the untiled reference."""
    g = fspyre.GraphBuilder("softmax97")
    g.dim("R", 97)
    g.dim("C", 512)
    x = g.input("x", ["R", "C"], "float16")
    e = g.exp(g.sub(x, g.amax(x, ["C"], keepdim=True)))
    g.output("y", g.div(e, g.sum(e, ["C"], keepdim=True)))
    graph = g.build()
    machine = fspyre.machine.spyre(cores=4, lx_bytes=8192)
    comp = fspyre.compile(graph, machine)
    judged = [c for grp in comp.stages["tiling_search"].groups for c in grp.candidates]
    tried = {lv.count for c in judged for lv in c.levels}
    assert {2, 4} <= tried
    assert fspyre.check(graph, machine=machine, comp=comp).equal
    # The time-first search judges only the segments its bound lets win (here the four ops
    # together, whose reductions split across cores at every count); the seed's pass judges each
    # consumer's group, where a tiling with a peeled tail keeps its buffers in LX.
    greedy = search_tiling(graph, machine, SearchOptions(strategy="greedy"))
    judged = [c for grp in greedy.groups for c in grp.candidates]
    assert any(c.verdict == "fits" and c.levels and 97 % c.levels[0].count for c in judged)


def test_verify_loop_tree_refuses_a_tail_of_no_op():
    from dataclasses import replace

    from fspyre.errors import TilingError
    from fspyre.stages.loop_tree import verify_loop_tree

    tree = fspyre.compile(scaled_sum(100, 128, [("A", 3)]), fspyre.machine.spyre(cores=4),
                          tiling="hints").stages["loop_tree"]
    loop, first, *rest = tree.body
    for origin, match in (("nope", "op buf0_tail is a tail of nope, which is not an op of the tree's main body"),
                          ("buf1", "op buf0_tail, a tail of buf1, computes mul where buf1 computes add")):
        bad = replace(tree, body=(loop, replace(first, origin=origin), *rest))
        with pytest.raises(TilingError, match=match):
            verify_loop_tree(bad)



def chain(rows: int, cols: int, count: int, fn: str | None):
    """y = 0.5 x + w, then exp(y) or ``fn`` of y over B, under A: count; x and w read once."""
    g = fspyre.GraphBuilder("chain")
    g.dim("A", rows)
    g.dim("B", cols)
    x = g.input("x", ["A", "B"], "float16")
    w = g.input("w", ["A", "B"], "float16")
    with g.hint(slices={"A": count}):
        y = g.add(g.mul(x, 0.5), w)
        g.output("z", g.exp(y) if fn is None else g.reduce(fn, y, ["B"], keepdim=True))
    return g.build()


@SETTINGS
@given(st.integers(3, 300), st.integers(1, 200), st.integers(2, 6), st.sampled_from([1, 3, 8, 32]),
       st.sampled_from([None, "sum", "amax"]))
def test_a_tail_keeps_the_loops_intermediates_in_lx(rows, cols, count, cores, fn):
    """Issue 21: the peeled tail writes and reads its own copy of each per-tile buffer, split
    across cores for the remainder, so the allocator keeps the main tile's in LX: the tailed
    loop moves exactly the HBM bytes per compulsory byte that the same tiles move on a range
    they divide (1.0: no intermediate leaves LX), and runs equal to untiled with a clean
    memory check."""
    tile = -(-rows // count)
    assume(rows % tile and rows // tile >= 2)
    machine = fspyre.machine.spyre(cores=cores)
    graph = chain(rows, cols, count, fn)
    comp = fspyre.compile(graph, machine, tiling="hints")
    assert tails(comp.stages["loop_tree"])
    even = fspyre.compile(chain(tile * (rows // tile), cols, rows // tile, fn), machine, tiling="hints")
    ratio = traffic_report(comp.program).traffic_ratio
    assert ratio == traffic_report(even.program).traffic_ratio == 1.0
    report = fspyre.check(graph, seed=rows, machine=machine, comp=comp)
    assert report.equal and report.memory is not None and report.memory.clean


def row_reduction(kind: str, rows: int, cols: int, dtype: str, count: int):
    """A reduction over B feeding pointwise ops of each row, under A: count: a softmax (x read
    by its max and its subtraction), a layernorm (two means, x and the centred rows each read
    twice), or a row sum of x * w scaled by x's row max."""
    g = fspyre.GraphBuilder(kind)
    g.dim("A", rows)
    g.dim("B", cols)
    x = g.input("x", ["A", "B"], dtype)
    with g.hint(slices={"A": count}):
        if kind == "softmax":
            e = g.exp(g.sub(x, g.amax(x, ["B"], keepdim=True)))
            out = g.div(e, g.sum(e, ["B"], keepdim=True))
        elif kind == "layernorm":
            xc = g.sub(x, g.mean(x, ["B"], keepdim=True))
            out = g.mul(xc, g.rsqrt(g.add(g.mean(g.mul(xc, xc), ["B"], keepdim=True), 1e-5)))
        else:
            out = g.mul(g.sum(g.mul(x, g.input("w", ["A", "B"], dtype)), ["B"], keepdim=True),
                        g.amax(x, ["B"], keepdim=True))
        g.output("y", out)
    return g.build()


@SETTINGS
@given(st.data(), st.sampled_from(["softmax", "layernorm", "rowsum"]), st.integers(1, 40), st.integers(2, 300),
       st.sampled_from([64, 96, 200, 256, 333]), st.sampled_from(["float16", "bfloat16", "float32"]),
       st.sampled_from([1, 3, 5, 8, 32]), st.sampled_from([None, 32 * 1024, 64 * 1024]))
def test_a_tailed_row_reduction_moves_the_untailed_ratio(data, kind, whole, tile, cols, dtype, cores, lx):
    """Issue 21: rows = whole * tile + tail (0 < tail < tile), hinted A: whole + 1 so the loop
    runs ``whole`` tiles and peels the tail, moves at most the HBM bytes per compulsory byte
    that the same tiles move over (whole + 1) * tile rows (no tail): the tail divides its work
    like the ops it copies, copies its own re-read rows of x into LX and keeps its
    intermediates in LX wherever the main tile does. Less only where the smaller tail keeps in
    LX what the main tile cannot (layernorm of 333 float32 columns on 3 cores with 32 KiB LX:
    1.983 against 2.000), or where a single whole tile runs unlooped. The tailed program runs
    equal to untiled with a clean memory check."""
    tile = max(2, min(tile, 1200 // whole))  # rows the interpreter runs in a moment
    # a count of whole + 1 cuts tiles of ceil(rows / (whole + 1)) == tile exactly when the tail
    # is more than tile - whole - 1 rows
    tail = data.draw(st.integers(max(1, tile - whole), tile - 1), label="tail")
    rows, count = whole * tile + tail, whole + 1
    machine = fspyre.machine.spyre(cores=cores, lx_bytes=lx)
    graph = row_reduction(kind, rows, cols, dtype, count)
    comp = fspyre.compile(graph, machine, tiling="hints")
    assert tails(comp.stages["loop_tree"])
    even = fspyre.compile(row_reduction(kind, tile * count, cols, dtype, count), machine, tiling="hints")
    assert not tails(even.stages["loop_tree"])
    assert traffic_report(comp.program).traffic_ratio <= traffic_report(even.program).traffic_ratio
    report = fspyre.check(graph, seed=rows, machine=machine, comp=comp)
    assert report.equal and report.memory is not None and report.memory.clean


# -- a tail reads the loop's hoisted copies ----------------------------------------------------
# the graph inputs no row tile moves: the loop reads them through copies hoisted before it
INVARIANT = {"mlp": ("w1", "b1", "w2", "b2"), "linear": ("w", "b"), "rmsnorm": ("gamma",),
             "layernorm": ("gamma", "beta")}


def with_weights(kind: str, rows: int, cols: int, dtype: str, count: int, hidden: int = 0):
    """Row-tiled (S: count) graphs that read loop-invariant inputs: an MLP with biases
    (matmul + bias, gelu, matmul + bias), one linear layer with a bias and relu, rmsnorm with
    gamma, layernorm with gamma and beta."""
    g = fspyre.GraphBuilder(kind)
    g.dim("S", rows)
    g.dim("D", cols)
    g.dim("F", hidden or 2 * cols)
    x = g.input("x", ["S", "D"], dtype)
    ins = {n: g.input(n, dims, dtype) for n, dims in {
        "mlp": (("w1", ["D", "F"]), ("b1", ["F"]), ("w2", ["F", "D"]), ("b2", ["D"])),
        "linear": (("w", ["D", "F"]), ("b", ["F"])),
        "rmsnorm": (("gamma", ["D"]),),
        "layernorm": (("gamma", ["D"]), ("beta", ["D"]))}[kind]}
    with g.hint(slices={"S": count}):
        if kind == "mlp":
            a = g.gelu(g.add(g.matmul(x, ins["w1"], "D"), ins["b1"]))
            out = g.add(g.matmul(a, ins["w2"], "F"), ins["b2"])
        elif kind == "linear":
            out = g.relu(g.add(g.matmul(x, ins["w"], "D"), ins["b"]))
        elif kind == "rmsnorm":
            ms = g.mean(g.mul(x, x), ["D"], keepdim=True)
            out = g.mul(g.mul(x, g.rsqrt(g.add(ms, 1e-6))), ins["gamma"])
        else:
            xc = g.sub(x, g.mean(x, ["D"], keepdim=True))
            var = g.mean(g.mul(xc, xc), ["D"], keepdim=True)
            out = g.add(g.mul(g.mul(xc, g.rsqrt(g.add(var, 1e-5))), ins["gamma"]), ins["beta"])
        g.output("y", out)
    return g.build()


def invariant_loads(tree, names) -> dict[str, set[str]]:
    """For each op node but the copies, the loop-invariant inputs it reads straight from HBM."""
    return {n.name: {ld.buffer for ld in n.op.loads} & set(names) for n, _ in walk(tree.body)
            if isinstance(n, OpNode) and not n.op.name.endswith("_copy")}


def invariant_copies(tree, names) -> list[str]:
    """The buffers of the copies that read a loop-invariant input."""
    return [n.op.store.buffer for n, _ in walk(tree.body) if isinstance(n, OpNode)
            and n.op.name.endswith("_copy") and {ld.buffer for ld in n.op.loads} & set(names)]


def assert_tail_reads_the_copies(kind: str, comp) -> None:
    """No tail op reads a loop-invariant input from HBM that the op it copies reads through an
    LX copy (the loop's hoisted copy serves both)."""
    tree = comp.stages["resident_tree"]
    direct = invariant_loads(tree, INVARIANT[kind])
    for node in tails(tree):
        assert direct[node.name] <= direct[node.origin], (node.name, direct[node.name], direct[node.origin])


def hbm_bytes(graph, machine) -> int:
    return traffic_report(fspyre.compile(graph, machine, tiling="hints").program).hbm_bytes


@pytest.mark.parametrize("kind, rows, count, cols, hidden, dtype, cores, lx", [
    # the issue-21 audit's reproducers: the tail re-read w1 and w2 (HBM ratio 2.000 against
    # 1.146 for 132 rows) and rmsnorm's gamma (1.000333 against 1.0 for 1,512 rows)
    ("mlp", 130, 3, 384, 768, "float32", 32, None),
    ("rmsnorm", 1500, 24, 896, 0, "float32", 7, 96 * 1024),
    # the tail's matmul runs on fewer cores than its origin: it follows its origin's division
    # onto the copy (HBM ratio 2.867 while the tail's division blocked the copy; 1.0 now)
    ("linear", 5, 3, 64, 64, "float32", 8, None),
])
def test_a_tail_reads_the_loops_hoisted_copies(kind, rows, count, cols, hidden, dtype, cores, lx):
    """Issue 21: a peeled tail reads the loop-invariant inputs (weights, biases, gamma) through
    the copies the loop hoists before it, as the main tile does, so the tailed loop moves the
    untailed loop's HBM bytes per row: its bytes are those of the loop's whole tiles plus the
    tail's share (tail / tile) of one more tile, exactly."""
    machine = fspyre.machine.spyre(cores=cores, lx_bytes=lx)
    tile = -(-rows // count)
    whole, tail = divmod(rows, tile)
    graph = with_weights(kind, rows, cols, dtype, count, hidden)
    comp = fspyre.compile(graph, machine, tiling="hints")
    assert tails(comp.stages["loop_tree"])
    assert_tail_reads_the_copies(kind, comp)
    tailed = traffic_report(comp.program).hbm_bytes
    fewer = hbm_bytes(with_weights(kind, whole * tile, cols, dtype, whole, hidden), machine)
    more = hbm_bytes(with_weights(kind, (whole + 1) * tile, cols, dtype, whole + 1, hidden), machine)
    assert tailed * tile == fewer * tile + tail * (more - fewer)
    report = fspyre.check(graph, seed=rows, machine=machine, comp=comp)
    assert report.equal and report.memory is not None and report.memory.clean


@SETTINGS
@given(st.data(), st.sampled_from(sorted(INVARIANT)), st.integers(2, 5), st.integers(2, 48),
       st.sampled_from([64, 96, 128, 200]), st.sampled_from(["float16", "bfloat16", "float32"]),
       st.sampled_from([1, 3, 8, 32]), st.sampled_from([None, 64 * 1024, 256 * 1024]))
def test_a_tailed_loop_moves_the_untailed_bytes_per_row(data, kind, whole, tile, cols, dtype, cores, lx):
    """Issue 21: rows = whole * tile + tail hinted S: whole + 1 (a loop of ``whole`` tiles and a
    peeled tail) on graphs that read loop-invariant inputs. No tail op reads from HBM an input
    its main-body op reads through the loop's copy; and where the untailed loop keeps those
    copies in LX (each input read once), the tailed loop moves at most the bytes of ``whole``
    tiles plus tail / tile of the next one -- the bytes per row of the same loop over a range
    its tiles divide (less only where the smaller tail keeps in LX what the main tile
    spills). The tailed program runs equal to untiled with a clean memory check."""
    tail = data.draw(st.integers(max(1, tile - whole), tile - 1), label="tail")
    rows, count = whole * tile + tail, whole + 1
    machine = fspyre.machine.spyre(cores=cores, lx_bytes=lx)
    graph = with_weights(kind, rows, cols, dtype, count, hidden=cols)
    comp = fspyre.compile(graph, machine, tiling="hints")
    assert tails(comp.stages["loop_tree"])
    assert_tail_reads_the_copies(kind, comp)
    even = fspyre.compile(with_weights(kind, count * tile, cols, dtype, count, hidden=cols), machine, tiling="hints")
    assert not tails(even.stages["loop_tree"])
    resident = even.stages["resident_tree"]
    copies = invariant_copies(resident, INVARIANT[kind])
    # every loop-invariant input read through a copy that stays in LX
    if not any(invariant_loads(resident, INVARIANT[kind]).values()) and all(
            even.stages["allocation"].buffers[c].memory == "lx" for c in copies):
        more = traffic_report(even.program).hbm_bytes
        fewer = hbm_bytes(with_weights(kind, whole * tile, cols, dtype, whole, hidden=cols), machine)
        assert traffic_report(comp.program).hbm_bytes * tile <= fewer * tile + tail * (more - fewer)
    report = fspyre.check(graph, seed=rows, machine=machine, comp=comp)
    assert report.equal and report.memory is not None and report.memory.clean
