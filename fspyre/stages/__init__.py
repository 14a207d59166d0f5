"""The stages, one pure function each, with the frozen options record it takes.

    from fspyre.stages import search_tiling, SearchOptions, tile, place_copies, emit_program

``fspyre.pipeline.compile`` runs them in this order (README's stage table; every option:
docs/options.md); each is also callable alone on the previous stage's artifact:

- ``plan_tiling(graph, TilingOptions)`` or ``search_tiling(graph, machine, SearchOptions)`` -> TilingPlan / TilingSearch
- ``tile(graph, plan, OnlineOptions)`` -> LoopTree
- ``keep_resident(tree, machine, ResidencyOptions)`` -> LoopTree; ``place_copies`` -> the tree with its
  split plan, allocation and program
- ``divide_work(tree, machine, SplitOptions)`` -> SplitPlan
- ``allocate(tree, split, machine, AllocationOptions)`` -> Allocation
- ``emit_program(tree, split, allocation, machine)`` -> Program
- the verifiers ``verify_loop_tree``, ``verify_split_plan``, ``verify_allocation``, ``verify_program``
"""

from fspyre.stages.allocation import AllocationOptions, allocate, verify_allocation
from fspyre.stages.loop_tree import tile, verify_loop_tree
from fspyre.stages.online_softmax import OnlineOptions
from fspyre.stages.program import emit_program, verify_program
from fspyre.stages.residency import ResidencyOptions, keep_resident, place_copies
from fspyre.stages.split_plan import SplitOptions, divide_work, verify_split_plan
from fspyre.stages.tiling_plan import TilingOptions, plan_groups, plan_tiling
from fspyre.stages.tiling_search import SearchOptions, search_tiling

# Every options record, in pipeline order (docs/options.md is generated from these).
OPTIONS = (TilingOptions, SearchOptions, OnlineOptions, ResidencyOptions, SplitOptions, AllocationOptions)

__all__ = [
    "OPTIONS", "AllocationOptions", "OnlineOptions", "ResidencyOptions", "SearchOptions", "SplitOptions",
    "TilingOptions", "allocate", "divide_work", "emit_program", "keep_resident", "place_copies", "plan_groups",
    "plan_tiling", "search_tiling", "tile", "verify_allocation", "verify_loop_tree", "verify_program",
    "verify_split_plan",
]
