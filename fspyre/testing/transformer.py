"""A transformer stack built with GraphBuilder: ``blocks`` pre-norm blocks of RMSNorm,
multi-head attention and a SwiGLU MLP, each with its own weights, float16 [S, D] hidden states.

Used to measure the tiling search at model scale (benchmarks/search.py) and in its tests: a
repeated block is the same subproblem for the search's memo. ``hinted`` puts each block's
RMSNorms and MLP under an ``S`` hint scope, what a user would write by hand."""

from __future__ import annotations

import contextlib

from fspyre.ir.builder import GraphBuilder, Tensor
from fspyre.ir.graph import Graph


def transformer_stack(blocks: int = 1, *, seq: int = 128, model: int = 256, heads: int = 4, hidden: int | None = None,
                      hinted: bool = False, row_tiles: int = 2) -> Graph:
    """``hidden`` is the MLP width (4 x ``model`` when not given); the head dim is
    ``model // heads``."""
    g = GraphBuilder(f"transformer{blocks}")
    S, D = g.dim("S", seq), g.dim("D", model)
    g.dim("T", seq)  # the keys: the sequence renamed, so scores have both
    H, E, F = g.dim("H", heads), g.dim("E", model // heads), g.dim("F", hidden or 4 * model)
    x = g.input("x", (S, D), "float16")

    def scope():
        return g.hint(slices={"S": row_tiles}) if hinted else contextlib.nullcontext()

    def rmsnorm(h: Tensor, w: Tensor) -> Tensor:
        with scope():
            r = g.rsqrt(g.add(g.mean(g.mul(h, h), ["D"], keepdim=True), 1e-6))
            return g.mul(g.mul(h, r), w)

    for b in range(blocks):
        w1, w2 = g.input(f"norm1_{b}", (D,), "float16"), g.input(f"norm2_{b}", (D,), "float16")
        wq, wk, wv = (g.input(f"w{n}_{b}", (D, H, E), "float16") for n in "qkv")
        wo = g.input(f"wo_{b}", (H, E, D), "float16")
        wg, wu = g.input(f"wg_{b}", (D, F), "float16"), g.input(f"wu_{b}", (D, F), "float16")
        wd = g.input(f"wd_{b}", (F, D), "float16")
        n = rmsnorm(x, w1)
        q = g.matmul(n, wq, "D")  # [S, H, E]
        k = g.rename(g.matmul(n, wk, "D"), {"S": "T"})  # [T, H, E]
        v = g.rename(g.matmul(n, wv, "D"), {"S": "T"})
        scores = g.mul(g.matmul(q, k, "E"), (model // heads) ** -0.5)  # [H, S, T]
        e = g.exp(g.sub(scores, g.amax(scores, ["T"], keepdim=True)))
        p = g.div(e, g.sum(e, ["T"], keepdim=True))
        att = g.matmul(p, v, "T")  # [H, S, E]
        h = g.add(x, g.sum(g.matmul(att, wo, "E"), ["H"]))  # the heads' projections summed: [S, D]
        m = rmsnorm(h, w2)
        with scope():
            a = g.mul(g.silu(g.matmul(m, wg, "D")), g.matmul(m, wu, "D"))  # [S, F]
            x = g.add(h, g.matmul(a, wd, "F"))
    g.output("y", x)
    return g.build()


def layer_norm_matmul(rows: int, hinted_count: int | None = None) -> Graph:
    """LayerNorm feeding a matmul, bf16 [rows, 1536] @ [1536, 1031], optionally hinted T:count:
    at a row count that is a product of two primes (2,047 = 23 x 89) only tailed counts tile it
    well (the search's benchmark and its test)."""
    g = GraphBuilder("layer_norm_matmul")
    g.dim("T", rows), g.dim("D", 1536), g.dim("N", 1031)
    x, w = g.input("x", ["T", "D"], "bfloat16"), g.input("w", ["D", "N"], "bfloat16")
    gamma = g.input("gamma", ["D"], "bfloat16")
    with g.hint(slices={"T": hinted_count}) if hinted_count else contextlib.nullcontext():
        xc = g.sub(x, g.mean(x, ["D"], keepdim=True))
        var = g.mean(g.mul(xc, xc), ["D"], keepdim=True)
        g.output("out", g.matmul(g.mul(g.mul(xc, g.rsqrt(g.add(var, 1e-5))), gamma), w, "D"))
    return g.build()


def rms_norm_matmul(rows: int, hinted_count: int | None = None) -> Graph:
    """RMSNorm feeding a matmul, fp16 [rows, 1024] @ [1024, 2048], optionally hinted T:count
    (the search's benchmark and its test: at 1,003 and 1,147 rows the search's groups met
    keep_resident's bundled trials, docs/tiling.md "Why auto missed a plan")."""
    g = GraphBuilder("rms_norm_matmul")
    g.dim("T", rows), g.dim("D", 1024), g.dim("N", 2048)
    x, w = g.input("x", ["T", "D"], "float16"), g.input("w", ["D", "N"], "float16")
    gamma = g.input("gamma", ["D"], "float16")
    with g.hint(slices={"T": hinted_count}) if hinted_count else contextlib.nullcontext():
        r = g.rsqrt(g.add(g.mean(g.mul(x, x), ["D"], keepdim=True), 1e-6))
        g.output("out", g.matmul(g.mul(g.mul(x, r), gamma), w, "D"))
    return g.build()


def silu_mlp(tokens: int = 257, model: int = 320, hidden: int = 1280) -> Graph:
    """y = silu(x @ w1 + b1) @ w2 in float32 (the search's benchmark and its test: on 3 cores
    and 64 KiB the first matmul, bias and silu fit only from 8 tiles of the hidden dim)."""
    g = GraphBuilder("silu_mlp")
    g.dim("S", tokens), g.dim("D", model), g.dim("F", hidden)
    x = g.input("x", ["S", "D"], "float32")
    w1, w2 = g.input("w1", ["D", "F"], "float32"), g.input("w2", ["F", "D"], "float32")
    a = g.silu(g.add(g.matmul(x, w1, "D"), g.input("b1", ["F"], "float32")))
    g.output("y", g.matmul(a, w2, "F"))
    return g.build()



def residual_layernorm(rows: int = 4093, d: int = 256) -> Graph:
    """h = x + a (an output), y = layernorm(h) * gamma + beta (an output), float16 [rows, d]:
    10 ops, of which mean(h) and h - mean cost nothing untiled beside h's kernel (their results
    stay in LX), what a segment's boundary can send through HBM."""
    g = GraphBuilder("resln")
    g.dim("T", rows), g.dim("D", d)
    x, a = g.input("x", ["T", "D"], "float16"), g.input("a", ["T", "D"], "float16")
    gam, bet = g.input("gamma", ["D"], "float16"), g.input("beta", ["D"], "float16")
    h = g.add(x, a)
    g.output("h", h)
    hc = g.sub(h, g.mean(h, ["D"], keepdim=True))
    r = g.rsqrt(g.add(g.mean(g.mul(hc, hc), ["D"], keepdim=True), 1e-5))
    g.output("y", g.add(g.mul(g.mul(hc, r), gam), bet))
    return g.build()


def logsumexp(rows: int = 129, cols: int = 3000) -> Graph:
    """log(sum(exp(x - amax(x)))) + amax(x) over C, float16 x[rows, cols]."""
    g = GraphBuilder("logsumexp")
    g.dim("R", rows), g.dim("C", cols)
    x = g.input("x", ["R", "C"], "float16")
    mx = g.amax(x, ["C"], keepdim=True)
    g.output("lse", g.add(g.log(g.sum(g.exp(g.sub(x, mx)), ["C"], keepdim=True)), mx))
    return g.build()


def softmax_lse(rows: int = 4093, cols: int = 256, dtype: str = "float16") -> Graph:
    """softmax over C computed in float32 with two outputs, the probabilities cast back and the
    logsumexp log(sum) + max: 9 ops, the probabilities' div and cast a sibling branch inside
    the lse's producers."""
    g = GraphBuilder("softmax_lse")
    g.dim("R", rows), g.dim("C", cols)
    xf = g.cast(g.input("x", ["R", "C"], dtype), "float32")
    m = g.amax(xf, ["C"], keepdim=True)
    e = g.exp(g.sub(xf, m))
    s = g.sum(e, ["C"], keepdim=True)
    g.output("p", g.cast(g.div(e, s), dtype))
    g.output("lse", g.add(g.log(s), m))
    return g.build()


def tiny_llama_lm(layers: int = 1):
    """A tiny ``LlamaForCausalLM`` with random weights (seed 0; hidden 64, two heads, vocabulary
    64), eager attention, in eval mode: generation's test and benchmark model. Needs
    ``transformers`` and ``torch``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=2,
                      num_hidden_layers=layers, vocab_size=64, max_position_embeddings=128)
    cfg._attn_implementation = "eager"
    return LlamaForCausalLM(cfg).eval()
