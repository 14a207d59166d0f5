"""``run_outputs`` hands its memories to the next run without zeroing them (interpreter
``_Spare``): the next checked run marks what it writes with a newer mark, and a run without
written marks zeroes the data first. What a run reads is what it wrote, whatever ran before:
a byte an earlier run wrote and this one did not is unwritten, and reads as zero unchecked."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from replica_programs import edit_specs, insert_after, replicated_matmul, rows_reader, with_specs

from fspyre.errors import ExecutionError
from fspyre.ir.frozen import FrozenMap
from fspyre.ir.program import OpSpec, Program, even_core_spaces
from fspyre.machine import interpreter
from fspyre.machine.interpreter import RunOptions, run_outputs, run_program
from fspyre.testing import inputs_for

FAST = RunOptions(check_written=False)


def _programs(reader: int = 0):
    """A tiled matmul (b copied into every core's LX, then read there), and the same program
    with the copy of b cut to its first 64 rows: the matmul reads LX bytes this run wrote and
    bytes only an earlier run can have written. ``reader``: the first program also reads b's
    LX copies through another access on that many cores (``rows_reader``), which makes their
    copies (the copy op's store writes one) and sets every core's written marks."""
    graph, program, copy = replicated_matmul()
    space = FrozenMap((s, (64, 1) if s.name == "K" else v) for s, v in copy.iteration_space.items())
    half = dataclasses.replace(copy, iteration_space=space, core_spaces=even_core_spaces(space))
    cut = with_specs(program, copy, (half,))
    if reader:
        program = insert_after(program, copy, rows_reader(copy, reader))
    return program, cut, inputs_for(graph)


@pytest.mark.parametrize("reader", [0, 2, 4])
def test_a_byte_an_earlier_run_wrote_is_unwritten(reader):
    program, cut, inputs = _programs(reader)
    with pytest.raises(ExecutionError, match="never written") as fresh:
        run_program(cut, inputs)
    for options in (RunOptions(), FAST):
        for _ in range(3):
            run_outputs(program, inputs, options)
        with pytest.raises(ExecutionError, match="never written") as recycled:
            run_outputs(cut, inputs)
        assert str(recycled.value) == str(fresh.value)


def _lx_spare():
    (lx,) = [spare for spare in interpreter._SPARES if spare.rows == 4]
    return lx


@pytest.mark.parametrize("reader", [0, 2, 4])
def test_marks_start_again_after_255_runs(reader):
    program, cut, inputs = _programs(reader)
    want = run_program(program, inputs)[0]["y"]
    run_outputs(program, inputs)
    _lx_spare().mark = 0xFE  # as after 254 runs
    assert np.array_equal(run_outputs(program, inputs)["y"], want)
    assert _lx_spare().mark == 0xFF
    # the marks are zeroed on every core a run marked (the reader's on all of them): the run
    # marking 1 leaves no older mark that a run 254 runs on, marking 0xFF again, would take
    # for its own
    assert np.array_equal(run_outputs(program, inputs)["y"], want)
    assert _lx_spare().mark == 1 and set(np.unique(_lx_spare().written).tolist()) <= {0, 1}
    # a run marking 2 reads b's second half as the earlier run left it
    with pytest.raises(ExecutionError, match="never written"):
        run_outputs(cut, inputs)


@pytest.mark.parametrize("reader", [0, 2, 4])
def test_unchecked_runs_read_unwritten_bytes_as_zeros(reader):
    program, cut, inputs = _programs(reader)
    zeros = run_program(cut, inputs, FAST)[0]["y"]  # fresh memories: half of b_lx reads as zeros
    for options in (RunOptions(), FAST):
        run_outputs(program, inputs, options)
        assert np.array_equal(run_outputs(cut, inputs, FAST)["y"], zeros)
    assert not np.array_equal(zeros, run_program(program, inputs)[0]["y"])


def test_kept_memories_start_from_zeros():
    program, _, inputs = _programs()
    _, clean = run_program(program, inputs)
    for _ in range(2):
        run_outputs(program, inputs)
    _, kept = run_program(program, inputs)
    for a, b in zip((clean.hbm, *clean.lx), (kept.hbm, *kept.lx)):
        assert np.array_equal(a.data, b.data) and np.array_equal(a.written, b.written), a.name
        assert a.mark == b.mark == 0xFF


def _b_lx_at(program: Program, address: int) -> Program:
    """``program`` with b's LX copies at LX ``address``."""
    def move(spec):
        if not isinstance(spec, OpSpec):
            return spec
        return dataclasses.replace(spec, args=tuple(dataclasses.replace(a, address=address) if a.name == "b_lx" else a
                                                    for a in spec.args))
    return edit_specs(program, move)


@pytest.mark.parametrize("reader", [0, 2, 4])
def test_what_a_run_wrote_is_inside_the_bytes_the_next_run_zeroes(reader):
    # each row of a recycled memory is zeroed (data unchecked, marks when they restart) up to
    # the bytes any run may have written there: nothing beyond them is nonzero, on the core
    # the copy op's store wrote, on the cores whose copies a read made, and on those whose
    # marks a read set. b's copies lie above everything else in LX, so no other store reaches
    # them on any core.
    program, cut, inputs = _programs(reader)
    program, cut = (_b_lx_at(p, (1 << 20) + (1 << 16)) for p in (program, cut))
    interpreter._SPARES.clear()
    for options in (RunOptions(), FAST, RunOptions(), FAST):
        for p in (program, cut):
            try:
                run_outputs(p, inputs, options)
            except ExecutionError:
                assert p is cut and options is not FAST
                continue
            for spare in interpreter._SPARES:
                data, written = (a.reshape(spare.rows, -1) for a in (spare.data, spare.written))
                for row, end in enumerate(spare.end):
                    assert not data[row, end:].any() and not written[row, end:].any(), (row, end)
