"""Uneven work division: slices of ceil and floor shares (whole sticks but the last), so
awkward sizes use every core; the per-core iteration spaces are data in the split plan and the
program, and every consumer of them (interpreter, memory check, traffic report, lowerings)
reads them from there."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from workloads import compile, pointwise

import fspyre
from fspyre.errors import FspyreWarning
from fspyre.ir.program import op_specs
from fspyre.ir.serialize import dumps, loads
from fspyre.lower.sdsc import sdsc_json
from fspyre.machine.memcheck import check_memory
from fspyre.machine.report import traffic_report
from fspyre.machine.rules import core_spaces, slice_extents
from fspyre.pretty import pretty
from fspyre.stages.split_plan import verify_split_plan
from fspyre.testing import numpy_ref as R

M32 = fspyre.machine.spyre(cores=32)
SETTINGS = dict(deadline=None, derandomize=True)


def add_sum(rows: int, cols: int):
    """z = a + b over [rows, cols] fp16, and its row sums: a pointwise op and a reduction."""
    g = fspyre.GraphBuilder("add_sum")
    A, B = g.dim("A", rows), g.dim("B", cols)
    a, b = (g.input(n, (A, B), "float16") for n in "ab")
    z = g.add(a, b)
    g.output("z", z)
    g.output("s", g.sum(z, ["B"], keepdim=True))
    return g.build()


def numpy_refs(inputs, rows: int, cols: int) -> dict[str, R.Ref]:
    names = ("A", "B")
    fmt = M32.device_format("float16")
    a, b = (R.exact(names, inputs[n].astype(np.float64), "float16") for n in "ab")
    z = R.pointwise("add", [a, b], names, (rows, cols), "float16", fmt)
    return {"z": z, "s": R.reduce("sum", z, ["B"], names, True, "float16", fmt)}


# [4097, 4096] used 17 cores, [1000, 4096] 25, [97, 96] and [1, 4100] one (issue 13)
ISSUE_SHAPES = [(4097, 4096), (1000, 4096), (97, 96), (1, 4100)]


@pytest.mark.parametrize("shape", ISSUE_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_awkward_shapes_use_every_core_and_check_equal(shape):
    graph = add_sum(*shape)
    comp = compile(graph, tiling="none")
    add = comp.stages["split_plan"].ops["buf0"]
    assert add.cores == 32, dict(add.splits)
    report = traffic_report(comp.program)
    assert report.cores_used == 32
    assert check_memory(comp.program).clean
    rng = np.random.default_rng(1)
    # multiples of 1/64 in [-2, 2): exact in DLFloat16, so the numpy reference starts from the same values
    inputs = {n: (rng.integers(-128, 128, size=shape) / 64.0).astype(np.float16) for n in "ab"}
    check = fspyre.check(graph, inputs, comp=comp)
    assert check.equal, str(check)
    got = fspyre.run(comp, inputs)
    for name, ref in numpy_refs(inputs, *shape).items():
        assert R.accept(got[name].astype(np.float64), ref).all(), name
    # the same values as the untiled program on one core
    one = fspyre.run(compile(graph, fspyre.machine.spyre(cores=1), tiling="none"), inputs)
    assert np.array_equal(got["z"], one["z"])


def test_uneven_slices_of_4097_rows_when_hinted():
    """A work_div that does not divide is honoured: 4097 rows over 32 cores, 129 on the first."""
    g = fspyre.GraphBuilder("add")
    A, B = g.dim("A", 4097), g.dim("B", 256)
    a, b = (g.input(n, (A, B), "float16") for n in "ab")
    with g.hint(work_div={"A": 32}):
        y = g.add(a, b)
    g.output("y", y)
    graph = g.build()
    comp = compile(graph, tiling="none")
    split = comp.stages["split_plan"].ops["buf0"]
    assert dict(split.splits) == {"A": 32, "B": 1} and split.slices["A"] == (129,) + (128,) * 31
    spec = op_specs(comp.program)[0]
    assert spec.core_spaces[0] == ((0, 129), (0, 256)) and spec.core_spaces[31] == ((3969, 128), (0, 256))
    assert fspyre.check(graph, comp=comp).equal


def test_uneven_split_reduction_dim_combines_every_core():
    """A sum over 300 elements (5 sticks, the last partial) on 4 cores: 128, 64, 64, 44."""
    g = fspyre.GraphBuilder("total")
    N = g.dim("N", 300)
    x = g.input("x", (N,), "float32")
    g.output("s", g.sum(g.mul(x, 2.0), ["N"]))
    graph = g.build()
    comp = compile(graph, fspyre.machine.spyre(cores=4), tiling="none")
    total = comp.stages["split_plan"].ops["buf1"]
    assert dict(total.splits) == {"N": 4} and total.slices["N"] == (96, 96, 64, 44)  # fp32: 10 sticks of 32
    assert fspyre.check(graph, comp=comp).equal


def test_a_matmul_split_unevenly_estimates_the_largest_core():
    """Compute time is the largest core's MACs: 7 rows on 4 cores cost 2 rows' worth."""
    g = fspyre.GraphBuilder("mm")
    M, K, N = g.dim("M", 7), g.dim("K", 128), g.dim("N", 64)
    a, b = g.input("a", (M, K), "float16"), g.input("b", (K, N), "float16")
    g.output("c", g.matmul(a, b))
    graph = g.build()
    comp = compile(graph, fspyre.machine.spyre(cores=4), tiling="none")
    mm = traffic_report(comp.program).ops[0]
    assert (mm.cores, mm.macs, mm.core_macs) == (4, 7 * 128 * 64, 2 * 128 * 64)
    assert fspyre.check(graph, comp=comp).equal


def test_per_core_spaces_round_trip_and_reach_the_lowerings():
    comp = compile(pointwise((97, 96)), tiling="none")
    for stage in ("split_plan", "program"):
        assert loads(dumps(comp.stages[stage])) == comp.stages[stage]
    spec = op_specs(comp.program)[0]
    assert not spec.even and spec.slice_extents == (slice_extents(97, 16), (64, 32))
    doc = sdsc_json(comp.program)["sdsc_0.json"]
    assert doc["core_spaces"][17] == {"A": [7, 6], "B": [64, 32]}  # core 17: second row slice, second stick
    assert doc["iteration_space"]["A"] == {"size": 97, "split": 16, "per_core": 7,
                                           "slices": list(slice_extents(97, 16))}
    assert '"core_spaces"=[[0, 7, 0, 64], [7, 6, 0, 64], ' in comp.bundle_mlir
    assert "core_spaces = [[0, 7, 0, 64], " in comp.mlir_generic


def test_printed_forms(golden):
    comp = compile(pointwise((97, 96)), fspyre.machine.spyre(cores=8), tiling="none")
    golden.check("97x96.split_plan", pretty(comp.stages["split_plan"]))
    golden.check("97x96.split_plan.detailed", pretty(comp.stages["split_plan"], detailed=True))
    golden.check("97x96.program", pretty(comp.program))


def test_hint_counts_beyond_the_units_split_one_unit_per_core_and_warn():
    g = fspyre.GraphBuilder("add")
    A, B = g.dim("A", 5), g.dim("B", 150)
    a, b = (g.input(n, (A, B), "float16") for n in "ab")
    with g.hint(work_div={"B": 4}):  # 150 elements are 3 sticks
        g.output("y", g.add(a, b))
    graph = g.build()
    with pytest.warns(fspyre.FspyreWarning, match=r"4 slices are more than dim B has \(3 sticks\), so it is split "
                                                   r"into 3; hint at most 3"):
        comp = compile(graph, tiling="none")
    assert dict(comp.stages["split_plan"].ops["buf0"].splits)["B"] == 3
    assert fspyre.check(graph, comp=comp).equal


def test_core_spaces_that_do_not_partition_are_refused():
    spec = op_specs(compile(pointwise((97, 96)), tiling="none").program)[0]
    from dataclasses import replace

    from fspyre.errors import LoweringError

    gap = list(spec.core_spaces)
    gap[1] = ((8, 6),) + gap[1][1:]  # slice 1 of A starts one row late
    with pytest.raises(LoweringError, match=r"op buf0: core_spaces .* do not divide the iteration space"):
        replace(spec, core_spaces=tuple(gap))
    assert replace(spec, core_spaces=spec.core_spaces) == spec


# -- properties ----------------------------------------------------------------------------------
@settings(max_examples=300, **SETTINGS)
@given(st.integers(1, 5000), st.sampled_from([1, 32, 64]), st.data())
def test_slice_extents_are_ceil_and_floor_shares_of_whole_sticks(size, unit, data):
    units = -(-size // unit)
    count = data.draw(st.integers(1, min(units, 40)), label="count")
    ext = slice_extents(size, count, unit)
    assert len(ext) == count and sum(ext) == size and min(ext) >= 1
    assert all(e % unit == 0 for e in ext[:-1])  # only the last slice may end mid-stick
    shares = [-(-e // unit) for e in ext]
    assert shares == sorted(shares, reverse=True) and shares[0] - shares[-1] <= 1
    assert shares[0] == -(-units // count)
    spaces = core_spaces([ext])
    assert [s for ((s, _),) in spaces] == [sum(ext[:k]) for k in range(count)]


def _anchor_share(units: list[int], cores: int) -> tuple[int, int]:
    """The largest core share and cores of the anchor's pass 3 (largest divisors, larger dims first)."""
    left, share, used = cores, 1, 1
    for n in sorted(units, reverse=True):
        k = max(d for d in range(1, min(n, left) + 1) if n % d == 0)
        left //= k
        share *= n // k
        used *= k
    return share, used


