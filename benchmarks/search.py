"""The tiling search (`tiling="auto"`) measured: what it costs and how close it gets.

Part 1, compile cost: each graph compiled with its hints and with `auto` (hints removed), each
in a fresh process, CPU time (`time.process_time`) of `fspyre.compile`; the candidates the
search compiled, the segments whose judgement a structurally equal segment gave (reused) and
those its lower bound screened out. Graphs: a GraphBuilder transformer stack
(`fspyre.testing.transformer`: RMSNorm, attention, SwiGLU) of 1, 2 and 4 blocks at S=128,
D=256 (growth exponent from 1 to 4 blocks), one block at S=2048, D=4096, F=11008, and a 4-layer
tiny `LlamaForCausalLM` captured from `transformers` (no hints: `none` is its baseline).

Part 2, quality: auto's estimate against the best plan of an exhaustive enumeration of a stated
space (SPACE, printed with the table): every cut of the op order into contiguous groups, each
group untiled or one loop level over one dim its ops share (an output dim every op iterates, an
accumulation or online reduction dim) with any count of that dim's whole-stick count set.
Where the space holds at most LIMIT plans, every plan is compiled whole. Otherwise every
group's every option is compiled as the search judges a candidate, a plan's score is the sum
over its tiled groups of what the group changes against its ops untiled in the hinted program
(the search's own objective, a sum over groups), and a dynamic program over the cuts finds the
least-score plan of the whole space exactly; that plan is compiled whole. Nothing else is
pruned. Graphs: the gallery (examples/*.py, hints removed) at its default sizes and at
benchmarks/tiling.py's large ones, and graphs where fit and time disagree (a norm feeding a
large matmul, softmax on a 4-core 64 KiB machine, three or four outputs sharing an exp or a
sigmoid, directly or each through a neg, on the default machine and on small ones, a softmax
over 50,257 columns as the front end emits it, odd sizes on 8 cores and 64 KiB, a silu MLP on 3
cores whose hidden dim fits only past three spilling counts, rmsnorm -> matmul over 1,003 and
1,147 rows, a softmax on 12 cores with 2 MiB LX and a logsumexp over 3,000 columns on 8 cores
and 64 KiB, where the groups judged alone do not add up in the whole program, a product
reading a concatenation of two computed pieces, two causal-masked attentions whose mask op
does not iterate the heads, a softmax with its logsumexp and a residual layernorm). The
enumeration's score is a sum over groups, as the search's is, so where the whole program's
correction finds a plan that sum misses auto's gap is negative.
`none` and the hints are printed beside: auto must not be estimated slower than either.

Part 3, checks: x[4093, 256] on 8 cores and 64 KiB LX with auto (its counts, rows a tile and
cores used), and the HBM ratio of 1,000 rows hinted into 3 row tiles (a peeled tail) beside 999.

    PYTHONPATH=. python benchmarks/search.py          # every part
    PYTHONPATH=. python benchmarks/search.py cost     # part 1 only (quality, checks: the others)
"""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
import time
import warnings
from dataclasses import replace
from pathlib import Path

from timing import machine_line, table

import fspyre
from fspyre.errors import FspyreError
from fspyre.ir.graph import Graph
from fspyre.ir.plans import Group, Level, TilingPlan
from fspyre.machine.report import traffic_report
from fspyre.machine.spyre import Machine, spyre
from fspyre.stages import tiling_search as ts
from fspyre.stages.tiling_plan import TilingOptions, plan_tiling, split_at_tiled_reductions
from fspyre.testing.transformer import (
    layer_norm_matmul,
    logsumexp,
    residual_layernorm,
    rms_norm_matmul,
    silu_mlp,
    softmax_lse,
    transformer_stack,
)

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
LIMIT = 1000


def unhinted(graph: Graph) -> Graph:
    return replace(graph, hints=(), ops=tuple(replace(op, hints=()) for op in graph.ops))


