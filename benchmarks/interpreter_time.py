"""Machine-model interpreter time for add_mul [1024, 4096] float16 on 32 cores, next to plain
numpy computing the same values, and the untiled reference evaluator.

numpy "as fspyre rounds" computes each op in float32 and rounds every stored tensor to
float16, which is what docs/semantics.md says the device does (with IEEE fp16 storage
instead of DLFloat16); the interpreter additionally encodes every value to device bytes at
its allocated addresses and decodes it back, core by core."""

from __future__ import annotations

import sys

import numpy as np
from timing import machine_line, ms, table, timed

import fspyre
from fspyre.cli import canonical_example
from fspyre.machine.hostio import random_inputs

REPEATS = 5


def main() -> int:
    graph = canonical_example()
    inputs = random_inputs({n: graph.buffer_table()[n].type for n in graph.inputs}, seed=0)
    a, b, c = (inputs[n] for n in "abc")
    machine = fspyre.machine.spyre(cores=32)
    print(f"add_mul [1024, 4096] float16, 32 cores ({machine_line()})\n")

    def numpy_rounded():
        y = (a.astype(np.float32) + b.astype(np.float32)).astype(np.float16)
        return (y.astype(np.float32) * c.astype(np.float32)).astype(np.float16)

    rows = []
    base = timed(lambda: (a + b) * c, REPEATS)

    def row(what: str, t) -> None:
        rows.append([what, ms(t.best), ms(t.median), ms(t.cpu), f"{t.best / base.best:.1f}x"])

    row("numpy float16 (a + b) * c", base)
    row("numpy as fspyre rounds (fp32 compute)", timed(numpy_rounded, REPEATS))
    row("fspyre.evaluate (reference)", timed(lambda: fspyre.evaluate(graph, inputs, machine), REPEATS))
    for label, tiling in (("untiled", "none"), ("tiled A:2 / B:4", "hints")):
        compile_t = timed(lambda: fspyre.compile(graph, machine, tiling=tiling), REPEATS)
        comp = fspyre.compile(graph, machine, tiling=tiling)
        row(f"fspyre.run, {label} (compile {ms(compile_t.best)} ms)", timed(lambda: fspyre.run(comp, inputs), REPEATS))
        assert fspyre.check(graph, inputs, machine=machine, comp=comp).equal, f"{label}: interpreter disagrees"
    print(table(["what", "ms (best)", f"median of {REPEATS}", "cpu ms", "vs numpy fp16"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
