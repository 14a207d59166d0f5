"""Stage tile: loop nests, per-tile ranges and steps, loop-boundary buffers, tiled reductions,
and every refusal naming op, dim, range and count."""

from __future__ import annotations

import contextlib
import math
from dataclasses import replace

import pytest

import fspyre
from fspyre.check import compare
from fspyre.errors import TilingError
from fspyre.ir.frozen import FrozenMap
from fspyre.ir.graph import Dim, Load, Pointwise, Reduction, Scalar, Store
from fspyre.ir.looptree import Loop, LoopTree, OpNode, TileStep, TreeBuffer, op_nodes
from fspyre.ir.plans import Group, Level, TilingPlan
from fspyre.ir.serialize import dumps, loads
from fspyre.machine.reference import evaluate_with_bounds
from fspyre.stages.allocation import allocate
from fspyre.stages.loop_tree import tile, verify_loop_tree
from fspyre.stages.program import emit_program
from fspyre.stages.split_plan import divide_work
from fspyre.stages.tiling_plan import TilingOptions, plan_groups, plan_tiling
from fspyre.testing import inputs_for


def tree_of(graph) -> LoopTree:
    tree = tile(graph, plan_tiling(graph))
    assert loads(dumps(tree)) == tree
    return tree


def shape(body):
    """The tree as nested lists: loops as (count, [...]), ops as 'name:fn'."""
    return [(n.count, shape(n.body)) if isinstance(n, Loop) else f"{n.op.name}:{n.op.fn}" for n in body]


def canonical():
    g = fspyre.GraphBuilder("add_mul")
    A, B = g.dim("A", 1024), g.dim("B", 4096)
    a, b, c = (g.input(n, (A, B), "float16") for n in "abc")
    with g.hint(slices={"A": 2}):
        with g.hint(slices={"B": 4}):
            y = g.add(a, b)
            z = g.mul(y, c)
    g.output("z", z)
    return g.build()


def test_canonical_tree():
    tree = tree_of(canonical())
    assert shape(tree.body) == [(2, [(4, ["buf0:add", "buf1:mul"])])]
    add, mul = tree.body[0].body[0].body
    for node in (add, mul):
        assert node.op.ranges == (Dim("A", 512), Dim("B", 1024))
        assert node.tiling == ((TileStep(dim="A", extent=512),), (TileStep(dim="B", extent=1024),))
    buffers = tree.buffer_table()
    assert (buffers["buf0"].scope, buffers["buf0"].type.shape) == ("tile", (512, 1024))
    assert (buffers["buf1"].scope, buffers["buf1"].type.shape) == ("full", (1024, 4096))
    # y is indexed in its tile; a, b, c and z keep their full-buffer index
    assert str(add.op.store.index) == "1024*A + B" and str(mul.op.operands[0].index) == "1024*A + B"
    assert str(mul.op.operands[1].index) == "4096*A + B" and str(mul.op.store.index) == "4096*A + B"


def test_no_groups_is_the_flat_tree():
    graph = canonical()
    tree = tile(graph, plan_tiling(graph, TilingOptions(mode="none")))
    assert shape(tree.body) == ["buf0:add", "buf1:mul"]
    assert all(n.op is op for n, op in zip(tree.body, graph.ops))
    assert all(b.scope == "full" for b in tree.buffers)


def test_dim_tiled_at_two_levels_is_divided_twice():
    g = fspyre.GraphBuilder("g")
    g.dim("A", 256)
    g.dim("B", 64)
    x = g.input("x", ["A", "B"], "float16")
    with g.hint(slices={"A": 4}):
        with g.hint(slices={"A": 2}):
            y = g.neg(x)
    g.output("y", y)
    (node,) = tree_of(g.build()).body[0].body[0].body
    assert node.op.ranges[0] == Dim("A", 32)
    # the outer level moves the final extent times the inner count
    assert node.tiling == ((TileStep(dim="A", extent=64),), (TileStep(dim="A", extent=32),))


