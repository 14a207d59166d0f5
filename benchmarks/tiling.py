"""Tilings compared: the gallery (examples/*.py) at its default sizes and at large ones, each
compiled untiled (`none`), as hand-hinted in the example (`hints`) and with the hints removed
and the tiling searched (`auto`). Figures are the traffic report's: HBM bytes over the
compulsory bytes, the LX peak per core, the estimated time, and the compile time (best of 3).

Large sizes: softmax 8192x8192, attention with 4096 queries and keys, mlp over 4096 tokens,
layernorm / residual layernorm / rmsnorm over 16384 tokens (their model width is the
example's, 768), add_mul 8192x8192.
"""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path

from timing import machine_line, ms, table, timed

import fspyre
from fspyre.frontend.files import load_torch_file
from fspyre.ir.graph import Graph
from fspyre.machine.report import traffic_report

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
LARGE = {
    "add_mul": {"rows": 8192, "cols": 8192},
    "softmax": {"rows": 8192, "cols": 8192},
    "attention": {"queries": 4096, "keys": 4096},
    "mlp": {"tokens": 4096},
    "layernorm": {"tokens": 16384},
    "residual_layernorm": {"tokens": 16384},
    "rmsnorm": {"tokens": 16384},
}


def unhinted(graph: Graph) -> Graph:
    """The same graph with every hint scope removed: what `auto` sees without help."""
    return replace(graph, hints=(), ops=tuple(replace(op, hints=()) for op in graph.ops))


def measure(graph: Graph, tiling: str) -> list[str]:
    comp = fspyre.compile(graph, tiling=tiling)
    t = timed(lambda: fspyre.compile(graph, tiling=tiling), 3)
    r = traffic_report(comp.program)
    return [f"{r.traffic_ratio:.3f}", f"{r.lx_peak}", f"{r.time_ns / 1000:.1f}", ms(t.best)]


def over_its_row(kind: str, rows: int = 512, cols: int = 8192, count: int = 8) -> Graph:
    """softmax / log_softmax over [rows, cols] float16 as the front end emits it (casts to
    float32 and back), hinted over its reduction dim: an online softmax in two loops."""
    g = fspyre.GraphBuilder(f"{kind}_over_its_row")
    B, C = g.dim("B", rows), g.dim("C", cols)
    x = g.input("x", (B, C), "float16")
    with g.hint(slices={"C": count}):
        d = g.sub(s := g.cast(x, "float32"), g.amax(s, ["C"], keepdim=True))
        total = g.sum(e := g.exp(d), ["C"], keepdim=True)
        y = g.div(e, total) if kind == "softmax" else g.sub(d, g.log(total))
        g.output("y", g.cast(y, "float16"))
    return g.build()


def main() -> int:
    print(f"tilings of the gallery ({machine_line()})\n")
    rows, ratios = [], []
    for name in sorted(LARGE):
        for size, args in (("default", {}), ("large", LARGE[name])):
            graph = load_torch_file(EXAMPLES / f"{name}.py", **args).graph
            found = {mode: measure(g, mode) for mode, g in
                     (("none", graph), ("hints", graph), ("auto", unhinted(graph)))}
            ratios.append(float(found["auto"][0]))
            rows.append([f"{name} ({size})", *(v for mode in ("none", "hints", "auto") for v in found[mode])])
    heads = ["example"] + [f"{mode} {what}" for mode in ("none", "hints", "auto")
                           for what in ("ratio", "LX peak", "est us", "compile ms")]
    print(table(heads, rows))
    geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    print(f"\nauto: geometric mean of the HBM ratio {geo:.3f} over {len(ratios)} cases")
    # tiled over the reduced dim (docs/tiling.md, "Online softmax"): x kept in LX slots
    # between the two loops where each core's rows fit, else read again by the second loop
    rows = [[f"{kind} 512x8192 C:8", *measure(over_its_row(kind), "none"), *measure(over_its_row(kind), "hints")]
            for kind in ("softmax", "log_softmax")]
    heads = ["over its row"] + [f"{mode} {what}" for mode in ("none", "hints")
                                for what in ("ratio", "LX peak", "est us", "compile ms")]
    print("\n" + table(heads, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
