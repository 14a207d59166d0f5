"""fspyre: a pure-functional staged compiler for IBM Spyre-style AI accelerators.

    g = fspyre.GraphBuilder("add_mul"); ...; graph = g.build()
    comp = fspyre.compile(graph, machine=fspyre.machine.spyre(cores=32), tiling="none")
    outs = fspyre.run(comp, inputs); ref = fspyre.evaluate(graph, inputs)
    print(fspyre.check(graph))
"""

from fspyre import machine
from fspyre.check import CheckReport, check
from fspyre.errors import FspyreError
from fspyre.ir.builder import GraphBuilder, Tensor
from fspyre.ir.graph import Dim, Graph
from fspyre.machine.reference import evaluate
from fspyre.pipeline import Compilation, compile, run

__all__ = [
    "CheckReport", "Compilation", "Dim", "FspyreError", "Graph", "GraphBuilder", "Tensor",
    "check", "compile", "evaluate", "machine", "run",
]