def test_loop_invariant_op_keeps_its_range():
    g = fspyre.GraphBuilder("g")
    g.dim("A", 64)
    g.dim("B", 128)
    col = g.input("col", ["A"], "float16")
    x = g.input("x", ["A", "B"], "float16")
    with g.hint(slices={"B": 2}):
        c = g.exp(col)  # does not iterate B: recomputed each iteration, whole
        y = g.add(x, c)
    g.output("y", y)
    loop = tree_of(g.build()).body[0]
    exp, add = loop.body
    assert exp.op.ranges == (Dim("A", 64),) and exp.tiling == ((),)
    assert add.op.ranges == (Dim("A", 64), Dim("B", 64))


def boundary_graph():
    """y read inside and after the loop (copy-out), z read only after it (direct write),
    t read only inside (tile)."""
    g = fspyre.GraphBuilder("g")
    g.dim("A", 128)
    g.dim("B", 128)
    a = g.input("a", ["A", "B"], "float16")
    with g.hint(slices={"A": 2}):
        y = g.exp(a)
        t = g.neg(y)
        z = g.mul(t, y)
    g.output("w", g.sub(z, y))
    return g.build()


def test_loop_boundary_buffers():
    tree = tree_of(boundary_graph())
    assert shape(tree.body) == [(2, ["buf0:exp", "buf0_copy:copy", "buf1:neg", "buf2:mul"]), "buf3:sub"]
    b = tree.buffer_table()
    assert [(n, b[n].scope, b[n].type.shape) for n in ("buf0", "buf0_tile", "buf1", "buf2")] == [
        ("buf0", "full", (128, 128)), ("buf0_tile", "tile", (64, 128)),
        ("buf1", "tile", (64, 128)), ("buf2", "full", (128, 128)),
    ]
    exp, copy, neg, mul = tree.body[0].body
    assert exp.op.store.buffer == "buf0_tile"
    assert copy.op.operands[0].buffer == "buf0_tile" and copy.op.store.buffer == "buf0"
    assert copy.tiling == exp.tiling
    assert [o.buffer for o in mul.op.operands] == ["buf1", "buf0_tile"]
    assert mul.op.store.buffer == "buf2"  # written straight into the full buffer
    sub = tree.body[1]
    assert [o.buffer for o in sub.op.operands] == ["buf2", "buf0"]  # outside reads full buffers


def test_new_names_do_not_clash():
    g = fspyre.GraphBuilder("g")
    g.dim("A", 128)
    g.dim("B", 128)
    a = g.input("buf0_tile", ["A", "B"], "float16")
    with g.hint(slices={"A": 2}):
        y = g.exp(a)
        t = g.neg(y)
    g.output("y", y)
    g.output("t", t)
    tree = tree_of(g.build())
    assert "buf0_tile1" in tree.buffer_table()


def reduction_graph(fn="sum", slices=({"A": 2}, {"K": 4}), dtype="float16"):
    g = fspyre.GraphBuilder("red")
    # 128 rows: the [A] result advances under A: 2, and its tiles must be whole 64-element sticks.
    g.dim("A", 128)
    g.dim("K", 256)
    x = g.input("x", ["A", "K"], dtype)
    with contextlib.ExitStack() as stack:
        for s in slices:
            stack.enter_context(g.hint(slices=s))
        r = g.reduce(fn, x, ["K"], correction=1 if fn == "var" else 0)
    g.output("r", r)
    return g.build()


def test_tiled_var_is_a_mean_nest_then_a_sum_of_squared_deviations():
    tree = tree_of(reduction_graph("var", dtype="float32"))
    assert shape(tree.body) == [(2, [
        "buf0_sum_fill:full", (4, ["buf0_sum:sum", "buf0_sum_combine:add"]), "buf0_sum_finish:mul", "buf0_fill:full",
        (4, ["buf0_center:sub", "buf0_square:mul", "buf0:sum", "buf0_combine:add"]), "buf0_finish:div"])]
    b = tree.buffer_table()
    assert (b["buf0_mean"].scope, b["buf0_mean"].type.dtype, b["buf0_mean"].type.shape) == ("tile", "float32", (64,))
    assert (b["buf0_dev"].scope, b["buf0_dev"].type.dtype, b["buf0_dev"].type.shape) == ("tile", "float32", (64, 64))
    mean_finish = tree.body[0].body[2].op
    assert mean_finish.store.buffer == "buf0_mean" and mean_finish.operands[1].value == 1 / 256
    finish = tree.body[0].body[-1].op
    assert finish.operands[1].value == 255.0 and finish.store.buffer == "buf0"  # N - correction


