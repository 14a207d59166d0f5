"""The static proof of a Llama decoder layer at its real size against one interpreter run of
the same layer at a small size (issue 25): CPU time of ``fspyre.prove`` on the layer at
S=2048, D=4096, F=11008 (32 heads of 128, 8 key/value heads), beside the CPU time of one
``fspyre.run`` of the layer at S=128, D=256, F=704 (4 heads of 64, 2 key/value heads). Each
side runs in a fresh process; compile time is printed apart and is not in either figure.

The layer is transformers' LlamaDecoderLayer as examples/llama_decoder_layer.py wraps it
(rotary embeddings, causal mask, one hint tiling S by 4), with random weights.

    PYTHONPATH=. python benchmarks/proof_time.py            # both sides
    PYTHONPATH=. python benchmarks/proof_time.py prove S D F HEADS KV   # one side, in this process
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

BIG = (2048, 4096, 11008, 32, 8)
SMALL = (128, 256, 704, 4, 2)


def layer_graph(seq: int, hidden: int, ff: int, heads: int, kv_heads: int):
    import torch
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    import fspyre
    from fspyre.frontend import declare_tensor_dim, name_tensor_dims, spyre_hint

    class DecoderLayer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            cfg = LlamaConfig(hidden_size=hidden, intermediate_size=ff, num_attention_heads=heads,
                              num_key_value_heads=kv_heads, num_hidden_layers=1, vocab_size=128,
                              max_position_embeddings=max(seq, 1024), attn_implementation="eager")
            self.layer = LlamaDecoderLayer(cfg, 0)
            self.rotary = LlamaRotaryEmbedding(cfg)

        def forward(self, x):
            with spyre_hint(slices={"S": 4}):
                positions = torch.arange(x.shape[1])
                causal = torch.where(positions[None, :] > positions[:, None], float("-inf"), 0.0).to(x.dtype)
                out = self.layer(x, attention_mask=causal[None, None],
                                 position_embeddings=self.rotary(x, positions[None]))
                return out[0] if isinstance(out, tuple) else out

    with torch.no_grad():
        model = DecoderLayer().eval().to(torch.float16)
        declare_tensor_dim("S", seq)
        x = torch.zeros(1, seq, hidden, dtype=torch.float16)
        return fspyre.from_torch(model, (name_tensor_dims(x, ["B", "S", "D"]),))


def one_side(what: str, sizes: tuple[int, ...]) -> dict:
    import warnings

    import fspyre
    from fspyre.testing import inputs_for

    graph = layer_graph(*sizes)
    start = time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        comp = fspyre.compile(graph, fspyre.machine.spyre(cores=32))
    compiled = time.process_time() - start
    ops = sum(1 for _ in comp.program.body)
    if what == "prove":
        start = time.process_time()
        proof = fspyre.prove(comp)
        took = time.process_time() - start
        return {"compile_cpu": compiled, "cpu": took, "verdict": str(proof).splitlines()[0],
                "detail": str(proof), "graph_ops": len(graph.ops), "top_level_specs": ops}
    inputs = inputs_for(graph)
    start = time.process_time()
    fspyre.run(comp, inputs)
    took = time.process_time() - start
    return {"compile_cpu": compiled, "cpu": took, "graph_ops": len(graph.ops), "top_level_specs": ops}


def main() -> None:
    if len(sys.argv) > 2:
        print(json.dumps(one_side(sys.argv[1], tuple(int(a) for a in sys.argv[2:]))))
        return
    results = {}
    for what, sizes in (("prove", BIG), ("run", SMALL)):
        out = subprocess.run([sys.executable, __file__, what, *map(str, sizes)], capture_output=True, text=True,
                             check=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
        results[what] = json.loads(out.stdout.strip().splitlines()[-1])
    p, r = results["prove"], results["run"]
    print(f"load average {os.getloadavg()[0]:.1f}")
    print(f"prove  S={BIG[0]} D={BIG[1]} F={BIG[2]}: {p['cpu']:.1f} s CPU ({p['graph_ops']} graph ops; "
          f"compile {p['compile_cpu']:.1f} s) -- {p['verdict']}")
    print(f"run    S={SMALL[0]} D={SMALL[1]} F={SMALL[2]}: {r['cpu']:.1f} s CPU (compile {r['compile_cpu']:.1f} s)")
    print(f"prove / run = {p['cpu'] / r['cpu']:.2f}")
    print(p["detail"])


if __name__ == "__main__":
    main()
