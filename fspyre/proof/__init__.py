"""A static proof that a compiled program is memory-safe, covers its outputs and computes
with the values its dataflow says, for every input and every size a symbolic program accepts
(docs/proof.md). Built on isl (``pip install fspyre[prove]``)."""

from __future__ import annotations

from typing import Any

from fspyre.ir.graph import Graph
from fspyre.ir.program import Program
from fspyre.proof.artifact import PROPERTIES, Counterexample, Proof, PropertyResult

__all__ = ["Counterexample", "Proof", "PropertyResult", "prove"]


def prove(comp: Any, graph: Graph | None = None) -> Proof:
    """The proof of a Compilation's program, or of a Program against ``graph`` (without a
    graph, only what the program says by itself: memory safety, the last writers, outputs
    written)."""
    from fspyre.errors import FspyreError

    if isinstance(comp, Program):
        program = comp
    elif isinstance(getattr(comp, "program", None), Program):
        program, graph = comp.program, graph or comp.graph
    else:
        raise FspyreError(f"prove: expected the Compilation fspyre.compile returns or a Program, got "
                          f"{type(comp).__name__}")
    from fspyre.proof.properties import coverage, dataflow, flows, memory_safety
    from fspyre.proof.sets import NotAffine, build_model
    from fspyre.proof.values import graph_values

    assumptions = () if program.symbolic is None else tuple(
        f"|{a.dim}| {_ASSUME[a.kind]} {a.value}" for a in program.symbolic.assumptions)
    try:
        model = build_model(program)
    except NotAffine as err:
        return Proof(program=program.name, assumptions=assumptions, properties=tuple(
            PropertyResult(name=n, verdict="undecided", reason=f"not affine: {err}") for n in PROPERTIES))
    safety = memory_safety(model)
    results = [safety]
    if safety.verdict != "proved":
        # the other properties read memory through the same accesses: unsafe ones make them moot
        results += [PropertyResult(name=n, verdict="undecided", reason="memory safety is not proved")
                    for n in PROPERTIES[1:]]
    else:
        tensor_flow = flows(model)
        cover, flow = coverage(model, graph, tensor_flow), dataflow(model, tensor_flow)
        if graph is not None and cover.verdict == flow.verdict == "proved":
            try:
                bad_cover, bad_flow = graph_values(model, graph, tensor_flow[0])
            except NotAffine as err:
                bad_cover = bad_flow = None
                cover = PropertyResult(name="coverage", verdict="undecided", reason=f"graph values: {err}")
                flow = PropertyResult(name="dataflow", verdict="undecided", reason=f"graph values: {err}")
            cover = bad_cover or _also(cover, "every point of every graph op computed once")
            flow = bad_flow or _also(flow, "every op reads its operands at the graph's indices, and every output "
                                           "element holds its own graph value")
        results += [cover, flow]
    return Proof(program=program.name, properties=tuple(results), assumptions=assumptions)


def _also(result: PropertyResult, what: str) -> PropertyResult:
    from dataclasses import replace

    return replace(result, reason=f"{result.reason}; {what}") if result.verdict == "proved" else result


_ASSUME = {"divisible": "divisible by", "at_least": ">=", "at_most": "<="}