def test_nested_tiled_reduction_layout():
    tree = tree_of(reduction_graph())
    assert shape(tree.body) == [(2, ["buf0_fill:full", (4, ["buf0:sum", "buf0_combine:add"]), "buf0_finish:cast"])]
    outer = tree.body[0]
    fill, inner, finish = outer.body
    partial, combine = inner.body
    b = tree.buffer_table()
    for name in ("buf0_acc", "buf0_part"):
        assert (b[name].scope, b[name].type.dtype, b[name].type.shape) == ("tile", "float32", (64,))
    assert fill.op.operands[0].value == 0.0 and fill.op.store.buffer == "buf0_acc"
    assert fill.tiling == ((TileStep(dim="A", extent=64),),)
    assert partial.op.fn == "sum" and partial.op.store.buffer == "buf0_part"
    assert partial.op.reduction_ranges == (Dim("K", 64),)
    assert partial.tiling == ((TileStep(dim="A", extent=64),), (TileStep(dim="K", extent=64),))
    assert [o.buffer for o in combine.op.operands] == ["buf0_acc", "buf0_part"]
    assert combine.tiling == ((TileStep(dim="A", extent=64),), ())
    assert finish.op.operands[0].buffer == "buf0_acc" and finish.op.store.buffer == "buf0"
    assert b["buf0"].scope == "full"


@pytest.mark.parametrize("fn, combine, identity, finish", [
    ("sum", "add", 0.0, "cast"), ("mean", "add", 0.0, "mul"), ("prod", "mul", 1.0, "cast"),
    ("amax", "maximum", -math.inf, "cast"), ("amin", "minimum", math.inf, "cast"),
])
def test_reduction_identities(fn, combine, identity, finish):
    tree = tree_of(reduction_graph(fn, slices=({"K": 2},)))
    fill, loop, fin = tree.body
    assert fill.op.operands[0].value == identity
    assert loop.body[0].op.fn == ("sum" if fn == "mean" else fn)
    assert loop.body[1].op.fn == combine
    assert fin.op.fn == finish
    if fn == "mean":
        assert fin.op.operands[1].value == 1 / 256


def test_int_accumulators():
    tree = tree_of(reduction_graph("amax", slices=({"K": 2},), dtype="int32"))
    assert tree.buffer_table()["buf0_acc"].type.dtype == "int32"
    assert tree.body[0].op.operands[0].value == -(2**31)


def test_matmul_k_tiling():
    g = fspyre.GraphBuilder("mm")
    g.dim("M", 64)
    g.dim("K", 256)
    g.dim("N", 64)
    a = g.input("a", ["M", "K"], "float16")
    b = g.input("b", ["K", "N"], "float16")
    with g.hint(slices={"K": 4}):
        c = g.matmul(a, b)
    g.output("c", c)
    tree = tree_of(g.build())
    assert shape(tree.body) == ["buf0_fill:full", (4, ["buf0:matmul", "buf0_combine:add"]), "buf0_finish:cast"]
    assert isinstance(tree.body[1].body[0].op, Reduction)


# -- refusals ------------------------------------------------------------------------------------
def refuse(graph, *parts):
    with pytest.raises(TilingError) as err:
        tree_of(graph)
    for p in parts:
        assert p in str(err.value), str(err.value)
    return str(err.value)


def test_a_level_no_whole_stick_tile_can_split_makes_no_loop():
    """A: 4 on 128 takes tiles of 64 (whole sticks of the [A] result), leaving 64 rows for
    A: 64: tiles of 1 element are not whole sticks, and no tile short of all 64 is, so the
    inner level makes no loop (docs/tiling.md, "Tails")."""
    graph = reduction_graph(slices=({"A": 4}, {"A": 64}))
    tree = tile(graph, plan_tiling(graph))
    msg = " ".join(tree.warnings)
    for part in ("op buf0: level 0 (hint scope 0 slices={'A': 4}) tiles dim A (range 128) in 2 tiles of 64",
                 "op buf0: level 1 (hint scope 1 slices={'A': 64}) tiles dim A (range 64 of 128 after the outer "
                 "levels) in 1 tile of 64", "a tile of 1 would move buf0 (float16[A=128]) by 1 elements",
                 "so the level makes no loop"):
        assert part in msg, msg
    assert shape(tree.body) == [(2, ["buf0:sum"])]


