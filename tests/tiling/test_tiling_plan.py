"""Stage plan_tiling (hints -> groups) and the embedders' plan_groups."""

from __future__ import annotations

import contextlib
from dataclasses import replace

import pytest

import fspyre
from fspyre.errors import HintError, TilingError
from fspyre.ir.frozen import FrozenMap
from fspyre.ir.graph import HintScope
from fspyre.ir.plans import Group, Level, TilingPlan
from fspyre.ir.serialize import dumps, loads
from fspyre.stages.tiling_plan import TilingOptions, plan_groups, plan_tiling, verify_plan


def chain(scopes=({"A": 2},), rows=128, cols=256, n=2):
    """n pointwise ops under nested scopes (outermost first)."""
    g = fspyre.GraphBuilder("chain")
    g.dim("A", rows)
    g.dim("B", cols)
    x = g.input("x", ["A", "B"], "float16")
    with contextlib.ExitStack() as stack:
        for s in scopes:
            stack.enter_context(g.hint(slices=s))
        for _ in range(n):
            x = g.exp(x)
    g.output("y", x)
    return g.build()


def hinted(**slices):
    return plan_tiling(chain(scopes=(slices,)))


def test_no_hints_means_no_groups_in_both_modes():
    graph = chain(scopes=())
    for mode in ("none", "hints"):
        plan = plan_tiling(graph, TilingOptions(mode=mode))
        assert plan == TilingPlan(order=tuple(op.name for op in graph.ops))


def test_mode_none_ignores_hints():
    assert plan_tiling(chain(), TilingOptions(mode="none")).groups == ()


def test_unknown_mode():
    with pytest.raises(TilingError, match="tiling='rows'"):
        TilingOptions(mode="rows")


def test_nested_scopes_are_nested_levels_outer_first():
    plan = plan_tiling(chain(scopes=({"A": 2}, {"B": 4})))
    (group,) = plan.groups
    assert group.ops == ("buf0", "buf1")
    assert [(lv.count, lv.dims) for lv in group.levels] == [(2, ("A",)), (4, ("B",))]
    assert group.levels[1].source == "hint scope 1 slices={'B': 4}"


def test_several_dims_in_one_scope_nest_in_written_order():
    for slices, want in (({"A": 2, "B": 4}, [(2, ("A",)), (4, ("B",))]),
                         ({"B": 4, "A": 2}, [(4, ("B",)), (2, ("A",))])):
        (group,) = hinted(**slices).groups
        assert [(lv.count, lv.dims) for lv in group.levels] == want


def test_count_one_and_missing_dim_are_dropped_with_warnings():
    plan = plan_tiling(chain(scopes=({"A": 1, "B": 2},)))
    (group,) = plan.groups
    assert [(lv.count, lv.dims) for lv in group.levels] == [(2, ("B",))]
    assert plan.warnings == ("hint scope 0 slices={'A': 1}: count 1 makes no loop; level dropped for ops [buf0, buf1] "
                             "(remove it, or give a count >= 2)",)

    g = fspyre.GraphBuilder("g")
    g.dim("A", 64)
    g.dim("C", 8)
    x = g.input("x", ["A"], "float16")
    with g.hint(slices={"C": 2}):
        y = g.neg(x)
    g.output("y", y)
    plan = plan_tiling(g.build())
    assert plan.groups == ()
    assert plan.warnings == (
        "hint scope 0 slices={'C': 2}: no op of [buf0] iterates dim C; hint ignored "
        "(remove it, or build the ops that iterate C inside the scope)",
        "ops [buf0] under hint scopes [0]: no loop level is left, so they run untiled",
    )


def test_size_one_dim_is_not_iterated():
    """A keepdim result has B of size 1: the op is invariant at a B level, not an error."""
    g = fspyre.GraphBuilder("g")
    g.dim("A", 64)
    g.dim("B", 128)
    x = g.input("x", ["A", "B"], "float16")
    m = g.amax(x, ["B"], keepdim=True)
    with g.hint(slices={"B": 2}):
        y = g.neg(m)
    g.output("y", y)
    plan = plan_tiling(g.build())
    assert plan.groups == ()
    assert "iterates dim B" in plan.warnings[0]


def test_work_div_only_scopes_make_no_loops_and_no_group_boundaries():
    g = fspyre.GraphBuilder("g")
    g.dim("A", 128)
    g.dim("B", 128)
    x = g.input("x", ["A", "B"], "float16")
    with g.hint(slices={"A": 2}):
        y = g.exp(x)
        with g.hint(work_div={"B": 2}):
            z = g.neg(y)
    with g.hint(work_div={"A": 4}):
        w = g.neg(z)
    g.output("w", w)
    plan = plan_tiling(g.build())
    assert [grp.ops for grp in plan.groups] == [("buf0", "buf1")]


