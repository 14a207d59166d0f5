"""Large ops run block by block (``RunOptions.block``): the bytes every memory ends with, the
written bits, the outputs and the error reports are those of running every op whole.

The default block (16K points) only cuts large grids; these tests cut small programs into
blocks of a few points, so every kind of access (HBM and stacked LX, broadcast operands,
split and tiled reductions, loop advances) is cut somewhere."""

from __future__ import annotations

import dataclasses
import warnings

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from workloads import add_mul, compile, softmax

import fspyre
from fspyre.errors import ExecutionError, FspyreWarning
from fspyre.ir.program import op_specs
from fspyre.machine import interpreter
from fspyre.machine.interpreter import RunOptions, run_program
from fspyre.machine.rules import core_slices
from fspyre.testing import core_counts, examples, inputs_for, lx_capacities, programs
from fspyre.testing.hints import legal_hint_nests

WHOLE = RunOptions(block=0)


def run(program, inputs, options):
    try:
        outs, state = run_program(program, inputs, options)
    except ExecutionError as err:
        return str(err), None
    return outs, state


def assert_same_run(program, inputs, block: int, check_written: bool = True) -> None:
    whole = run(program, inputs, RunOptions(block=0, check_written=check_written))
    cut = run(program, inputs, RunOptions(block=block, check_written=check_written))
    if isinstance(whole[0], str) or isinstance(cut[0], str):
        assert whole[0] == cut[0]
        return
    (w_outs, w_state), (c_outs, c_state) = whole, cut
    assert w_outs.keys() == c_outs.keys()
    for name in w_outs:
        a, b = w_outs[name], c_outs[name]
        assert a.dtype == b.dtype and a.shape == b.shape
        assert np.array_equal(a, b, equal_nan=a.dtype.kind == "f"), name
    for w_mem, c_mem in [(w_state.hbm, c_state.hbm), *zip(w_state.lx, c_state.lx)]:
        assert np.array_equal(w_mem.data, c_mem.data), w_mem.name
        assert np.array_equal(w_mem.written, c_mem.written), w_mem.name


def blocked_ops(program, block: int) -> list[str]:
    """Names of the ops the interpreter planned to run block by block (after a run)."""
    plan = interpreter._program_plan(program, block)
    return [op.spec.name for op in plan.ops.values() if op.blocking is not None]


@pytest.mark.parametrize("block", [16, 64, 1024])
@pytest.mark.parametrize("case", ["add_mul tiled", "add_mul untiled", "softmax tiled", "softmax untiled, no LX"])
def test_blocks_change_nothing_on_the_canonical_programs(case, block):
    comp = {
        "add_mul tiled": lambda: compile(add_mul(128, 1024)),
        "add_mul untiled": lambda: compile(add_mul(128, 1024, tiled=False), tiling="none"),
        "softmax tiled": lambda: compile(softmax(128, 1024, row_tiles=4), residency=True),
        "softmax untiled, no LX": lambda: compile(softmax(128, 1024, row_tiles=1), tiling="none", lx_planning=False),
    }[case]()
    inputs = inputs_for(comp.graph)
    assert_same_run(comp.program, inputs, block)
    assert blocked_ops(comp.program, block), "no op was cut: the test would prove nothing"


def test_reductions_are_cut_only_along_output_axes():
    comp = compile(softmax(128, 1024, row_tiles=1), tiling="none")
    assert_same_run(comp.program, inputs_for(comp.graph), 4096)  # a block holds whole rows of 1024
    plan = interpreter._program_plan(comp.program, 4096)
    cut = {op.fn: op.blocking for op in plan.ops.values() if op.blocking is not None}
    assert {"amax", "sum"} <= cut.keys()
    for op in plan.ops.values():
        if op.blocking is not None and op.red_pos:
            assert op.blocking.axis < min(op.red_pos)


def _with_output_at(program, spec, address_of):
    """``program`` with ``spec``'s output moved to the allocation of ``address_of``."""
    dst = dataclasses.replace(spec.args[-1], memory=address_of.memory, address=address_of.address)
    moved = dataclasses.replace(spec, args=(*spec.args[:-1], dst))
    return moved, dataclasses.replace(program, body=tuple(moved if s is spec else s for s in program.body))