def test_output_level_inside_the_reduction_level_accumulates_across_its_tiles():
    tree = tree_of(reduction_graph(slices=({"K": 2}, {"A": 2})))
    assert shape(tree.body) == ["buf0_fill:full", (2, [(2, ["buf0:sum", "buf0_combine:add"])]), "buf0_finish:cast"]
    fill, loop, finish = tree.body
    b = tree.buffer_table()
    # the accumulator spans the A tiles: the whole output, walked by the combine as A moves
    assert (b["buf0_acc"].scope, b["buf0_acc"].type.dtype, b["buf0_acc"].type.shape) == ("full", "float32", (128,))
    assert (b["buf0_part"].scope, b["buf0_part"].type.shape) == ("tile", (64,))
    assert fill.op.ranges == finish.op.ranges == (Dim("A", 128),) and fill.tiling == finish.tiling == ()
    _, combine = loop.body[0].body
    assert combine.op.ranges == (Dim("A", 64),) and combine.tiling == ((), (TileStep(dim="A", extent=64),))


def test_invariant_level_inside_reduction_level():
    g = fspyre.GraphBuilder("g")
    g.dim("A", 64)
    g.dim("K", 256)
    g.dim("C", 64)
    x = g.input("x", ["A", "K"], "float16")
    w = g.input("w", ["C"], "float16")
    with g.hint(slices={"K": 2}):
        with g.hint(slices={"C": 2}):
            r = g.sum(x, ["K"])
            v = g.neg(w)
    g.output("r", r)
    g.output("v", v)
    refuse(g.build(), "level 1 (hint scope 1 slices={'C': 2}) tiles no dim of buf0",
           "folded into the accumulator 2 times")


def test_in_loop_readers_of_partial_results_in_a_hand_made_plan():
    g = fspyre.GraphBuilder("softmax")
    g.dim("A", 64)
    g.dim("B", 256)
    x = g.input("x", ["A", "B"], "float16")
    with g.hint(slices={"B": 2}):
        m = g.amax(x, ["B"], keepdim=True)
        y = g.sub(x, m)
    g.output("y", y)
    graph = g.build()
    # plan_tiling splits the group by loop fission (tests/tiling/test_fission.py); a hand-made
    # plan that keeps the reader in the reduction's nest is refused
    level = Level(count=2, dims=("B",))
    plan = TilingPlan(order=("buf0", "buf1"), groups=(Group(ops=("buf0", "buf1"), levels=(level,)),))
    with pytest.raises(TilingError, match="op buf1 reads buf0, the amax of op buf0.*tiles the reduction dim B.*"
                                          "split_at_tiled_reductions"):
        tile(graph, plan)


def test_several_dims_at_one_level():
    graph = boundary_graph()
    with pytest.raises(TilingError, match="tiles dims \\['A', 'B'\\] at once"):
        tile(graph, plan_groups(graph, [(["buf0", "buf1", "buf2"], 2, ["A", "B"])]))
    graph = reduction_graph(slices=())
    with pytest.raises(TilingError, match="tiles output dim A and reduction dim K at once"):
        tile(graph, plan_groups(graph, [(["buf0"], 2, ["A", "K"])]))


