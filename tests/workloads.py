"""Graphs for the work-division and allocation tests, and one way to compile them.

``add_mul`` and ``softmax`` are the canonical examples (the coarse-tiling seed's:
add_mul [1024, 4096] fp16 tiled A:2 / B:4; softmax tiled over rows). ``compile`` passes the
graph's hint scopes to ``divide_work`` (the LoopTree does not carry them) and takes the
allocation options by keyword.

Tests in any directory import it as ``workloads``: pytest puts ``tests/`` (the directory of the
root conftest.py) on ``sys.path``.
"""

from __future__ import annotations

import fspyre
from fspyre.ir.graph import Graph
from fspyre.machine.spyre import Machine
from fspyre.stages.allocation import AllocationOptions
from fspyre.stages.split_plan import SplitOptions


def add_mul(rows: int = 1024, cols: int = 4096, *, tiled: bool = True, dtype: str = "float16") -> Graph:
    g = fspyre.GraphBuilder("add_mul")
    g.dim("A", rows)
    g.dim("B", cols)
    a, b, c = (g.input(n, ["A", "B"], dtype) for n in "abc")
    if tiled:
        with g.hint(slices={"A": 2}), g.hint(slices={"B": 4}):
            z = g.mul(g.add(a, b), c)
    else:
        z = g.mul(g.add(a, b), c)
    g.output("z", z)
    return g.build()


def softmax(rows: int = 512, cols: int = 1024, *, row_tiles: int = 4, dtype: str = "float16") -> Graph:
    """amax, sub, exp, sum, div over the last dim, the reductions keepdim (as torch writes
    softmax): their [M, 1] results hold one value per stick, so M is not a stick dim."""
    g = fspyre.GraphBuilder("softmax")
    g.dim("M", rows)
    g.dim("N", cols)
    x = g.input("x", ["M", "N"], dtype)
    with g.hint(slices={"M": row_tiles}):
        m = g.amax(x, ["N"], keepdim=True)
        e = g.exp(g.sub(x, m))
        s = g.sum(e, ["N"], keepdim=True)
        y = g.div(e, s)
    g.output("y", y)
    return g.build()


def pointwise(shape: tuple[int, ...], dtype: str = "float16", names: str = "ABCD") -> Graph:
    g = fspyre.GraphBuilder("pointwise")
    dims = [g.dim(n, s) for n, s in zip(names, shape)]
    a = g.input("a", dims, dtype)
    b = g.input("b", dims, dtype)
    g.output("y", g.add(a, b))
    return g.build()


def compile(graph: Graph, machine: Machine | None = None, tiling: str = "hints", *, residency: bool = False,
            **allocation) -> fspyre.Compilation:
    """Without ``keep_resident`` unless asked: these tests pin what work division and LX
    planning do with the tile stage's tree (tests/tiling/test_residency.py covers the copies)."""
    return fspyre.compile(
        graph, machine or fspyre.machine.spyre(), tiling=tiling, residency=residency,
        split_options=SplitOptions(), allocation_options=AllocationOptions(**allocation),
    )
