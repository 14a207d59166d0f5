"""Tiles of an advancing (full) buffer must start on a stick boundary (issue 8).

Before the fix, a tile ending inside a 128-byte stick compiled when the address step happened
to be constant (a 1-D tensor, a dim inside one stick, a [1, n] tensor) and the memory check
then found the program addressing past its allocation: [768] fp16 under C: 8 read bytes
[0x0, 0x640) of an allocation [0x0, 0x600). Now the tiling stage refuses it, naming the counts
that work; every compile here also runs the memory check (tests/conftest.py), and whatever
compiles is compared with numpy computing the graph from its own definition."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import fspyre
from fspyre.errors import TilingError
from fspyre.machine.memcheck import check_memory

FOUR = fspyre.machine.spyre(cores=4)
DIMS = (48, 96, 100, 160, 320, 64, 128, 1000)
COUNTS = (2, 3, 4, 5, 8, 10)
DTYPES = ("float16", "bfloat16", "float32")
STICK_ELEMS = {"float16": 64, "bfloat16": 64, "float32": 32}  # 128-byte sticks of 2- and 4-byte elements


def elems_per_stick(dtype: str) -> int:
    return STICK_ELEMS[dtype]


def scaled_add(n: int, count: int, dtype: str, rows: int):
    """z = 2a + b over [rows, n] (or [n] when rows == 0), the stick dim C tiled by ``count``."""
    g = fspyre.GraphBuilder("scaled_add")
    dims = ["C"] if rows == 0 else ["R", "C"]
    if rows:
        g.dim("R", rows)
    g.dim("C", n)
    a, b = g.input("a", dims, dtype), g.input("b", dims, dtype)
    with g.hint(slices={"C": count}):
        z = g.add(g.mul(a, 2.0), b)
    g.output("z", z)
    return g.build()


def exact_inputs(graph, seed: int) -> dict[str, np.ndarray]:
    # Quarters in [-4, 4): exactly representable in every float format, and 2a + b stays exact,
    # so the interpreter must equal numpy bit for bit whatever the format rounds.
    rng = np.random.default_rng(seed)
    table = graph.buffer_table()
    return {n: (rng.integers(-16, 16, table[n].type.shape) / 4).astype(np.float32) for n in graph.inputs}


def whole_sticks(n: int, count: int, dtype: str) -> bool:
    return n % count == 0 and (n // count) % elems_per_stick(dtype) == 0


@pytest.mark.parametrize("rows", [0, 3])
@pytest.mark.parametrize("n, count, dtype", list(itertools.product(DIMS, COUNTS, DTYPES)))
def test_stick_dim_tiles_compile_safely_or_are_refused(n, count, dtype, rows):
    graph = scaled_add(n, count, dtype, rows)
    try:
        comp = fspyre.compile(graph, FOUR)
    except TilingError as err:
        assert not whole_sticks(n, count, dtype), f"whole-stick tiling refused: {err}"
        msg = str(err)
        assert "op buf" in msg and "dim C" in msg, msg
        if n % count == 0:
            eps = elems_per_stick(dtype)
            works = [c for c in range(2, n + 1) if n % c == 0 and (n // c) % eps == 0]
            assert f"by {n // count} elements" in msg and f"{eps}-element stick" in msg, msg
            assert f"keep tiles whole sticks: {works[:12] or 'none'}" in msg, msg
        return
    assert whole_sticks(n, count, dtype), f"C={n} in {count} tiles of {dtype} is not whole sticks, yet compiled"
    assert check_memory(comp.program).clean
    inputs = exact_inputs(graph, n + count)
    got = fspyre.run(comp, inputs)["z"]
    assert np.array_equal(got.astype(np.float64), 2.0 * inputs["a"] + inputs["b"])


def test_the_issue_example_is_refused_with_the_counts_that_work():
    """[768] fp16 in 8 tiles of 96 elements (1.5 sticks): constant step 192 B, but the last
    tile's sticks end at 0x640, past the 0x600-byte allocation."""
    g = fspyre.GraphBuilder("issue8")
    g.dim("C", 768)
    x = g.input("x", ["C"], "float16")
    with g.hint(slices={"C": 8}):
        y = g.exp(x)
    g.output("y", y)
    with pytest.raises(TilingError) as err:
        fspyre.compile(g.build())
    msg = str(err.value)
    for part in ("op buf0 reads x (float16[C=768])", "hint scope 0 slices={'C': 8}) (count 8)",
                 "moves dim C (range 768) by 96 elements", "starts 32 elements into a 64-element stick",
                 "Counts of C that keep tiles whole sticks: [2, 3, 4, 6, 12]"):
        assert part in msg, msg