def test_reader_through_a_reshape_reads_the_full_buffer_in_a_later_nest():
    """A per-tile buffer cannot serve a reader through a reshape that merges the tiled dim:
    loop fission runs the reader in a nest of its own, after the producer's, reading the full
    buffer; a plan that skipped fission is refused by tile."""
    g = fspyre.GraphBuilder("g")
    g.dim("A", 64)
    g.dim("B", 64)
    g.dim("F", 64 * 64)
    x = g.input("x", ["A", "B"], "float16")
    with g.hint(slices={"A": 2}):
        y = g.exp(x)
        z = g.neg(g.reshape(y, ["F"]))
    g.output("z", z)
    graph = g.build()
    plan = plan_tiling(graph, TilingOptions(mode="hints"))
    assert [grp.ops for grp in plan.groups] == [("buf0",)]  # buf1 iterates no tiled dim: untiled after it
    assert "buf1 reads buf0, which buf0 writes tile by tile, through a view" in plan.notes[0]
    comp = fspyre.compile(graph, machine=fspyre.machine.spyre(cores=4), tiling="hints")
    assert fspyre.check(graph, machine=fspyre.machine.spyre(cores=4), comp=comp).equal
    whole = TilingPlan(order=("buf0", "buf1"),
                       groups=(Group(ops=("buf0", "buf1"), levels=(Level(count=2, dims=("A",)),)),))
    with pytest.raises(TilingError, match=r"op buf1 reads buf0 \(written by buf0 in the same loop nest\) "
                                          r"through index F"):
        tile(graph, whole)


def test_readers_must_walk_the_producers_tiles():
    graph = boundary_graph()
    plan = plan_groups(graph, [(["buf0", "buf1", "buf2"], 2, [0])])
    tile(graph, plan)  # lockstep: every op tiles A
    g = fspyre.GraphBuilder("g")
    g.dim("A", 128)
    g.dim("B", 128)
    a = g.input("a", ["A", "B"], "float16")
    y = g.exp(a)
    z = g.neg(g.permute(y, ["B", "A"]))  # z iterates (B, A): its first dim is B
    g.output("z", z)
    graph = g.build()
    plan = plan_groups(graph, [(["buf0", "buf1"], 2, [0])])
    # the plan gives z a nest of its own after y's (loop fission): z's loop walks B, not y's A
    assert [grp.ops for grp in plan.groups] == [("buf0",), ("buf1",)]
    assert "buf1 reads buf0, which buf0 writes tile by tile, where the loop of 2 walks dim A" in plan.notes[0]
    assert fspyre.check(graph, machine=fspyre.machine.spyre(cores=4), comp=fspyre.compile(
        graph, machine=fspyre.machine.spyre(cores=4), tiling=plan)).equal
    # tile() itself refuses the one nest the plan no longer makes
    whole = TilingPlan(order=("buf0", "buf1"), groups=(Group(ops=("buf0", "buf1"), levels=(Level(
        count=2, dims=("A", "B"), op_dims=FrozenMap({"buf0": ("A",), "buf1": ("B",)})),)),))
    with pytest.raises(TilingError, match="op buf1 reads buf0 along dim A in tiles of 128"):
        tile(graph, whole)


def test_verify_loop_tree_catches_inconsistent_trees():
    tree = tree_of(canonical())
    node = tree.body[0].body[0].body[0]
    bad = LoopTree(name="t", buffers=tree.buffers, inputs=tree.inputs, outputs=tree.outputs,
                   body=(Loop(count=2, steps=(), body=(OpNode(op=node.op, tiling=()),)),))
    with pytest.raises(TilingError, match="sits in 1 loops but has 0 tiling levels"):
        verify_loop_tree(bad)
    late = LoopTree(name="t", buffers=tree.buffers, inputs=tree.inputs, outputs=tree.outputs,
                    body=(OpNode(op=tree.body[0].body[0].body[1].op),))
    with pytest.raises(TilingError, match="reads buf0 before anything writes it"):
        verify_loop_tree(late)


def test_verify_loop_tree_checks_each_loops_recorded_steps():
    tree = tree_of(canonical())
    outer = tree.body[0]
    wrong = replace(outer, steps=(TileStep(dim="A", extent=256),))
    with pytest.raises(TilingError, match=r"level 0 \(count 2\) records steps \[A\+256\] but its ops move \[A\+512\]"):
        verify_loop_tree(replace(tree, body=(wrong,)))
    inner = outer.body[0]
    silent = replace(outer, body=(replace(inner, steps=()),))
    with pytest.raises(TilingError, match=r"level 1 \(count 4\) records steps \[\] but its ops move \[B\+1024\]"):
        verify_loop_tree(replace(tree, body=(silent,)))


def test_untouched_ops_are_shared():
    graph = boundary_graph()
    tree = tree_of(graph)
    assert tree.body[1].op is graph.ops[-1]
    assert isinstance(tree.body[0].body[0].op, Pointwise)


