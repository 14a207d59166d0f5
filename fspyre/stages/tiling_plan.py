"""Stage ``plan_tiling``: graph (with hint scopes) -> TilingPlan (op order and loop groups)."""

from __future__ import annotations

from dataclasses import dataclass

from fspyre.errors import TilingError
from fspyre.ir.graph import Graph
from fspyre.ir.plans import TilingPlan


@dataclass(frozen=True, slots=True, kw_only=True)
class TilingOptions:
    mode: str = "hints"  # "none": no loops; "hints": groups from the graph's hint scopes

    def __post_init__(self) -> None:
        if self.mode not in ("none", "hints"):
            raise TilingError(f"tiling={self.mode!r}: use 'none' or 'hints'")


def plan_tiling(graph: Graph, options: TilingOptions = TilingOptions()) -> TilingPlan:
    order = tuple(op.name for op in graph.ops)
    if options.mode == "none":
        return TilingPlan(order=order)
    raise NotImplementedError("tiling='hints' lands with the coarse-tiling stage")
