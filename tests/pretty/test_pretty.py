"""Printers and pictures: golden text for every stage artifact, hand-built loop trees (the
tiling stage lands separately), valid dot output, and output that does not depend on hashing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fspyre
from fspyre.errors import FspyreError
from fspyre.ir.frozen import FrozenMap
from fspyre.ir.graph import Dim, Graph, Load, Output, Pointwise, Reduction, Scalar, Store, TensorType, sym
from fspyre.ir.looptree import Loop, LoopTree, OpNode, TileStep, TreeBuffer
from fspyre.ir.plans import Allocation, Group, Level, Placement, TilingPlan
from fspyre.machine.interpreter import run_program
from fspyre.machine.layout import stick_layout
from fspyre.pretty import pretty, render, to_dot
from fspyre.stages.allocation import allocate
from fspyre.stages.program import emit_program
from fspyre.stages.split_plan import divide_work

REPO = Path(__file__).resolve().parents[2]
MACHINE = fspyre.machine.spyre(cores=32)


# -- examples -------------------------------------------------------------------------------
def add_mul_graph() -> Graph:
    """The seed's canonical example, with its hint scopes (recorded, not yet applied)."""
    g = fspyre.GraphBuilder("add_mul")
    A, B = g.dim("A", 1024), g.dim("B", 4096)
    a, b, c = (g.input(n, (A, B), "float16") for n in "abc")
    with g.hint(slices={"A": 2}):
        with g.hint(slices={"B": 4}):
            z = g.mul(g.add(a, b), c)
    g.output("z", z)
    return g.build()


def softmax_graph(bias: bool = False) -> Graph:
    g = fspyre.GraphBuilder("softmax_bias" if bias else "softmax")
    R, C = g.dim("R", 8), g.dim("C", 128)
    x = g.input("x", (R, C), "float16")
    if bias:
        x = g.add(x, g.input("bias", (C,), "float16"))
    m = g.amax(x, ["C"], keepdim=True)
    e = g.exp(g.sub(x, m))
    g.output("y", g.div(e, g.sum(e, ["C"], keepdim=True)))
    return g.build()


def matmul_graph() -> Graph:
    g = fspyre.GraphBuilder("matmul")
    M, K, N = g.dim("M", 64), g.dim("K", 128), g.dim("N", 256)
    a = g.input("a", (M, K), "float16")
    b = g.input("b", (K, N), "float16")
    g.output("y", g.matmul(a, b))
    return g.build()


EXAMPLES = {"add_mul": add_mul_graph, "softmax": softmax_graph, "matmul": matmul_graph}


def canonical_tree() -> LoopTree:
    """What the tile stage should make of add_mul: LoopSpec(2){LoopSpec(4){add, mul}} over
    [512, 1024] tiles, y per-tile, z written tile by tile into its full buffer."""
    A, B = sym("A"), sym("B")
    full = TensorType(dims=(Dim("A", 1024), Dim("B", 4096)), dtype="float16")
    tile = TensorType(dims=(Dim("A", 512), Dim("B", 1024)), dtype="float16")
    ranges = tile.dims
    steps = ((TileStep(dim="A", extent=512),), (TileStep(dim="B", extent=1024),))
    add = Pointwise(
        name="buf0", fn="add", operands=(Load(buffer="a", index=4096 * A + B), Load(buffer="b", index=4096 * A + B)),
        ranges=ranges, store=Store(buffer="buf0", index=1024 * A + B),
    )
    mul = Pointwise(
        name="buf1", fn="mul", operands=(Load(buffer="buf0", index=1024 * A + B), Load(buffer="c", index=4096 * A + B)),
        ranges=ranges, store=Store(buffer="buf1", index=4096 * A + B),
    )
    return LoopTree(
        name="add_mul",
        buffers=(*(TreeBuffer(name=n, type=full) for n in "abc"),
                 TreeBuffer(name="buf0", type=tile, scope="tile"), TreeBuffer(name="buf1", type=full)),
        inputs=("a", "b", "c"),
        outputs=(Output(name="z", buffer="buf1"),),
        body=(Loop(count=2, steps=steps[0], body=(Loop(count=4, steps=steps[1], body=(
            OpNode(op=add, tiling=steps), OpNode(op=mul, tiling=steps))),)),),
    )


