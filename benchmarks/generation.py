"""``LlamaForCausalLM.generate`` through ``torch.compile(backend="fspyre")`` (issue 23): a tiny
Llama (one layer, hidden 64, 2 heads, vocabulary 64, random weights), a prompt of 5 tokens,
greedy decoding of ``--tokens`` new tokens, under Dynamo's default automatic dynamic shapes
and under ``dynamic=True``. Prints, per mode: whether the tokens are eager's, the fspyre
compiles (counted by the backend's ``on_graph`` hook, called before every ``fspyre.compile``;
how many were symbolic), and CPU time (``time.process_time``) against eager's.

    python benchmarks/generation.py [--tokens 32] [--tiling none|auto] [--mode default|dynamic]
"""

from __future__ import annotations

import argparse
import os
import time
import warnings

import torch

from fspyre.testing.transformer import tiny_llama_lm


def measure(mode: str, tiling: str, tokens: int) -> str:
    lm = tiny_llama_lm()
    ids = torch.randint(0, 64, (1, 5), generator=torch.Generator().manual_seed(1))
    kw = dict(max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
    with torch.no_grad():
        start = time.process_time()
        want = lm.generate(ids, **kw)
        eager = time.process_time() - start
    graphs: list = []
    torch._dynamo.reset()
    lm.forward = torch.compile(lm.forward, backend="fspyre", dynamic=True if mode == "dynamic" else None,
                               options={"tiling": tiling, "cores": 8, "on_graph": graphs.append})
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        start = time.process_time()
        got = lm.generate(ids, **kw)
        compiled = time.process_time() - start
    symbolic = sum(g.symbolic for g in graphs)
    lines = [f"{mode}: tokens equal to eager: {torch.equal(got, want)} ({got.shape[1]} tokens); "
             f"{len(graphs)} fspyre compiles ({symbolic} symbolic); {compiled:.1f} s CPU vs eager {eager:.2f} s"]
    lines += [f"  warning: {str(w.message)[:300]}" for w in caught if "fspyre" in str(w.message)]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--tiling", default="none", choices=("none", "auto"))
    p.add_argument("--mode", choices=("default", "dynamic"), action="append")
    a = p.parse_args()
    print(f"tiling={a.tiling}, {a.tokens} new tokens, load average {os.getloadavg()[0]:.1f}")
    for mode in a.mode or ("default", "dynamic"):
        print(measure(mode, a.tiling, a.tokens), flush=True)


if __name__ == "__main__":
    main()
