"""Ops of an outer hint scope before and after a nested scope run in the outer loop's body,
around the inner loop, instead of in loop nests of their own (docs/tiling.md, "Outer-scope
ops around a nested scope"). Every program runs on the interpreter against the untiled one."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_tiling_properties import GRAPHS, check_tiled

import fspyre
from fspyre.errors import TilingError
from fspyre.ir.frozen import FrozenMap
from fspyre.ir.looptree import Loop
from fspyre.ir.plans import Group, Level
from fspyre.ir.serialize import dumps, loads
from fspyre.machine.report import traffic_report
from fspyre.pretty import pretty
from fspyre.stages.tiling_plan import plan_tiling
from fspyre.testing import examples
from fspyre.testing.hints import legal_hint_nests

pytestmark = pytest.mark.filterwarnings("ignore::fspyre.FspyreWarning")


def outer_inner_outer():
    g = fspyre.GraphBuilder("nest")
    g.dim("A", 256)
    g.dim("B", 1024)
    a = g.input("a", ["A", "B"], "float16")
    b = g.input("b", ["A", "B"], "float16")
    with g.hint(slices={"A": 2}):
        y = g.add(a, b)
        with g.hint(slices={"B": 4}):
            z = g.mul(y, b)
        w = g.exp(z)
        u = g.add(w, y)
    g.output("u", u)
    return g.build()


def test_one_outer_loop_holds_the_outer_ops_and_the_inner_loop():
    graph = outer_inner_outer()
    comp = fspyre.compile(graph, tiling="hints")
    (group,) = comp.stages["tiling_plan"].groups
    assert dict(group.depths) == {"buf0": 1, "buf2": 1, "buf3": 1}
    (outer,) = comp.stages["loop_tree"].body
    assert isinstance(outer, Loop) and outer.count == 2
    kinds = [type(n).__name__ for n in outer.body]
    assert kinds == ["OpNode", "Loop", "OpNode", "OpNode"]
    assert outer.body[1].count == 4 and [n.name for n in outer.body[1].body] == ["buf1"]
    text = pretty(comp.stages["loop_tree"])
    assert text.splitlines()[:4] == [
        "for A in 0..2:  (tile A=128)",
        "  buf0 = add(a, b)  [A=128, B=1024]",
        "  for B in 0..4:  (tile B=256)",
        "    buf1 = mul(buf0, b)  [A=128, B=256]",
    ]
    assert "outer ops {buf0: 1, buf2: 1, buf3: 1}" in pretty(comp.stages["tiling_plan"])
    assert loads(dumps(comp.stages["tiling_plan"])) == comp.stages["tiling_plan"]
    assert loads(dumps(comp.stages["loop_tree"])) == comp.stages["loop_tree"]
    assert "scf.for" in comp.bundle_mlir and comp.bundle_mlir.count("scf.for") == 2
    report = fspyre.check(graph, comp=comp)
    assert report.equal and report.safe, str(report)
    # one kernel: the outer ops' traffic is timed with the inner loop's
    assert len(traffic_report(comp.program).kernels) == 1


def test_a_group_whose_depths_do_not_rise_and_fall_is_refused():
    levels = (Level(count=2, dims=("A",)), Level(count=4, dims=("B",)))
    with pytest.raises(TilingError, match="rise to one run"):
        Group(ops=("a", "b", "c"), levels=levels, depths=FrozenMap({"b": 1}))
    with pytest.raises(TilingError, match="from 1 to 1"):
        Group(ops=("a", "b"), levels=levels, depths=FrozenMap({"a": 2}))
    with pytest.raises(TilingError, match="not in the group"):
        Group(ops=("a", "b"), levels=levels, depths=FrozenMap({"x": 1}))


def test_a_second_inner_run_starts_a_loop_nest_of_its_own():
    """outer, inner, outer, inner: one outer loop cannot hold two sibling inner loops here."""
    g = fspyre.GraphBuilder("two")
    g.dim("A", 256)
    g.dim("B", 1024)
    a = g.input("a", ["A", "B"], "float16")
    with g.hint(slices={"A": 2}):
        y = g.exp(a)
        with g.hint(slices={"B": 4}):
            z = g.neg(y)
        w = g.abs(z)
        with g.hint(slices={"B": 2}):
            v = g.neg(w)
    g.output("v", v)
    graph = g.build()
    plan = plan_tiling(graph)
    assert [(grp.ops, dict(grp.depths)) for grp in plan.groups] == [
        (("buf0", "buf1", "buf2"), {"buf0": 1, "buf2": 1}), (("buf3",), {})]
    report = fspyre.check(graph)
    assert report.equal and report.safe, str(report)


def _with_scopes(graph, scopes):
    """``graph`` with each op's hint scopes set from ``scopes`` (a reshape carries none when
    built; the hypothesis nests put views inside scopes, as a traced model can)."""
    return replace(graph, ops=tuple(replace(op, hints=scopes.get(op.name, op.hints)) for op in graph.ops))


def _rows(name: str):
    """x [M=64, N=64], and dims P1, P2 to reshape M into (a view whose variable is P2)."""
    g = fspyre.GraphBuilder(name)
    g.dim("M", 64)
    g.dim("N", 64)
    g.dim("P1", 1)
    g.dim("P2", 64)
    return g, g.input("x", ["M", "N"], "float16")


def test_an_outer_op_reading_the_inner_result_out_of_step_keeps_its_own_nest():
    """Found by the property below: the outer op reads the inner scope's result through a
    reshape view whose variable P2 is not M, so in a shared M loop it would read the rows of tiles
    not yet written. The groups stay separate nests, and the plan says why."""
    g, x = _rows("view")
    with g.hint(slices={"M": 2}):
        with g.hint(slices={"M": 2}):
            y = g.neg(x)
        z = g.abs(x)
    w = g.neg(g.reshape(y, ["P1", "P2", "N"]))
    g.output("z", z)
    g.output("w", w)
    graph = _with_scopes(g.build(), {w.buffer: (0,)})
    plan = plan_tiling(graph)
    assert [grp.ops for grp in plan.groups] == [(y.buffer,), (z.buffer, w.buffer)]
    assert any(f"{w.buffer} would read {y.buffer}, which {y.buffer} writes tile by tile" in n for n in plan.notes)
    report = fspyre.check(graph, tiling="hints")
    assert report.equal and report.safe, str(report)


def test_a_reader_walking_the_tiled_dim_with_another_variable_runs_after_the_nest():
    """One scope: the reshape reads y with P2 where the loop walks M. Loop fission gives it a
    nest of its own after y's (it used to be refused as a per-tile buffer reader)."""
    g, x = _rows("fission")
    with g.hint(slices={"M": 2}):
        y = g.neg(x)
    w = g.neg(g.reshape(y, ["P1", "P2", "N"]))
    g.output("w", w)
    graph = _with_scopes(g.build(), {w.buffer: (0,)})
    plan = plan_tiling(graph)
    assert [(grp.ops, len(grp.levels)) for grp in plan.groups] == [((y.buffer,), 1)]
    assert any("with variable P2, which that loop does not walk in step" in n for n in plan.notes)
    report = fspyre.check(graph, tiling="hints")
    assert report.equal and report.safe, str(report)


@settings(max_examples=examples(40), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
@given(st.data(), st.integers(1, 32))
def test_outer_scope_ops_around_nested_scopes_agree_with_untiled(data, cores):
    graph = data.draw(GRAPHS, label="graph")
    nest = data.draw(legal_hint_nests(graph), label="hints")
    try:
        plan = plan_tiling(nest.apply(graph))
    except fspyre.FspyreError:
        assume(False)
    assume(any(g.depths for g in plan.groups))
    check_tiled(graph, nest, cores, must_compile=True)