# -- part 1: compile cost, one graph and mode per fresh process ----------------------------------
def tiny_llama() -> Graph:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from fspyre.frontend import from_torch

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                      num_hidden_layers=4, vocab_size=256, max_position_embeddings=64,
                      attn_implementation="eager", use_cache=False)

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lm = LlamaForCausalLM(cfg).eval()

        def forward(self, ids, mask):
            return self.lm(input_ids=ids, attention_mask=mask, use_cache=False).logits

    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(3))
    return from_torch(Logits(), (ids, torch.ones(2, 16, dtype=torch.int64)))


COST = {
    "transformer x1 S=128 D=256": lambda hinted: transformer_stack(1, hinted=hinted),
    "transformer x2 S=128 D=256": lambda hinted: transformer_stack(2, hinted=hinted),
    "transformer x4 S=128 D=256": lambda hinted: transformer_stack(4, hinted=hinted),
    "transformer x1 S=2048 D=4096 F=11008": lambda hinted: transformer_stack(
        1, seq=2048, model=4096, hidden=11008, hinted=hinted),
    "LlamaForCausalLM 4 layers (tiny)": lambda hinted: tiny_llama(),
}


def one(name: str, mode: str) -> dict:
    graph = COST[name](mode == "hints")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        start = time.process_time()
        comp = fspyre.compile(graph, tiling=mode)
        cpu = time.process_time() - start
    search = comp.stages.get("tiling_search")
    out = {"cpu": cpu, "us": traffic_report(comp.program).time_ns / 1000, "ops": len(graph.ops)}
    if search is not None:
        out |= {"compiled": search.compiled, "reused": search.reused, "screened": search.screened}
    return out


