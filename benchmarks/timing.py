"""Shared by the benchmark scripts: repeat a call, keep the best and the median, print a table."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence


def timed(fn: Callable[[], object], repeats: int) -> tuple[float, float]:
    """(best, median) seconds over ``repeats`` calls; the best is the figure least disturbed
    by other work on the machine, the median shows how noisy it was."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times), statistics.median(times)


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

    return (f"{cpu}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
            f"numpy {numpy.__version__}, {platform.system()} {platform.release()}")


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"
