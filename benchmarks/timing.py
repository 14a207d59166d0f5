"""Shared by the benchmark scripts: repeat a call, keep the best and the median, print a table."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Timing:
    best: float  # seconds, the fastest wall-clock run: the one least disturbed by other work
    median: float  # seconds, wall clock: how noisy the runs were
    cpu: float  # seconds of this process's CPU time in the fastest-CPU run: steadier on a busy machine


def timed(fn: Callable[[], object], repeats: int) -> Timing:
    walls, cpus = [], []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return Timing(best=min(walls), median=statistics.median(walls), cpu=min(cpus))


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    line = lambda r: "  ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
    return "\n".join([line(headers), "  ".join("-" * w for w in widths), *map(line, rows)])


def machine_line() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        model = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        cpu = next((ln.split(":", 1)[1].strip() for ln in model.splitlines() if ln.startswith("Model name")), cpu)
    except OSError:
        pass
    import numpy

    # Wall-clock figures scale with whatever else runs: the load average says how busy it was.
    load = os.getloadavg()[0]
    return (f"{cpu}, {os.cpu_count()} CPUs, load average {load:.1f}, Python {platform.python_version()}, "
            f"numpy {numpy.__version__}, {platform.system()} {platform.release()}")


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"
