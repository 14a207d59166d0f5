"""Hypothesis strategies for property-testing fspyre, and other compilers through it.

    from hypothesis import given
    from fspyre.testing import graphs, inputs_for

    @given(graphs(max_ops=6))
    def test_my_stage(graph): ...

``graphs`` / ``programs`` draw random graphs built through ``GraphBuilder`` (see
``fspyre.testing.graphs`` for what they contain and how values are kept meaningful).
"""

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

__all__ = [
    "DIM_NAMES", "KINDS", "STICK_SIZES", "GraphProgram", "dim_sizes", "dims", "graphs", "has_reduction",
    "inputs_for", "programs",
]
