"""Transposed reads inside nested loops (issue: a reader must walk its producer's tiles in
lockstep, advance for advance, not only tile size for tile size). Checked against numpy."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fspyre
from fspyre.errors import TilingError
from fspyre.ir.plans import Group, Level, TilingPlan
from fspyre.stages.loop_tree import tile
from fspyre.stages.tiling_plan import TilingOptions, plan_tiling
from fspyre.testing import examples


def nest(outer: str, inner: str, rows: int, reader_inside: bool = True) -> fspyre.Graph:
    g = fspyre.GraphBuilder("transposed")
    g.dim("A", rows)
    g.dim("B", 128)
    a, b = g.input("a", ["A", "B"], "float32"), g.input("b", ["A", "B"], "float32")
    with g.hint(slices={outer: 2}):
        with g.hint(slices={inner: 2}):
            y = g.add(a, b)
            z = g.mul(g.permute(y, ["B", "A"]), 2.0)  # written transposed: [B, A] in memory
            w = g.add(g.permute(a, ["B", "A"]), z)  # a read transposed, z read as written
    g.output("z", z)
    g.output("w", w)
    return g.build()


@pytest.mark.parametrize("outer,inner", [("A", "B"), ("B", "A")])
@pytest.mark.parametrize("rows", [128, 256])
def test_permuted_reads_and_writes_in_a_nest_equal_numpy(outer, inner, rows):
    graph = nest(outer, inner, rows)
    rng = np.random.default_rng(rows)
    ins = {n: rng.standard_normal((rows, 128)).astype(np.float32) for n in ("a", "b")}
    comp = fspyre.compile(graph, tiling="hints")
    got = fspyre.run(comp, ins)
    z = 2 * (ins["a"] + ins["b"]).T
    assert np.array_equal(got["z"], z)
    assert np.array_equal(got["w"], ins["a"].T + z)


def renamed_reader(name: str, *, one_scope: bool):
    """y = a + b written under A:2 > B:2; z = 2 y read with y's dims renamed (the reader's A
    walks y's B), under the same hint scopes (one scope) or in a second nest like the first."""
    g = fspyre.GraphBuilder(name)
    g.dim("A", 128)
    g.dim("B", 128)
    a, b = g.input("a", ["A", "B"], "float32"), g.input("b", ["A", "B"], "float32")
    with contextlib.ExitStack() as scopes:
        scopes.enter_context(_nested(g, "AB"))
        y = g.add(a, b)
        if not one_scope:
            scopes.close()
            scopes.enter_context(_nested(g, "AB"))
        z = g.mul(g.rename(y, {"A": "B", "B": "A"}), 2.0)
    g.output("z", z)
    return g.build(), y


def test_a_read_walking_the_producer_along_another_level_runs_in_a_later_nest():
    # rename swaps which iteration variable walks y's first dim: the reader moves it at the
    # inner level, the producer at the outer one, so no shared nest can serve it. The plan
    # gives the reader a nest of its own after y's (loop fission); tile() refuses the shared
    # nest with both advances.
    graph, _ = renamed_reader("swapped", one_scope=True)
    plan = plan_tiling(graph, TilingOptions(mode="hints"))
    assert [grp.ops for grp in plan.groups] == [("buf0",), ("buf1",)]
    assert "buf1 reads buf0, which buf0 writes tile by tile, where the loop of 2 walks dim A, with variable B" \
        in plan.notes[0]
    report = fspyre.check(graph, tiling="hints")
    assert report.equal and report.safe, str(report)
    shared = TilingPlan(order=("buf0", "buf1"), groups=(Group(ops=("buf0", "buf1"), levels=(
        Level(count=2, dims=("A",)), Level(count=2, dims=("B",)))),))
    with pytest.raises(TilingError, match=r"moving \[L0: -, L1: 64\].*moving \[L0: 64, L1: -\]"):
        tile(graph, shared)


def test_sibling_nests_walking_a_buffer_in_other_orders_do_not_share_lx_slots():
    # Two nests A:2 > B:2. The second reads y with its dims renamed, so its outer loop walks
    # y's second dim and its inner loop y's first. LX keeps one slot per iteration of such
    # sibling loops, found by iteration number: iteration (i, j) of the second nest would read
    # the tile (i, j) of the first nest left there, i.e. y's tile (A i, B j) where it needs
    # (A j, B i). Both accesses name their loops' dims A and B; the allocator compares what
    # each loop moves in y's own elements, so y stays in HBM. (Before, this compiled, passed
    # the memory check and gave the wrong z, silently.)
    graph, y = renamed_reader("siblings", one_scope=False)
    comp = fspyre.compile(graph, tiling="hints")
    placed = comp.stages["allocation"].buffers[y.buffer]
    assert placed.memory == "hbm"
    assert "walks it otherwise ([2x64, 2x8192])" in placed.reason
    rng = np.random.default_rng(0)
    ins = {n: rng.standard_normal((128, 128)).astype(np.float32) for n in ("a", "b")}
    assert np.array_equal(fspyre.run(comp, ins)["z"], 2 * (ins["a"] + ins["b"]))  # a rename relabels, in place


@settings(max_examples=examples(30), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.sampled_from([64, 128, 256]), cols=st.sampled_from([64, 128]),
       first=st.sampled_from(["AB", "BA", "A", "B"]), second=st.sampled_from(["AB", "BA", "A", "B"]),
       read=st.sampled_from(["as written", "renamed", "permuted"]), same_scope=st.booleans(),
       cores=st.sampled_from([1, 3, 8, 32]))
def test_a_buffer_written_by_one_nest_and_read_by_another_in_any_order_equals_numpy(
        rows, cols, first, second, read, same_scope, cores):
    """Property over the two bugs above: y written by a nest over A and/or B, then read as
    written, with its dims renamed (the reader's loop over "A" walks y's B) or permuted, by a
    nest over A and/or B -- in one hint scope (loop fission decides) or in two. Whatever the
    plan, the program equals numpy, and the memory check is clean (tests/conftest.py)."""
    g = fspyre.GraphBuilder("orders")
    g.dim("A", rows)
    g.dim("B", cols if read == "as written" else rows)
    a, b = g.input("a", ["A", "B"], "float32"), g.input("b", ["A", "B"], "float32")

    def scope(dims):
        return contextlib.ExitStack() if not dims else _nested(g, dims)

    def reader(y):
        if read == "renamed":
            return g.rename(y, {"A": "B", "B": "A"})
        return g.permute(y, ["B", "A"]) if read == "permuted" else y

    if same_scope:
        with scope(first):
            y = g.add(a, b)
            z = g.mul(reader(y), 2.0)
    else:
        with scope(first):
            y = g.add(a, b)
        with scope(second):
            z = g.mul(reader(y), 2.0)
    g.output("z", z)
    graph = g.build()
    rng = np.random.default_rng(rows + cols)
    shape = tuple(d.size for d in graph.buffer_table()["a"].type.dims)
    ins = {n: rng.standard_normal(shape).astype(np.float32) for n in ("a", "b")}
    want = 2 * (ins["a"] + ins["b"])
    want = want.T if read == "permuted" else want  # a rename relabels in place
    comp = fspyre.compile(graph, fspyre.machine.spyre(cores=cores), tiling="hints")
    assert np.array_equal(fspyre.run(comp, ins)["z"], want)


def _nested(g, dims):
    stack = contextlib.ExitStack()
    for d in dims:
        stack.enter_context(g.hint(slices={d: 2}))
    return stack
