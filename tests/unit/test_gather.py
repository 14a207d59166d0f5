"""The gather reduction (embedding, index_select, torch.gather): the reference evaluator and
the machine model against a numpy reference written from the definition (``np.take`` /
``np.take_along_axis``), over core counts and tilings of the other dims; an index that names
no position is an ExecutionError in both; what the builder and the tiling stage refuse."""

from __future__ import annotations

import numpy as np
import pytest

import fspyre
from fspyre.errors import ExecutionError, GraphError, TilingError
from fspyre.ir.serialize import dumps, loads
from fspyre.machine.spyre import spyre

V, D, S = 40, 64, 12


def embedding(dtype: str = "float32", slices: dict[str, int] | None = None) -> fspyre.Graph:
    """``table[ids] * 2``, the ids a [2, S] batch; ``slices`` hints the B or D dim."""
    g = fspyre.GraphBuilder("embedding")
    v, d, b, s = g.dim("V", V), g.dim("D", D), g.dim("B", 2), g.dim("S", S)
    table = g.input("table", (v, d), dtype)
    ids = g.input("ids", (b, s), "int32")
    pos = g.input("pos", (v,), "int32")
    if slices:
        with g.hint(slices=slices):
            out = g.mul(g.gather(table, "V", ids, pos), 2.0)
    else:
        out = g.mul(g.gather(table, "V", ids, pos), 2.0)
    g.output("out", out)
    return g.build()


def inputs(dtype=np.float32, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"table": rng.standard_normal((V, D)).astype(dtype), "ids": rng.integers(0, V, (2, S)).astype(np.int32),
            "pos": np.arange(V, dtype=np.int32)}


def test_reference_equals_numpy_take() -> None:
    ins = inputs()
    got = fspyre.evaluate(embedding(), ins)["out"]
    np.testing.assert_array_equal(got, np.take(ins["table"], ins["ids"], axis=0) * np.float32(2))


@pytest.mark.parametrize("cores", [1, 4, 32])
@pytest.mark.parametrize("slices", [None, {"B": 2}, {"D": 2}])
def test_machine_equals_reference_and_numpy(cores: int, slices) -> None:
    graph, ins = embedding(slices=slices), inputs()
    comp = fspyre.compile(graph, machine=spyre(cores=cores), tiling="hints")
    got = fspyre.run(comp, ins)["out"]
    np.testing.assert_array_equal(got, np.take(ins["table"], ins["ids"], axis=0) * np.float32(2))
    assert fspyre.check(graph, ins, machine=spyre(cores=cores)).equal


def test_selects_without_arithmetic_on_other_rows() -> None:
    """A row holding inf or NaN does not leak into rows that do not select it (a one-hot
    product would give 0 * inf = NaN everywhere); a selected inf stays inf."""
    ins = inputs()
    ins["table"][5] = np.inf
    ins["table"][6] = np.nan
    ins["ids"][:] = 7
    ins["ids"][0, 0] = 5
    comp = fspyre.compile(embedding(), machine=spyre(cores=4))
    got = fspyre.run(comp, ins)["out"]
    assert np.isinf(got[0, 0]).all() and np.isfinite(got[0, 1:]).all() and np.isfinite(got[1]).all()


def test_torch_gather_shares_batch_dims_by_name() -> None:
    """``out[a, j] = x[a, index[a, j]]``: the dim A of x and index is one batch dim."""
    g = fspyre.GraphBuilder("gather")
    a, k, j = g.dim("A", 3), g.dim("K", 8), g.dim("J", 5)
    x = g.input("x", (a, k), "float32")
    index = g.input("index", (a, j), "int32")
    g.output("out", g.gather(x, "K", index, g.input("pos", (k,), "int32")))
    graph = g.build()
    rng = np.random.default_rng(1)
    ins = {"x": rng.standard_normal((3, 8)).astype(np.float32), "index": rng.integers(0, 8, (3, 5)).astype(np.int32),
           "pos": np.arange(8, dtype=np.int32)}
    want = np.take_along_axis(ins["x"], ins["index"], axis=1)
    np.testing.assert_array_equal(fspyre.evaluate(graph, ins)["out"], want)
    np.testing.assert_array_equal(fspyre.run(fspyre.compile(graph, machine=spyre(cores=3)), ins)["out"], want)


@pytest.mark.parametrize("bad", [V, -1])
def test_an_index_naming_no_position_is_refused_when_it_runs(bad: int) -> None:
    ins = inputs()
    ins["ids"][1, 4] = bad
    msg = rf"gather\): index {bad} at \[1, 4, 0\] matches 0 of the positions 0..{V - 1}"
    with pytest.raises(ExecutionError, match=msg):
        fspyre.evaluate(embedding(), ins)
    with pytest.raises(ExecutionError, match=msg):
        fspyre.run(fspyre.compile(embedding(), machine=spyre(cores=4)), ins)


def test_tiling_the_gathered_dim_is_refused() -> None:
    g = fspyre.GraphBuilder("tiled")
    v, d = g.dim("V", V), g.dim("D", D)
    table, pos = g.input("table", (v, d), "float32"), g.input("pos", (v,), "int32")
    ids = g.input("ids", (g.dim("S", S),), "int32")
    with g.hint(slices={"V": 2}):
        g.output("out", g.gather(table, "V", ids, pos))
    with pytest.raises(TilingError, match=r"gather has no tile-by-tile combine \(each index is checked"):
        fspyre.compile(g.build(), tiling="hints")


def test_builder_refusals() -> None:
    g = fspyre.GraphBuilder("bad")
    v, d, s = g.dim("V", V), g.dim("D", D), g.dim("S", S)
    table, ids = g.input("table", (v, d), "float32"), g.input("ids", (s,), "int32")
    pos = g.input("pos", (v,), "int32")
    with pytest.raises(GraphError, match="over='S' must name a dim of values"):
        g.gather(table, "S", ids, pos)
    with pytest.raises(GraphError, match=r"index must be an int32 tensor without dim 'V'"):
        g.gather(table, "V", g.input("fids", (s,), "float32"), pos)
    with pytest.raises(GraphError, match=r"positions must be int32 over \[V\] alone"):
        g.gather(table, "V", ids, g.input("p2", (s,), "int32"))


def test_round_trips_through_json() -> None:
    graph = embedding()
    assert loads(dumps(graph)) == graph