# -- a loaded tree's buffer dims and guards (issue 22: every stage verifies the tree it is handed) --
def _with_buffer(tree: LoopTree, name: str, dims) -> LoopTree:
    return replace(tree, buffers=tuple(replace(b, type=replace(b.type, dims=tuple(dims))) if b.name == name else b
                                       for b in tree.buffers))


def test_a_buffers_dims_must_be_the_ones_its_writer_stores_through():
    tree = tree_of(canonical())
    out = tree.buffer_table()["buf1"].type  # full [A=1024, B=4096], written by mul through 4096*A + B
    verify_loop_tree(tree)
    a, b = out.dims
    with pytest.raises(TilingError, match=r"op buf1 stores into buf1 float16\[B=4096, A=1024\] through index "
                                          r"4096\*A \+ B, which moves \w by \d+ elements where the buffer's dims "
                                          r"need dim \w's stride \d+"):
        verify_loop_tree(_with_buffer(tree, "buf1", (b, a)))
    with pytest.raises(TilingError, match=r"moves A by 4096 elements where the buffer's dims need the stride of "
                                          r"one of its dims \[1\]"):
        verify_loop_tree(_with_buffer(tree, "buf1", (b,)))
    with pytest.raises(TilingError, match="full buffer buf1 has dim A of 512 elements where full buffer a has 1024; "
                                          "a dim name is one axis, of one size"):
        verify_loop_tree(_with_buffer(tree, "buf1", (Dim("A", 512), b)))


def test_dims_of_one_size_swapped_are_refused_by_their_names():
    # both dims 64: the swap keeps every stride, so only the names tell the transposed output
    g = fspyre.GraphBuilder("square")
    A, B = g.dim("A", 64), g.dim("B", 64)
    x = g.input("x", (A, B), "float16")
    with g.hint(slices={"A": 2}):
        g.output("y", g.exp(x))
    tree = tree_of(g.build())
    (writer,) = [n for n in op_nodes(tree) if n.op.store.buffer == "buf0"]
    a, b = tree.buffer_table()["buf0"].type.dims
    with pytest.raises(TilingError, match=r"op buf0 stores into buf0 float16\[B=64, A=64\] through index 64\*A \+ B, "
                                          r"which moves [AB] by \d+ elements where the buffer's dims need dim [AB]'s "
                                          r"stride"):
        verify_loop_tree(_with_buffer(tree, "buf0", (b, a)))
    assert writer.op.store.buffer == "buf0"


def _online_softmax(slices: int = 4):
    g = fspyre.GraphBuilder("softmax")
    r, c = g.dim("R", 16), g.dim("C", 256)
    x = g.input("x", (r, c), "float32")
    with g.hint(slices={"C": slices}):
        mx = g.amax(x, ["C"], keepdim=True)
        e = g.exp(g.sub(x, mx))
        g.output("p", g.div(e, g.sum(e, ["C"], keepdim=True)))
    return g.build()


def _guarded(body, name: str, runs: str):
    return tuple(replace(n, body=_guarded(n.body, name, runs)) if isinstance(n, Loop)
                 else replace(n, runs=runs) if n.name == name else n for n in body)


@pytest.mark.parametrize("stage", ["loop_tree", "resident_tree"])
def test_a_combine_guarded_last_loses_the_partials_of_all_iterations_but_the_last(stage):
    comp = fspyre.compile(_online_softmax(), fspyre.machine.spyre(cores=4), tiling="hints")
    tree = comp.stages[stage]
    (loop, *_) = [n for n in tree.body if isinstance(n, Loop)]
    combine = loop.body[-1]  # buf3_acc = add(buf3_acc, buf3_part), the loop body's tail: it may be guarded
    assert (combine.name, combine.op.fn, combine.runs, combine.tiling[-1]) == ("buf3_combine", "add", "every", ())
    bad = replace(tree, body=_guarded(tree.body, "buf3_combine", "last"))
    with pytest.raises(TilingError, match=r"the loop at level 0 \(count 4\): op buf3 writes buf3_part in the same "
                                          r"place in each of the 4 iterations, from what the loop moves, but only its "
                                          r"last-iteration ops \['buf3_combine'\] read it, and it reaches nothing the "
                                          r"loop moves or carries, so the values of all iterations but the last are "
                                          r"lost"):
        verify_loop_tree(bad)
    # through the JSON door too: loads verifies what it loads
    with pytest.raises(TilingError, match="are lost"):
        loads(dumps(bad))


