"""Machine-model interpreter time next to plain numpy computing the same graph in the same
dtype, measured in the same run: for each case the numpy function and ``fspyre.run`` of the
untiled and the tiled compile are called in alternation, ``REPEATS`` times, and the table
shows medians and their ratios to numpy.

numpy computes in the graph's dtype (float16 here), except matmul, which is compared with a
float32 BLAS matmul of the same operands (numpy has no float16 BLAS). BLAS runs on one thread,
as the interpreter's GEMM does: on a shared 2-CPU host a threaded BLAS spin-waits against
the other processes (512^3 float32 took 24 ms threaded against 2.4 ms on one thread, same
run) and its idle threads keep spinning into the next measured call. The interpreter
additionally encodes every value to device bytes (DLFloat16) at its allocated addresses and
decodes it back, per core, with bounds and read-before-write checks (``checks="full"``, the
default); the ``fast`` column is ``fspyre.run(..., checks="fast")`` on the tiled compile.
The ``cpu ms`` column is the CPU time of numpy's call and of the interpreter's, untiled and
tiled (medians): on a shared machine wall-clock ratios move with the load, CPU time much less.

The gallery rows (examples/*.py at their default sizes) compare with ``fspyre.evaluate``,
the untiled reference evaluator on host arrays, instead of hand-written numpy."""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from timing import machine_line, table

import fspyre
from fspyre.ir.graph import Graph
from fspyre.machine.hostio import random_inputs

REPEATS = 5
CORES = 32


def medians(fns: dict[str, Callable[[], object]], repeats: int = REPEATS) -> tuple[dict[str, float], dict[str, float]]:
    """Median wall and CPU seconds of each function, the functions called in alternation."""
    walls: dict[str, list[float]] = {k: [] for k in fns}
    cpus: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t, c = time.perf_counter(), time.process_time()
            fn()
            walls[k].append(time.perf_counter() - t)
            cpus[k].append(time.process_time() - c)
    return ({k: statistics.median(v) for k, v in walls.items()}, {k: statistics.median(v) for k, v in cpus.items()})


def add_mul(rows: int = 1024, cols: int = 4096) -> Graph:
    g = fspyre.GraphBuilder("add_mul")
    A, B = g.dim("A", rows), g.dim("B", cols)
    a, b, c = (g.input(n, (A, B), "float16") for n in "abc")
    with g.hint(slices={"A": 2}), g.hint(slices={"B": 4}):
        z = g.mul(g.add(a, b), c)
    g.output("z", z)
    return g.build()


def softmax(rows: int = 4096, cols: int = 2048) -> Graph:
    g = fspyre.GraphBuilder("softmax")
    g.dim("M", rows)
    g.dim("N", cols)
    x = g.input("x", ["M", "N"], "float16")
    with g.hint(slices={"M": 4}):
        m = g.amax(x, ["N"], keepdim=True)
        e = g.exp(g.sub(x, m))
        y = g.div(e, g.sum(e, ["N"], keepdim=True))
    g.output("y", y)
    return g.build()


def _layernorm(g: fspyre.GraphBuilder, x, w, b, dim: str):
    mu = g.mean(x, [dim], keepdim=True)
    xc = g.sub(x, mu)
    var = g.mean(g.mul(xc, xc), [dim], keepdim=True)
    return g.add(g.mul(g.mul(xc, g.rsqrt(g.add(var, 1e-5))), w), b)


def layernorm(tokens: int = 256, width: int = 768) -> Graph:
    g = fspyre.GraphBuilder("layernorm")
    T, D = g.dim("T", tokens), g.dim("D", width)
    x = g.input("x", (T, D), "float16")
    w, b = g.input("w", (D,), "float16"), g.input("b", (D,), "float16")
    with g.hint(slices={"T": 4}):
        g.output("y", _layernorm(g, x, w, b, "D"))
    return g.build()


def matmul(n: int = 512) -> Graph:
    g = fspyre.GraphBuilder("matmul")
    M, K, N = g.dim("M", n), g.dim("K", n), g.dim("N", n)
    a, b = g.input("a", (M, K), "float16"), g.input("b", (K, N), "float16")
    with g.hint(slices={"M": 4}):
        g.output("y", g.matmul(a, b))
    return g.build()


def bert_layer(seq: int = 128, width: int = 256, hidden: int = 1024) -> Graph:
    """One encoder layer, single head: q, k, v projections, softmax attention, output
    projection, residual + layernorm, gelu MLP, residual + layernorm (41 ops)."""
    g = fspyre.GraphBuilder("bert_layer")
    S, D, F = g.dim("S", seq), g.dim("D", width), g.dim("F", hidden)
    g.dim("Sk", seq)
    g.dim("E", width)
    x = g.input("x", (S, D), "float16")
    p = {n: g.input(n, dims, "float16") for n, dims in [
        ("wq", (D, "E")), ("wk", (D, "E")), ("wv", (D, "E")), ("bq", ("E",)), ("bk", ("E",)), ("bv", ("E",)),
        ("wo", ("E", D)), ("bo", (D,)), ("g1", (D,)), ("b1", (D,)),
        ("w1", (D, F)), ("c1", (F,)), ("w2", (F, D)), ("c2", (D,)), ("g2", (D,)), ("b2", (D,))]}
    k = g.rename(g.add(g.matmul(x, p["wk"]), p["bk"]), {"S": "Sk"})  # every query tile reads all keys
    v = g.rename(g.add(g.matmul(x, p["wv"]), p["bv"]), {"S": "Sk"})
    with g.hint(slices={"S": 4}):
        q = g.add(g.matmul(x, p["wq"]), p["bq"])
        scores = g.mul(g.matmul(q, g.permute(k, ("E", "Sk")), contract="E"), 1.0 / width**0.5)
        m = g.amax(scores, ["Sk"], keepdim=True)
        e = g.exp(g.sub(scores, m))
        att = g.div(e, g.sum(e, ["Sk"], keepdim=True))
        ctx = g.matmul(att, v, contract="Sk")
        h = _layernorm(g, g.add(x, g.add(g.matmul(ctx, p["wo"]), p["bo"])), p["g1"], p["b1"], "D")
        f = g.gelu(g.add(g.matmul(h, p["w1"]), p["c1"]))
        y = _layernorm(g, g.add(h, g.add(g.matmul(f, p["w2"]), p["c2"])), p["g2"], p["b2"], "D")
    g.output("y", y)
    return g.build()