def test_outer_scope_ops_around_a_nested_scope_share_its_outer_loop():
    """The anchor gives each run of one scope key a loop nest of its own (three loops over A
    here); fspyre runs the outer scope's ops in the body of the one A loop, before and after
    the B loop (docs/tiling.md, "Outer-scope ops around a nested scope")."""
    g = fspyre.GraphBuilder("g")
    g.dim("A", 128)
    g.dim("B", 128)
    x = g.input("x", ["A", "B"], "float16")
    with g.hint(slices={"A": 2}):
        y = g.exp(x)
        with g.hint(slices={"B": 2}):
            z = g.neg(y)
        w = g.abs(z)
    g.output("w", w)
    plan = plan_tiling(g.build())
    (group,) = plan.groups
    assert group.ops == ("buf0", "buf1", "buf2") and [lv.dims for lv in group.levels] == [("A",), ("B",)]
    assert dict(group.depths) == {"buf0": 1, "buf2": 1}


def interloper_graph(reads_run: bool, run_reads_it: bool):
    g = fspyre.GraphBuilder("g")
    g.dim("A", 128)
    g.dim("B", 128)
    a = g.input("a", ["A", "B"], "float16")
    with g.hint(slices={"A": 2}) as s:
        y = g.exp(a)
    u = g.neg(y if reads_run else a)
    with g.reenter(s):
        z = g.mul(y, u if run_reads_it else a)
    g.output("z", z)
    g.output("u", u)
    return g.build()


def test_interloper_moves_before_the_run_when_it_can():
    plan = plan_tiling(interloper_graph(reads_run=False, run_reads_it=True))
    assert plan.order == ("buf1", "buf0", "buf2")
    assert [grp.ops for grp in plan.groups] == [("buf0", "buf2")]


def test_interloper_moves_after_the_run_otherwise():
    plan = plan_tiling(interloper_graph(reads_run=True, run_reads_it=False))
    assert plan.order == ("buf0", "buf2", "buf1")
    assert [grp.ops for grp in plan.groups] == [("buf0", "buf2")]


def test_stuck_interloper_names_itself_the_run_and_both_blockers():
    with pytest.raises(HintError) as err:
        plan_tiling(interloper_graph(reads_run=True, run_reads_it=True))
    msg = str(err.value)
    assert "unhinted op buf1" in msg and "[buf0, buf2]" in msg
    assert "reads buf0 (written by buf0)" in msg and "buf2 in the run reads its result buf1" in msg


def test_trailing_unhinted_ops_stay():
    plan = plan_tiling(chain(scopes=({"A": 2},), n=1))
    assert plan.order == ("buf0",)


def test_undeclared_scope_and_bad_counts_are_hint_errors():
    graph = chain()
    bad = replace(graph, ops=tuple(replace(op, hints=(7,)) for op in graph.ops))
    with pytest.raises(HintError, match="op buf0 carries hint scope 7"):
        plan_tiling(bad)
    zero = replace(graph, hints=(HintScope(id=0, slices=FrozenMap({"A": 0})),))
    with pytest.raises(HintError, match="count must be an integer >= 1"):
        plan_tiling(zero)


def test_plan_round_trips_through_json():
    plan = plan_tiling(chain(scopes=({"A": 2, "B": 4},)))
    assert loads(dumps(plan)) == plan


# -- plan_groups ------------------------------------------------------------------------------
def three_ops():
    g = fspyre.GraphBuilder("emb")
    g.dim("A", 128)
    g.dim("B", 256)
    a = g.input("a", ["A", "B"], "float16")
    at = g.input("at", ["B", "A"], "float16")
    y = g.exp(a)
    z = g.add(g.permute(at, ["A", "B"]), y)
    g.output("w", g.sum(z, ["B"]))
    g.output("z", z)
    return g.build()


def test_group_forms():
    graph = three_ops()
    ops = ["buf0", "buf1", "buf2"]
    flat = plan_groups(graph, [(ops, 2)])
    (level,) = flat.groups[0].levels
    assert level.count == 2 and level.dims == ("A",)
    assert dict(level.op_dims) == {"buf0": ("A",), "buf1": ("A",), "buf2": ("A",)}
    assert loads(dumps(flat)) == flat
    named = plan_groups(graph, [(ops, 2, ["B"])])
    assert named.groups[0].levels == (Level(count=2, dims=("B",), source="group 0 level 0"),)
    nested = plan_groups(graph, [(ops, [(2, [0]), (4, "B")])])
    assert [(lv.count, lv.dims) for lv in nested.groups[0].levels] == [(2, ("A",)), (4, ("B",))]
    assert nested.order == ("buf0", "buf1", "buf2")


