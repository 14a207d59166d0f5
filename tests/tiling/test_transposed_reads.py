"""Transposed reads inside nested loops (issue: a reader must walk its producer's tiles in
lockstep, advance for advance, not only tile size for tile size). Checked against numpy."""

from __future__ import annotations

import numpy as np
import pytest

import fspyre
from fspyre.errors import TilingError


def nest(outer: str, inner: str, rows: int, reader_inside: bool = True) -> fspyre.Graph:
    g = fspyre.GraphBuilder("transposed")
    g.dim("A", rows)
    g.dim("B", 128)
    a, b = g.input("a", ["A", "B"], "float32"), g.input("b", ["A", "B"], "float32")
    with g.hint(slices={outer: 2}):
        with g.hint(slices={inner: 2}):
            y = g.add(a, b)
            z = g.mul(g.permute(y, ["B", "A"]), 2.0)  # written transposed: [B, A] in memory
            w = g.add(g.permute(a, ["B", "A"]), z)  # a read transposed, z read as written
    g.output("z", z)
    g.output("w", w)
    return g.build()


@pytest.mark.parametrize("outer,inner", [("A", "B"), ("B", "A")])
@pytest.mark.parametrize("rows", [128, 256])
def test_permuted_reads_and_writes_in_a_nest_equal_numpy(outer, inner, rows):
    graph = nest(outer, inner, rows)
    rng = np.random.default_rng(rows)
    ins = {n: rng.standard_normal((rows, 128)).astype(np.float32) for n in ("a", "b")}
    comp = fspyre.compile(graph, tiling="hints")
    got = fspyre.run(comp, ins)
    z = 2 * (ins["a"] + ins["b"]).T
    assert np.array_equal(got["z"], z)
    assert np.array_equal(got["w"], ins["a"].T + z)


def test_a_read_walking_the_producer_along_another_level_is_refused_with_both_advances():
    # rename swaps which iteration variable walks y's first dim: the reader moves it at the
    # inner level, the producer at the outer one, so the per-tile buffer cannot serve it
    g = fspyre.GraphBuilder("swapped")
    g.dim("A", 128)
    g.dim("B", 128)
    a, b = g.input("a", ["A", "B"], "float32"), g.input("b", ["A", "B"], "float32")
    with g.hint(slices={"A": 2}), g.hint(slices={"B": 2}):
        y = g.add(a, b)
        z = g.mul(g.rename(y, {"A": "B", "B": "A"}), 2.0)
    g.output("z", z)
    with pytest.raises(TilingError, match=r"moving \[L0: -, L1: 64\].*moving \[L0: 64, L1: -\]"):
        fspyre.compile(g.build(), tiling="hints")