@settings(max_examples=60, **SETTINGS)
@given(st.integers(1, 300), st.integers(1, 700), st.integers(1, 32))
def test_the_split_shrinks_the_largest_share_and_uses_more_cores(rows, cols, cores):
    machine = fspyre.machine.spyre(cores=cores)
    graph = pointwise((rows, cols))
    comp = compile(graph, machine, tiling="none")
    split = comp.stages["split_plan"].ops["buf0"]
    verify_split_plan(comp.stages["loop_tree"], comp.stages["split_plan"], machine)
    sizes = {"A": rows, "B": cols}
    units = {d: -(-n // split.stick_elems.get(d, 1)) for d, n in sizes.items() if n > 1}
    share = math.prod(-(-units[d] // split.splits.get(d, 1)) for d in units)
    anchor, anchor_cores = _anchor_share(list(units.values()), cores)
    assert split.cores <= cores
    assert share < anchor or (share == anchor and split.cores >= anchor_cores)
    if rows * cols <= 20000:
        assert check_memory(comp.program).clean
        assert fspyre.check(graph, comp=comp).equal


def test_a_hint_on_a_dim_tiled_to_one_element_does_not_split_it():
    """slices tile D down to one element: work_div on D has no point to divide, like a dim the
    op does not iterate; no op of the scope iterates it, so the hint is dropped with a warning."""
    g = fspyre.GraphBuilder("add")
    D, B = g.dim("D", 4), g.dim("B", 128)
    a, b = (g.input(n, (D, B), "float16") for n in "ab")
    with g.hint(slices={"D": 4}), g.hint(work_div={"D": 2}):
        g.output("y", g.add(a, b))
    graph = g.build()
    with pytest.warns(FspyreWarning, match=r"work_div={'D': 2}: no op of \[buf0\] iterates dim D; hint ignored"):
        comp = compile(graph)
    plan = comp.stages["split_plan"]
    assert plan.ops["buf0"].splits.get("D", 1) == 1
    assert any("work_div={'D': 2}: no op of [buf0] iterates dim D" in w for w in plan.warnings), plan.warnings
    assert fspyre.check(graph, comp=comp).equal


def test_the_span_limit_still_holds_with_a_prime_row_count():
    """[65537, 4096] fp16 is 512 MiB: the span limit forces B into 4 (each core's 16 sticks of
    65537 rows span 134 MB), and the 8 cores left take the prime rows unevenly."""
    from fspyre.stages.loop_tree import tile
    from fspyre.stages.split_plan import divide_work
    from fspyre.stages.tiling_plan import TilingOptions, plan_tiling

    graph = pointwise((65537, 4096))
    tree = tile(graph, plan_tiling(graph, TilingOptions(mode="none")))
    plan = divide_work(tree, M32)
    split = plan.ops["buf0"]
    assert dict(split.span_splits) == {"B": 4} and dict(split.splits) == {"A": 8, "B": 4}
    assert split.slices["A"] == (8193,) + (8192,) * 7
    assert verify_split_plan(tree, plan, M32) is plan


def test_the_cached_core_slices_are_read_only():
    # shared by every caller through the cache: a caller writing into them would change the
    # division every later op reads
    from fspyre.machine.rules import core_slices

    slices = core_slices([2, 3])
    assert slices.tolist() == [[0, 0], [1, 0], [0, 1], [1, 1], [0, 2], [1, 2]]
    assert not slices.flags.writeable
    with pytest.raises(ValueError):
        slices[0, 0] = 1


def test_with_a_split_reduction_only_the_cores_of_its_first_slice_write():
    from fspyre.machine.rules import writing_cores

    # cores enumerate the slices first symbol fastest: (0,0) (1,0) (0,1) (1,1)
    assert writing_cores([2, 2], [False, True]).tolist() == [True, True, False, False]
    assert writing_cores([2, 2], [True, False]).tolist() == [True, False, True, False]
    assert writing_cores([2, 2], [False, False]).tolist() == [True] * 4
