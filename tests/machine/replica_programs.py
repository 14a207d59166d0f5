"""A small program whose weight is copied whole into every core's LX, shared by the tests of
the interpreter's replica paths (``test_corruptions``, ``test_recycled_memories``,
``test_lazy_copies``), and the edits those tests plant in it."""

from __future__ import annotations

import dataclasses

import fspyre
from fspyre.ir.frozen import FrozenMap
from fspyre.ir.graph import Graph
from fspyre.ir.program import LoopSpec, OpSpec, Program, even_core_spaces, op_specs
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


def edit_specs(program: Program, fn) -> Program:
    """``program`` with every spec ``s`` replaced by ``fn(s)`` (loops rebuilt around their bodies)."""
    def walk(body):
        out = []
        for s in body:
            new = fn(s)
            if isinstance(new, LoopSpec) and new is s:
                new = dataclasses.replace(s, body=walk(s.body))
            out.append(new)
        return tuple(out)

    return dataclasses.replace(program, body=walk(program.body))


def insert_after(program: Program, target, new) -> Program:
    """``program`` with ``new`` right after ``target``, wherever it sits (the copy runs in the
    loop's first iteration: a spec inserted after it there runs there too, guarded alike)."""
    return with_specs(program, target, (target, new))


def with_cores(spec: OpSpec, cores: int) -> OpSpec:
    """``spec`` spread over ``cores`` of its copy symbol (the first) instead of all."""
    first = next(iter(spec.iteration_space))
    space = FrozenMap((s, (cores, cores) if s == first else v) for s, v in spec.iteration_space.items())
    return dataclasses.replace(spec, iteration_space=space, core_spaces=even_core_spaces(space))


def rows_reader(copy: OpSpec, split: int) -> OpSpec:
    """An op reading the LX copy ``copy`` writes with K split over ``split`` cores, each core
    its own box of rows at the start of its LX (not a replicated read: the coordinates use the
    split symbol), and copying what it reads to LX address 1 MiB."""
    src = copy.args[1]
    copies = next(iter(copy.iteration_space))
    space = FrozenMap((s, (1, 1) if s == copies else (128, split) if s.name == "K" else v)
                      for s, v in copy.iteration_space.items())
    return dataclasses.replace(copy, iteration_space=space, core_spaces=even_core_spaces(space),
                               args=(dataclasses.replace(src, is_input=True),
                                     dataclasses.replace(src, name="b_rows", address=1 << 20)),
                               name="b_rows_copy")
