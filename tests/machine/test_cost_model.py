"""The anchor's fitted time terms in the traffic report (issue 21; docs/tiling.md, "The cost
model"): each term on a program built to exercise it, the terms only ever adding time to
max(bytes at the peak, MACs at the rate), and the estimate never preferring tiles smaller
than one stick row per core to the untiled program."""

from __future__ import annotations

import contextlib
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from workloads import compile

import fspyre
from fspyre.ir.program import LoopSpec
from fspyre.machine import cost_model as cm
from fspyre.machine.report import traffic_report
from fspyre.testing import examples

SETTINGS = settings(max_examples=examples(30), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
pytestmark = pytest.mark.filterwarnings("ignore::fspyre.FspyreWarning")


def derated(report, k, derate: float) -> float:
    """A kernel's memory time when every op's bytes run at ``derate`` of the peak: the derate
    slows the bytes at 150 B/ns, not their share of the program's read/write turnaround."""
    share = 0.00574 * min(report.hbm_read, report.hbm_write) / report.hbm_bytes
    return (k.hbm_read + k.hbm_write) * (1 / (150 * derate) + share)


def rows_graph(rows: int, cols: int, ops: tuple[str, ...], count: int | None = None, dtype: str = "float16"):
    """x[M, N] through the pointwise ``ops`` ("sum" reduces over N, keepdim), under M: count."""
    g = fspyre.GraphBuilder("rows")
    g.dim("M", rows)
    g.dim("N", cols)
    x = g.input("x", ["M", "N"], dtype)
    with g.hint(slices={"M": count}) if count else contextlib.nullcontext():
        y = x
        for fn in ops:
            y = g.reduce("sum", y, ["N"], keepdim=True) if fn == "sum" else getattr(g, fn)(y)
        g.output("y", y)
    return g.build()


def mm_graph(m: int, k: int, n: int, count: int | None = None):
    g = fspyre.GraphBuilder("mm")
    g.dim("M", m)
    g.dim("K", k)
    g.dim("N", n)
    a = g.input("a", ["M", "K"], "float16")
    b = g.input("b", ["K", "N"], "float16")
    with g.hint(slices={"M": count}) if count else contextlib.nullcontext():
        g.output("c", g.matmul(a, b))
    return g.build()


def test_the_terms_follow_the_anchors_formulas():
    assert cm.tile_efficiency(7.9, 2048, False) == pytest.approx(1.0)
    assert cm.tile_efficiency(4, 1024, False) == pytest.approx((4 / 7.9) ** 0.5 * 0.5 ** 0.38)
    raw = (1 / 7.9) ** 0.5 * (64 / 2048) ** 0.38  # below eff0: the gentler tail
    assert raw < 0.248 and cm.tile_efficiency(1, 64, False) == pytest.approx(0.248 * (raw / 0.248) ** 0.1)
    assert cm.tile_efficiency(1000, 1, True) == 0.95 and cm.tile_efficiency(2, 1, True) == pytest.approx(
        (2 / 13) ** 0.68)
    assert cm.lx_spill_derate(512 << 10, False) == 1.0
    assert cm.lx_spill_derate(1 << 20, False) == pytest.approx(0.5 ** 0.06)
    assert cm.lx_spill_derate(4 << 20, True) == pytest.approx(0.5 ** 0.15)
    assert [cm.core_share(c) for c in (1, 2, 4, 8, 16, 32)] == [0.11, 0.22, 0.43, 0.54, 0.54, 1.0]
    assert cm.core_share(3) == pytest.approx(0.22 + 0.21 * math.log2(1.5))  # log-linear between 2 and 4
    assert cm.core_underuse(32, 32) == 1.0 and cm.core_underuse(4, 8) == pytest.approx(0.43 / 0.54)
    assert cm.reduction_bandwidth_derate(0, 150) == 1.0
    assert cm.reduction_bandwidth_derate(37000, 150) == pytest.approx((114 + 61 * math.exp(-10)) / 150)
    assert cm.pt_efficiency(64) == 1.0 and cm.pt_efficiency(8) == pytest.approx(0.125 ** 0.35)
    assert cm.matmul_spill_factor(65536) == 0.0 and cm.matmul_spill_factor(1 << 30) == 1.5
    assert cm.split_penalty_ns(131072, 32, 1) == 0.0
    assert cm.split_penalty_ns(262144, 32, 32) == pytest.approx(131072 * (2.62e-3 * 2 + 2.88e-3 * 1) * 1000)


def test_short_tiles_are_derated_by_their_height():
    """512 x 1024 exp in tiles of 128 rows on 32 cores: 4 rows of 1024 per core per tile,
    eff = (4 / 7.9)^0.5 (1024 / 2048)^0.38; untiled the same bytes run at the peak."""
    tiled = traffic_report(compile(rows_graph(512, 1024, ("exp",), 4)).program)
    untiled = traffic_report(compile(rows_graph(512, 1024, ("exp",)), tiling="none").program)
    assert tiled.hbm_bytes == untiled.hbm_bytes
    (k,) = tiled.kernels
    assert k.memory_ns == pytest.approx(derated(tiled, k, cm.tile_efficiency(4, 1024, False)))
    assert untiled.time_ns == pytest.approx(untiled.kernels[0].peak_memory_ns)


def test_an_op_on_fewer_cores_moves_its_bytes_slower():
    """x[2, 64] on a 32-core machine: two rows of one stick occupy 2 cores, g(2) / g(32);
    untiled, no tile derate."""
    report = traffic_report(compile(rows_graph(2, 64, ("exp",)), tiling="none").program)
    (k,) = report.kernels
    assert report.cores_used == 2
    assert k.memory_ns == pytest.approx(derated(report, k, 0.22 / 1.0))


def test_a_lone_row_reduction_runs_at_the_fitted_reduction_bandwidth():
    rows = 8192
    report = traffic_report(compile(rows_graph(rows, 256, ("sum",)), tiling="none").program)
    (k,) = report.kernels
    assert k.memory_ns == pytest.approx(k.peak_memory_ns * 150 / (114 + 61 * math.exp(-rows / 3700)))


def test_a_large_tile_spills_lx():
    """Tiles of 2048 rows x 2048 fp16 on 8 cores: 256 rows per core, 1 MiB per core, working
    set 2 MiB past the 512 KiB cap: bandwidth x (1/4)^0.06."""
    machine = fspyre.machine.spyre(cores=8)
    report = traffic_report(compile(rows_graph(4096, 2048, ("exp",), 2), machine).program)
    (k,) = report.kernels
    assert k.memory_ns == pytest.approx(derated(report, k, 0.25 ** 0.06))


def test_matmul_terms():
    """256 x 512 x 8192 on 32 cores, untiled: split M/32 -> 8 rows per core (PT efficiency
    (8/64)^0.35), area 8 x 8192 = 65536 (no spill, no split penalty)."""
    report = traffic_report(compile(mm_graph(256, 512, 8192), tiling="none").program)
    (k,) = report.kernels
    macs = 256 * 512 * 8192
    assert k.compute_ns == pytest.approx(macs / 32 / (1140 * (8 / 64) ** 0.35))
    assert k.memory_ns == pytest.approx(k.peak_memory_ns) and k.split_ns == 0


def test_a_matmul_tiled_over_rows_derates_its_bandwidth():
    """1024 x 256 x 256 on 4 cores in 4 row tiles: M/m = 64 per core per tile: bandwidth x
    min(0.95, (64 / 13)^0.68) = 0.95; PT efficiency 1."""
    machine = fspyre.machine.spyre(cores=4)
    report = traffic_report(compile(mm_graph(1024, 256, 256, 4), machine).program)
    (k,) = report.kernels
    assert k.memory_ns == pytest.approx(derated(report, k, 0.95))
    assert k.compute_ns == pytest.approx(1024 * 256 * 256 / 4 / 1140)


@pytest.mark.parametrize("ops", [("neg", "exp"), ("amax_softmax",)])
def test_auto_uses_every_core_and_whole_stick_tiles_on_4093_rows(ops):
    """Issue 21: x[4093, 256] with 8 cores and 64 KiB LX. Before the fitted terms, auto chose
    4,093 one-row iterations on 4 cores, estimated at the minimum-traffic time."""
    graph = softmax_graph(4093, 256) if ops == ("amax_softmax",) else rows_graph(4093, 256, ops)
    machine = fspyre.machine.spyre(cores=8, lx_bytes=64 << 10)
    comp = fspyre.compile(graph, machine, tiling="auto")
    report = traffic_report(comp.program)
    assert report.cores_used == 8 and all(o.cores == 8 for o in report.ops)
    # every op's tile: at least a stick row on each core (no loop of single rows)
    assert all(o.iterations <= 4093 // 8 for o in report.ops)
    none = traffic_report(fspyre.compile(graph, machine, tiling="none").program)
    assert report.time_ns <= none.time_ns
    assert fspyre.check(graph, machine=machine, comp=comp).equal


def softmax_graph(rows: int, cols: int, count: int | None = None):
    g = fspyre.GraphBuilder("softmax")
    g.dim("M", rows)
    g.dim("N", cols)
    x = g.input("x", ["M", "N"], "float16")
    with g.hint(slices={"M": count}) if count else contextlib.nullcontext():
        m = g.amax(x, ["N"], keepdim=True)
        e = g.exp(g.sub(x, m))
        g.output("y", g.div(e, g.sum(e, ["N"], keepdim=True)))
    return g.build()


@SETTINGS
@given(st.data(), st.sampled_from([4, 8, 16, 32]), st.integers(2, 300),
       st.sampled_from([("exp",), ("neg", "exp"), ("neg", "exp", "sum"), ("neg", "exp", "neg", "exp"), ("softmax",)]),
       st.sampled_from([64 << 10, None]))
def test_tiles_below_a_stick_row_per_core_never_beat_untiled(data, cores, tiles, ops, lx):
    """No plan whose tiles hold fewer stick rows than the machine has cores (some cores idle,
    each busy one moves a sliver) is estimated faster than the untiled program, whatever the
    untiled program pays for its intermediates."""
    sticks = data.draw(st.integers(1, cores - 1), label="sticks per row")
    rows_per_tile = data.draw(st.integers(1, (cores - 1) // sticks), label="rows per tile")
    cols = 64 * sticks - data.draw(st.integers(0, 63), label="short of whole sticks")
    rows = rows_per_tile * tiles
    machine = fspyre.machine.spyre(cores=cores, lx_bytes=lx)
    graph = softmax_graph(rows, cols, tiles) if ops == ("softmax",) else rows_graph(rows, cols, ops, tiles)
    comp = fspyre.compile(graph, machine, tiling="hints")
    assert any(isinstance(s, LoopSpec) and s.count >= 2 for s in comp.program.body)
    tiled = traffic_report(comp.program)
    untiled = traffic_report(fspyre.compile(graph, machine, tiling="none").program)
    assert tiled.time_ns > untiled.time_ns


def test_the_fitted_terms_only_add_time():
    """Every kernel's time is at least its bytes at the peak and its MACs at the rate."""
    for graph, machine, tiling in [
        (softmax_graph(4093, 256), fspyre.machine.spyre(cores=8, lx_bytes=64 << 10), "auto"),
        (rows_graph(2, 64, ("exp",)), fspyre.machine.spyre(), "none"),
        (mm_graph(1024, 256, 256, 4), fspyre.machine.spyre(cores=4), "hints"),
        (mm_graph(2048, 512, 4096), fspyre.machine.spyre(), "none"),
    ]:
        report = traffic_report(fspyre.compile(graph, machine, tiling=tiling).program)
        for k in report.kernels:
            floor = max(k.peak_memory_ns, k.macs / report.cores / 1140)
            assert k.time_ns >= floor * (1 - 1e-12) and k.split_ns >= 0
