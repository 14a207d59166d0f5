"""A store of the same bits to every core's LX (interpreter ``Spread``) writes one copy and
makes the other cores' copies only when something reads or overwrites their bytes
(``RunOptions.lazy_copies``). Nothing observable may depend on it: each program here runs
with the copies made lazily and made at the store, and gives the same outputs, the same
bytes and written marks in every memory afterwards, or the same error. The programs end a
copy's record in part (a later store into some cores' copies, or into part of its bytes),
read one core's copy through another access than the replicated read, and read copies whose
first slice lies on cores other than the one the store wrote."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from replica_programs import edit_specs, insert_after, replicated_matmul, rows_reader, with_cores

from fspyre.errors import ExecutionError
from fspyre.ir.frozen import FrozenMap
from fspyre.ir.program import LoopSpec, OpSpec, Program, even_core_spaces, op_specs
from fspyre.machine.interpreter import RunOptions, run_outputs, run_program
from fspyre.testing import inputs_for

LAZY, EAGER = RunOptions(), RunOptions(lazy_copies=False)


def _same_either_way(program: Program, inputs, checked: bool = True):
    """Run ``program`` with lazy and with eager copies; require identical outputs, memories
    and written marks, or identical errors. The lazy run's outputs, or its error."""
    results = []
    for options in (LAZY, EAGER):
        options = dataclasses.replace(options, check_written=checked)
        try:
            results.append(run_program(program, inputs, options))
        except ExecutionError as e:
            results.append(e)
    lazy, eager = results
    if isinstance(lazy, ExecutionError) or isinstance(eager, ExecutionError):
        assert type(lazy) is type(eager) and str(lazy) == str(eager)
        assert (lazy.op, lazy.tensor, lazy.core, lazy.address) == (eager.op, eager.tensor, eager.core, eager.address)
        # the recycled memories of run_outputs report it the same way
        with pytest.raises(ExecutionError) as recycled:
            run_outputs(program, inputs, dataclasses.replace(LAZY, check_written=checked))
        assert str(recycled.value) == str(lazy)
        return lazy
    (lazy_outs, lazy_state), (eager_outs, eager_state) = lazy, eager
    assert lazy_outs.keys() == eager_outs.keys()
    for name in lazy_outs:
        assert np.array_equal(lazy_outs[name], eager_outs[name], equal_nan=True), name
    for a, b in zip((lazy_state.hbm, *lazy_state.lx), (eager_state.hbm, *eager_state.lx)):
        assert np.array_equal(a.data, b.data), a.name
        assert np.array_equal(a.written, b.written), a.name
    for _ in range(2):  # and so do the recycled memories of run_outputs, run after run
        outs = run_outputs(program, inputs, dataclasses.replace(LAZY, check_written=checked))
        for name in lazy_outs:
            assert np.array_equal(outs[name], lazy_outs[name], equal_nan=True), name
    return lazy_outs


def _matmul(program: Program) -> OpSpec:
    (loop,) = [s for s in program.body if isinstance(s, LoopSpec)]
    return next(s for s in loop.body if isinstance(s, OpSpec) and s.op == "batchmatmul")  # after b's copy


@pytest.mark.parametrize("checked", [True, False])
def test_clean_program(checked):
    graph, program, _ = replicated_matmul()
    inputs = inputs_for(graph)
    outs = _same_either_way(program, inputs, checked)
    assert not isinstance(outs, ExecutionError)


@pytest.mark.parametrize("cores", [1, 3])
def test_a_later_store_into_some_cores_copies(cores):
    # b negated into the LX of cores 0..cores-1 after the copy ends the record: the copies of
    # the other cores must be made before the store overwrites the copy they come from
    graph, program, copy = replicated_matmul()
    neg = dataclasses.replace(with_cores(copy, cores), op="neg", name="neg_b")
    outs = _same_either_way(insert_after(program, copy, neg), inputs_for(graph))
    assert not isinstance(outs, ExecutionError)


def _first_rows(spec: OpSpec, rows: int) -> OpSpec:
    space = FrozenMap((s, (rows, 1) if s.name == "K" else v) for s, v in spec.iteration_space.items())
    return dataclasses.replace(spec, iteration_space=space, core_spaces=even_core_spaces(space))


@pytest.mark.parametrize("cores", [1, 2, 4])
def test_a_later_store_into_part_of_the_copies(cores):
    # the first 64 rows of b negated into cores 0..cores-1: the rest of each copy is b's
    graph, program, copy = replicated_matmul()
    neg = dataclasses.replace(_first_rows(with_cores(copy, cores), 64), op="neg", name="neg_b")
    outs = _same_either_way(insert_after(program, copy, neg), inputs_for(graph))
    assert not isinstance(outs, ExecutionError)


@pytest.mark.parametrize("split", [2, 4])
def test_copies_read_through_another_access(split):
    # an op reading b_lx with K split over ``split`` cores, each core its own box of rows at
    # the start of its LX (not the replicated read: the coordinates use the split symbol),
    # copying what it reads elsewhere in LX; the matmul then reads the copies as before
    graph, program, copy = replicated_matmul()
    reader = rows_reader(copy, split)
    outs = _same_either_way(insert_after(program, copy, reader), inputs_for(graph))
    assert not isinstance(outs, ExecutionError)


def test_copies_read_on_cores_the_store_did_not_write():
    # the matmul (and the add after it) split N too: the cores of M's first slice are 0 and
    # 2, so the replicated read of b_lx decodes core 2's copy, which the copy op's store did
    # not write itself (it wrote core 0's)
    graph, program, _ = replicated_matmul()
    mm = _matmul(program)

    def split_n(spec):
        if not isinstance(spec, OpSpec) or spec.name not in (mm.name, "buf1"):
            return spec
        space = FrozenMap((s, (n, 2) if s.name in ("M", "N") else (n, k))
                          for s, (n, k) in spec.iteration_space.items())
        return dataclasses.replace(spec, iteration_space=space, core_spaces=even_core_spaces(space))

    edited = edit_specs(program, split_n)
    assert [(s.name, s.cores) for s in op_specs(edited) if s.name in (mm.name, "buf1")] == [(mm.name, 4), ("buf1", 4)]
    outs = _same_either_way(edited, inputs_for(graph))
    assert not isinstance(outs, ExecutionError)


@pytest.mark.parametrize("checked", [True, False])
def test_a_copy_missing_on_one_core(checked):
    # the copy runs on cores 0..2 only: core 3 reads bytes nobody wrote, either way (zeros
    # unchecked, where the replicated read compares the copies and decodes each core's own)
    graph, program, copy = replicated_matmul()
    got = _same_either_way(edit_specs(program, lambda s: with_cores(copy, 3) if s is copy else s), inputs_for(graph),
                           checked)
    if checked:
        assert isinstance(got, ExecutionError) and "core 3" in str(got) and "never written" in str(got)
    else:
        assert not isinstance(got, ExecutionError)
