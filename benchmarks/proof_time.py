"""The static proof of a Llama decoder layer at its real size against one interpreter run of
the same layer at a small size (issue 25): CPU time of ``fspyre.prove`` on the layer at
S=2048, D=4096, F=11008 (32 heads of 128, 8 key/value heads), beside the CPU time of one
``fspyre.run`` of the layer at S=128, D=256, F=704 (4 heads of 64, 2 key/value heads). Each
side runs in a fresh process; compile time is printed apart and is not in either figure.

The layer is examples/llama_decoder_layer.py's (transformers' LlamaDecoderLayer with rotary
embeddings, a causal mask and one hint tiling S by 4), with random weights, at each size.

    PYTHONPATH=. python benchmarks/proof_time.py            # both sides
    PYTHONPATH=. python benchmarks/proof_time.py prove S D F HEADS KV   # one side, in this process
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

BIG = (2048, 4096, 11008, 32, 8)
SMALL = (128, 256, 704, 4, 2)


def layer_graph(seq: int, hidden: int, ff: int, heads: int, kv_heads: int):
    """The example's layer (examples/llama_decoder_layer.py) at these sizes, as a graph."""
    import torch

    import fspyre
    from fspyre.frontend import declare_tensor_dim, name_tensor_dims

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
    from llama_decoder_layer import DecoderLayer

    with torch.no_grad():
        model = DecoderLayer(hidden, ff, heads, kv_heads, max_positions=max(seq, 1024)).eval().to(torch.float16)
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
