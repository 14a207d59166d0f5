"""The traffic report as an artifact: what ``fspyre.machine.report.traffic_report`` computes
from a Program (HBM and LX bytes per op, kernels and their time estimate). Frozen records like
every stage artifact, so the report prints (``str``, ``fspyre.pretty``) and round-trips JSON
through ``fspyre.ir.serialize``."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class OpTraffic:
    name: str
    op: str
    kernel: int
    iterations: int
    cores: int
    hbm_read: int
    hbm_write: int
    lx_read: int  # summed over cores
    lx_write: int
    macs: int
    core_macs: int = 0  # the MACs of the core with the largest slice (macs / cores when even)


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelEstimate:
    index: int
    ops: tuple[str, ...]
    hbm_read: int
    hbm_write: int
    macs: int
    memory_ns: float  # with the fitted derates and spill
    compute_ns: float
    split_ns: float = 0.0
    peak_memory_ns: float = 0.0  # the same bytes at the fitted peak: the lower bound the derates raise

    @property
    def time_ns(self) -> float:
        return max(self.memory_ns, self.compute_ns) + self.split_ns

    @property
    def bound(self) -> str:
        return "compute" if self.compute_ns > self.memory_ns else "memory"


@dataclass(frozen=True, slots=True, kw_only=True)
class TrafficReport:
    program: str
    ops: tuple[OpTraffic, ...]
    kernels: tuple[KernelEstimate, ...]
    compulsory_read: int  # graph inputs read once
    compulsory_write: int  # graph outputs written once
    lx_peak_per_core: tuple[int, ...]
    cores_used: int
    cores: int
    # the sum of the kernels' times, computed exactly and rounded once: the same bytes charged
    # to differently merged kernels give the same total to the last bit (keep_resident and the
    # tiling search compare such programs)
    time_ns: float
    assumptions: tuple[str, ...] = ()  # the model's assumptions, in words (fspyre.machine.report.ASSUMPTIONS)

    def _repr_html_(self) -> str:
        """A notebook shows the whole report."""
        from fspyre.pretty import html_text

        return html_text(str(self))

    def __repr__(self) -> str:  # short: str() is the whole report
        return (f"TrafficReport({self.program!r}: HBM {self.hbm_bytes} B, traffic ratio {self.traffic_ratio:.3f}, "
                f"LX peak {self.lx_peak} B per core, {len(self.kernels)} kernels, {self.time_ns / 1000:.2f} us)")

    @property
    def hbm_read(self) -> int:
        return sum(o.hbm_read for o in self.ops)

    @property
    def hbm_write(self) -> int:
        return sum(o.hbm_write for o in self.ops)

    @property
    def hbm_bytes(self) -> int:
        return self.hbm_read + self.hbm_write

    @property
    def lx_bytes(self) -> int:
        return sum(o.lx_read + o.lx_write for o in self.ops)

    @property
    def compulsory_bytes(self) -> int:
        return self.compulsory_read + self.compulsory_write

    @property
    def traffic_ratio(self) -> float:
        return self.hbm_bytes / self.compulsory_bytes if self.compulsory_bytes else math.inf

    @property
    def lx_peak(self) -> int:
        return max(self.lx_peak_per_core, default=0)


    def __str__(self) -> str:
        rows = [("op", "fn", "kernel", "iters", "cores", "HBM read", "HBM write", "LX read", "LX write")]
        rows += [(o.name, o.op, str(o.kernel), str(o.iterations), str(o.cores), str(o.hbm_read), str(o.hbm_write),
                  str(o.lx_read), str(o.lx_write)) for o in self.ops]
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        table = ["  " + "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
                 for r in rows]
        lines = [f"traffic report {self.program}: {self.cores_used} of {self.cores} cores used", *table]
        lines.append(f"  HBM {self.hbm_bytes} B (read {self.hbm_read}, write {self.hbm_write}); compulsory "
                     f"{self.compulsory_bytes} B (read {self.compulsory_read}, write {self.compulsory_write}); "
                     f"traffic ratio {self.traffic_ratio:.3f}")
        lines.append(f"  LX {self.lx_bytes} B moved over all cores; LX peak {self.lx_peak} B per core")
        lines.append(f"  time estimate {self.time_ns / 1000:.2f} us")
        for k in self.kernels:
            split = f", split {k.split_ns / 1000:.2f} us" if k.split_ns else ""
            lines.append(f"    kernel {k.index} ({', '.join(k.ops)}): R {k.hbm_read} B, W {k.hbm_write} B, memory "
                         f"{k.memory_ns / 1000:.2f} us (at peak {k.peak_memory_ns / 1000:.2f} us), compute "
                         f"{k.compute_ns / 1000:.2f} us{split} -> {k.bound} bound")
        lines.append("  assumptions:")
        lines += [f"    - {a}" for a in self.assumptions]
        return "\n".join(lines)
