"""lx_memmap_svg: one box per LX buffer over its lifetime, a panel per distinct core map, the
axis to capacity, a legend; hbm_memmap_svg: every HBM tensor."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from workloads import compile, softmax

import fspyre
from fspyre.ir.program import op_specs
from fspyre.pretty.memmap import hbm_memmap_svg, lx_memmap_svg

SVG = "{http://www.w3.org/2000/svg}"


def boxes(svg: str) -> list[str]:
    root = ET.fromstring(svg)
    return [r.find(f"{SVG}title").text for r in root.iter(f"{SVG}rect") if r.find(f"{SVG}title") is not None]


def test_softmax_memmap(golden):
    comp = compile(softmax(128, 256, row_tiles=2))
    svg = lx_memmap_svg(comp)
    assert boxes(svg) == [
        "buf0: LX [0, 256) live [0, 2)",  # 64-row tiles over 32 cores: 2 rows, one stick each
        "buf1: LX [256, 1280) live [1, 3)",
        "buf2: LX [256, 1280) live [2, 5)",  # exp writes in place of sub's result
        "buf3: LX [0, 256) live [3, 5)",  # the row sums reuse the row maxima's slot
    ]
    assert "cores 0-31" in svg
    assert lx_memmap_svg(comp.program) == svg
    golden.check("softmax_128x256_2_tiles", svg)


def test_cores_holding_different_buffers_get_their_own_panels():
    g = fspyre.GraphBuilder("two_chains")
    g.dim("A", 32)
    g.dim("C", 24)
    g.dim("B", 64)
    x1 = g.input("x1", ["A", "B"], "float16")
    x2 = g.input("x2", ["C", "B"], "float16")
    g.output("z1", g.neg(g.exp(x1)))  # 32 rows: 32 cores
    g.output("z2", g.neg(g.exp(x2)))  # 24 rows: 24 cores
    comp = compile(g.build(), tiling="none")
    svg = lx_memmap_svg(comp)
    assert "cores 0-23" in svg and "cores 24-31" in svg
    assert len(boxes(svg)) == 3  # both buffers on cores 0-23, one on cores 24-31


def test_a_program_without_lx_says_so():
    comp = compile(softmax(128, 256, row_tiles=2), lx_planning=False)
    assert "no buffer lives in LX" in lx_memmap_svg(comp)


def test_lx_map_runs_to_capacity_with_a_detail_and_a_legend():
    comp = compile(softmax(128, 256, row_tiles=2))
    svg = lx_memmap_svg(comp)
    capacity = comp.program.lx_bytes
    assert f"to capacity, {capacity / (1 << 20):.3g} MiB" in svg  # the first axis ends at the capacity
    assert "detail, first" in svg and "high water" in svg  # 1280 of 1.5 MiB: a detail panel follows
    for name in ("buf0", "buf1", "buf2", "buf3"):  # every buffer named in the legend, however small
        assert f">{name}: " in svg
    assert len(boxes(svg)) == 4  # each box's tooltip once


def test_hbm_map_holds_every_hbm_tensor():
    comp = compile(softmax(128, 256, row_tiles=2))
    svg = hbm_memmap_svg(comp)
    program = comp.program
    tips = boxes(svg)
    assert {t.split(":")[0] for t in tips} >= {a.buffer for a in program.kernel_args}
    nops = len(op_specs(program))
    for a in program.kernel_args:  # kernel arguments live for the whole program at their address
        assert any(t.startswith(f"{a.buffer}: HBM [{a.address}, ") and t.endswith(f"live [0, {nops})") for t in tips)
    assert f"in {program.hbm_bytes} bytes" in svg
    ET.fromstring(svg)  # well-formed
