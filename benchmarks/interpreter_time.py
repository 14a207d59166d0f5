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
    numpy_best, numpy_median = timed(lambda: (a + b) * c, REPEATS)
    rows.append(["numpy float16 (a + b) * c", ms(numpy_best), ms(numpy_median), "1.0x"])
    best, median = timed(numpy_rounded, REPEATS)
    rows.append(["numpy as fspyre rounds (fp32 compute)", ms(best), ms(median), f"{best / numpy_best:.1f}x"])
    best, median = timed(lambda: fspyre.evaluate(graph, inputs, machine), REPEATS)
    rows.append(["fspyre.evaluate (reference)", ms(best), ms(median), f"{best / numpy_best:.1f}x"])

    for label, tiling in (("untiled", "none"), ("tiled A:2 / B:4", "hints")):
        comp_best, _ = timed(lambda: fspyre.compile(graph, machine, tiling=tiling), REPEATS)
        comp = fspyre.compile(graph, machine, tiling=tiling)
        best, median = timed(lambda: fspyre.run(comp, inputs), REPEATS)
        rows.append([f"fspyre.run, {label} (compile {ms(comp_best)} ms)", ms(best), ms(median),
                     f"{best / numpy_best:.1f}x"])
        assert fspyre.check(graph, inputs, machine=machine, comp=comp).equal, f"{label}: interpreter disagrees"
    print(table(["what", "ms (best)", f"median of {REPEATS}", "vs numpy fp16"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
