"""Small programs for the lowering tests, untiled and hand-tiled into LoopSpecs.

Until the tiling stages land, ``hand_tile`` wraps an untiled program's ops in nested
LoopSpecs: each level divides one dim's per-tile size by its count, and each tensor's byte
step per level is derived here independently of ``fspyre.stages.program`` (the anchor's
unroller rule: the device offset of the tile start minus that of the origin). The
interpreter then proves the hand tiling: looped, unrolled and untiled runs must agree.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
from hypothesis import strategies as st

import fspyre
from fspyre.ir.frozen import FrozenMap
from fspyre.ir.program import LoopSpec, OpSpec, Program, TensorArg, even_core_spaces
from fspyre.machine import formats
from fspyre.machine.hostio import random_inputs
from fspyre.machine.indexing import compile_index
from fspyre.stages.allocation import AllocationOptions


def add_graph(rows: int = 4, cols: int = 128):
    g = fspyre.GraphBuilder("add")
    A, B = g.dim("A", rows), g.dim("B", cols)
    a = g.input("a", (A, B), "float16")
    b = g.input("b", (A, B), "float16")
    g.output("y", g.add(a, b))
    return g.build()


def add_mul_graph(rows: int = 4, cols: int = 128):
    g = fspyre.GraphBuilder("add_mul")
    A, B = g.dim("A", rows), g.dim("B", cols)
    a, b, c = (g.input(n, (A, B), "float16") for n in "abc")
    y = g.add(a, b)
    g.output("z", g.mul(y, c))
    return g.build()


def row_sum_graph(rows: int = 8, cols: int = 128):
    g = fspyre.GraphBuilder("row_sum")
    A, B = g.dim("A", rows), g.dim("B", cols)
    x = g.input("x", (A, B), "float16")
    g.output("s", g.sum(g.mul(x, 0.5), ["B"]))
    return g.build()


def matmul_graph(m: int = 8, k: int = 128, n: int = 64):
    g = fspyre.GraphBuilder("mm")
    M, K, N = g.dim("M", m), g.dim("K", k), g.dim("N", n)
    a = g.input("a", (M, K), "float16")
    b = g.input("b", (K, N), "float16")
    g.output("c", g.add(g.matmul(a, b), 1.0))
    return g.build()


def untiled(graph, cores: int = 4, lx_planning: bool = False) -> Program:
    """The untiled program; by default every tensor in HBM, so ``hand_tile`` decides what is LX."""
    return fspyre.compile(
        graph, machine=fspyre.machine.spyre(cores=cores), tiling="none",
        allocation_options=AllocationOptions(lx_planning=lx_planning),
    ).program


def inputs_for(graph, seed: int = 0) -> dict[str, np.ndarray]:
    buffers = graph.buffer_table()
    return random_inputs({n: buffers[n].type for n in graph.inputs}, seed)


def _row_major(sizes: Sequence[int]) -> list[int]:
    out, acc = [], 1
    for s in reversed(sizes):
        out.append(acc)
        acc *= s
    return out[::-1]


def _byte_step(t: TensorArg, syms: list, pos: int, extent: int) -> int:
    def offset(v: int) -> int:
        args = [v if i == pos else 0 for i in range(len(syms))]
        return sum(int(compile_index(c, syms)(*args)) * st
                   for c, st in zip(t.device_coordinates, _row_major(t.device_size)))

    return (offset(extent) - offset(0)) * formats.FORMATS[t.device_dtype].nbytes


def _tile_op(spec: OpSpec, levels: Sequence[tuple[str, int]], lx: frozenset[str]) -> OpSpec:
    names = [str(s) for s in spec.iteration_space]
    space = dict(spec.iteration_space)
    for dim, count in levels:
        if dim in names:
            s = list(spec.iteration_space)[names.index(dim)]
            size, split = space[s]
            assert size % count == 0, (spec.name, dim, size, count)
            space[s] = (size // count, math.gcd(split, size // count))
    syms = list(spec.iteration_space)
    args = []
    for t in spec.args:
        if t.name in lx or t.memory == "lx":
            args.append(replace(t, arg_index=-1, memory="lx", address=0, tile_advance=(0,) * len(levels)))
            continue
        steps = []
        for dim, _ in levels:
            if dim in names:
                pos = names.index(dim)
                steps.append(_byte_step(t, syms, pos, space[syms[pos]][0]))
            else:
                steps.append(0)
        args.append(replace(t, tile_advance=tuple(steps)))
    return replace(
        spec, iteration_space=FrozenMap(space), args=tuple(args), core_spaces=even_core_spaces(FrozenMap(space)),
        tiled_symbols=tuple(tuple(s for s in syms if str(s) == dim) for dim, _ in levels),
    )


def hand_tile(program: Program, levels: Sequence[tuple[str, int]], lx: Sequence[str] = ()) -> Program:
    """Every op of ``program`` inside nested loops, ``levels`` outermost first, each tiling a
    distinct dim; tensors named in ``lx`` become per-tile LX buffers at address 0."""
    assert len({d for d, _ in levels}) == len(levels)
    ops = tuple(_tile_op(s, levels, frozenset(lx)) for s in program.body)
    body: tuple = ops
    for _, count in reversed(levels):
        body = (LoopSpec(count=count, body=body),)
    return replace(program, body=body)


@functools.lru_cache(maxsize=1)
def looped_cases() -> dict[str, Program]:
    """Hand-tiled programs covering one and two levels, LX intermediates, a reduction whose
    output advances, an op that does not advance at a level, and a matmul tiled over M."""
    return {
        "add_rows": hand_tile(untiled(add_graph()), [("A", 2)]),
        "add_mul_2x2_lx": hand_tile(untiled(add_mul_graph(4, 256)), [("A", 2), ("B", 2)], lx=["buf0"]),
        "row_sum": hand_tile(untiled(row_sum_graph()), [("A", 4)]),
        "matmul_m": hand_tile(untiled(matmul_graph()), [("M", 2)]),
        "matmul_m_n": hand_tile(untiled(matmul_graph(8, 128, 128)), [("M", 2), ("N", 2)], lx=["buf0"]),
    }


CASE_GRAPHS = {
    "add_rows": add_graph,
    "add_mul_2x2_lx": lambda: add_mul_graph(4, 256),
    "row_sum": row_sum_graph,
    "matmul_m": matmul_graph,
    "matmul_m_n": lambda: matmul_graph(8, 128, 128),
}


def _canonical(rows: int = 8, cols: int = 256):
    """The seed's y = a + b; z = y * c with A:2 outer and B:2 inner hints, at a small size."""
    g = fspyre.GraphBuilder("add_mul")
    A, B = g.dim("A", rows), g.dim("B", cols)
    a, b, c = (g.input(n, (A, B), "float16") for n in "abc")
    with g.hint(slices={"A": 2}):
        with g.hint(slices={"B": 2}):
            z = g.mul(g.add(a, b), c)
    g.output("z", z)
    return g.build()


