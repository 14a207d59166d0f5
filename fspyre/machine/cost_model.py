"""The anchor's fitted time terms (torch-spyre ``cost_model.py::predict_ops``), as functions of
the quantities ``traffic_report`` reads off a program's OpSpecs.

Each term only ever adds time to the lower bound ``max(bytes / peak, MACs / rate)``: a derate
is a factor in (0, 1] that divides memory time, a penalty is a non-negative number of
nanoseconds or bytes. The anchor fitted them on its own kernels: pointwise 8.5 % RMS,
reductions 7.2 %, matmul 26-40 % (docs/tiling.md, "The cost model").
"""

from __future__ import annotations

import math

# Tile-height bandwidth derate of a coarse-tiled kernel: eff = min(1, (h / 7.9)^0.5 (cols /
# 2048)^0.38), below 0.248 the gentler eff0 (raw / eff0)^0.1; a matmul min(0.95, (h / 13)^0.68).
TILE_H0 = 7.9
TILE_COLS0 = 2048
TILE_EFF0 = 0.248
MATMUL_TILE_H0 = 13.0
MATMUL_TILE_EFF_MAX = 0.95
# LX-spill derate of a coarse-tiled kernel whose per-core working set 2 h cols bytes passes
# 512 KiB: (cap / ws)^exp, exp 0.06; a matmul's cap is 2 MiB, exp 0.15.
LX_SPILL_WS = 512 << 10
LX_SPILL_EXP = 0.06
MATMUL_LX_SPILL_WS = 2 << 20
MATMUL_LX_SPILL_EXP = 0.15
# Matmul: PT efficiency min(1, (M/m / 64)^0.35); operand spill (|A| + |B|) min(1.5, 0.45
# log2(max(1, area / 65536))) with area = (M/m)(N/n); split penalty max(0, area - 131072)
# (2.62e-3 max(0, log2(fan_long / 8)) + 2.88e-3 max(0, log2(fan_short / 16))) us.
PT_ROWS0 = 64
PT_EXP = 0.35
SPILL_AREA0 = 65536
SPILL_SLOPE = 0.45
SPILL_MAX = 1.5
SPLIT_AREA0 = 131072
SPLIT_LONG_US = 2.62e-3
SPLIT_SHORT_US = 2.88e-3
# A kernel of one non-matmul reduction: min(150, 114 + 61 e^(-rows / 3700)) B/ns.
REDUCTION_BW_BASE = 114.0
REDUCTION_BW_RISE = 61.0
REDUCTION_ROWS0 = 3700.0
# The reduction bandwidth's share by cores used, interpolated log-linearly in the core count.
CORE_SHARE = ((1, 0.11), (2, 0.22), (4, 0.43), (8, 0.54), (16, 0.54), (32, 1.0))


def tile_efficiency(rows: float, cols: float, matmul: bool) -> float:
    """Bandwidth derate of a coarse tile of ``rows`` rows of ``cols`` elements per core."""
    if matmul:
        return min(MATMUL_TILE_EFF_MAX, (rows / MATMUL_TILE_H0) ** 0.68)
    raw = (rows / TILE_H0) ** 0.5 * (cols / TILE_COLS0) ** 0.38
    if raw >= TILE_EFF0:
        return min(1.0, raw)
    return TILE_EFF0 * (raw / TILE_EFF0) ** 0.1


def lx_spill_derate(working_set: int, matmul: bool) -> float:
    cap, exp = (MATMUL_LX_SPILL_WS, MATMUL_LX_SPILL_EXP) if matmul else (LX_SPILL_WS, LX_SPILL_EXP)
    return (cap / working_set) ** exp if working_set > cap else 1.0


def core_share(cores: int) -> float:
    """The anchor's g(cores): the share of the card's bandwidth ``cores`` cores reach."""
    if cores <= CORE_SHARE[0][0]:
        return CORE_SHARE[0][1]
    for (c0, g0), (c1, g1) in zip(CORE_SHARE, CORE_SHARE[1:]):
        if cores <= c1:
            return g0 + (g1 - g0) * (math.log2(cores) - math.log2(c0)) / (math.log2(c1) - math.log2(c0))
    return CORE_SHARE[-1][1]


def core_underuse(used: int, cores: int) -> float:
    """An op on ``used`` of the machine's ``cores`` moves bytes at g(used) / g(cores) of the
    rate the whole machine reaches (1 when it uses every core)."""
    return min(1.0, core_share(used) / core_share(cores)) if used < cores else 1.0


def reduction_bandwidth_derate(rows: int, peak: float) -> float:
    """A lone row reduction's bandwidth over rows rows, as a share of ``peak`` B/ns (<= 1)."""
    return min(peak, REDUCTION_BW_BASE + REDUCTION_BW_RISE * math.exp(-rows / REDUCTION_ROWS0)) / peak


def pt_efficiency(rows_per_core: int) -> float:
    return min(1.0, (rows_per_core / PT_ROWS0) ** PT_EXP)


def matmul_spill_factor(area: int) -> float:
    """Extra operand bytes per operand byte a matmul re-reads when its output area per core is large."""
    return min(SPILL_MAX, SPILL_SLOPE * math.log2(max(1.0, area / SPILL_AREA0)))


def split_penalty_ns(area: int, m: int, n: int) -> float:
    long, short = max(m, n), min(m, n)
    us = max(0, area - SPLIT_AREA0) * (SPLIT_LONG_US * max(0.0, math.log2(long / 8))
                                       + SPLIT_SHORT_US * max(0.0, math.log2(short / 16)))
    return us * 1000.0
