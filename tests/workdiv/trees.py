"""Graphs and hand-built tiled LoopTrees for the work-division and allocation tests.

``tile_all`` puts every op of a graph in one loop nest (levels outermost first, each tiling
one dim by a count), the way the coarse-tiling stage does for one hint group: ops get
per-tile ranges and per-level TileSteps; intermediates no graph output needs become per-tile
buffers (scope "tile", the tile's shape, indexed row-major over the tile); graph inputs and
outputs stay full-size and advance. ``compile_tree`` runs the remaining stages on it.
"""

from __future__ import annotations

from collections.abc import Sequence

import sympy

import fspyre
from fspyre.ir.graph import Dim, Graph, Load, Pointwise, Reduction, Store, TensorType
from fspyre.ir.looptree import Loop, LoopTree, OpNode, TileStep, TreeBuffer
from fspyre.machine.spyre import Machine
from fspyre.stages.allocation import AllocationOptions, allocate
from fspyre.stages.loop_tree import tile
from fspyre.stages.program import emit_program
from fspyre.stages.split_plan import SplitOptions, divide_work
from fspyre.stages.tiling_plan import TilingOptions, plan_tiling


def add_mul(rows: int = 1024, cols: int = 4096, dtype: str = "float16") -> Graph:
    g = fspyre.GraphBuilder("add_mul")
    g.dim("A", rows)
    g.dim("B", cols)
    a, b, c = (g.input(n, ["A", "B"], dtype) for n in "abc")
    y = g.add(a, b)
    g.output("z", g.mul(y, c))
    return g.build()


def softmax(rows: int = 512, cols: int = 1024, dtype: str = "float16") -> Graph:
    g = fspyre.GraphBuilder("softmax")
    g.dim("M", rows)
    g.dim("N", cols)
    x = g.input("x", ["M", "N"], dtype)
    m = g.amax(x, ["N"], keepdim=True)
    e = g.exp(g.sub(x, m))
    s = g.sum(e, ["N"], keepdim=True)
    g.output("y", g.div(e, s))
    return g.build()


def untiled_tree(graph: Graph) -> LoopTree:
    return tile(graph, plan_tiling(graph, TilingOptions(mode="none")))


def _retile_index(index: sympy.Expr, full: TensorType, tiled: TensorType) -> sympy.Expr:
    """The same element in the tile's row-major order: each dim's full stride -> tile stride."""
    by_stride = {s: t for s, t, d in zip(full.strides(), tiled.strides(), full.dims) if d.size > 1}
    out = sympy.S.Zero
    for term in sympy.Add.make_args(sympy.expand(index)):
        coef, rest = term.as_coeff_Mul()
        if rest is sympy.S.One:
            assert coef == 0, f"constant offset {coef} in a tile-buffer index"
            continue
        assert int(coef) in by_stride, f"index {index} does not step one dim of {full}"
        out += by_stride[int(coef)] * rest
    return out


def tile_all(graph: Graph, levels: Sequence[tuple[str, int]]) -> LoopTree:
    counts = {d: 1 for d, _ in levels}
    for d, k in levels:
        counts[d] *= k
    outputs = {o.buffer for o in graph.outputs}

    def tiled_dims(dims):
        return tuple(Dim(d.name, d.size // counts[d.name]) if d.name in counts and d.size > 1 else d for d in dims)

    buffers = graph.buffer_table()
    tile_types = {}
    for b in graph.buffers:
        if b.name not in graph.inputs and b.name not in outputs:
            tile_types[b.name] = TensorType(dims=tiled_dims(b.type.dims), dtype=b.type.dtype)

    def fix(buffer: str, index: sympy.Expr) -> sympy.Expr:
        if buffer in tile_types:
            return _retile_index(index, buffers[buffer].type, tile_types[buffer])
        return index

    nodes = []
    for op in graph.ops:
        iterated = {d.name: d.size for d in tuple(op.ranges) + tuple(op.reduction_ranges) if d.size > 1}
        steps, inner = [], dict(counts)
        for d, k in levels:
            inner[d] //= k
            steps.append(tuple(TileStep(dim=d, extent=iterated[d] // counts[d] * inner[d])
                               for _ in [0] if d in iterated))
        operands = tuple(Load(buffer=o.buffer, index=fix(o.buffer, o.index)) if isinstance(o, Load) else o
                         for o in op.operands)
        store = Store(buffer=op.store.buffer, index=fix(op.store.buffer, op.store.index))
        if isinstance(op, Reduction):
            new = Reduction(name=op.name, fn=op.fn, operands=operands, ranges=tiled_dims(op.ranges),
                            reduction_ranges=tiled_dims(op.reduction_ranges), store=store,
                            correction=op.correction, hints=op.hints)
        else:
            assert isinstance(op, Pointwise)
            new = Pointwise(name=op.name, fn=op.fn, operands=operands, ranges=tiled_dims(op.ranges), store=store,
                            hints=op.hints)
        nodes.append(OpNode(op=new, tiling=tuple(steps)))
    body: tuple = tuple(nodes)
    for _, k in reversed(levels):
        body = (Loop(count=k, body=body),)
    tree_buffers = tuple(
        TreeBuffer(name=b.name, type=tile_types[b.name], scope="tile") if b.name in tile_types
        else TreeBuffer(name=b.name, type=b.type) for b in graph.buffers)
    return LoopTree(name=graph.name, buffers=tree_buffers, inputs=graph.inputs, outputs=graph.outputs, body=body)


def compile_tree(tree: LoopTree, machine: Machine, split_options: SplitOptions = SplitOptions(),
                 allocation_options: AllocationOptions = AllocationOptions()):
    split = divide_work(tree, machine, split_options)
    alloc = allocate(tree, split, machine, allocation_options)
    return split, alloc, emit_program(tree, split, alloc, machine)
