"""fspyre: a pure-functional staged compiler for IBM Spyre-style AI accelerators.

    g = fspyre.GraphBuilder("add_mul"); ...; graph = g.build()
    comp = fspyre.compile(graph, machine=fspyre.machine.spyre(cores=32), tiling="none")
    outs = fspyre.run(comp, inputs); ref = fspyre.evaluate(graph, inputs)
    report = fspyre.check(graph)  # .equal, .max_abs_diff; str(report) is the verdict

Names load on first use, so ``import fspyre`` (and ``fspyre --help``) costs no sympy, numpy or
torch; ``fspyre.stages``, ``fspyre.lower``, ``fspyre.pretty`` and ``fspyre.machine`` are
reachable as attributes.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

from fspyre.errors import FspyreError, FspyreWarning

if TYPE_CHECKING:
    from fspyre import lower, machine, pretty, stages
    from fspyre.check import CheckReport, check
    from fspyre.frontend import from_torch
    from fspyre.ir.builder import GraphBuilder, Tensor
    from fspyre.ir.graph import Dim, Graph
    from fspyre.machine.reference import evaluate
    from fspyre.pipeline import Compilation, compile, resume, run
    from fspyre.proof import prove

__version__ = "0.1.0"  # pyproject.toml's version

# name -> the module defining it; the front end imports torch (seconds), the rest sympy and numpy
_EXPORTS = {
    "CheckReport": "fspyre.check", "Compilation": "fspyre.pipeline", "Dim": "fspyre.ir.graph",
    "Graph": "fspyre.ir.graph", "GraphBuilder": "fspyre.ir.builder", "Tensor": "fspyre.ir.builder",
    "compile": "fspyre.pipeline", "evaluate": "fspyre.machine.reference", "from_torch": "fspyre.frontend",
    "prove": "fspyre.proof", "resume": "fspyre.pipeline", "run": "fspyre.pipeline",
}
_SUBMODULES = ("lower", "machine", "pretty", "stages")


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"fspyre.{name}")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fspyre' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


class _Package(types.ModuleType):
    """``fspyre.check`` is the function, though ``fspyre/check.py`` is a module of the same name:
    loading that module binds it on the package (the import system does so whoever imports it
    first), so the package keeps the function behind a property that ignores the binding."""

    @property
    def check(self) -> Any:
        from fspyre.check import check

        return check

    @check.setter
    def check(self, module: object) -> None:
        pass


sys.modules[__name__].__class__ = _Package


def _register_torch_backend() -> None:
    """``torch.compile(backend="fspyre")``: the entry point in pyproject.toml covers a fresh
    process; when torch is already loaded, register now so no lookup is needed."""
    if "torch" in sys.modules:
        from fspyre.frontend.dynamo import register_backend

        register_backend()


_register_torch_backend()

__all__ = [
    "CheckReport", "Compilation", "Dim", "FspyreError", "FspyreWarning", "Graph", "GraphBuilder", "Tensor",
    "check", "compile", "evaluate", "from_torch", "lower", "machine", "pretty", "prove", "resume", "run", "stages",
]
