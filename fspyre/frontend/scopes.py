"""Hint scopes around code the user did not write: a ``spyre_hint`` around a whole
transformers layer covers ops that no S loop can hold (a rotary embedding read back through
the reshape that merges its two halves, a mask built from a position ``arange`` in tiles of
less than a stick). The user cannot move those ops out of the scope: they are inside the
layer's own ``forward``. So the front end moves them out itself, each with a warning naming
the torch op, its source line and the tiling stage's reason, and tiles the rest.

``fit_hint_scopes`` asks the tiling stages themselves (``plan_tiling`` + ``tile`` with the
hints as written) which op they refuse, so the rule of what a loop can hold keeps one home.
The refused op leaves its slicing scopes; the ops of a scope after it go on in a fresh copy
of the scope (a second loop), since a loop holds contiguous ops only. Repeats until the
tiling stages accept the graph; each round moves one op, so it ends.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

from fspyre.errors import FspyreError, TilingError
from fspyre.ir.graph import Graph
from fspyre.stages.loop_tree import tile
from fspyre.stages.tiling_plan import TilingOptions, plan_tiling

# TilingError's messages name the op they refuse first ("op buf8 reads ...", "op buf3 writes
# ..."); it carries no field for it.
_OP = re.compile(r"\bop (\w+)")


def fit_hint_scopes(graph: Graph, origin: Mapping[str, str]) -> tuple[Graph, tuple[str, ...]]:
    """``graph`` with every op the tiling stages refuse to loop over moved out of its slicing
    hint scopes, and one warning per op moved (``origin``: op name -> the torch op it lowers,
    for the message). A hint that would keep no op at all cannot be honoured (a count that
    cuts sticks, say): then, and when a refusal is not a TilingError naming an op in a scope,
    ``graph`` is returned as it was, and compiling it with its hints raises the refusal, as
    it did before (capture itself never raises it: ``tiling="none"`` ignores hints)."""
    given = graph
    warnings: list[str] = []
    scoped_at_start = {h for op in graph.ops for h in op.hints}
    emptied: set[int] = set()  # the user's scopes an op has left
    original = {h.id: h.id for h in graph.hints}  # a scope's copies -> the user's scope
    for _ in range(len(graph.ops) + 1):
        if not any(h.slices for h in graph.hints):
            break
        try:
            tile(graph, plan_tiling(graph, TilingOptions(mode="hints")))
            break
        except FspyreError as e:
            if not isinstance(e, TilingError):  # not about one op (a hint the plan refuses): the compile's to raise
                return given, ()
            scoped = {op.name for op in graph.ops if op.hints}
            culprit = next((m for m in _OP.findall(str(e)) if m in scoped), None)
            if culprit is None:
                return given, ()
            op = graph.op_table()[culprit]
            slicing = [h for h in graph.hints if h.id in op.hints and h.slices]
            emptied.update(original[h.id] for h in slicing)
            reason = str(e).split(". ")[0]
            warnings.append(
                f"spyre_hint slices={' and '.join(str(dict(h.slices)) for h in slicing)}: "
                f"{origin.get(culprit, f'op {culprit}')} cannot run in the hint's loop ({reason}); it runs outside "
                f"it, and the ops after it in a loop of their own"
            )
            graph, copies = _without(graph, culprit)
            original.update((new, original[old]) for old, new in copies.items())
    kept = {original[h] for op in graph.ops for h in op.hints}
    if any(scope in scoped_at_start and scope not in kept for scope in emptied):
        return given, ()
    return graph, tuple(warnings)


def _without(graph: Graph, culprit: str) -> tuple[Graph, dict[int, int]]:
    """``culprit`` out of its slicing scopes; a scope that has ops both before and after it
    is split, the ops after it going to a copy with a fresh id (ids keep growing, so nested
    copies stay outer-before-inner). Returns the graph and {scope id: its copy's id}."""
    scopes = {h.id: h for h in graph.hints}
    at = next(i for i, op in enumerate(graph.ops) if op.name == culprit)
    dropped = {h for h in graph.ops[at].hints if scopes[h].slices}
    before = {h for op in graph.ops[:at] for h in op.hints}
    after = {h for op in graph.ops[at + 1:] for h in op.hints}
    fresh: dict[int, int] = {}
    for h in sorted(dropped & before & after):
        fresh[h] = max(scopes) + 1 + len(fresh)
    ops = []
    for i, op in enumerate(graph.ops):
        if i == at:
            op = dataclasses.replace(op, hints=tuple(h for h in op.hints if h not in dropped))
        elif i > at and any(h in fresh for h in op.hints):
            op = dataclasses.replace(op, hints=tuple(fresh.get(h, h) for h in op.hints))
        ops.append(op)
    copies = tuple(dataclasses.replace(scopes[h], id=n) for h, n in fresh.items())
    return dataclasses.replace(graph, ops=tuple(ops), hints=graph.hints + copies), fresh
