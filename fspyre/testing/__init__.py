"""Hypothesis strategies for property-testing fspyre, and other compilers through it.

    from hypothesis import given
    from fspyre.testing import graphs, inputs_for, machines

    @given(graphs(max_ops=6), machines())
    def test_my_stage(graph, machine): ...

- ``graphs`` / ``programs`` (``fspyre.testing.graphs``): random graphs built through
  ``GraphBuilder``; what they contain and how their values are kept meaningful is in that
  module's docstring. ``inputs_for(graph, seed)`` gives matching inputs.
- ``legal_hint_nests`` / ``any_hint_nests`` (``fspyre.testing.hints``): tiling hints laid over
  a drawn graph.
- ``machines`` / ``core_counts`` / ``lx_capacities`` (``fspyre.testing.machines``): machine
  configurations.

``fspyre.testing.graphs`` as an attribute is the strategy; its module is imported as usual
with ``from fspyre.testing.graphs import ...``.
"""

from hypothesis import settings

from fspyre.testing.graphs import (
    DIM_NAMES,
    KINDS,
    STICK_SIZES,
    GraphProgram,
    dim_sizes,
    dims,
    graphs,
    has_reduction,
    inputs_for,
    programs,
)
from fspyre.testing.hints import HintNest, any_hint_nests, legal_hint_nests
from fspyre.testing.machines import core_counts, lx_capacities, machines


def examples(n: int) -> int:
    """``n`` examples scaled by the loaded hypothesis profile (its ``max_examples`` over
    hypothesis's default of 100), so a test sizes its own count and still grows under a
    ``deep`` profile: ``@settings(max_examples=examples(40))``."""
    return max(1, round(n * settings().max_examples / 100))


__all__ = [
    "DIM_NAMES", "KINDS", "STICK_SIZES", "GraphProgram", "HintNest", "any_hint_nests", "core_counts",
    "dim_sizes", "dims", "examples", "graphs", "has_reduction", "inputs_for", "legal_hint_nests",
    "lx_capacities", "machines", "programs",
]