def fresh(name: str, mode: str) -> dict:
    done = subprocess.run([sys.executable, __file__, "--one", name, mode], capture_output=True, text=True,
                          check=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    return json.loads(done.stdout.splitlines()[-1])


def cost() -> None:
    rows, auto_cpu = [], {}
    for name in COST:
        base = "none" if "Llama" in name else "hints"
        b, a = fresh(name, base), fresh(name, "auto")
        auto_cpu[name] = a["cpu"]
        rows.append([name, str(a["ops"]), f"{base} {b['cpu']:.2f}", f"{a['cpu']:.2f}", f"{a['cpu'] / b['cpu']:.1f}x",
                     str(a["compiled"]), str(a["reused"]), str(a["screened"]), f"{b['us']:.1f}", f"{a['us']:.1f}"])
    print(table(["graph", "ops", "baseline CPU s", "auto CPU s", "ratio", "compiled", "reused", "screened",
                 "baseline est us", "auto est us"], rows))
    t1, t4 = auto_cpu["transformer x1 S=128 D=256"], auto_cpu["transformer x4 S=128 D=256"]
    print(f"\nauto CPU growth from 1 to 4 blocks: {t4 / t1:.2f}x, exponent {math.log(t4 / t1) / math.log(4):.2f}")


# -- part 2: the gap to an enumeration -----------------------------------------------------------
def norm_matmul(n: int = 4096) -> Graph:
    g = fspyre.GraphBuilder("norm_matmul")
    T, D, N = g.dim("T", n), g.dim("D", n), g.dim("N", n)
    x = g.input("x", (T, D), "float16")
    y = g.mul(x, g.rsqrt(g.add(g.mean(g.mul(x, x), ["D"], keepdim=True), 1e-6)))
    g.output("out", g.matmul(y, g.input("w", (D, N), "float16"), "D"))
    return g.build()


def softmax(rows: int, cols: int, name: str = "softmax", cast: bool = False) -> Graph:
    g = fspyre.GraphBuilder(name)
    g.dim("S", rows)
    g.dim("N", cols)
    x = g.input("x", ["S", "N"], "float16")
    s = g.cast(x, "float32") if cast else x
    e = g.exp(g.sub(s, g.amax(s, ["N"], keepdim=True)))
    y = g.div(e, g.sum(e, ["N"], keepdim=True))
    g.output("y", g.cast(y, "float16") if cast else y)
    return g.build()


def shared_exp(rows: int = 2048, cols: int = 2048, dtype: str = "float16", fn: str = "exp", outputs: int = 3,
               branch: bool = False) -> Graph:
    """e = fn(x) read by ``outputs`` siblings, each a graph output (no sibling reads another),
    with ``branch`` each through a neg."""
    g = fspyre.GraphBuilder("shared_exp")
    g.dim("S", rows)
    g.dim("N", cols)
    e = getattr(g, fn)(g.input("x", ["S", "N"], dtype))
    for k, op in enumerate(("mul", "add", "sub", "maximum")[:outputs]):
        y = getattr(g, op)(e, g.input("pqrs"[k], ["S", "N"], dtype))
        g.output("abcd"[k], g.neg(y) if branch else y)
    return g.build()


def odd_rows(rows: int = 4093, cols: int = 256) -> Graph:
    g = fspyre.GraphBuilder("odd_rows")
    g.dim("S", rows)
    g.dim("N", cols)
    x = g.input("x", ["S", "N"], "float16")
    g.output("y", g.mul(g.add(x, g.input("b", ["S", "N"], "float16")), x))
    return g.build()


def exp_neg(rows: int, cols: int) -> Graph:
    g = fspyre.GraphBuilder("exp_neg")
    g.dim("R", rows), g.dim("C", cols)
    g.output("y", g.exp(g.neg(g.input("x", ["R", "C"], "float16"))))
    return g.build()


def silu(rows: int, cols: int, dtype: str = "float32") -> Graph:
    g = fspyre.GraphBuilder("silu")
    g.dim("R", rows), g.dim("C", cols)
    x = g.input("x", ["R", "C"], dtype)
    g.output("y", g.mul(x, g.sigmoid(x)))
    return g.build()


def gqa(groups: int = 2, heads: int = 4, seq: int = 197, embed: int = 64) -> Graph:
    """Grouped-query attention: ``heads`` query heads per kv head, fp16."""
    g = fspyre.GraphBuilder("gqa")
    g.dim("G", groups), g.dim("R", heads), g.dim("S", seq), g.dim("T", seq), g.dim("E", embed)
    q = g.input("q", ["G", "R", "S", "E"], "float16")
    k, v = g.input("k", ["G", "T", "E"], "float16"), g.input("v", ["G", "T", "E"], "float16")
    s = g.mul(g.matmul(q, k, "E"), embed ** -0.5)
    e = g.exp(g.sub(s, g.amax(s, ["T"], keepdim=True)))
    g.output("o", g.matmul(g.div(e, g.sum(e, ["T"], keepdim=True)), v, "T"))
    return g.build()


def causal(heads: int, seq: int, embed: int, dtype: str, hinted: bool = False) -> Graph:
    """Causal-masked attention: where(gt(causal[S, T], 0.5), scores, -1e4), the mask's gt first
    in program order (it does not iterate the heads); ``hinted``: slices={"H": heads} over all."""
    import contextlib

    g = fspyre.GraphBuilder("causal")
    g.dim("H", heads), g.dim("S", seq), g.dim("T", seq), g.dim("E", embed)
    q, k = g.input("q", ["H", "S", "E"], dtype), g.input("k", ["H", "T", "E"], dtype)
    v, mask = g.input("v", ["H", "T", "E"], dtype), g.input("causal", ["S", "T"], dtype)
    with g.hint(slices={"H": heads}) if hinted else contextlib.nullcontext():
        s = g.where(g.gt(mask, 0.5), g.mul(g.matmul(q, k, "E"), embed ** -0.5), -1e4)
        e = g.exp(g.sub(s, g.amax(s, ["T"], keepdim=True)))
        g.output("o", g.matmul(g.div(e, g.sum(e, ["T"], keepdim=True)), v, "T"))
    return g.build()


def concat_product(rows: int = 2049) -> Graph:
    """y = concat([exp(a), -b], columns) * w, fp16: the pieces' producers, a copy per piece,
    and a product that reads the whole result."""
    g = fspyre.GraphBuilder("concat_product")
    g.dim("R", rows), g.dim("C1", 256), g.dim("C2", 192), g.dim("C", 448)
    pieces = [g.exp(g.input("a", ["R", "C1"], "float16")), g.neg(g.input("b", ["R", "C2"], "float16"))]
    g.output("y", g.mul(g.concat(pieces, 1, ["R", "C"]), g.input("w", ["R", "C"], "float16")))
    return g.build()


def gallery() -> list[tuple[str, Graph, Graph, Machine]]:
    """The gallery (examples/*.py) at its default sizes and at benchmarks/tiling.py's large ones."""
    from tiling import LARGE

    from fspyre.frontend.files import load_torch_file

    out = []
    for path in sorted(EXAMPLES.glob("*.py")):
        if path.stem in ("llama_decoder_layer",):
            continue  # needs its S hint to capture; measured in part 1 as a model
        for size, args in (("", {}), (" (large)", LARGE.get(path.stem))):
            if args is None:
                continue
            graph = load_torch_file(path, **args).graph
            out.append((path.stem + size, graph, unhinted(graph), spyre()))
    return out


def designed() -> list[tuple[str, Graph, Graph, Machine]]:
    small = spyre(cores=4, lx_bytes=64 * 1024)
    cases = [("rmsnorm -> matmul 4096^3", norm_matmul(), spyre()),
             ("softmax 2048x2048, 4 cores 64 KiB", softmax(2048, 2048), small),
             ("three outputs share exp", shared_exp(), spyre()),
             ("three outputs share sigmoid [1023, 1500], 8 cores 64 KiB",
              shared_exp(1023, 1500, fn="sigmoid"), spyre(cores=8, lx_bytes=64 * 1024)),
             ("four outputs share exp bf16 [640, 2050], 32 cores 32 KiB",
              shared_exp(640, 2050, "bfloat16", outputs=4), spyre(cores=32, lx_bytes=32 * 1024)),
             ("three outputs share sigmoid, each through a neg, 8 cores 64 KiB",
              shared_exp(1023, 1500, fn="sigmoid", branch=True), spyre(cores=8, lx_bytes=64 * 1024)),
             ("softmax over 50,257 columns (fp32 casts)", softmax(64, 50257, "vocab", cast=True), spyre()),
             ("x[4093, 256], 8 cores 64 KiB", odd_rows(), spyre(cores=8, lx_bytes=64 * 1024))]
    out = [(n, g, g, m) for n, g, m in cases]
    # odd sizes: rows a product of two primes (divisors only into tiles of 23 or 89 rows;
    # hinted T:8, tiles of 256 and a tail), and a pointwise op whose whole-stick columns,
    # every row in each tile, beat its row tiles
    out.append(("layernorm -> matmul, 2,047 rows, 16 cores 256 KiB", layer_norm_matmul(2047, 8),
                layer_norm_matmul(2047), spyre(cores=16, lx_bytes=256 * 1024)))
    out.append(("exp(-x[333, 4096]), 8 cores 32 KiB", exp_neg(333, 4096), exp_neg(333, 4096),
                spyre(cores=8, lx_bytes=32 * 1024)))
    # a dim that fits only past three spilling counts (F:8 of the MLP's hidden dim), and
    # groups whose whole program met keep_resident's bundled trials (hinted T:4)
    out.append(("silu MLP fp32 257x320x1280, 3 cores 64 KiB", silu_mlp(), silu_mlp(),
                spyre(cores=3, lx_bytes=64 * 1024)))
    for rows in (1003, 1147):
        out.append((f"rmsnorm -> matmul, {rows:,} rows, 8 cores 128 KiB", rms_norm_matmul(rows, 4),
                    rms_norm_matmul(rows), spyre(cores=8, lx_bytes=128 * 1024)))
    # where the groups judged alone do not add up in the whole program (the correction in
    # plan_correction._corrected): a softmax whose sub spills untiled, and odd rows hinted T:4
    out.append(("softmax 1021x1000, 12 cores 2 MiB", softmax(1021, 1000), softmax(1021, 1000),
                spyre(cores=12, lx_bytes=2 << 20)))
    # counts past a tie (R:4 and R:5 tie, R:8 wins) and a dim alone that the shrink had tiled
    # only under two dims that never fit (S:13 fits alone, S:16 does not)
    out.append(("x * sigmoid(x) fp32 [10007, 64], 13 cores 64 KiB", silu(10007, 64), silu(10007, 64),
                spyre(cores=13, lx_bytes=64 * 1024)))
    out.append(("GQA attention fp16 S=197, 16 cores 128 KiB", gqa(), gqa(), spyre(cores=16, lx_bytes=128 * 1024)))
    # a concatenation's two pieces, one result only once both are written (a buffer of regions)
    out.append(("concat([exp(a), -b]) * w fp16 [2049, 448], 4 cores 32 KiB", concat_product(), concat_product(),
                spyre(cores=4, lx_bytes=32 * 1024)))
    # a segment the DP screened by claims the whole program does not bear out (the amax's
    # share in place of the untiled sub's and exp's read/write turnaround)
    out.append(("logsumexp fp16 [129, 3000], 8 cores 64 KiB", logsumexp(), logsumexp(),
                spyre(cores=8, lx_bytes=64 * 1024)))
    # a chain longer than the window whose leading op (the mask's gt) does not iterate the
    # heads: the tail without it, and the heads with it hoisted (the second hinted H:6)
    out.append(("causal-masked attention fp16 H=4 S=333, 12 cores 256 KiB", causal(4, 333, 64, "float16"),
                causal(4, 333, 64, "float16"), spyre(cores=12, lx_bytes=256 * 1024)))
    out.append(("causal-masked attention fp32 H=6 S=129, 3 cores 48 KiB", causal(6, 129, 32, "float32", True),
                causal(6, 129, 32, "float32"), spyre(cores=3, lx_bytes=48 * 1024)))
    # a consumer's producers with a sibling branch between them, past the window; and free
    # untiled neighbours a group's boundary would send through HBM
    out.append(("softmax + logsumexp fp16 [4093, 256], 8 cores 64 KiB", softmax_lse(), softmax_lse(),
                spyre(cores=8, lx_bytes=64 * 1024)))
    out.append(("residual layernorm fp16 [4093, 256], 11 cores 256 KiB", residual_layernorm(), residual_layernorm(),
                spyre(cores=11, lx_bytes=256 * 1024)))
    return out


def estimate(graph: Graph, machine: Machine, plan) -> float:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return traffic_report(fspyre.compile(graph, machine, tiling=plan).program).time_ns
    except FspyreError:
        return math.inf


SPACE = ("every cut of the op order into contiguous groups; each group untiled, or one loop level over one "
         "dim its ops share (an output dim every op iterates, an accumulation or online reduction dim) with "
         "any count of that dim's whole-stick count set (`_counts`: every divisor into whole sticks, and the "
         "tailed counts of tiles of 2^k sticks or of size / 2^k rounded up to sticks)")


def options(ctx: ts._Search, ops: tuple[str, ...]) -> list[tuple[Level, ...]]:
    """The group untiled, or one level over one of its dims with every count of the dim's set."""
    members = [ctx.ops[o] for o in ops]
    dims = dict.fromkeys(ts._tileable_dims(members) + ts._accumulation_dims(members) + ts._online_dims(ctx, members))
    out: list[tuple[Level, ...]] = [()]
    for d, size in dims:
        out += [(Level(count=c, dims=(d,), source="enumerated"),) for c in ts._counts(ctx, members, d, size)]
    return out


def plan_of(graph: Graph, groups: list[tuple[tuple[str, ...], tuple[Level, ...]]], online) -> TilingPlan:
    order = tuple(op.name for op in graph.ops)
    plan = TilingPlan(order=order, groups=tuple(Group(ops=o, levels=lv) for o, lv in groups if lv))
    return split_at_tiled_reductions(graph, plan, online)


def enumerate_best(graph: Graph, machine: Machine) -> tuple[float, int, str]:
    """(best whole-program estimate, compiles, how) over SPACE.

    Where SPACE holds at most LIMIT plans, every plan is compiled whole ("every plan").
    Otherwise ("every group"): every option of every contiguous group of ops is compiled as
    the search judges a candidate (the group's ops as a graph of their own), and a plan is
    scored as the search scores it -- the sum over its tiled groups of the group's estimate
    less what its ops cost untiled in the hinted program, an untiled group changing nothing.
    That score is a sum over groups, so the dynamic program over cuts below is exact: it
    finds the plan of least score among all of SPACE's plans without listing them (it drops
    a plan only for another with the same last group and a better prefix). That plan is
    compiled whole and its estimate is the enumeration's."""
    hinted = plan_tiling(graph, TilingOptions(mode="hints"))
    base = ts._compiled(ts.SearchOptions(), machine, graph, hinted)
    ctx = ts._Search(graph=graph, machine=machine, options=ts.SearchOptions(), ops=graph.op_table(),
                     buffers=graph.buffer_table(), readers=ts._readers(graph),
                     outputs=frozenset(o.buffer for o in graph.outputs),
                     untiled=ts._alone(base, graph))
    names = [op.name for op in graph.ops]
    n = len(names)
    spans = {(a, b): options(ctx, tuple(names[a:b])) for a in range(n) for b in range(a + 1, n + 1)}
    total = [1] + [0] * n  # plans of names[:b]
    for b in range(1, n + 1):
        total[b] = sum(total[a] * len(spans[a, b]) for a in range(b))
    online = ctx.options.online
    if total[n] <= LIMIT:
        best, compiled = math.inf, 0
        cuts = [c for k in range(n) for c in itertools.combinations(range(1, n), k)]
        for cut in cuts:
            ends = [0, *cut, n]
            groups = [(ends[k], ends[k + 1]) for k in range(len(ends) - 1)]
            for choice in itertools.product(*(spans[g] for g in groups)):
                try:
                    plan = plan_of(graph, [(tuple(names[a:b]), lv) for (a, b), lv in zip(groups, choice)], online)
                except FspyreError:
                    continue
                best, compiled = min(best, estimate(graph, machine, plan)), compiled + 1
        return best, compiled, f"every plan ({total[n]})"
    # score of each group's best option: (change, HBM change, levels)
    change: dict[tuple[int, int], tuple[float, int, tuple[Level, ...]]] = {}
    compiled = 0
    for (a, b), opts in spans.items():
        untiled_t, untiled_b = ts._in_place(ctx, names[a:b])
        found = (0.0, 0, ())
        for lv in opts[1:]:
            cand = ts._judge(ctx, names[a:b], lv)
            compiled += 1
            if cand.verdict != "refused":
                found = min(found, (cand.time_ns - untiled_t, cand.hbm_bytes - untiled_b, lv), key=lambda t: t[:2])
        change[a, b] = found
    best = [(0.0, 0)] + [(math.inf, 0)] * n
    back = [0] * (n + 1)
    for b in range(1, n + 1):
        for a in range(b):
            t = (best[a][0] + change[a, b][0], best[a][1] + change[a, b][1])
            if t < best[b]:
                best[b], back[b] = t, a
    groups, b = [], n
    while b > 0:
        a = back[b]
        groups.append((tuple(names[a:b]), change[a, b][2]))
        b = a
    plan = plan_of(graph, groups[::-1], online)
    return estimate(graph, machine, plan), compiled + 1, f"every group ({total[n]:.3g} plans)"


def quality() -> None:
    rows, gaps, slower = [], [], []
    print(f"enumerated space: {SPACE}; at most {LIMIT} plans: each compiled whole, else every group's every "
          f"option compiled and the plan of least summed score (exact over the space) compiled whole\n")
    for name, hinted, graph, machine in gallery() + designed():
        auto = estimate(graph, machine, "auto")
        none, hints = estimate(graph, machine, "none"), estimate(hinted, machine, "hints")
        start = time.process_time()
        best, n, how = enumerate_best(graph, machine)
        took = time.process_time() - start
        best = min(best, none, hints)
        gap = auto / best - 1
        gaps.append(gap)
        if auto > min(none, hints) * (1 + 1e-9):
            slower.append(name)
        rows.append([name, str(len(graph.ops)), f"{none / 1000:.1f}", f"{hints / 1000:.1f}", f"{auto / 1000:.1f}",
                     f"{best / 1000:.1f}", f"{gap:+.1%}", f"{n} compiles, {how}", f"{took:.0f}"])
    print(table(["graph", "ops", "none us", "hints us", "auto us", "enumerated best us", "auto gap", "enumeration",
                 "CPU s"], rows))
    print(f"\nlargest gap {max(gaps):+.1%} over {len(gaps)} graphs; auto estimated slower than none or the hints on: "
          f"{', '.join(slower) or 'none'}")


# -- part 3: the plans issue 21 names ------------------------------------------------------------
def tailed(rows: int, count: int = 3, cols: int = 256) -> Graph:
    """A pointwise chain hinted into ``count`` row tiles: 1,000 rows leave a peeled tail, 999 none."""
    g = fspyre.GraphBuilder(f"tailed{rows}")
    g.dim("R", rows)
    g.dim("C", cols)
    x = g.input("x", ["R", "C"], "float16")
    with g.hint(slices={"R": count}):
        g.output("z", g.exp(g.add(g.mul(x, 0.5), g.input("w", ["R", "C"], "float16"))))
    return g.build()


def checks() -> None:
    machine = spyre(cores=8, lx_bytes=64 * 1024)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        comp = fspyre.compile(odd_rows(), machine, tiling="auto")
    report = traffic_report(comp.program)
    levels = [lv for g in comp.stages["tiling_plan"].groups for lv in g.levels]
    rows = [f"{'/'.join(lv.dims)}:{lv.count} ({-(-4093 // lv.count)} rows a tile)" for lv in levels] or ["untiled"]
    print(f"x[4093, 256] on 8 cores, 64 KiB LX, auto: {', '.join(rows)}; cores used per op "
          f"{sorted({o.cores for o in report.ops})} of 8; {report.time_ns / 1000:.1f} us")
    ratios = {rows: traffic_report(fspyre.compile(tailed(rows), tiling="hints").program).traffic_ratio
              for rows in (1000, 999)}
    print(f"R:3 hinted: 1,000 rows (a peeled tail) HBM ratio {ratios[1000]:.3f}, 999 rows (no tail) "
          f"{ratios[999]:.3f}")


def main() -> int:
    if sys.argv[1:2] == ["--one"]:
        print(json.dumps(one(sys.argv[2], sys.argv[3])))
        return 0
    parts = sys.argv[1:] or ["cost", "quality", "checks"]
    print(f"the tiling search ({machine_line()})\n")
    if "cost" in parts:
        cost()
    if "quality" in parts:
        print()
        quality()
    if "checks" in parts:
        print()
        checks()
    return 0


if __name__ == "__main__":
    sys.exit(main())