def numpy_layernorm(x, w, b):
    mu = x.mean(-1, keepdims=True)
    xc = x - mu
    return xc / np.sqrt((xc * xc).mean(-1, keepdims=True) + np.float16(1e-5)) * w + b


def numpy_softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def numpy_bert(i):
    """In float16 except the matmuls, which run as float32 BLAS (numpy has no float16 BLAS)."""
    mm = lambda p, q: (p.astype(np.float32) @ q.astype(np.float32)).astype(np.float16)  # noqa: E731
    x = i["x"]
    q, k, v = (mm(x, i[f"w{n}"]) + i[f"b{n}"] for n in "qkv")
    att = numpy_softmax(mm(q, k.T) * np.float16(1.0 / x.shape[1] ** 0.5))
    h = numpy_layernorm(x + mm(mm(att, v), i["wo"]) + i["bo"], i["g1"], i["b1"])
    f = mm(h, i["w1"]) + i["c1"]
    f32 = f.astype(np.float32)  # numpy has no erf: torch's gelu on the same values
    import torch
    f = torch.nn.functional.gelu(torch.from_numpy(f32)).numpy().astype(np.float16)
    return numpy_layernorm(h + mm(f, i["w2"]) + i["c2"], i["g2"], i["b2"])


def inputs_of(graph: Graph) -> dict[str, np.ndarray]:
    return random_inputs({n: graph.buffer_table()[n].type for n in graph.inputs}, seed=0)


def cases():
    machine = fspyre.machine.spyre(cores=CORES)
    g = add_mul()
    i = inputs_of(g)
    yield "add_mul 1024x4096 fp16", g, i, (lambda: (i["a"] + i["b"]) * i["c"]), "numpy fp16", machine
    g = softmax()
    i = inputs_of(g)
    yield "softmax 4096x2048 fp16", g, i, (lambda: numpy_softmax(i["x"])), "numpy fp16", machine
    g = layernorm()
    i = inputs_of(g)
    yield "layernorm 256x768 fp16", g, i, (lambda: numpy_layernorm(i["x"], i["w"], i["b"])), "numpy fp16", machine
    g = matmul()
    i = inputs_of(g)
    a32, b32 = i["a"].astype(np.float32), i["b"].astype(np.float32)
    yield "matmul 512^3 fp16", g, i, (lambda: a32 @ b32), "numpy fp32 BLAS", machine
    g = bert_layer()
    i = inputs_of(g)
    yield f"bert_layer S=128 D=256 ({len(g.ops)} ops)", g, i, (lambda: numpy_bert(i)), "numpy fp16+fp32 BLAS", machine
    from fspyre.frontend.files import load_torch_file

    for path in sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.py")):
        prog = load_torch_file(path)
        g, i = prog.graph, dict(prog.inputs)
        yield (f"gallery {path.stem}", g, i,
               (lambda g=g, i=i: fspyre.evaluate(g, i, machine)), "fspyre.evaluate", machine)


ONE_THREAD = {v: "1" for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}


def main() -> int:
    if any(os.environ.get(k) != v for k, v in ONE_THREAD.items()):
        # BLAS reads these when it loads, and numpy is loaded: start again with them set
        os.environ.update(ONE_THREAD)
        os.execv(sys.executable, [sys.executable, *sys.argv])
    print(f"fspyre.run next to numpy, {CORES} cores, medians of {REPEATS} alternating runs ({machine_line()})\n")
    headers = ["case", "vs", "ms", "fspyre.run untiled", "tiled", "tiled, checks=fast", "cpu ms: ref / untiled / tiled"]
    rows = []
    only = sys.argv[1:]
    for name, graph, inputs, ref, ref_name, machine in cases():
        if only and not any(o in name for o in only):
            continue
        untiled = fspyre.compile(graph, machine, tiling="none")
        tiled = fspyre.compile(graph, machine, tiling="hints")
        for comp in (untiled, tiled):
            assert fspyre.check(graph, inputs, machine=machine, comp=comp).equal, f"{name}: interpreter disagrees"
        t, cpu = medians({"ref": ref, "untiled": lambda: fspyre.run(untiled, inputs),
                          "tiled": lambda: fspyre.run(tiled, inputs),
                          "fast": lambda: fspyre.run(tiled, inputs, checks="fast")})
        cell = lambda k: f"{t[k] * 1e3:.1f} ({t[k] / t['ref']:.1f}x)"
        rows.append([name, ref_name, f"{t['ref'] * 1e3:.2f}", cell("untiled"), cell("tiled"), cell("fast"),
                     f"{cpu['ref'] * 1e3:.1f} / {cpu['untiled'] * 1e3:.1f} / {cpu['tiled'] * 1e3:.1f}"])
        print(" | ".join(rows[-1]), file=sys.stderr, flush=True)
    print(table(headers, rows))
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