def _softmax_rows():
    g = fspyre.GraphBuilder("softmax")
    R, C = g.dim("R", 8), g.dim("C", 128)
    x = g.input("x", (R, C), "float16")
    with g.hint(slices={"R": 2}):
        e = g.exp(g.sub(x, g.amax(x, ["C"], keepdim=True)))
        y = g.div(e, g.sum(e, ["C"], keepdim=True))
    g.output("y", y)
    return g.build()


def _matmul_tiled(dim: str):
    g = fspyre.GraphBuilder(f"mm_{dim}")
    M, K, N = g.dim("M", 8), g.dim("K", 256), g.dim("N", 64)
    a = g.input("a", (M, K), "float16")
    b = g.input("b", (K, N), "float16")
    with g.hint(slices={dim: 2}):
        c = g.matmul(a, b)
    g.output("c", c)
    return g.build()


@functools.lru_cache(maxsize=1)
def hinted_cases() -> dict[str, tuple[Program, object]]:
    """Programs tiled by the pipeline itself (tiling="hints"), with their graphs."""
    graphs = {
        "canonical_2x2": _canonical(),
        "softmax_rows": _softmax_rows(),
        "matmul_tiled_m": _matmul_tiled("M"),
        "matmul_tiled_k": _matmul_tiled("K"),
    }
    machine = fspyre.machine.spyre(cores=4)
    return {name: (fspyre.compile(g, machine=machine, tiling="hints").program, g) for name, g in graphs.items()}


@functools.lru_cache(maxsize=1)
def all_programs() -> dict[str, Program]:
    """Every program the lowering tests print: untiled (HBM only, so with a pool), hand-tiled
    and pipeline-tiled."""
    return {
        "add_mul": untiled(add_mul_graph()),
        "row_sum": untiled(row_sum_graph()),
        "matmul": untiled(matmul_graph()),
        "add_mul_lx_planned": untiled(add_mul_graph(), lx_planning=True),
        # uneven work division: a partial last stick, a reduction split unevenly, uneven rows
        "add_mul_uneven": untiled(add_mul_graph(5, 150)),
        "row_sum_uneven": untiled(row_sum_graph(1, 300)),
        "matmul_uneven": untiled(matmul_graph(7, 128, 64)),
        **looped_cases(),
        **{name: p for name, (p, _) in hinted_cases().items()},
    }


@st.composite
def hand_tiled_programs(draw) -> tuple[Program, object]:
    """A hand-tiled add_mul or matmul: random sizes, cores, one or two levels in either order,
    the intermediate in HBM or LX."""
    cores = draw(st.sampled_from([1, 2, 4]))
    if draw(st.booleans()):
        rows, sticks = draw(st.sampled_from([2, 4, 8])), draw(st.sampled_from([1, 2, 4]))
        graph = add_mul_graph(rows, 64 * sticks)
        options = [("A", c) for c in (2,) if rows % c == 0] + [("B", c) for c in (2, 4) if sticks % c == 0]
    else:
        m, n_sticks = draw(st.sampled_from([2, 4, 8])), draw(st.sampled_from([1, 2]))
        graph = matmul_graph(m, 128, 64 * n_sticks)
        options = [("M", 2)] + ([("N", 2)] if n_sticks == 2 else [])
    chosen = draw(st.lists(st.sampled_from(options), min_size=1, max_size=2, unique_by=lambda lvl: lvl[0]))
    lx = ["buf0"] if draw(st.booleans()) else []
    return hand_tile(untiled(graph, cores), chosen, lx=lx), graph
