"""traffic_report: bytes from the program, the compulsory floor, and the anchor's time model
(150 B/ns one-directional HBM peak, 0.00574 ns/B read/write turnaround, 1140 MAC/ns/core)."""

from __future__ import annotations

import dataclasses

import pytest
from workloads import add_mul, compile, softmax

import fspyre
from fspyre.machine.report import traffic_report


def test_the_anchors_softmax_time_check():
    # The anchor's hand check: softmax 4096 x 2048 fp16 on 32 cores with x copied into LX,
    # R = W = 16.78 MB -> 33.55e6 / 150 + 0.00574 * 16.78e6 = 223.7 + 96.3 = 320.0 us.
    size = 4096 * 2048 * 2
    report = traffic_report(compile(softmax(4096, 2048, row_tiles=8), residency=True).program)
    assert report.hbm_read == report.hbm_write == size
    assert report.time_ns == pytest.approx(320_000, rel=1e-3)
    assert len(report.kernels) == 1 and report.kernels[0].bound == "memory"
    assert report.ops[0].op == "copy" and report.ops[0].hbm_read == size  # the only read of x


def test_without_the_copy_x_is_read_twice():
    # amax and sub each read x from HBM: R is twice the compulsory read, and so is its cost
    size = 4096 * 2048 * 2
    report = traffic_report(compile(softmax(4096, 2048, row_tiles=8)).program)
    assert report.hbm_read == 2 * size and report.hbm_write == size
    assert report.time_ns == pytest.approx(3 * size / 150 + 0.00574 * size, rel=1e-9)


def test_turnaround_does_not_depend_on_kernel_boundaries():
    # The same bytes cost the same whether the ops share one loop nest or run as separate
    # kernels: untiled softmax with LX moves what the tiled one moves and is timed the same.
    # Tiles of 512 rows give each core 16 rows of 1024: the tile-height derate is 1, and 1024
    # rows keep the lone reductions' fitted bandwidth at its 150 B/ns cap.
    size = 1024 * 1024 * 2
    tiled = traffic_report(compile(softmax(1024, 1024, row_tiles=2)).program)
    untiled = traffic_report(compile(softmax(1024, 1024, row_tiles=1), tiling="none").program)
    assert (tiled.hbm_read, tiled.hbm_write) == (untiled.hbm_read, untiled.hbm_write) == (2 * size, size)
    assert len(untiled.kernels) > len(tiled.kernels) == 1
    assert untiled.time_ns == pytest.approx(tiled.time_ns, rel=1e-12)


def test_untiled_programs_pay_for_every_intermediate():
    rows, cols = 512, 1024
    size = rows * cols * 2
    report = traffic_report(compile(softmax(rows, cols, row_tiles=1), tiling="none", lx_planning=False).program)
    # x read by amax and by sub; sub's and exp's results written and read back; y written; the
    # [M, 1] max and sum are one stick per row, written once and read once.
    column = rows * 128
    assert report.hbm_read == size * 5 + 2 * column and report.hbm_write == size * 3 + 2 * column
    assert report.traffic_ratio == pytest.approx((8 * size + 4 * column) / (2 * size))
    assert len(report.kernels) == 5


def test_untiled_add_mul_with_lx_keeps_y_on_chip():
    report = traffic_report(compile(add_mul(tiled=False), tiling="none").program)
    assert report.traffic_ratio == 1.0  # y: 1024 x 4096 over 32 cores = 256 KiB per core fits in LX
    assert report.lx_peak == 256 * 1024 and report.cores_used == 32


def test_matmul_time_is_compute_bound():
    g = fspyre.GraphBuilder("mm")
    g.dim("M", 1024)
    g.dim("K", 4096)
    g.dim("N", 4096)
    a = g.input("a", ["M", "K"], "float16")
    b = g.input("b", ["K", "N"], "float16")
    g.output("c", g.matmul(a, b))
    report = traffic_report(compile(g.build(), tiling="none").program)
    (kernel,) = report.kernels
    macs = 1024 * 4096 * 4096
    # M / m = 32 rows per core: PT efficiency (32 / 64)^0.35; the output area per core
    # 32 x 4096 = 2 x 65536 re-reads 0.45 log2(2) of the operands
    assert kernel.macs == macs and kernel.compute_ns == pytest.approx(macs / 32 / (1140 * 0.5 ** 0.35))
    r, w = (1024 * 4096 + 4096 * 4096) * 2, 1024 * 4096 * 2
    assert kernel.peak_memory_ns == pytest.approx((r + w) / 150 + 0.00574 * w)
    assert kernel.memory_ns == pytest.approx(kernel.peak_memory_ns + r * 0.45 / 150)
    assert kernel.split_ns == 0  # area 131072 is not above the split penalty's threshold
    assert kernel.bound == "compute" and report.time_ns == pytest.approx(kernel.compute_ns)


def test_reports_are_frozen_and_print_their_assumptions(golden):
    report = traffic_report(compile(add_mul()).program)
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.cores = 1  # type: ignore[misc]
    text = str(report)
    assert "150 B/ns" in text and "0.00574" in text and "1140" in text and "traffic ratio 1.000" in text
    assert "traffic ratio 1.500" in str(traffic_report(compile(softmax()).program))  # x read twice
    golden.check("add_mul_tiled", text)
    golden.check("softmax_tiled", str(traffic_report(compile(softmax()).program)))


def test_a_read_after_a_write_in_the_same_iteration_is_counted():
    # Tiled add_mul with y in HBM: add reads a, b and writes y; mul reads y back and c.
    size = 1024 * 4096 * 2
    report = traffic_report(compile(add_mul(), lx_planning=False).program)
    assert report.hbm_read == 4 * size == 33_554_432 and report.hbm_write == 2 * size