def canonical_allocation() -> Allocation:
    """The seed's placement: a, b, c, z as HBM kernel arguments 0..3, y in LX at 0, each core
    holding its 1/32 of the [512, 1024] fp16 tile."""
    full = stick_layout((1024, 4096), 64).nbytes
    tile = stick_layout((512, 1024), 64).nbytes // MACHINE.cores
    args = [(n, Placement(memory="hbm", address=i * full, nbytes=full, arg_index=i))
            for i, n in enumerate(("a", "b", "c", "buf1"))]
    lx = Placement(memory="lx", address=0, nbytes=tile)
    return Allocation(buffers=FrozenMap([*args, ("buf0", lx)]), hbm_bytes=4 * full, lx_peak_bytes=tile)


def softmax_row_tree() -> LoopTree:
    """softmax(x + bias) over 8 rows, in a loop of 2 over rows: every intermediate is per-tile,
    y is written into its full buffer, and bias (no row dim) does not advance."""
    graph = softmax_graph(bias=True)
    out = {o.buffer for o in graph.outputs}
    step = ((TileStep(dim="R", extent=4),),)

    def shrink(dims: tuple[Dim, ...]) -> tuple[Dim, ...]:
        return tuple(Dim("R", 4) if d.name == "R" else d for d in dims)

    nodes = []
    for op in graph.ops:
        if isinstance(op, Reduction):
            op = Reduction(name=op.name, fn=op.fn, operands=op.operands, ranges=shrink(op.ranges),
                           reduction_ranges=op.reduction_ranges, store=op.store, hints=op.hints)
        else:
            op = Pointwise(name=op.name, fn=op.fn, operands=op.operands, ranges=shrink(op.ranges), store=op.store,
                           hints=op.hints)
        nodes.append(OpNode(op=op, tiling=step))
    buffers = []
    for b in graph.buffers:
        inside = b.name not in graph.inputs and b.name not in out
        t = TensorType(dims=shrink(b.type.dims), dtype=b.type.dtype) if inside else b.type
        buffers.append(TreeBuffer(name=b.name, type=t, scope="tile" if inside else "full"))
    return LoopTree(name=graph.name, buffers=tuple(buffers), inputs=graph.inputs, outputs=graph.outputs,
                    body=(Loop(count=2, steps=step[0], body=tuple(nodes)),))


def tree_program(tree: LoopTree, allocation: Allocation | None = None):
    split = divide_work(tree, MACHINE)
    alloc = allocation or allocate(tree, split, MACHINE)
    return split, alloc, emit_program(tree, split, alloc, MACHINE)


def all_text() -> str:
    """Everything the printers produce for the examples; the determinism test compares it
    across interpreter runs with different hash seeds."""
    parts = []
    for name, build in EXAMPLES.items():
        graph = build()
        comp = fspyre.compile(graph, machine=MACHINE, tiling="none")
        for stage, artifact in comp.stages.items():
            for detailed in (False, True):
                parts.append(f"--- {name}.{stage} detailed={detailed}\n{pretty(artifact, detailed=detailed)}")
        parts.append(to_dot(graph))
        parts.append(to_dot(comp.stages["loop_tree"]))
    for tree in (canonical_tree(), softmax_row_tree()):
        split, alloc, program = tree_program(tree)
        for artifact in (tree, split, alloc, program):
            parts += [pretty(artifact), pretty(artifact, detailed=True)]
        parts.append(to_dot(tree))
    return "\n".join(parts)


# -- golden text of every stage -------------------------------------------------------------
@pytest.mark.parametrize("name", list(EXAMPLES))
def test_stage_artifacts(name, golden):
    comp = fspyre.compile(EXAMPLES[name](), machine=MACHINE, tiling="none")
    assert list(comp.stages) == ["graph", "tiling_plan", "loop_tree", "resident_tree", "split_plan", "allocation",
                                 "program"]
    for stage, artifact in comp.stages.items():
        golden.check(f"{name}.{stage}", pretty(artifact))
        if name == "add_mul" or stage in ("graph", "loop_tree"):
            golden.check(f"{name}.{stage}.detailed", pretty(artifact, detailed=True))
    golden.check(f"{name}.graph.dot", to_dot(comp.graph))


def test_tiling_plan_with_groups(golden):
    """The plan the hints of add_mul describe (hand-built until the hints stage lands)."""
    plan = TilingPlan(
        order=("buf0", "buf1", "buf2"),
        groups=(Group(ops=("buf0", "buf1"), levels=(Level(count=2, dims=("A",)), Level(count=4, dims=("B",)))),
                Group(ops=("buf2",), levels=(Level(count=8, dims=("A", "B")),))),
        warnings=("hint #2: slices={C: 1} has count 1; the level is dropped",),
    )
    golden.check("plan.compact", pretty(plan))
    golden.check("plan.detailed", pretty(plan, detailed=True))