def test_a_reduction_result_of_partial_sticks_is_refused():
    """The [A] result of a row sum advances under A: 2 in tiles of 32 fp16: half sticks, which
    two iterations would each write part of; refused at the finish that writes it."""
    g = fspyre.GraphBuilder("rowsum")
    g.dim("A", 64)
    g.dim("K", 256)
    x = g.input("x", ["A", "K"], "float16")
    with g.hint(slices={"A": 2}):
        r = g.sum(x, ["K"])
    g.output("r", r)
    with pytest.raises(TilingError, match=r"op buf0 writes buf0 \(float16\[A=64\]\).*keep tiles whole sticks: none"):
        fspyre.compile(g.build())


def test_a_non_stick_dim_may_be_tiled_at_any_divisor():
    """Rows of [100, 100] in 4 tiles of 25: each tile is whole (padded) sticks, no refusal."""
    g = fspyre.GraphBuilder("rows")
    g.dim("R", 100)
    g.dim("C", 100)
    a = g.input("a", ["R", "C"], "float16")
    with g.hint(slices={"R": 4}):
        z = g.mul(a, 2.0)
    g.output("z", z)
    graph = g.build()
    inputs = exact_inputs(graph, 0)
    got = fspyre.run(fspyre.compile(graph, FOUR), inputs)["z"]
    assert np.array_equal(got.astype(np.float64), 2.0 * inputs["a"])


def test_check_never_reports_an_unsafe_program_equal():
    from dataclasses import replace

    from fspyre.machine.memcheck import MemoryIssue

    g = fspyre.GraphBuilder("safe")
    g.dim("C", 128)
    x = g.input("x", ["C"], "float16")
    g.output("y", g.exp(x))
    report = fspyre.check(g.build())
    assert report.equal and report.safe
    fault = MemoryIssue(kind="out_of_bounds", op="buf0", tensor="x", core=-1, memory="hbm", address=0x100,
                        message="planted")
    unsafe = replace(report, memory=replace(report.memory, issues=(fault,)))
    assert all(o.equal for o in unsafe.outputs) and not unsafe.safe
    assert not unsafe.equal


def test_reshape_split_then_tiled_reduction_is_refused_not_wrong():
    """y [C, N=192] read as [C, A=2, B=96] and summed over B, tiled A: 2. Each tile starts 96
    elements (1.5 sticks) along y's stick dim, and the emitter's advance check, which moves
    only A (one position) with B at 0, found a "constant" step of 320 bytes: the interpreter
    then summed the wrong elements (max |diff| 45.5 against numpy) and the memory check saw
    reads past y. Refused now; tiled by C, the same graph compiles and equals numpy."""
    def graph(slices):
        g = fspyre.GraphBuilder("split_sum")
        g.dim("A", 2)
        g.dim("B", 96)
        g.dim("C", 4)
        g.dim("N", 192)
        x = g.input("x", ["C", "N"], "float16")
        y = g.add(x, 1.0)
        with g.hint(slices=slices):
            z = g.sum(g.mul(g.reshape(y, ["C", "A", "B"]), 2.0), ["B"])
        g.output("z", z)
        return g.build()

    with pytest.raises(TilingError, match=r"reads buf0 \(float16\[C=4, N=192\]\).*moves dim A .*by 1 elements"):
        fspyre.compile(graph({"A": 2}), FOUR)
    tiled = graph({"C": 2})
    inputs = exact_inputs(tiled, 1)
    want = ((inputs["x"].astype(np.float64) + 1.0).reshape(4, 2, 96) * 2.0).sum(axis=2)
    got = fspyre.run(fspyre.compile(tiled, FOUR), inputs)["z"].astype(np.float64)
    assert np.array_equal(got, want)  # quarters: every partial sum is exact in float32
