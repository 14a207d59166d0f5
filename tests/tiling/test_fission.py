"""Reductions tiled over their reduction dim whose results the same hint scope reads: loop
fission into passes (docs/tiling.md, "Loop fission"). Each program is run on the interpreter
against the untiled program and against the numpy reference (``fspyre.testing.numpy_ref``,
written from the op definitions)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fspyre
from fspyre.check import compare
from fspyre.errors import TilingError
from fspyre.ir.looptree import Loop, op_nodes
from fspyre.ir.serialize import dumps, loads
from fspyre.machine.memcheck import check_memory
from fspyre.machine.reference import evaluate_with_bounds
from fspyre.pretty import pretty
from fspyre.stages.loop_tree import tile
from fspyre.stages.tiling_plan import plan_groups, plan_tiling
from fspyre.testing import examples
from fspyre.testing import numpy_ref as R

FMT = "SEN169_FP16"  # the default machine's float16 format


def hinted(g: fspyre.GraphBuilder, slices: Sequence[dict[str, int]]) -> contextlib.ExitStack:
    """Nested hint scopes, outermost first."""
    stack = contextlib.ExitStack()
    for s in slices:
        stack.enter_context(g.hint(slices=s))
    return stack


def softmax(rows: int, cols: int, dtype: str, slices: Sequence[dict[str, int]]):
    """softmax over B (cols) and its numpy reference."""
    g = fspyre.GraphBuilder("softmax")
    g.dim("A", rows)
    g.dim("B", cols)
    x = g.input("x", ["A", "B"], dtype)
    with hinted(g, slices):
        m = g.amax(x, ["B"], keepdim=True)
        e = g.exp(g.sub(x, m))
        s = g.sum(e, ["B"], keepdim=True)
        y = g.div(e, s)
    g.output("y", y)

    def ref(xs: np.ndarray) -> dict[str, R.Ref]:
        names, shape = ("A", "B"), (rows, cols)
        X = R.exact(names, xs.astype(np.float64), dtype)
        M = R.reduce("amax", X, ["B"], names, True, dtype, FMT)
        E = R.pointwise("exp", [R.pointwise("sub", [X, M], names, shape, dtype, FMT)], names, shape, dtype, FMT)
        S = R.reduce("sum", E, ["B"], names, True, dtype, FMT)
        return {"y": R.pointwise("div", [E, S], names, shape, dtype, FMT)}

    return g.build(), ref


def sixty_fourths(shape: Sequence[int], dtype: str, seed: int) -> np.ndarray:
    """Multiples of 1/64 in [-2, 2): exact in every float format, so the reference starts exact."""
    rng = np.random.default_rng(seed)
    return (rng.integers(-128, 128, size=tuple(shape)) / 64.0).astype(np.float16 if dtype == "float16" else np.float32)


def check_program(graph, ref: Callable[[np.ndarray], dict[str, R.Ref]], cores: int, seed: int = 0):
    """The hinted program against the untiled one (both on the interpreter, each within the
    per-element bound of ``evaluate_with_bounds``, so within twice it of each other) and
    against the numpy reference; memory-clean. Returns the compilation."""
    machine = fspyre.machine.spyre(cores=cores)
    (name,) = graph.inputs
    shape = graph.buffer_table()[name].type.shape
    inputs = {name: sixty_fourths(shape, graph.buffer_table()[name].type.dtype, seed)}
    tiled = fspyre.compile(graph, machine, tiling="hints")
    assert check_memory(tiled.program).clean
    got = fspyre.run(tiled, inputs)
    untiled = fspyre.run(fspyre.compile(graph, machine, tiling="none"), inputs)
    want, bounds = evaluate_with_bounds(graph, inputs, machine)
    assert compare(graph, got, want, bounds).equal, compare(graph, got, want, bounds)
    assert compare(graph, untiled, want, bounds).equal
    refs = ref(inputs[name])
    for o in graph.outputs:
        a, b = got[o.name].astype(np.float64), untiled[o.name].astype(np.float64)
        bound = 0.0 if bounds[o.name] is None else np.asarray(bounds[o.name])  # None: bit-exact
        assert np.all(np.abs(a - b) <= 2 * bound), o.name
        assert R.accept(got[o.name], refs[o.name]).all(), o.name
    return tiled


# -- softmax tiled over its row: three passes ---------------------------------------------------
def test_softmax_tiled_over_its_row_is_three_passes():
    graph, ref = softmax(64, 512, "float16", [{"A": 2}, {"B": 4}])
    plan = plan_tiling(graph)
    assert [g.ops for g in plan.groups] == [("buf0",), ("buf1", "buf2", "buf3"), ("buf4",)]
    assert all([lv.count for lv in g.levels] == [2, 4] for g in plan.groups)
    (note,) = plan.notes
    assert note.startswith("loop fission of group [buf0, buf1, buf2, buf3, buf4] into 3 loop nests "
                           "[buf0] | [buf1, buf2, buf3] | [buf4]: buf1 reads buf0, the amax of op buf0 over B")
    assert "notes:" in pretty(plan) and loads(dumps(plan)) == plan
    tree = tile(graph, plan)
    assert [type(n).__name__ for n in tree.body] == ["Loop", "Loop", "Loop"]
    # the exp is read by the sum in its own nest and by the division in the next: a full buffer
    # written through a per-tile copy; the max and the sum reach the next nest as full buffers
    scopes = {b.name: b.scope for b in tree.buffers}
    assert scopes["buf0"] == scopes["buf2"] == scopes["buf3"] == "full" and scopes["buf1"] == "tile"
    comp = check_program(graph, ref, cores=4)
    assert comp.stages["tiling_plan"].notes == plan.notes and not comp.warnings


def test_softmax_tiled_only_over_its_row():
    graph, ref = softmax(8, 1024, "float32", [{"B": 8}])
    plan = plan_tiling(graph)
    assert [g.ops for g in plan.groups] == [("buf0",), ("buf1", "buf2", "buf3"), ("buf4",)]
    check_program(graph, ref, cores=8)


def test_auto_tiling_keeps_the_fissioned_hint_groups():
    graph, ref = softmax(64, 512, "float16", [{"B": 2}])
    comp = fspyre.compile(graph, fspyre.machine.spyre(cores=2))  # tiling="auto"
    assert [g.ops for g in comp.stages["tiling_search"].plan.groups][:3] == \
        [("buf0",), ("buf1", "buf2", "buf3"), ("buf4",)]
    assert comp.stages["tiling_plan"].notes


def test_a_pass_whose_ops_do_not_iterate_the_tiled_dim_runs_untiled():
    g = fspyre.GraphBuilder("rowsum_scale")
    g.dim("A", 64)
    g.dim("B", 256)
    x = g.input("x", ["A", "B"], "float32")
    with g.hint(slices={"B": 4}):
        s = g.sum(x, ["B"])
        y = g.mul(s, 0.5)  # iterates A only: the level of B does not tile it
    g.output("y", y)
    graph = g.build()
    plan = plan_tiling(graph)
    assert [g.ops for g in plan.groups] == [("buf0",)] and plan.order == ("buf0", "buf1")
    assert "[buf1] untiled" in plan.notes[0]

    def ref(xs):
        S = R.reduce("sum", R.exact(("A", "B"), xs.astype(np.float64), "float32"), ["B"], ("A",), False,
                     "float32", FMT)
        return {"y": R.pointwise("mul", [S, 0.5], ("A",), (64,), "float32", FMT)}

    check_program(graph, ref, cores=2)


def test_ops_that_do_not_read_the_reduction_stay_in_its_nest():
    g = fspyre.GraphBuilder("g")
    g.dim("A", 64)
    g.dim("B", 256)
    x = g.input("x", ["A", "B"], "float32")
    with g.hint(slices={"B": 4}):
        m = g.amax(x, ["B"], keepdim=True)
        t = g.neg(x)          # independent of m: first pass
        y = g.sub(t, m)       # reads m: second pass, with its producer t kept beside it
    g.output("y", y)
    plan = plan_tiling(g.build())
    assert [g.ops for g in plan.groups] == [("buf0",), ("buf1", "buf2")]


def test_plan_groups_positional_form_is_split_too():
    graph, ref = softmax(64, 512, "float32", [])
    plan = plan_groups(graph, [(["buf0", "buf1", "buf2", "buf3", "buf4"], [(2, [0]), (4, ["B"])])])
    assert [g.ops for g in plan.groups] == [("buf0",), ("buf1", "buf2", "buf3"), ("buf4",)]
    # the positional level keeps only its own ops' entries in each pass
    assert dict(plan.groups[1].levels[0].op_dims) == {"buf1": ("A",), "buf2": ("A",), "buf3": ("A",)}
    tree = tile(graph, plan)
    assert len(op_nodes(tree)) > 5 and all(isinstance(n, Loop) for n in tree.body)


def test_hand_made_plan_is_still_refused():
    from fspyre.ir.plans import Group, Level, TilingPlan

    graph, _ = softmax(64, 512, "float32", [])
    plan = TilingPlan(order=tuple(op.name for op in graph.ops),
                      groups=(Group(ops=tuple(op.name for op in graph.ops), levels=(Level(count=4, dims=("B",)),)),))
    with pytest.raises(TilingError, match="split_at_tiled_reductions"):
        tile(graph, plan)


# -- properties ----------------------------------------------------------------------------------
SETTINGS = settings(max_examples=examples(25), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def softmax_programs(draw):
    """softmax with its row tiled, maybe under a row-tile level, on 1..8 cores."""
    dtype = draw(st.sampled_from(["float16", "float32"]))
    rows = draw(st.sampled_from([1, 4, 16, 32]))
    count = draw(st.sampled_from([2, 3, 4, 8]))
    cols = 64 * count * draw(st.sampled_from([1, 2]))
    slices = [{"B": count}]
    if rows > 1 and draw(st.booleans()):
        slices.insert(0, {"A": draw(st.sampled_from([c for c in (2, 4) if rows % c == 0]))})
    return softmax(rows, cols, dtype, slices), draw(st.integers(1, 8)), draw(st.integers(0, 2**16))


@SETTINGS
@given(softmax_programs())
def test_softmax_tiled_over_its_row_equals_untiled_and_numpy(program):
    (graph, ref), cores, seed = program
    assert len(plan_tiling(graph).groups) == 3
    check_program(graph, ref, cores, seed)


# -- var tiled over its reduction dim -----------------------------------------------------------
def variance(rows: int, cols: int, dtype: str, slices: Sequence[dict[str, int]], correction: int,
             offset: float = 0.0):
    """var over B of (x + offset), keepdim, then a consumer of it, all under the hints; and the
    numpy reference. The offset makes the mean large against the spread: the case where a
    one-pass formula (E[x²] − E[x]²) loses every digit and the two-pass one keeps them."""
    g = fspyre.GraphBuilder("variance")
    g.dim("A", rows)
    g.dim("B", cols)
    x = g.input("x", ["A", "B"], dtype)
    with hinted(g, slices):
        t = g.add(x, offset)
        v = g.reduce("var", t, ["B"], keepdim=True, correction=correction)
        y = g.sqrt(g.add(v, 1.0))
    g.output("v", v)
    g.output("y", y)

    def ref(xs: np.ndarray) -> dict[str, R.Ref]:
        names, shape, keep = ("A", "B"), (rows, cols), (rows, 1)
        T = R.pointwise("add", [R.exact(names, xs.astype(np.float64), dtype), offset], names, shape, dtype, FMT)
        V = R.reduce("var", T, ["B"], names, True, dtype, FMT, correction)
        Y = R.pointwise("sqrt", [R.pointwise("add", [V, 1.0], names, keep, dtype, FMT)], names, keep, dtype, FMT)
        return {"v": V, "y": Y}

    return g.build(), ref


def test_tiled_var_runs_after_its_producer_and_before_its_reader():
    graph, ref = variance(64, 512, "float32", [{"A": 2}, {"B": 4}], correction=1)
    plan = plan_tiling(graph)
    assert [g.ops for g in plan.groups] == [("buf0",), ("buf1",), ("buf2", "buf3")]
    assert "the var of op buf1 over B, which the loop of 4 (hint scope 1 slices={'B': 4}) tiles, reads buf0 whole " \
        "twice (for the mean, then the deviations), so it runs after the nest of buf0; buf2 reads buf1, the var of " \
        "op buf1 over B" in plan.notes[0]
    tree = tile(graph, plan)
    names = [n.op.name for n in op_nodes(tree)]
    assert names.index("buf1_sum") < names.index("buf1_center") < names.index("buf1")
    check_program(graph, ref, cores=4)


def test_tiled_var_keeps_its_digits_under_a_large_mean():
    graph, ref = variance(16, 1024, "float32", [{"B": 8}], correction=0, offset=1000.0)
    check_program(graph, ref, cores=2)


def test_tiled_var_with_a_larger_correction_than_its_count_divides_by_zero_as_untiled():
    graph, ref = variance(4, 128, "float32", [{"B": 2}], correction=200)
    machine = fspyre.machine.spyre(cores=1)
    inputs = {"x": sixty_fourths((4, 128), "float32", 3)}
    got = fspyre.run(fspyre.compile(graph, machine, tiling="hints"), inputs)
    want = fspyre.run(fspyre.compile(graph, machine, tiling="none"), inputs)
    assert np.array_equal(got["v"], want["v"]) and np.isinf(got["v"]).all()


def test_hand_made_plan_with_a_tiled_var_beside_its_producer_is_refused():
    from fspyre.ir.plans import Group, Level, TilingPlan

    graph, _ = variance(64, 512, "float32", [], correction=1)
    names = tuple(op.name for op in graph.ops)
    plan = TilingPlan(order=names, groups=(Group(ops=names[:2], levels=(Level(count=4, dims=("B",)),)),))
    with pytest.raises(TilingError,
                       match="op buf1 \\(var over \\['B'\\]\\).*reads buf0 twice.*split_at_tiled_reductions"):
        tile(graph, plan)


@st.composite
def variance_programs(draw):
    dtype = draw(st.sampled_from(["float16", "float32"]))
    rows = draw(st.sampled_from([1, 4, 16]))
    count = draw(st.sampled_from([2, 3, 4, 8]))
    cols = 64 * count * draw(st.sampled_from([1, 2]))
    slices = [{"B": count}]
    if rows > 1 and draw(st.booleans()):
        slices.insert(0, {"A": draw(st.sampled_from([c for c in (2, 4) if rows % c == 0]))})
    offset = draw(st.sampled_from([0.0, 3.0, 100.0])) if dtype == "float32" else draw(st.sampled_from([0.0, 3.0]))
    program = variance(rows, cols, dtype, slices, draw(st.sampled_from([0, 1])), offset)
    return program, draw(st.integers(1, 8)), draw(st.integers(0, 2**16))


@SETTINGS
@given(variance_programs())
def test_tiled_var_equals_untiled_and_numpy(program):
    (graph, ref), cores, seed = program
    check_program(graph, ref, cores, seed)


# -- output levels nested inside a reduction level ---------------------------------------------
def reduction_with_inner_output_levels(fn: str, rows: int, cols: int, dtype: str,
                                       slices: Sequence[dict[str, int]], keepdim: bool):
    """``fn`` over K of x[A, K] and a reader of it, under ``slices`` (a K level with A levels
    inside it, maybe one outside too); and the numpy reference."""
    g = fspyre.GraphBuilder("inner_output")
    g.dim("A", rows)
    g.dim("K", cols)
    x = g.input("x", ["A", "K"], dtype)
    with hinted(g, slices):
        r = g.reduce(fn, x, ["K"], keepdim=keepdim, correction=1 if fn == "var" else 0)
        y = g.mul(r, 0.5)
    g.output("r", r)
    g.output("y", y)

    def ref(xs: np.ndarray) -> dict[str, R.Ref]:
        names = ("A", "K") if keepdim else ("A",)
        shape = (rows, 1) if keepdim else (rows,)
        X = R.exact(("A", "K"), xs.astype(np.float64), dtype)
        Rd = R.reduce(fn, X, ["K"], names, keepdim, dtype, FMT, 1 if fn == "var" else 0)
        return {"r": Rd, "y": R.pointwise("mul", [Rd, 0.5], names, shape, dtype, FMT)}

    return g.build(), ref


def test_row_sums_with_the_rows_tiled_inside_the_column_loop():
    graph, ref = reduction_with_inner_output_levels("sum", 256, 512, "float16", [{"K": 4}, {"A": 2}], False)
    tree = tile(graph, plan_tiling(graph))
    assert tree.buffer_table()["buf0_acc"].scope == "full"
    check_program(graph, ref, cores=4)


def test_matmul_with_its_rows_tiled_inside_its_contraction_loop():
    g = fspyre.GraphBuilder("mm")
    g.dim("M", 128)
    g.dim("K", 256)
    g.dim("N", 128)
    a = g.input("a", ["M", "K"], "float32")
    b = g.input("b", ["K", "N"], "float32")
    with g.hint(slices={"K": 2}):
        with g.hint(slices={"M": 2, "N": 2}):
            c = g.matmul(a, b)
    g.output("c", c)
    graph = g.build()
    machine = fspyre.machine.spyre(cores=4)
    inputs = {"a": sixty_fourths((128, 256), "float32", 1), "b": sixty_fourths((256, 128), "float32", 2)}
    got = fspyre.run(fspyre.compile(graph, machine, tiling="hints"), inputs)
    want, bounds = evaluate_with_bounds(graph, inputs, machine)
    assert compare(graph, got, want, bounds).equal
    A = R.exact(("M", "K"), inputs["a"].astype(np.float64), "float32")
    B = R.exact(("K", "N"), inputs["b"].astype(np.float64), "float32")
    assert R.accept(got["c"], R.matmul(A, B, "K", ("M", "N"), "float32", FMT)).all()


@st.composite
def inner_output_programs(draw):
    fn = draw(st.sampled_from(["sum", "mean", "amax", "amin", "var"]))
    dtype = draw(st.sampled_from(["float16", "float32"]))
    keepdim = draw(st.booleans())
    k_count, a_count = draw(st.sampled_from([2, 4])), draw(st.sampled_from([2, 4]))
    outer = draw(st.sampled_from([1, 2]))
    # the rows are the stick dim of a reduction without keepdim: its tiles stay whole sticks
    rows = 64 * a_count * outer * (1 if keepdim else draw(st.sampled_from([1, 2])))
    if keepdim:
        rows = draw(st.sampled_from([a_count * outer, 4 * a_count * outer]))
    cols = 64 * k_count * draw(st.sampled_from([1, 2]))
    slices = [{"K": k_count}, {"A": a_count}]
    if outer > 1:
        slices.insert(0, {"A": outer})
    program = reduction_with_inner_output_levels(fn, rows, cols, dtype, slices, keepdim)
    return program, draw(st.integers(1, 8)), draw(st.integers(0, 2**16))


@SETTINGS
@given(inner_output_programs())
def test_output_levels_inside_a_reduction_level_equal_untiled_and_numpy(program):
    (graph, ref), cores, seed = program
    check_program(graph, ref, cores, seed)
