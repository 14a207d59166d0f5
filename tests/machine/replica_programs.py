"""A small program whose weight is copied whole into every core's LX, shared by the tests of
the interpreter's replica paths (``test_corruptions``, ``test_recycled_memories``)."""

from __future__ import annotations

import dataclasses

import fspyre
from fspyre.ir.graph import Graph
from fspyre.ir.program import LoopSpec, OpSpec, Program, op_specs
from fspyre.machine.spyre import spyre


def replicated_matmul() -> tuple[Graph, Program, OpSpec]:
    """``y = a @ b + bias`` tiled M:2 on 4 cores: ``b_lx_copy`` puts b whole in every core's LX
    in the loop's first iteration, and the matmul reads it there. Returns the graph, the
    program and that copy."""
    g = fspyre.GraphBuilder("matmul")
    M, K, N = g.dim("M", 32), g.dim("K", 128), g.dim("N", 128)
    a, b = g.input("a", (M, K), "float16"), g.input("b", (K, N), "float16")
    bias = g.input("bias", (N,), "float16")
    with g.hint(slices={"M": 2}):
        g.output("y", g.add(g.matmul(a, b), bias))
    graph = g.build()
    program = fspyre.compile(graph, machine=spyre(cores=4), tiling="hints").program
    copy = next(s for s in op_specs(program) if s.name == "b_lx_copy")
    return graph, program, copy


def with_specs(program: Program, target: OpSpec, new: tuple[OpSpec, ...]) -> Program:
    """``program`` with ``target`` (wherever it sits) replaced by the specs ``new``."""
    def walk(body):
        out = []
        for s in body:
            if s is target:
                out.extend(new)
            elif isinstance(s, LoopSpec):
                out.append(dataclasses.replace(s, body=walk(s.body)))
            else:
                out.append(s)
        return tuple(out)

    return dataclasses.replace(program, body=walk(program.body))
