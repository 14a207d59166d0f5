"""``run_outputs`` hands its memories to the next run without zeroing them (interpreter
``_Spare``): the next checked run marks what it writes with a newer mark, and a run without
written marks zeroes the data first. What a run reads is what it wrote, whatever ran before:
a byte an earlier run wrote and this one did not is unwritten, and reads as zero unchecked."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from replica_programs import replicated_matmul, with_specs

from fspyre.errors import ExecutionError
from fspyre.ir.frozen import FrozenMap
from fspyre.ir.program import even_core_spaces
from fspyre.machine import interpreter
from fspyre.machine.interpreter import RunOptions, run_outputs, run_program
from fspyre.testing import inputs_for

FAST = RunOptions(check_written=False)


def _programs():
    """A tiled matmul (b copied into every core's LX, then read there), and the same program
    with the copy of b cut to its first 64 rows: the matmul reads LX bytes this run wrote and
    bytes only an earlier run can have written."""
    graph, program, copy = replicated_matmul()
    space = FrozenMap((s, (64, 1) if s.name == "K" else v) for s, v in copy.iteration_space.items())
    half = dataclasses.replace(copy, iteration_space=space, core_spaces=even_core_spaces(space))
    cut = with_specs(program, copy, (half,))
    return program, cut, inputs_for(graph)


def test_a_byte_an_earlier_run_wrote_is_unwritten():
    program, cut, inputs = _programs()
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


def test_marks_start_again_after_255_runs():
    program, cut, inputs = _programs()
    want = run_program(program, inputs)[0]["y"]
    run_outputs(program, inputs)
    _lx_spare().mark = 0xFE  # as after 254 runs
    assert np.array_equal(run_outputs(program, inputs)["y"], want)
    assert _lx_spare().mark == 0xFF
    # the marks are zeroed: a run marking 1 reads b's second half as the earlier run left it
    with pytest.raises(ExecutionError, match="never written"):
        run_outputs(cut, inputs)


def test_unchecked_runs_read_unwritten_bytes_as_zeros():
    program, cut, inputs = _programs()
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
