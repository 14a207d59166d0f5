"""Unrolling (fspyre.lower.unroll): the interpreter gives identical results on the looped and
the unrolled program, and both equal the untiled program."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from looped_programs import (
    CASE_GRAPHS,
    add_graph,
    hand_tiled_programs,
    hinted_cases,
    inputs_for,
    looped_cases,
    untiled,
)

from fspyre.check import compare
from fspyre.errors import LoweringError
from fspyre.ir.program import LoopSpec, OpSpec, op_specs, walk_specs
from fspyre.ir.serialize import dumps, loads
from fspyre.lower.unroll import unroll
from fspyre.machine.interpreter import run_program
from fspyre.machine.reference import evaluate_with_bounds

LOOPED = looped_cases()


def assert_identical(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k], equal_nan=True), k


def _trip_product(program) -> int:
    """How many OpSpecs the unrolled program has: each op times its enclosing counts (an op of
    one iteration of its innermost loop, times the counts outside that one)."""
    def count(body, mult, inner):
        n = 0
        for s in body:
            if isinstance(s, LoopSpec):
                n += count(s.body, mult * s.count, s.count)
            else:
                n += mult if s.runs == "every" else mult // inner
        return n

    return count(program.body, 1, 1)


def check_unrolled(program, graph, seed: int = 0, exact: bool = True) -> None:
    """Looped and unrolled runs are identical; both equal the untiled run bit for bit, or,
    when a reduction dim is tiled (summation order changes), pass fspyre.check against the
    reference."""
    flat = unroll(program)
    assert all(isinstance(s, OpSpec) for s in flat.body)
    assert len(flat.body) == _trip_product(program)
    for op in flat.body:
        assert op.tiled_symbols == ()
        assert all(t.tile_advance == () for t in op.args)
    assert loads(dumps(flat)) == flat
    inputs = inputs_for(graph, seed)
    looped_out, _ = run_program(program, inputs)
    flat_out, _ = run_program(flat, inputs)
    assert_identical(looped_out, flat_out)
    if exact:
        plain_out, _ = run_program(untiled(graph), inputs)
        assert_identical(looped_out, plain_out)
    else:
        report = compare(graph, looped_out, *evaluate_with_bounds(graph, inputs))
        assert report.equal, str(report)


@pytest.mark.parametrize("name", sorted(LOOPED))
def test_unrolled_equals_looped_and_untiled(name):
    check_unrolled(LOOPED[name], CASE_GRAPHS[name]())


@pytest.mark.parametrize("name", sorted(hinted_cases()))
def test_unrolled_pipeline_tiled_programs(name):
    program, graph = hinted_cases()[name]
    assert any(isinstance(s, LoopSpec) for s, _ in walk_specs(program.body))
    check_unrolled(program, graph, exact=name != "matmul_tiled_k")


def test_brief_example_addresses():
    """[4,128] fp16 add in LoopSpec(2) over rows: copy 1 reads and writes one row block
    (2 rows x 64 elements x 2 bytes = 256 bytes) further on."""
    program = LOOPED["add_rows"]
    ((loop,),) = (program.body,)
    (op,) = loop.body
    assert [t.tile_advance for t in op.args] == [(256,)] * 3
    first, second = unroll(program).body
    assert [t.address for t in second.args] == [t.address + 256 for t in first.args]
    assert [t.address for t in first.args] == [t.address for t in op.args]


def test_order_is_innermost_first():
    """LoopSpec(2){LoopSpec(2){add, mul}} unrolls to add, mul for (0,0), (0,1), (1,0), (1,1)."""
    program = LOOPED["add_mul_2x2_lx"]
    flat = unroll(program).body
    assert [op.name for op in flat] == ["buf0", "buf1"] * 4
    outer, inner = 256, 1024  # A: 2 rows x 64 x 2 bytes; B: 2 sticks x 4 rows x 64 x 2 bytes
    looped_c = op_specs(program)[1].args[1]
    assert looped_c.tile_advance == (outer, inner)
    assert [op.args[1].address - looped_c.address for op in flat[1::2]] == [0, inner, outer, outer + inner]
    assert all((op.args[0].memory, op.args[0].address) == ("lx", 0) for op in flat[1::2])


def test_untouched_programs_are_shared():
    program = untiled(add_graph())
    assert unroll(program) is program
    flat = unroll(LOOPED["add_rows"])
    assert unroll(flat) is flat


def test_mismatched_levels_are_refused():
    program = untiled(add_graph())
    (op,) = program.body
    bad = replace(op, args=(replace(op.args[0], tile_advance=(256, 256)), *op.args[1:]))
    with pytest.raises(LoweringError, match=r"op add buf0: tensor a has tile_advance \[256, 256\] \(2 levels\)"):
        unroll(replace(program, body=(LoopSpec(count=2, body=(bad,)),)))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=hand_tiled_programs(), seed=st.integers(0, 3))
def test_property_hand_tiled(case, seed):
    program, graph = case
    check_unrolled(program, graph, seed)