def test_index_form_resolves_per_op():
    """Index 0 is A for the pointwise ops and the sum alike here; index 1 is B, which the sum
    (output [A]) does not have."""
    graph = three_ops()
    with pytest.raises(TilingError, match=r"op buf2 has 1 output dims \['A'\]; index 1 is out of range"):
        plan_groups(graph, [(["buf0", "buf1", "buf2"], 2, [1])])
    plan = plan_groups(graph, [(["buf0", "buf1"], 2, [1])])
    assert dict(plan.groups[0].levels[0].op_dims) == {"buf0": ("B",), "buf1": ("B",)}


@pytest.mark.parametrize("spec, message", [
    ([(["nope"], 2)], "op nope is not in graph emb"),
    ([(["buf0", "buf2"], 2)], "op buf1 runs between its ops buf0 and buf2 but is not in the group"),
    ([(["buf0"], 0)], "count 0 must be an integer >= 1"),
    ([(["buf0"], [])], "at least one"),
    ([("buf0", 2)], "non-empty list of op names"),
    ([(["buf0"], 2), (["buf0", "buf1"], 2)], "op buf0 is in group 0 and in group 1"),
    ([(["buf1", "buf0"], 2)], "out of program order"),
    ([(["buf0"], 2, [2.5])], "must be a dim name or an output-dim index"),
])
def test_group_errors(spec, message):
    with pytest.raises(TilingError, match=message.replace("[", r"\[").replace("]", r"\]")):
        plan_groups(three_ops(), spec)


def test_a_level_naming_no_dim_is_a_warning():
    """An empty dims list is a hint with no effect: dropped with a warning, like a count of 1."""
    plan = plan_groups(three_ops(), [(["buf0"], 2, [])])
    assert plan.groups == ()
    assert any("names no dim to tile; level ignored" in w for w in plan.warnings)


def test_verify_plan_checks_the_order():
    graph = three_ops()
    with pytest.raises(TilingError, match="op buf1 runs before op buf0, which writes buf0"):
        verify_plan(graph, TilingPlan(order=("buf1", "buf0", "buf2")))
    with pytest.raises(TilingError, match="leaves out ops"):
        verify_plan(graph, TilingPlan(order=("buf0", "buf1")))
    with pytest.raises(TilingError, match="op zzz in the program order is not in graph emb"):
        verify_plan(graph, TilingPlan(order=("buf0", "buf1", "buf2", "zzz")))
    with pytest.raises(TilingError, match="group 0 .* has no loop levels"):
        verify_plan(graph, TilingPlan(order=("buf0", "buf1", "buf2"), groups=(Group(ops=("buf0",), levels=()),)))


def test_level_validates_itself():
    with pytest.raises(TilingError, match="count 0"):
        Level(count=0, dims=("A",))
    with pytest.raises(TilingError, match="names no dim"):
        Level(count=2, dims=())
    with pytest.raises(TilingError, match=r"op x tiles \['B'\]"):
        Level(count=2, dims=("A",), op_dims=FrozenMap({"x": ("B",)}))


def test_a_plan_naming_an_op_twice_or_leaving_one_out_is_refused():
    # issue 22's surviving mutant: verify_plan accepted an order listing an op twice
    graph = chain()
    plan = plan_tiling(graph)
    assert verify_plan(graph, plan) is plan
    first = plan.order[0]
    with pytest.raises(TilingError, match=f"op {first} appears twice"):
        verify_plan(graph, replace(plan, order=plan.order + (first,)))
    with pytest.raises(TilingError, match=rf"leaves out ops \[{first}\]"):
        verify_plan(graph, replace(plan, order=plan.order[1:]))


def test_a_group_s_depths_rise_to_one_inner_run_and_fall():
    levels = (Level(count=2, dims=("A",)), Level(count=2, dims=("B",)))
    Group(ops=("a", "b", "c"), levels=levels, depths=FrozenMap({"a": 1, "c": 1}))  # 1, 2, 1: one inner run
    with pytest.raises(TilingError, match=r"depths \[2, 1, 2\] must rise to one run of ops under all 2 levels"):
        Group(ops=("a", "b", "c"), levels=levels, depths=FrozenMap({"b": 1}))  # two inner runs


def test_a_tiling_plan_prints_its_groups_short():
    level = (Level(count=2, dims=("A",)),)
    groups = tuple(Group(ops=(f"buf{i}",), levels=level) for i in range(5)) + (
        Group(ops=("buf5", "buf6"), levels=level),)
    plan = TilingPlan(order=tuple(f"buf{i}" for i in range(7)), groups=groups)
    assert repr(plan) == "TilingPlan(7 ops, 6 groups: buf0 A:2; buf1 A:2; buf2 A:2; buf3 A:2; +2 more)"
    assert repr(TilingPlan(order=("buf5", "buf6"), groups=groups[-1:])) == (
        "TilingPlan(2 ops, 1 groups: buf5..buf6 A:2)")