# -- hand-built loop trees ------------------------------------------------------------------
def test_canonical_tree_views(golden):
    tree = canonical_tree()
    golden.check("canonical.tree", pretty(tree))
    golden.check("canonical.tree.detailed", pretty(tree, detailed=True))
    golden.check("canonical.tree.dot", to_dot(tree))


def test_canonical_tree_program(golden):
    """The canonical program as the anchor's wrapper source: nested LoopSpec, per-tile
    iteration space, y in LX, advances from the stick layout. The interpreter proves the
    hand-built tree means what the reference means, so the golden text is of a right program."""
    tree = canonical_tree()
    split, alloc, program = tree_program(tree, canonical_allocation())
    golden.check("canonical.split_plan", pretty(split))
    golden.check("canonical.allocation", pretty(alloc))
    golden.check("canonical.program", pretty(program))
    golden.check("canonical.program.detailed", pretty(program, detailed=True))
    rng = np.random.default_rng(0)
    inputs = {n: rng.standard_normal((1024, 4096)).astype(np.float16) for n in "abc"}
    got, _ = run_program(program, inputs)
    np.testing.assert_array_equal(got["z"], fspyre.evaluate(add_mul_graph(), inputs)["z"])


def test_softmax_row_tree(golden):
    tree = softmax_row_tree()
    _, _, program = tree_program(tree)
    golden.check("softmax_rows.tree", pretty(tree))
    golden.check("softmax_rows.tree.detailed", pretty(tree, detailed=True))
    golden.check("softmax_rows.tree.dot", to_dot(tree))
    golden.check("softmax_rows.program", pretty(program))
    rng = np.random.default_rng(1)
    inputs = {"x": rng.standard_normal((8, 128)).astype(np.float16),
              "bias": rng.standard_normal(128).astype(np.float16)}
    got, _ = run_program(program, inputs)
    np.testing.assert_array_equal(got["y"], fspyre.evaluate(softmax_graph(bias=True), inputs)["y"])


def test_loop_header_shows_every_tiled_dim_and_invariant_levels():
    A, B = sym("A"), sym("B")
    t = TensorType(dims=(Dim("A", 4), Dim("B", 8)), dtype="float32")
    op = Pointwise(name="p", fn="add", operands=(Load(buffer="x", index=8 * A + B), Scalar(value=1.0)),
                   ranges=t.dims, store=Store(buffer="p", index=8 * A + B))
    inv = Pointwise(name="q", fn="neg", operands=(Load(buffer="w", index=B),), ranges=(Dim("B", 8),),
                    store=Store(buffer="q", index=B))
    both = (TileStep(dim="A", extent=4), TileStep(dim="B", extent=8))
    loop = Loop(count=3, steps=both, body=(OpNode(op=op, tiling=(both,)), OpNode(op=inv, tiling=((),))))
    assert pretty(loop).splitlines() == [
        "for A, B in 0..3:  (tile A=4, B=8)",
        "  p = add(x, 1.0)  [A=4, B=8]",
        "  q = neg(w)  [B=8]",
    ]
    assert "tiling=[L0: invariant]" in pretty(loop, detailed=True)


def test_graph_shows_every_hint_scope_and_which_ops_it_holds():
    g = fspyre.GraphBuilder("hinted")
    A, B = g.dim("A", 64), g.dim("B", 128)
    x = g.input("x", (A, B), "float32")
    with g.hint(slices={"A": 2}, work_div={"B": 2}):
        y = g.relu(x)
    g.output("y", g.add(y, 1.0))
    text = pretty(g.build())
    assert "hint #0: slices={A: 2} work_div={B: 2}" in text.splitlines()
    assert "buf0: ComputedBuffer  float32[A=64, B=128]  hints=[#0]" in text.splitlines()
    assert "buf1: ComputedBuffer  float32[A=64, B=128]" in text.splitlines()  # outside every scope
    assert "loads=[buf0[128*A + B], 1.0]" in text


def test_unknown_artifact_is_a_clear_error():
    with pytest.raises(FspyreError, match="no printer for int"):
        pretty(3)
    with pytest.raises(FspyreError, match="pass a Graph or a LoopTree"):
        to_dot(TilingPlan(order=()))


