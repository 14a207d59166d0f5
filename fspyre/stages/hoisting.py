"""Hoisting, the first job of ``keep_resident``: an op that no level of its innermost loop
moves, and that reads nothing the loop writes, runs once before that loop, level by level
outwards (docs/tiling.md, "LX residency")."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from fspyre.ir.looptree import Loop, LoopTree, Node, OpNode, walk


def hoist_invariants(tree: LoopTree) -> LoopTree:
    """Ops a loop does not move (no tile step at its level) and that read nothing the loop
    writes compute the same values every iteration: they run once, before the loop."""
    body = _hoist_body(tree.body)
    return tree if body == tree.body else replace(tree, body=body)


def _hoist_body(body: Sequence[Node]) -> tuple[Node, ...]:
    out: list[Node] = []
    for node in body:
        if not isinstance(node, Loop):
            out.append(node)
            continue
        inner = _hoist_body(node.body)
        writers: dict[str, int] = {}
        for n, _ in walk(inner):
            if isinstance(n, OpNode):
                writers[n.op.store.buffer] = writers.get(n.op.store.buffer, 0) + 1
        moved: list[Node] = []
        kept: list[Node] = []
        for child in inner:
            # the only writer of its result (an accumulator's fill must run every iteration),
            # reading nothing the loop writes
            if (isinstance(child, OpNode) and not child.tiling[-1] and writers[child.op.store.buffer] == 1
                    and not any(ld.buffer in writers for ld in child.op.loads)):
                moved.append(replace(child, tiling=child.tiling[:-1], runs="every"))
                del writers[child.op.store.buffer]
            else:
                kept.append(child)
        out.extend(moved)
        if kept:
            out.append(replace(node, body=tuple(kept)) if tuple(kept) != node.body else node)
    return tuple(out)
