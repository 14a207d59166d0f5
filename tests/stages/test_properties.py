"""Properties of work division and allocation over random graphs, hint nests and machines.

- Random graphs (``fspyre.testing.graphs``) under random legal tiling hints
  (``fspyre.testing.hints``), on machines of 1..32 cores with LX from none to the default
  window, with each LX solver: the memory check is clean, the program computes bit for bit
  what the same split computes with everything in HBM, and the interpreter agrees with the
  reference (``fspyre.check``). The split plan keeps the anchor's invariants.
- Shrinking LX never changes the answer (bit for bit) and only moves buffers to HBM, for a
  capacity reason.
- The per-core coordinate bounds the planner reasons with are exactly the interpreter's.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import fspyre
from fspyre.errors import LoweringError, TilingError
from fspyre.ir.program import op_specs
from fspyre.ir.serialize import dumps, loads
from fspyre.machine.indexing import compile_index
from fspyre.machine.memcheck import check_memory
from fspyre.machine.rules import coord_bounds, open_grid
from fspyre.machine.spyre import Machine
from fspyre.stages.allocation import AllocationOptions
from fspyre.stages.split_plan import SplitOptions, splits_from_index_coeffs
from fspyre.testing import examples, graphs, inputs_for
from fspyre.testing.hints import legal_hint_nests
from fspyre.testing.machines import core_counts, lx_capacities, machines

# Random hints drop levels on purpose (count 1, dims no op iterates); each drop is a
# FspyreWarning, tested in tests/unit/test_misuse.py, and noise here.
pytestmark = pytest.mark.filterwarnings("ignore::fspyre.FspyreWarning")

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                      HealthCheck.filter_too_much])
SOLVERS = st.sampled_from(("greedy", "firstfit", "bestfit"))
CAPACITY = ("no room in LX", "bytes of LX per core, more than")


def for_capacity(reason: str) -> bool:
    return any(c in reason for c in CAPACITY)


def hinted_graph(data):
    graph = data.draw(graphs(max_ops=6, max_elements=8192), label="graph")
    return data.draw(legal_hint_nests(graph), label="hints").apply(graph)


def compile_or_reject(graph, machine, **allocation):
    """Rejected, as outside these properties: a read the stick layout cannot express (a
    reshape merging across the stick dim fails in device_coordinates whatever the split or
    allocation), and a hint nest the tiling stages refuse. Without ``keep_resident``: its
    copies depend on the LX capacity by design, and these properties pin the stages after it."""
    try:
        return fspyre.compile(graph, machine, tiling="hints", residency=False, split_options=SplitOptions(),
                              allocation_options=AllocationOptions(**allocation))
    except LoweringError as err:
        assume("device_coordinates" not in str(err))
        raise
    except TilingError:
        assume(False)


def check_split_invariants(comp, machine: Machine) -> None:
    tree = comp.stages["loop_tree"]
    from fspyre.ir.looptree import op_nodes

    for node in op_nodes(tree):
        split = comp.stages["split_plan"].ops[node.name]
        op = node.op
        assert split.cores == math.prod(split.splits.values()) <= machine.cores
        reduced = {d.name for d in op.reduction_ranges}
        assert sum(1 for d, k in split.splits.items() if k > 1 and d in reduced) <= 1, (node.name, split)
        sizes = {d.name: d.size for d in (*op.ranges, *op.reduction_ranges)}
        for d, k in split.splits.items():
            # ceil and floor shares, the larger first; whole sticks but for the last slice
            eps = split.stick_elems.get(d, 1)
            ext = split.extents(d, sizes[d])
            assert len(ext) == k and sum(ext) == sizes[d] and min(ext) >= 1, (node.name, d, ext)
            assert all(e % eps == 0 for e in ext[:-1]), (node.name, d, ext, eps)
            units = [-(-e // eps) for e in ext]
            assert max(units) - min(units) <= 1 and units == sorted(units, reverse=True), (node.name, d, ext)
        if op.fn == "var":
            assert all(split.splits.get(d, 1) == 1 for d in reduced)
        assert splits_from_index_coeffs(op, split) == dict(split.splits)


@settings(max_examples=examples(40), **SETTINGS)
@given(st.data(), machines(), SOLVERS)
def test_random_graphs_are_equal_and_memory_safe(data, machine, solver):
    graph = hinted_graph(data)
    comp = compile_or_reject(graph, machine, lx_solver=solver)
    check_split_invariants(comp, machine)
    mem = check_memory(comp.program)
    assert mem.clean, str(mem)
    inputs = inputs_for(graph, 5)
    hbm_only = compile_or_reject(graph, machine, lx_planning=False)
    got, want = fspyre.run(comp, inputs), fspyre.run(hbm_only, inputs)
    for name in want:
        assert np.array_equal(got[name], want[name], equal_nan=True), name
    report = fspyre.check(graph, inputs, machine=machine, comp=comp)
    assert report.equal, str(report)
    for stage in ("split_plan", "allocation"):
        assert loads(dumps(comp.stages[stage])) == comp.stages[stage]


@settings(max_examples=examples(30), **SETTINGS)
@given(st.data(), core_counts(), lx_capacities(), SOLVERS)
def test_shrinking_lx_only_moves_buffers_to_hbm(data, cores, big, solver):
    graph = hinted_graph(data)
    small = data.draw(st.sampled_from(sorted({0, big // 2 // 128 * 128, big})), label="smaller LX")
    comps = {lx: compile_or_reject(graph, Machine(cores=cores, lx_bytes=lx), lx_solver=solver)
             for lx in (big, small, 0)}
    inputs = inputs_for(graph, 3)
    outs = {lx: fspyre.run(c, inputs) for lx, c in comps.items()}
    for lx, comp in comps.items():
        assert comp.stages["split_plan"] == comps[big].stages["split_plan"]
        mem = check_memory(comp.program)
        assert mem.clean, str(mem)
        for name in outs[big]:
            assert np.array_equal(outs[lx][name], outs[big][name], equal_nan=True), (lx, name)
    assert not any(p.memory == "lx" for p in comps[0].stages["allocation"].buffers.values())
    wide, narrow = comps[big].stages["allocation"].buffers, comps[small].stages["allocation"].buffers
    for name, p in narrow.items():
        q = wide[name]
        if p.memory == "lx":
            assert q.memory == "lx" or for_capacity(q.reason), (name, q.reason)
        elif q.memory == "lx" or for_capacity(q.reason):
            assert for_capacity(p.reason), (name, p.reason)  # moved out for lack of room
        else:
            assert p.reason == q.reason  # eligibility does not depend on the capacity
    assert fspyre.check(graph, machine=comps[small].machine, comp=comps[small]).equal


@settings(max_examples=examples(30), **SETTINGS)
@given(graphs(max_ops=4, max_elements=4096), st.sampled_from((1, 2, 3, 5, 8, 32)))
def test_coordinate_bounds_are_the_interpreters(graph, cores):
    machine = fspyre.machine.spyre(cores=cores)
    try:
        comp = fspyre.compile(graph, machine, tiling="none")
    except LoweringError as err:
        assume("device_coordinates" not in str(err))
        raise
    for spec in op_specs(comp.program):
        syms = list(spec.iteration_space)
        for arg in spec.args:
            lows, highs = coord_bounds(arg.device_coordinates, syms, spec.slice_extents)
            for core, space in enumerate(spec.core_spaces):
                per = [n for _, n in space]
                grid = open_grid(per, [start for start, _ in space])
                for d, c in enumerate(arg.device_coordinates):
                    v = np.broadcast_to(np.asarray(compile_index(c, syms)(*grid)), tuple(per))
                    assert (v.min(), v.max()) == (lows[core, d], highs[core, d]), (spec.name, arg.name, core, d)
