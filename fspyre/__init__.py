"""fspyre: a pure-functional staged compiler for IBM Spyre-style AI accelerators.

    g = fspyre.GraphBuilder("add_mul"); ...; graph = g.build()
    comp = fspyre.compile(graph, machine=fspyre.machine.spyre(cores=32), tiling="none")
    outs = fspyre.run(comp, inputs); ref = fspyre.evaluate(graph, inputs)
    report = fspyre.check(graph)  # .equal, .max_abs_diff; str(report) is the verdict
"""

from fspyre import machine
from fspyre.check import CheckReport, check
from fspyre.errors import FspyreError, FspyreWarning
from fspyre.ir.builder import GraphBuilder, Tensor
from fspyre.ir.graph import Dim, Graph
from fspyre.machine.reference import evaluate
from fspyre.pipeline import Compilation, compile, run


def __getattr__(name: str):
    # The front end imports torch (seconds); load it only when asked for.
    if name == "from_torch":
        from fspyre.frontend import from_torch

        return from_torch
    if name == "prove":  # needs islpy (the ``prove`` extra)
        from fspyre.proof import prove

        return prove
    raise AttributeError(f"module 'fspyre' has no attribute {name!r}")


def _register_torch_backend() -> None:
    """``torch.compile(backend="fspyre")``: the entry point in pyproject.toml covers a fresh
    process; when torch is already loaded, register now so no lookup is needed."""
    import sys

    if "torch" in sys.modules:
        from fspyre.frontend.dynamo import register_backend

        register_backend()


_register_torch_backend()

__all__ = [
    "CheckReport", "Compilation", "Dim", "FspyreError", "FspyreWarning", "Graph", "GraphBuilder", "Tensor",
    "check", "compile", "evaluate", "from_torch", "machine", "prove", "run",
]