@pytest.mark.parametrize("lx_planning", [False, True])
def test_in_place_ops_and_overlapping_outputs(lx_planning):
    """An output at exactly its operand's elements (in place) is cut: block k writes only what
    block k read. An output overlapping an operand any other way runs whole, reading
    everything before it writes."""
    g = fspyre.GraphBuilder("in_place")
    A, B = g.dim("A", 64), g.dim("B", 1024)
    a = g.input("a", (A, B), "float16")
    g.output("y", g.mul(g.exp(g.add(a, 1.0)), 2.0))
    comp = compile(g.build(), tiling="none", lx_planning=lx_planning)
    program, inputs = comp.program, inputs_for(comp.graph)
    spec = op_specs(program)[1]  # exp of the add's result
    src = spec.args[0]
    assert src.memory == spec.args[-1].memory == ("lx" if lx_planning else "hbm")
    same, in_place = _with_output_at(program, spec, src)
    shifted = dataclasses.replace(src, memory=src.memory, address=src.address + 128)
    skew, overlapping = _with_output_at(program, spec, shifted)
    for prog, s, cut in [(program, spec, True), (in_place, same, True), (overlapping, skew, False)]:
        assert_same_run(prog, inputs, 64)
        op = interpreter._program_plan(prog, 64).ops[id(s)]
        assert op.blocking is not None and interpreter._independent(op, [0], 0) is cut


def compiled(data, prog, cores, lx, tiling, residency):
    """A drawn program (with drawn legal hints under tiling="hints") compiled, or discarded
    when fspyre refuses it: refusals belong to the tiling properties."""
    graph = prog.graph
    if tiling == "hints":
        graph = data.draw(legal_hint_nests(graph), label="hints").apply(graph)
    machine = fspyre.machine.spyre(cores=cores, lx_bytes=lx)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FspyreWarning)
            return graph, fspyre.compile(graph, machine=machine, tiling=tiling, residency=residency)
    except fspyre.FspyreError:
        assume(False)
        raise  # unreachable: assume(False) discards the example


@settings(max_examples=examples(40), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
@given(data=st.data(), prog=programs(max_ops=6), cores=core_counts(), lx=lx_capacities(),
       tiling=st.sampled_from(["none", "auto", "hints"]), residency=st.booleans(),
       block=st.sampled_from([4, 16, 64, 256]), check_written=st.booleans(), seed=st.integers(0, 2**16))
def test_blocks_change_nothing_on_random_programs(data, prog, cores, lx, tiling, residency, block,
                                                  check_written, seed):
    graph, comp = compiled(data, prog, cores, lx, tiling, residency)
    assert_same_run(comp.program, inputs_for(graph, seed), block, check_written)


def test_block_option_is_checked():
    with pytest.raises(ExecutionError, match="block=-1"):
        RunOptions(block=-1)


def lx_accesses(program):
    """(arg, syms, sizes, splits, cores, slices, spaces, store) of every LX access of an op
    split evenly, as the interpreter plans them (a store: the writing cores over the output
    symbols). The all-cores plan is for even splits; uneven ones run the per-core model."""
    for spec in op_specs(program):
        if not spec.even:
            continue
        syms = tuple(spec.iteration_space)
        sizes = tuple(n for n, _ in spec.iteration_space.values())
        splits = tuple(k for _, k in spec.iteration_space.values())
        slices = core_slices(list(splits))
        reduced = set(spec.op_info.reduced)
        red = [i for i, s in enumerate(syms) if s in reduced]
        out = [i for i, s in enumerate(syms) if s not in reduced]
        for arg in spec.args[:-1]:
            if arg.memory == "lx":
                yield arg, syms, sizes, splits, range(len(slices)), slices, spec.core_spaces, False
        if spec.args[-1].memory == "lx":
            writers = [c for c in range(len(slices)) if all(slices[c][i] == 0 for i in red)]
            yield (spec.args[-1], tuple(syms[i] for i in out), tuple(sizes[i] for i in out),
                   tuple(splits[i] for i in out), writers, slices[:, out],
                   [tuple(space[i] for i in out) for space in spec.core_spaces], True)


@settings(max_examples=examples(40), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
@given(data=st.data(), prog=programs(max_ops=6), cores=core_counts(), lx=lx_capacities(),
       tiling=st.sampled_from(["none", "auto", "hints"]), residency=st.booleans())
def test_lx_plans_for_all_cores_at_once_are_the_per_core_model(data, prog, cores, lx, tiling, residency):
    """Each core's LX box, layout and address range, computed for all cores by reductions over
    the grid, equal the per-core model's (the one the error reports rerun)."""
    graph, comp = compiled(data, prog, cores, lx, tiling, residency)
    program = comp.program
    for args in lx_accesses(program):
        arg, syms, sizes, splits, cores, slices, spaces, store = args
        fast = interpreter._lx_addresses(arg, syms, sizes, splits, cores, slices, program.lx_bytes, store)
        slow = interpreter._lx_addresses_per_core(arg, syms, sizes, splits, cores, spaces, program.lx_bytes, store)
        assert fast is not None, args[0].name
        assert fast[0].shape == slow[0].shape and np.array_equal(fast[0], slow[0]), args[0].name
        assert np.array_equal(fast[1], slow[1]), args[0].name
