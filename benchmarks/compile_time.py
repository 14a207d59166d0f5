"""Compile time of chains of 10, 100 and 1000 pointwise ops: total, per op, and how it grows.

A linear pipeline keeps the time per op flat, so each tenfold longer chain takes about ten
times as long (growth ~10x); quadratic work in graph size would show as ~100x."""

from __future__ import annotations

import sys
import time

from timing import machine_line, ms, table, timed

import fspyre

FNS = ("add", "mul", "sub", "maximum")
SIZES = ((10, 20), (100, 5), (1000, 3))  # (ops in the chain, repeats)


def chain(n: int):
    """x0 = a; x_{i+1} = f_i(x_i, b) cycling add/mul/sub/maximum over [256, 1024] float16."""
    g = fspyre.GraphBuilder(f"chain{n}")
    M, N = g.dim("M", 256), g.dim("N", 1024)
    a, b = g.input("a", (M, N), "float16"), g.input("b", (M, N), "float16")
    x = a
    for i in range(n):
        x = getattr(g, FNS[i % len(FNS)])(x, b)
    g.output("y", x)
    return g.build()


def stage_times(graph) -> dict[str, float]:
    """Seconds per stage, from the pipeline's own callback."""
    marks: list[tuple[str, float]] = []
    start = time.perf_counter()
    fspyre.compile(graph, fspyre.machine.spyre(cores=32), tiling="none",
                   callback=lambda name, _: marks.append((name, time.perf_counter())))
    out, last = {}, start
    for name, t in marks:
        out[name], last = t - last, t
    return out


def main() -> int:
    print(f"compile time of pointwise chains ({machine_line()})\n")
    rows, per_op, previous = [], {}, None
    for n, repeats in SIZES:
        build = timed(lambda: chain(n), repeats)
        graph = chain(n)
        t = timed(lambda: fspyre.compile(graph, fspyre.machine.spyre(cores=32), tiling="none"), repeats)
        per_op[n] = t.best / n
        growth = f"{t.best / previous:.1f}x" if previous else "-"
        rows.append([str(n), ms(build.best), ms(t.best), ms(t.median), ms(t.cpu), f"{t.best / n * 1e3:.2f}", growth])
        previous = t.best
    print(table(["ops", "build ms", "compile ms (best)", "median", "cpu ms", "ms/op", "growth vs 10x fewer"], rows))

    stages = stage_times(chain(1000))
    total = sum(stages.values())
    print("\nwhere the 1000-op compile goes (one run):\n")
    print(table(["stage", "ms", "share"],
                [[s, ms(t), f"{t / total:.0%}"] for s, t in stages.items() if s != "graph"]))
    flat = per_op[1000] / per_op[10]
    print(f"\nms/op at 1000 ops is {flat:.2f}x ms/op at 10 ops (1.0 = linear)")

    # the tiling search compiles candidate groups with the real stages: side by side, one run
    graph = chain(1000)
    times = {mode: timed(lambda m=mode: fspyre.compile(graph, fspyre.machine.spyre(cores=32), tiling=m), 3)
             for mode in ("hints", "auto")}
    print(f"\n1000-op chain: hints {ms(times['hints'].best)} ms, auto {ms(times['auto'].best)} ms "
          f"({times['auto'].best / times['hints'].best:.1f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
