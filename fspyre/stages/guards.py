"""Kernel boundaries, the last job of ``keep_resident``: ops that run just before or just
after a loop for it become ops of its first or last iteration (``OpNode.runs``; docs/tiling.md,
"Kernel boundaries")."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from fspyre.ir.looptree import Loop, LoopTree, Node, OpNode, carried_buffers, walk


def guard_boundaries(tree: LoopTree) -> LoopTree:
    """Ops that run just before or just after a loop *for* it run inside it as ops of its
    first or last iteration (``OpNode.runs``): a copy of a loop-invariant operand, an
    accumulator's fill (what the loop reads), a finish and what reads it (what reads the
    loop's results). They run at the same moment, on the same data, but in the loop's kernel,
    whose memory time then includes their bytes instead of them being kernels of their own
    (docs/tiling.md, "Kernel boundaries"). An op tied to no loop stays a kernel of its own:
    joining it would only overlap, in the estimate, work the loop does not wait for or feed.
    An op already guarded in the enclosing loop stays where it is."""
    body = _guarded_body(tree.body, 0, frozenset(b.name for b in tree.buffers if b.scope == "full"))
    return tree if body == tree.body else replace(tree, body=body)


def _guarded_body(body: Sequence[Node], depth: int, full: frozenset[str]) -> tuple[Node, ...]:
    out: list[Node] = []
    pending: list[OpNode] = []

    def joined(loop: Loop, firsts: Sequence[OpNode], lasts: Sequence[OpNode]) -> Loop:
        inner = (tuple(replace(n, tiling=n.tiling + ((),), runs="first") for n in firsts) + loop.body
                 + tuple(replace(n, tiling=n.tiling + ((),), runs="last") for n in lasts))
        return replace(loop, body=inner, carried=carried_buffers(inner, depth, full))

    def close(pending: list[OpNode]) -> list[OpNode]:
        """The ops after the loop just placed that belong to it join its last iteration; the
        rest are returned."""
        if not pending or not out or not isinstance(out[-1], Loop):
            return pending
        lasts, after = _epilogue(out[-1], pending)
        if lasts:
            out[-1] = joined(out[-1], (), lasts)
        return after

    for node in body:
        if isinstance(node, OpNode):
            if node.guarded:  # an op of one iteration of the enclosing loop: it stays where it is
                out.extend(close(pending))
                pending = []
                out.append(node)
            else:
                pending.append(node)
            continue
        inner = _guarded_body(node.body, depth + 1, full)
        loop = node if inner == node.body else replace(node, body=inner)
        # between two loops: what belongs to the one before joins its last iteration, what
        # feeds the one after its first
        before, firsts = _prologue(close(pending), loop)
        out.extend(before)
        out.append(joined(loop, firsts, ()) if firsts else loop)
        pending = []
    out.extend(close(pending))
    return tuple(out)


def _prologue(pending: Sequence[OpNode], loop: Loop) -> tuple[list[OpNode], list[OpNode]]:
    """The ops before ``loop`` that stay before it, and those that run in its first
    iteration: an op whose result the loop reads (or an op joining it reads), unless an op
    staying before the loop, after it in program order, reads or writes that result or
    writes what it reads (a tail writes the buffer its main part wrote; moving the op past
    such an op would change what either sees). Program order is kept within each part."""
    needed = {ld.buffer for node, _ in walk(loop.body) if isinstance(node, OpNode) for ld in node.op.loads}
    stay_reads: set[str] = set()  # of the ops that stay before the loop, after the one at hand
    stay_writes: set[str] = set()
    joins: set[int] = set()
    for k in range(len(pending) - 1, -1, -1):
        op = pending[k].op
        reads = {ld.buffer for ld in op.loads}
        out = op.store.buffer
        if out in needed and out not in stay_reads | stay_writes and not reads & stay_writes:
            joins.add(k)
            needed.update(reads)
        else:
            stay_reads.update(reads)
            stay_writes.add(out)
    return ([n for k, n in enumerate(pending) if k not in joins], [n for k, n in enumerate(pending) if k in joins])


def _epilogue(loop: Loop, pending: Sequence[OpNode]) -> tuple[list[OpNode], list[OpNode]]:
    """The ops after ``loop`` that run in its last iteration -- the loop's peeled tail (the
    remainder its whole tiles leave: the loop's own work), an op that reads what the loop (or
    an op joining it) wrote -- unless an op staying after the loop, before it in program
    order, writes what it reads or reads or writes what it writes (moving it before such an op
    would change what either sees: a tail writes the buffer its main part wrote); and those
    that stay after it, each in program order."""
    nodes = [node for node, _ in walk(loop.body) if isinstance(node, OpNode)]
    ours = {node.op.store.buffer for node in nodes}
    origins = {node.name for node in nodes} | {node.origin for node in nodes if node.origin}
    stepped = set(loop.dims)
    stay_reads: set[str] = set()  # of the ops that stay after the loop, before the one at hand
    stay_writes: set[str] = set()
    lasts: list[OpNode] = []
    after: list[OpNode] = []
    for node in pending:
        reads = {ld.buffer for ld in node.op.loads}
        out = node.op.store.buffer
        # a tail of this loop: a copy of one of its ops on the remainder of a dim it steps
        tail = node.origin in origins and any(p.dim in stepped for p in node.peeled)
        if (tail or reads & ours) and not reads & stay_writes and out not in stay_reads | stay_writes:
            lasts.append(node)
            ours.add(out)
        else:
            after.append(node)
            stay_reads.update(reads)
            stay_writes.add(out)
    return lasts, after