def _k_accumulation():
    g = fspyre.GraphBuilder("mm")
    m, k, n = g.dim("M", 8), g.dim("K", 128), g.dim("N", 64)
    x, w = g.input("x", (m, k), "float32"), g.input("w", (k, n), "float32")
    with g.hint(slices={"K": 2}):
        g.output("y", g.matmul(x, w, contract="K"))
    return g.build()


def test_a_first_iteration_op_must_not_read_what_the_iterations_rewrite():
    tree = fspyre.compile(_k_accumulation(), fspyre.machine.spyre(cores=4), tiling="hints").stages["resident_tree"]
    (i, loop), = [(i, n) for i, n in enumerate(tree.body) if isinstance(n, Loop)]
    fill, *rest = loop.body
    assert (fill.runs, fill.op.fn, loop.carried) == ("first", "full", ("buf0_acc",))
    acc = tree.buffer_table()["buf0_acc"]
    # t = acc * 2 at the head of the loop body: run in every iteration it reads the running sum
    # the combine rewrites; guarded first it would read only the fill's zeros
    head = OpNode(op=Pointwise(name="twice", fn="mul", operands=(Load(buffer="buf0_acc", index=fill.op.store.index),
                                                                   Scalar(value=2.0)),
                               ranges=fill.op.ranges, store=Store(buffer="t", index=fill.op.store.index)),
                  tiling=fill.tiling)
    made = replace(tree, buffers=tree.buffers + (TreeBuffer(name="t", type=acc.type, scope="tile"),))

    def with_head(runs: str) -> LoopTree:
        body = (fill, replace(head, runs=runs), *rest)
        return replace(made, body=tree.body[:i] + (replace(loop, body=body),) + tree.body[i + 1:])

    verify_loop_tree(with_head("every"))
    with pytest.raises(TilingError, match=r"the loop at level 0 \(count 2\): op twice runs in the first iteration "
                                          r"only but reads buf0_acc, which op buf0_combine rewrites in every "
                                          r"iteration, so it would see only the value from before the loop"):
        verify_loop_tree(with_head("first"))


def test_a_value_nothing_reads_is_not_lost():
    # a dead op of the graph, tiled: its per-tile buffer is rewritten in every iteration and
    # read by no op; not a lost value (the property test of outer scopes drew this graph)
    g = fspyre.GraphBuilder("dead")
    a, b = g.dim("A", 8), g.dim("B", 64)
    x = g.input("x", (a, b), "float16")
    with g.hint(slices={"A": 2}):
        with g.hint(slices={"A": 2}):
            g.neg(x)
        y = g.neg(x)
    g.output("y", y)
    tree = fspyre.compile(g.build(), fspyre.machine.spyre(cores=1), tiling="hints").stages["loop_tree"]
    assert shape(tree.body) == [(2, [(2, ["buf0:neg"]), "buf1:neg"])]
    assert tree.buffer_table()["buf0"].scope == "tile"
    verify_loop_tree(tree)


def test_a_finish_run_in_every_iteration_is_legal():
    # the K-accumulation's cast, guarded last, run in every iteration instead: it rewrites y
    # from the running sum each time, and the last time from the whole sum -- the same answer
    machine = fspyre.machine.spyre(cores=4)
    graph = _k_accumulation()
    comp = fspyre.compile(graph, machine, tiling="hints")
    tree = comp.stages["resident_tree"]
    (loop,) = [n for n in tree.body if isinstance(n, Loop)]
    finish = loop.body[-1]
    assert (finish.runs, finish.op.fn) == ("last", "cast")
    every = loads(dumps(replace(tree, body=_guarded(tree.body, finish.name, "every"))))
    split = divide_work(every, machine)
    program = emit_program(every, split, allocate(every, split, machine), machine)
    inputs = inputs_for(graph, 0)
    assert compare(graph, fspyre.run(program, inputs), *evaluate_with_bounds(graph, inputs, machine)).equal