# -- pictures -------------------------------------------------------------------------------
def test_dot_ids_come_from_tree_paths():
    dot = to_dot(canonical_tree())
    for needle in ("subgraph cluster_0 {", "subgraph cluster_0_0 {", 'label="for A in 0..2  (tile A=512)"',
                   'label="for B in 0..4  (tile B=1024)"', 'label="output z = buf1\\nfloat16[A=1024, B=4096]"',
                   "n_0_0_0 [", "n_0_0_1 [", "in_0 -> n_0_0_0", "n_0_0_0 -> n_0_0_1", "n_0_0_1 -> out_0"):
        assert needle in dot
    tile_edge = next(line for line in dot.splitlines() if line.strip().startswith("n_0_0_0 -> n_0_0_1"))
    full_edge = next(line for line in dot.splitlines() if line.strip().startswith("n_0_0_1 -> out_0"))
    assert "style=dashed" in tile_edge and "style=dashed" not in full_edge
    assert "0x" not in dot  # no object addresses


@pytest.mark.needs_dot
@pytest.mark.parametrize("which", ["graph", "canonical", "softmax_rows"])
def test_dot_renders(which, tmp_path):
    artifact = {"graph": softmax_graph(), "canonical": canonical_tree(), "softmax_rows": softmax_row_tree()}[which]
    out = tmp_path / f"{which}.svg"
    assert render(to_dot(artifact), str(out)) is True
    svg = out.read_text()
    assert "<svg" in svg
    if which != "graph":
        assert "cluster_0" in svg and "for " in svg and " in 0..2" in svg


@pytest.mark.needs_dot
def test_render_reports_bad_dot_source(tmp_path):
    with pytest.raises(FspyreError, match="dot -Tsvg failed"):
        render("digraph {", str(tmp_path / "bad.svg"))


def test_render_without_dot_returns_false(tmp_path, monkeypatch):
    monkeypatch.setattr("fspyre.pretty.dot.shutil.which", lambda _: None)
    assert render(to_dot(add_mul_graph()), str(tmp_path / "x.svg")) is False
    assert not (tmp_path / "x.svg").exists()


# -- determinism ----------------------------------------------------------------------------
def test_printing_is_independent_of_hash_seed():
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('pretty_case', {str(Path(__file__).resolve())!r})\n"
        "mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)\n"
        "sys.stdout.write(mod.all_text())\n"
    )
    runs = []
    for seed in ("0", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        runs.append(done.stdout)
    assert runs[0] == runs[1]
    assert runs[0] == all_text()


def test_tree_picture_shows_cores_memories_and_a_legend():
    comp = fspyre.compile(add_mul_graph(), machine=MACHINE, tiling="hints")
    tree, split, alloc = (comp.stages[s] for s in ("resident_tree", "split_plan", "allocation"))
    dot = to_dot(tree, split=split, allocation=alloc)
    assert "cluster_legend" in dot and "HBM tensor" in dot and "LX tensor" in dot
    for name, s in split.ops.items():
        assert f"{s.cores} cores" in dot, name
    lx = [b for b, p in alloc.buffers.items() if p.memory == "lx"]
    hbm = [b for b, p in alloc.buffers.items() if p.memory == "hbm"]
    edges = [line for line in dot.splitlines() if "->" in line]
    for b in lx:
        assert all('color="#d9730d"' in e for e in edges if f'label="{b}\\n' in e), b
    for b in hbm:
        assert all('color="#2f6db5"' in e for e in edges if f'label="{b}\\n' in e), b


def test_large_trees_fold_their_runs_of_ops():
    """Past ``fold`` ops, each run of three or more ops between loops is one node naming them all;
    edges join nodes, never a node to itself, and every op still appears."""
    g = fspyre.GraphBuilder("chain")
    A, B = g.dim("A", 64), g.dim("B", 128)
    x = g.input("x", (A, B), "float16")
    with g.hint(slices={"A": 2}):
        y = x
        for _ in range(6):
            y = g.exp(g.neg(y))
    g.output("y", y)
    comp = fspyre.compile(g.build(), machine=MACHINE, tiling="hints")
    tree = comp.stages["loop_tree"]
    plain, folded = to_dot(tree), to_dot(tree, fold=4)
    assert "(12 ops)" in folded and "(12 ops)" not in plain
    assert "graph inputs" in folded and "ops run back to back, folded" in folded
    edges = [line.split("[")[0].split("->") for line in folded.splitlines() if "->" in line]
    assert all(a.strip() != b.strip() for a, b in edges)
    assert folded.count(" = ") < plain.count(" = ")
    assert all(fn in folded for fn in ("exp", "neg"))
