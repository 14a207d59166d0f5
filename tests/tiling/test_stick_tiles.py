"""Tiles of an advancing (full) buffer must start on a stick boundary (issue 8).

Before the fix, a tile ending inside a 128-byte stick compiled when the address step happened
to be constant (a 1-D tensor, a dim inside one stick, a [1, n] tensor) and the memory check
then found the program addressing past its allocation: [768] fp16 under C: 8 read bytes
[0x0, 0x640) of an allocation [0x0, 0x600). Then the tiling stage refused it; now (issue 13)
it rounds the tile up to whole sticks and peels the remainder as a tail, warning when the
iteration count changes, and refuses only a dim no whole-stick tile can split. Every compile
here also runs the memory check (tests/conftest.py), and whatever compiles is compared with
numpy computing the graph from its own definition."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest

import fspyre
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


def stick_tile(n: int, count: int, dtype: str) -> int:
    """The tile docs/tiling.md ("Tails") promises: ceil(n / count) rounded up to whole sticks,
    or the whole dim (no loop) when no smaller tile is whole sticks."""
    eps = elems_per_stick(dtype)
    return min(-(-(-(-n // count)) // eps) * eps, n)


def loop_and_tail(comp) -> tuple[int, int]:
    """(whole tiles, elements of C the tail covers) of a one-level tree: a loop's count, or 1
    when the one whole tile runs in place."""
    from fspyre.ir.looptree import Loop

    body = comp.stages["loop_tree"].body
    loops = [n for n in body if isinstance(n, Loop)]
    tails = [n for n in body if not isinstance(n, Loop) and n.origin]
    size = {d.name: d.size for d in tails[0].op.ranges} if tails else {"C": 0}
    return (loops[0].count if loops else 1), size["C"]


@pytest.mark.parametrize("rows", [0, 3])
@pytest.mark.parametrize("n, count, dtype", list(itertools.product(DIMS, COUNTS, DTYPES)))
def test_stick_dim_tiles_compile_safely(n, count, dtype, rows):
    graph = scaled_add(n, count, dtype, rows)
    tile = stick_tile(n, count, dtype)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        comp = fspyre.compile(graph, FOUR)
    assert loop_and_tail(comp) == (n // tile, n % tile)
    changed = [str(w.message) for w in caught if "instead of the hinted" in str(w.message)]
    used = n // tile + (n % tile > 0)
    assert bool(changed) == (used != count), changed
    if changed:
        assert f"iteration{'s' if used > 1 else ''} instead of the hinted {count}" in changed[0], changed[0]
        assert "op buf" in changed[0] and "dim C" in changed[0], changed[0]
    assert check_memory(comp.program).clean
    inputs = exact_inputs(graph, n + count)
    got = fspyre.run(comp, inputs)["z"]
    assert np.array_equal(got.astype(np.float64), 2.0 * inputs["a"] + inputs["b"])


def test_the_issue_example_rounds_tiles_up_to_whole_sticks():
    """[768] fp16 in 8 tiles of 96 elements (1.5 sticks): constant step 192 B, but the last
    tile's sticks ended at 0x640, past the 0x600-byte allocation. Now the tile is rounded up to
    128 elements (2 sticks): 6 iterations and no tail, with a warning naming why."""
    g = fspyre.GraphBuilder("issue8")
    g.dim("C", 768)
    x = g.input("x", ["C"], "float16")
    with g.hint(slices={"C": 8}):
        y = g.exp(x)
    g.output("y", y)
    graph = g.build()
    with pytest.warns(fspyre.FspyreWarning) as caught:
        comp = fspyre.compile(graph)
    msg = " ".join(str(w.message) for w in caught)
    for part in ("op buf0: level 0 (hint scope 0 slices={'C': 8}) tiles dim C (range 768) in 6 tiles of 128",
                 "6 iterations instead of the hinted 8", "a tile of 96 would move x (float16[C=768]) by 96 elements",
                 "rounded up to 128"):
        assert part in msg, msg
    assert loop_and_tail(comp) == (6, 0)
    assert check_memory(comp.program).clean
    assert fspyre.check(graph, comp=comp).equal


def test_a_reduction_result_within_one_stick_makes_no_loop():
    """The [A] result of a row sum advances under A: 2 in tiles of 32 fp16: half sticks, which
    two iterations would each write part of. 64 elements are one stick, so no whole-stick tile
    splits them: the level makes no loop, and the warning says why."""
    g = fspyre.GraphBuilder("rowsum")
    g.dim("A", 64)
    g.dim("K", 256)
    x = g.input("x", ["A", "K"], "float16")
    with g.hint(slices={"A": 2}):
        r = g.sum(x, ["K"])
    g.output("r", r)
    graph = g.build()
    with pytest.warns(fspyre.FspyreWarning, match=r"a tile of 32 would move buf0 \(float16\[A=64\]\) by 32 elements"
                                                  r".*no larger tile below 64 is whole sticks, so the level makes no "
                                                  r"loop. Remove the level"):
        comp = fspyre.compile(graph)
    assert loop_and_tail(comp) == (1, 0)
    assert fspyre.check(graph, comp=comp).equal


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


def test_reshape_split_then_tiled_reduction_is_not_tiled_wrong():
    """y [C, N=192] read as [C, A=2, B=96] and summed over B, tiled A: 2. Each tile starts 96
    elements (1.5 sticks) along y's stick dim, and the emitter's advance check, which moves
    only A (one position) with B at 0, found a "constant" step of 320 bytes: the interpreter
    then summed the wrong elements (max |diff| 45.5 against numpy) and the memory check saw
    reads past y. Now no tile of A short of both elements is whole sticks, so the level makes
    no loop (with a warning); tiled by C, the same graph compiles and equals numpy."""
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

    with pytest.warns(fspyre.FspyreWarning, match=r"tiles dim A \(range 2\) in 1 tile of 2: 1 iteration instead of "
                                                  r"the hinted 2, because a tile of 1 would move buf0 "
                                                  r"\(float16\[C=4, N=192\]\) by 96 elements"):
        comp = fspyre.compile(graph({"A": 2}), FOUR)
    assert fspyre.check(graph({"A": 2}), comp=comp).equal
    tiled = graph({"C": 2})
    inputs = exact_inputs(tiled, 1)
    want = ((inputs["x"].astype(np.float64) + 1.0).reshape(4, 2, 96) * 2.0).sum(axis=2)
    got = fspyre.run(fspyre.compile(tiled, FOUR), inputs)["z"].astype(np.float64)
    assert np.array_equal(got, want)  # quarters: every partial sum is exact in float32
