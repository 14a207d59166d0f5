"""Issue 2: ``run(compile(g))`` agrees with ``evaluate(g)`` on random graphs and core counts.

Graphs without reductions must be bit-exact (same values, same NaN positions, same dtype
and shape); graphs with reductions must pass ``fspyre.check`` (docs/semantics.md). Any
FspyreError from compiling or running a graph the builder accepted is a failure too.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import fspyre
from fspyre.machine.spyre import spyre
from fspyre.testing import core_counts, examples, has_reduction, inputs_for, programs

machines = st.builds(
    spyre, cores=core_counts(), fp16_format=st.sampled_from(("SEN169_FP16", "IEEE_FP16")),
)
seeds = st.integers(0, 2**16)


def assert_bit_exact(got: dict[str, np.ndarray], ref: dict[str, np.ndarray]) -> None:
    assert got.keys() == ref.keys()
    for name in ref:
        a, b = np.asarray(got[name]), np.asarray(ref[name])
        assert (a.dtype, a.shape) == (b.dtype, b.shape), f"output {name}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
        equal_nan = a.dtype.kind == "f"
        if not np.array_equal(a, b, equal_nan=equal_nan):
            bad = np.argwhere(~((a == b) | (np.isnan(a) & np.isnan(b)) if equal_nan else a == b))
            where = tuple(int(i) for i in bad[0]) if bad.size else ()
            raise AssertionError(
                f"output {name}: {len(bad)} of {a.size} elements differ, first at {where}: "
                f"run {a[where] if a.ndim else a} vs evaluate {b[where] if b.ndim else b}"
            )


def run_and_evaluate(graph, machine, seed):
    comp = fspyre.compile(graph, machine=machine, tiling="none")
    inputs = inputs_for(graph, seed)
    return comp, inputs, fspyre.run(comp, inputs), fspyre.evaluate(graph, inputs, machine)


@settings(max_examples=examples(120))
@given(prog=programs(kinds=("pointwise",)), machine=machines, seed=seeds)
def test_pointwise_graphs_are_bit_exact(prog, machine, seed):
    graph = prog.graph
    assert not has_reduction(graph)
    comp, inputs, got, ref = run_and_evaluate(graph, machine, seed)
    assert_bit_exact(got, ref)
    report = fspyre.check(graph, inputs, machine=machine, tiling="none", comp=comp)
    assert report.exact and report.equal, str(report)


@settings(max_examples=examples(150))
@given(prog=programs(), machine=machines, seed=seeds)
def test_graphs_agree_with_reference(prog, machine, seed):
    graph = prog.graph
    comp, inputs, got, ref = run_and_evaluate(graph, machine, seed)
    if not has_reduction(graph):
        assert_bit_exact(got, ref)
    report = fspyre.check(graph, inputs, machine=machine, tiling="none", comp=comp)
    assert report.equal, str(report)


@settings(max_examples=examples(60))
@given(prog=programs(kinds=("reduction", "matmul"), max_ops=5), machine=machines, seed=seeds)
def test_reduction_and_matmul_graphs_agree_with_reference(prog, machine, seed):
    graph = prog.graph
    comp, inputs, _, _ = run_and_evaluate(graph, machine, seed)
    report = fspyre.check(graph, inputs, machine=machine, tiling="none", comp=comp)
    assert report.equal, str(report)
