"""Lowering a Program to what the Spyre back end consumes, as pure data -> text functions.

- ``bundle.bundle_mlir(program)``: the anchor-compatible bundle.mlir (custom syntax);
- ``generic.mlir_generic(program)``: the same bundle in MLIR generic syntax (parsed back in tests);
- ``sdsc.sdsc_json(program)``: one JSON-ready dict per OpSpec, ``sdsc_{idx}.json`` (docs/sdsc-schema.md);
- ``unroll.unroll(program)``: the program with every loop expanded into straight-line OpSpecs.
"""

from fspyre.lower.bundle import bundle_mlir
from fspyre.lower.generic import mlir_generic
from fspyre.lower.sdsc import sdsc_json
from fspyre.lower.unroll import unroll

__all__ = ["bundle_mlir", "mlir_generic", "sdsc_json", "unroll"]
