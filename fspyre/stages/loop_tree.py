"""Stage ``tile``: graph + TilingPlan -> LoopTree."""

from __future__ import annotations

from fspyre.ir.graph import Graph
from fspyre.ir.looptree import LoopTree, OpNode, TreeBuffer
from fspyre.ir.plans import TilingPlan


def tile(graph: Graph, plan: TilingPlan) -> LoopTree:
    ops = graph.op_table()
    if plan.groups:
        raise NotImplementedError("tiled groups land with the coarse-tiling stage")
    return LoopTree(
        name=graph.name,
        buffers=tuple(TreeBuffer(name=b.name, type=b.type) for b in graph.buffers),
        inputs=graph.inputs,
        outputs=graph.outputs,
        body=tuple(OpNode(op=ops[name]) for name in plan.order),
    )
