"""Compile time per op of five graph families at 100, 1,000 and 10,000 ops, and how it grows.

A linear pipeline keeps the time per op flat, so each tenfold larger graph takes about ten
times as long (growth ~10x); quadratic work in graph size would show as ~100x. The families:
a chain of pointwise ops; a fan-out/fan-in (one input read by n/2 ops whose results are all
alive until a chain of adds joins them: thousands of buffers live at once, the allocator's
worst case); reductions (sum then broadcast subtract); matmuls; and the chain under two
nested hint scopes (tiling="hints"). The last lines compare tiling="auto" with "hints"."""

from __future__ import annotations

import sys
import time

from timing import machine_line, ms, table, timed

import fspyre

FNS = ("add", "mul", "sub", "maximum")
SIZES = ((100, 5), (1000, 3), (10000, 1))  # (ops, repeats)


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


def fan(n: int):
    """a read by n/2 ops (a + b_i cycling the pointwise fns with b), all joined by a chain of adds."""
    g = fspyre.GraphBuilder(f"fan{n}")
    M, N = g.dim("M", 256), g.dim("N", 1024)
    a, b = g.input("a", (M, N), "float16"), g.input("b", (M, N), "float16")
    outs = [getattr(g, FNS[i % len(FNS)])(a, b) for i in range(n // 2)]
    x = outs[0]
    for y in outs[1:]:
        x = g.add(x, y)
    g.output("y", x)
    return g.build()


def reductions(n: int):
    """x <- x - sum(x over N), n/2 times: a reduction and a broadcast op per step."""
    g = fspyre.GraphBuilder(f"reductions{n}")
    M, N = g.dim("M", 256), g.dim("N", 1024)
    x = g.input("a", (M, N), "float16")
    for _ in range(n // 2):
        x = g.sub(x, g.sum(x, ["N"], keepdim=True))
    g.output("y", x)
    return g.build()


def matmuls(n: int):
    """x <- x @ w, n times, x [256, 256] and w [256, 256]."""
    g = fspyre.GraphBuilder(f"matmul{n}")
    M, K = g.dim("M", 256), g.dim("K", 256)
    x = g.input("a", (M, K), "float16")
    w = g.input("w", (K, g.dim("J", 256)), "float16")
    for _ in range(n):
        x = g.rename(g.matmul(x, w, "K"), {"J": "K"})
    g.output("y", x)
    return g.build()


def nested(n: int):
    """The chain inside nested hint scopes M:2 and N:4 (each level whole 64-element sticks)."""
    g = fspyre.GraphBuilder(f"nested{n}")
    M, N = g.dim("M", 256), g.dim("N", 1024)
    a, b = g.input("a", (M, N), "float16"), g.input("b", (M, N), "float16")
    x = a
    with g.hint(slices={"M": 2}), g.hint(slices={"N": 4}):
        for i in range(n):
            x = getattr(g, FNS[i % len(FNS)])(x, b)
    g.output("y", x)
    return g.build()


FAMILIES = {"chain": (chain, "none"), "fan-out/fan-in": (fan, "none"), "reductions": (reductions, "none"),
            "matmul": (matmuls, "none"), "nested hints": (nested, "hints")}


def main() -> int:
    print(f"compile time per op, 32 cores ({machine_line()})\n")
    machine = fspyre.machine.spyre(cores=32)
    # CPU time of this process beside wall clock: on a shared machine the wall figures carry
    # the load, the CPU figures much less of it
    rows, per_op = [], {}
    for family, (build, tiling) in FAMILIES.items():
        previous = None
        for n, repeats in SIZES:
            graph = build(n)
            ops = len(graph.ops)
            t = timed(lambda: fspyre.compile(graph, machine, tiling=tiling), repeats)
            per_op[family, n] = (t.best / ops, t.cpu / ops)
            growth = f"{t.best / previous[0]:.1f}x / {t.cpu / previous[1]:.1f}x" if previous else "-"
            rows.append([family, tiling, str(ops), ms(t.best), ms(t.cpu), f"{t.best / ops * 1e3:.2f}",
                         f"{t.cpu / ops * 1e3:.2f}", growth])
            previous = (t.best, t.cpu)
    print(table(["family", "tiling", "ops", "compile ms (best)", "cpu ms", "ms/op", "cpu ms/op",
                 "growth vs 10x fewer (wall / cpu)"], rows))
    big = SIZES[-1][0]
    print("\nms/op at the largest size against the chain's (wall / cpu): " + ", ".join(
        f"{f} {per_op[f, big][0] / per_op['chain', big][0]:.2f}x / {per_op[f, big][1] / per_op['chain', big][1]:.2f}x"
        for f in FAMILIES if f != "chain"))

    stages = stage_times(chain(1000))
    total = sum(stages.values())
    print("\nwhere the 1000-op chain's compile goes (one run):\n")
    print(table(["stage", "ms", "share"],
                [[s, ms(t), f"{t / total:.0%}"] for s, t in stages.items() if s != "graph"]))

    # the tiling search compiles candidate groups with the real stages: side by side, one run
    graph = chain(1000)
    times = {mode: timed(lambda m=mode: fspyre.compile(graph, machine, tiling=m), 3) for mode in ("hints", "auto")}
    print(f"\n1000-op chain: hints {ms(times['hints'].best)} ms, auto {ms(times['auto'].best)} ms "
          f"({times['auto'].best / times['hints'].best:.1f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
