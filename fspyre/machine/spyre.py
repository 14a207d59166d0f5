"""The Spyre machine model: the numbers every stage plans against.

Sources, all in torch-spyre (the anchor) unless said otherwise:
torch-spyre ``_inductor/config.py`` (SENCORES), ``scratchpad/allocator.py`` (LX window), the
device allocator's 16 GiB segments and the card's 128 GB LPDDR5 less 16 GB ECC (HBM_BYTES),
``work_division.py`` (MAX_SPAN_BYTES, #3162), ``cost_model.py`` (fitted bandwidth and MAC rates).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

from fspyre.errors import MachineError
from fspyre.ir.kinds import FP16_FORMATS, DeviceFormat, Fp16Format

MAX_CORES = 32  # cores per card; SENCORES must be 1..32 (config.py, work_division.py)
LX_PHYSICAL_BYTES = 2 << 20  # 2 MiB SRAM per core (allocator.py _LX_PHYSICAL_CAPACITY_BYTES)
LX_RESERVED_BYTES = 64 << 10  # program/debug reservation (allocator.py)
LX_BACKEND_FRACTION = 0.2  # DXP_LX_FRAC_AVAIL default: the backend's share of LX
LX_ALIGN = 128  # LX allocation granularity (allocator.py)
SPAN_LIMIT_BYTES = 65535 * 4096  # MAX_SPAN_BYTES since #3162: MVLOC 65535 entries of 4096 B
HBM_ALIGN = 128  # pool and argument alignment (hbm_pool_planning.py)
HBM_SEGMENT_BYTES = 16 << 30  # the device allocator hands out HBM in 16 GiB segments
# Device memory a program may use: a card carries 128 GB of LPDDR5, 16 GB of it for ECC, and
# the anchor's device allocator maps the ~112 GB left as 7 segments of 16 GiB (offsets 0, 16G,
# ..., 96G). fspyre plans one flat space for arguments and its pool, so its limit is the seven
# segments; the anchor's pool alone is capped at segment 0 less 2 GiB (MAX_POOL_SIZE = 14 GiB).
HBM_BYTES = 7 * HBM_SEGMENT_BYTES
HBM_BYTES_PER_NS = 150.0  # fitted one-directional peak, cost_model.py CostParams
HBM_TURNAROUND_NS_PER_BYTE = 0.00574  # read/write turnaround alpha, cost_model.py
MACS_PER_NS_PER_CORE = 1140.0  # sustained 2-D matmul rate, cost_model.py (fitted)


def lx_window(backend_fraction: float = LX_BACKEND_FRACTION) -> int:
    """Bytes of LX the front end may plan: 1,625,344 at the default 0.2 (allocator.py). The
    backend's share is a fraction in [0, 1]: outside it the window would pass the 2,031,616
    bytes the allocator tracks, or be negative."""
    if (isinstance(backend_fraction, bool) or not isinstance(backend_fraction, numbers.Real)
            or not 0 <= backend_fraction <= 1):
        raise MachineError(f"lx_window: backend_fraction={backend_fraction!r} must be a number in [0, 1] (the "
                           f"backend's share of LX; default {LX_BACKEND_FRACTION})")
    tracker = LX_PHYSICAL_BYTES - LX_RESERVED_BYTES  # 2,031,616
    raw = int(tracker * (1 - backend_fraction))
    return -(-raw // LX_ALIGN) * LX_ALIGN


@dataclass(frozen=True, slots=True, kw_only=True)
class Machine:
    """One Spyre card as the compiler sees it. ``fp16_format`` picks how float16 is stored:
    ``"SEN169_FP16"`` (IBM DLFloat16, the default, as on the hardware) or ``"IEEE_FP16"``."""

    cores: int = MAX_CORES
    lx_bytes: int = lx_window()
    span_limit: int = SPAN_LIMIT_BYTES
    fp16_format: Fp16Format = "SEN169_FP16"
    hbm_bytes: int = HBM_BYTES  # device memory for kernel arguments and intermediates

    def __post_init__(self) -> None:
        if not isinstance(self.cores, int) or isinstance(self.cores, bool) or not 1 <= self.cores <= MAX_CORES:
            raise MachineError(f"cores={self.cores!r}: a Spyre card has 1..{MAX_CORES} cores; pass cores in that range")
        if not isinstance(self.lx_bytes, int) or self.lx_bytes < 0 or self.lx_bytes % LX_ALIGN:
            raise MachineError(
                f"lx_bytes={self.lx_bytes!r}: LX capacity must be a non-negative multiple of {LX_ALIGN} bytes"
            )
        if self.lx_bytes > LX_PHYSICAL_BYTES:
            raise MachineError(f"lx_bytes={self.lx_bytes}: more than the {LX_PHYSICAL_BYTES} bytes of LX a core has")
        if (not isinstance(self.hbm_bytes, int) or isinstance(self.hbm_bytes, bool) or self.hbm_bytes <= 0
                or self.hbm_bytes % HBM_ALIGN):
            raise MachineError(
                f"hbm_bytes={self.hbm_bytes!r}: HBM capacity must be a positive multiple of {HBM_ALIGN} bytes "
                f"(a card has {HBM_BYTES})"
            )
        if self.fp16_format not in FP16_FORMATS:
            raise MachineError(f"fp16_format={self.fp16_format!r}: use 'SEN169_FP16' (DLFloat16) or 'IEEE_FP16'")

    def device_format(self, dtype: str) -> DeviceFormat:
        """Device data format name of a host dtype (docs/semantics.md)."""
        return {
            "float16": self.fp16_format,
            "bfloat16": "BF16",
            "float32": "IEEE_FP32",
            "int32": "IEEE_INT32",
            "bool": self.fp16_format,  # the anchor stores bool as SEN169_FP16 (types_mapping.h)
        }[dtype]


def spyre(cores: int = MAX_CORES, *, lx_bytes: int | None = None, fp16_format: Fp16Format = "SEN169_FP16",
          hbm_bytes: int = HBM_BYTES) -> Machine:
    # A core count often comes from numpy (a sweep, a shape): accept its integers as ints.
    if isinstance(cores, numbers.Integral) and not isinstance(cores, bool):
        cores = int(cores)
    if isinstance(lx_bytes, numbers.Integral) and not isinstance(lx_bytes, bool):
        lx_bytes = int(lx_bytes)
    if isinstance(hbm_bytes, numbers.Integral) and not isinstance(hbm_bytes, bool):
        hbm_bytes = int(hbm_bytes)
    return Machine(cores=cores, lx_bytes=lx_window() if lx_bytes is None else lx_bytes, fp16_format=fp16_format,
                   hbm_bytes=hbm_bytes)
