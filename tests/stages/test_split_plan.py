"""divide_work: stick adjustment, per-core span, span reduction, work distribution, hints.

Expected splits follow the anchor's rules (torch-spyre's ``work_division.py``: stick
adjustment, span reduction, work distribution); every plan that can run at test size is also
run on the interpreter against the reference (``fspyre.check``).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import sympy
from workloads import add_mul, compile, pointwise, softmax

import fspyre
from fspyre.errors import HintError, MachineError, WorkDivisionError
from fspyre.ir.frozen import FrozenMap
from fspyre.ir.looptree import loop_counts, op_nodes
from fspyre.ir.plans import OpSplit
from fspyre.ir.program import op_specs
from fspyre.ir.serialize import dumps, loads
from fspyre.machine.rules import core_slices
from fspyre.machine.spyre import Machine
from fspyre.stages.access import op_accesses
from fspyre.stages.allocation import allocate
from fspyre.stages.split_plan import (
    SplitOptions,
    divide_work,
    per_core_span,
    splits_from_index_coeffs,
    verify_split_plan,
)

M32 = fspyre.machine.spyre()


def plan(graph, machine=M32, **options):
    """The untiled graph's split plan (divide_work alone: no program is emitted)."""
    return divide_work(untiled_tree(graph), machine, SplitOptions(**options))


def splits_of(graph, machine=M32, **options):
    return {name: dict(s.splits) for name, s in plan(graph, machine, **options).ops.items()}


def untiled_tree(graph):
    from fspyre.stages.loop_tree import tile
    from fspyre.stages.tiling_plan import TilingOptions, plan_tiling

    return tile(graph, plan_tiling(graph, TilingOptions(mode="none")))


def test_pointwise_1024x4096_fp16_on_32_cores():
    graph = pointwise((1024, 4096))
    split = plan(graph).ops["buf0"]
    # A: 1024 rows; B: 4096 elements = 64 sticks. Larger adjusted size first: A takes all 32.
    assert dict(split.splits) == {"A": 32, "B": 1}
    assert split.cores == 32
    assert dict(split.stick_elems) == {"B": 64}
    assert dict(split.span_splits) == {}
    assert dict(split.output_coeffs) == {4096: 32} and dict(split.reduction_coeffs) == {}
    assert fspyre.check(graph, comp=compile(graph, tiling="none")).equal


@pytest.mark.parametrize("n, dtype, want", [(320, "float16", 5), (320, "float32", 10), (4096, "float16", 32)])
def test_the_stick_count_limits_the_split(n, dtype, want):
    # 320 elements have the divisor 32, but 320 fp16 elements are 5 sticks: 5 cores.
    graph = pointwise((n,), dtype, names="N")
    assert splits_of(graph)["buf0"] == {"N": want}
    assert fspyre.check(graph, comp=compile(graph, tiling="none")).equal


def test_tensors_sharing_a_stick_dim_split_it_in_the_largest_sticks():
    g = fspyre.GraphBuilder("cast")
    g.dim("N", 256)
    x = g.input("x", ["N"], "float16")
    g.output("y", g.cast(x, "float32"))  # fp16 sticks of 64 (4), fp32 sticks of 32 (8)
    graph = g.build()
    split = plan(graph).ops["buf0"]
    assert dict(split.splits) == {"N": 4} and dict(split.stick_elems) == {"N": 64}
    assert fspyre.check(graph, comp=compile(graph, tiling="none")).equal


def test_a_stick_dim_that_is_not_whole_sticks_puts_the_partial_stick_in_the_last_slice():
    graph = pointwise((4, 150))  # 150 = 2 sticks + 22: every slice starts on a stick
    split = plan(graph).ops["buf0"]
    assert dict(split.splits) == {"A": 4, "B": 3} and dict(split.slices) == {"A": (1, 1, 1, 1), "B": (64, 64, 22)}
    comp = compile(graph, tiling="none")
    assert fspyre.check(graph, comp=comp).equal
    spaces = op_specs(comp.program)[0].core_spaces  # core 4k + a: row a, stick k
    assert spaces[0] == ((0, 1), (0, 64)) and spaces[5] == ((1, 1), (64, 64)) and spaces[11] == ((3, 1), (128, 22))


@pytest.mark.parametrize("shape, want, cores", [
    ((24, 64), {"A": 24, "B": 1}, 24),  # 32 // 24 = 1 core left: 8 cores idle
    ((7, 64), {"A": 7, "B": 1}, 7),
    ((48, 192), {"A": 10, "B": 3}, 30),  # 5 rows x 1 stick a core at most (24 x 1: 2 rows x 3 sticks)
    ((3, 640), {"A": 3, "B": 10}, 30),  # 3, then 32 // 3 = 10 of B's 10 sticks
])
def test_shapes_that_leave_cores_unused(shape, want, cores):
    graph = pointwise(shape)
    split = plan(graph).ops["buf0"]
    assert dict(split.splits) == want and split.cores == cores
    assert fspyre.check(graph, comp=compile(graph, tiling="none")).equal


def test_per_core_span_is_the_outermost_dim_a_core_touches():
    graph = pointwise((1024, 4096))
    tree = untiled_tree(graph)
    node = op_nodes(tree)[0]
    acc = op_accesses(node, (), tree.buffer_table(), M32)[0]  # a: device (64, 1024, 64), coords (B//64, A, B%64)
    sizes = {"A": 1024, "B": 4096}
    whole = 64 * 1024 * 64 * 2
    assert per_core_span(acc, sizes, {}) == whole
    assert per_core_span(acc, sizes, {"B": 4}) == whole // 4
    assert per_core_span(acc, sizes, {"A": 32}) == whole  # splitting an inner device dim does not help


def test_a_tensor_over_the_span_limit_forces_a_split():
    # 512 MiB per tensor. Two slices of B would leave 256 MiB = 268,435,456 bytes per core, just
    # over MAX_SPAN_BYTES = 65535 * 4096 = 268,431,360: span reduction needs 4.
    graph = pointwise((65536, 4096))
    only = plan(graph, distribute=False).ops["buf0"]
    assert dict(only.span_splits) == {"B": 4} and dict(only.splits) == {"A": 1, "B": 4}
    full = plan(graph).ops["buf0"]
    assert dict(full.span_splits) == {"B": 4} and dict(full.splits) == {"A": 8, "B": 4}  # 32 // 4 = 8 for A
    old_limit = Machine(span_limit=256 * 1024 * 1024)  # the pre-#3162 limit: 2 slices fit exactly
    assert dict(plan(graph, old_limit, distribute=False).ops["buf0"].span_splits) == {"B": 2}


def test_a_span_the_cores_cannot_bring_under_the_limit_is_an_error():
    graph = pointwise((65536, 4096))
    with pytest.raises(WorkDivisionError) as err:
        plan(graph, fspyre.machine.spyre(cores=2))
    msg = str(err.value)
    for part in ("op buf0", "tensor a", "268435456 bytes per core", "268431360-byte per-core span limit", "slices="):
        assert part in msg, msg


def test_a_span_needing_two_split_reduction_dims_is_an_error():
    g = fspyre.GraphBuilder("big_sum")
    g.dim("K1", 1 << 21)
    g.dim("K2", 128)
    x = g.input("x", ["K1", "K2"], "float16")  # device (2, 2M, 64): 512 MiB
    g.output("s", g.sum(x, ["K1", "K2"], keepdim=True))
    with pytest.raises(WorkDivisionError) as err:
        plan(g.build())
    assert "at most 1 reduction dim may be split" in str(err.value) and "K1" in str(err.value)


def test_a_full_reduction_splits_one_reduction_dim():
    g = fspyre.GraphBuilder("total")
    g.dim("A", 64)
    g.dim("B", 128)
    x = g.input("x", ["A", "B"], "float32")
    g.output("s", g.sum(x, ["A", "B"], keepdim=True))
    graph = g.build()
    # No output dim to split; of the reduction dims (A: 64, B: 4 fp32 sticks) the one taking
    # the most cores is split, only that one.
    assert splits_of(graph)["buf0"] == {"A": 32, "B": 1}
    assert fspyre.check(graph, comp=compile(graph, tiling="none")).equal


def test_matmul_splits_k_only_when_the_output_cannot_use_the_cores():
    g = fspyre.GraphBuilder("mm")
    g.dim("M", 4)
    g.dim("K", 256)
    g.dim("N", 64)
    a = g.input("a", ["M", "K"], "float16")
    b = g.input("b", ["K", "N"], "float16")
    g.output("c", g.matmul(a, b))
    graph = g.build()
    split = plan(graph).ops["buf0"]
    # M takes 4, N is one stick, then K (4 sticks) takes the 32 // 4 = 8 cores' largest divisor.
    assert dict(split.splits) == {"M": 4, "N": 1, "K": 4}
    assert dict(split.reduction_coeffs) == {1: 4} and dict(split.output_coeffs) == {64: 4}
    assert fspyre.check(graph, comp=compile(graph, tiling="none")).equal


def test_var_never_splits_its_reduction():
    g = fspyre.GraphBuilder("v")
    g.dim("A", 4)
    g.dim("N", 4096)
    x = g.input("x", ["A", "N"], "float32")
    g.output("v", g.var(x, ["N"], keepdim=True))  # [4, 1]: A is not a stick dim of the result
    graph = g.build()
    assert splits_of(graph)["buf0"] == {"A": 4, "N": 1}
    assert fspyre.check(graph, comp=compile(graph, tiling="none")).equal


@pytest.mark.parametrize("cores", [0, 33, -1])
def test_invalid_core_counts_are_refused(cores):
    with pytest.raises(MachineError, match=r"1\.\.32"):
        fspyre.machine.spyre(cores=cores)


@pytest.mark.parametrize("budget", [0, 33, True, 2.0])
def test_an_invalid_core_budget_is_refused(budget):
    with pytest.raises(WorkDivisionError, match=r"max_cores=.*1\.\.32"):
        plan(pointwise((64, 64)), max_cores=budget)


def test_the_core_budget_limits_the_split():
    assert splits_of(pointwise((64, 64)), max_cores=8)["buf0"] == {"A": 8, "B": 1}
    with pytest.raises(WorkDivisionError, match=r"1\.\.4"):
        plan(pointwise((64, 64)), fspyre.machine.spyre(cores=4), max_cores=8)


def test_cores_map_to_slices_first_dim_fastest():
    # The anchor's test_core_mapping: splits (2, 3) -> (0,0) (1,0) (0,1) (1,1) (0,2) (1,2).
    assert core_slices((2, 3)).tolist() == [[0, 0], [1, 0], [0, 1], [1, 1], [0, 2], [1, 2]]


# -- work_div hints ----------------------------------------------------------------------------


def hinted(work_div, shape=(64, 256), **kw):
    g = fspyre.GraphBuilder("h")
    g.dim("A", shape[0])
    g.dim("B", shape[1])
    x = g.input("x", ["A", "B"], "float16")
    with g.hint(work_div=work_div):
        y = g.exp(x)
    g.output("y", y)
    return g.build()


def test_a_work_div_hint_is_authoritative():
    graph = hinted({"B": 2})
    split = plan(graph).ops["buf0"]
    assert dict(split.splits) == {"A": 1, "B": 2} and split.hinted
    assert fspyre.check(graph, comp=compile(graph, tiling="none")).equal
    assert splits_of(graph, use_hints=False)["buf0"] == {"A": 32, "B": 1}


def test_a_hint_that_does_not_divide_gives_uneven_slices_of_whole_sticks():
    graph = hinted({"B": 3})  # B = 256 elements = 4 sticks: 2, 1, 1
    split = plan(graph).ops["buf0"]
    assert dict(split.splits) == {"A": 1, "B": 3} and dict(split.slices) == {"B": (128, 64, 64)}
    assert fspyre.check(graph, comp=compile(graph, tiling="none")).equal
    over = plan(hinted({"B": 5}))  # 5 slices of 4 sticks: one stick per core, and a warning
    assert dict(over.ops["buf0"].splits)["B"] == 4
    assert any("work_div hint {'B': 5}: 5 slices are more than dim B has (4 sticks), so it is split into 4" in w
               for w in over.warnings)


def test_a_hint_beyond_the_core_budget_is_skipped_with_a_warning():
    """A dropped hint is a warning (docs/tiling.md, "Hint warnings"), carried as data."""
    result = plan(hinted({"A": 64}))
    assert dict(result.ops["buf0"].splits) == {"A": 1, "B": 1}
    assert any("skipped" in n and "64" in n for n in result.warnings), result.warnings


def test_a_hint_on_a_dim_no_op_of_its_scope_iterates_is_a_warning():
    """Like a slices level no op iterates: the hint has no effect, so it warns (it was an
    error before the one warning policy; docs/tiling.md, "Hint warnings")."""
    g = fspyre.GraphBuilder("h")
    g.dim("A", 64)
    g.dim("B", 64)
    g.dim("C", 8)
    x = g.input("x", ["A", "B"], "float16")
    with g.hint(work_div={"C": 2}):
        y = g.exp(x)
    g.output("y", y)
    result = plan(g.build())
    assert result.warnings == (
        "hint scope 0 work_div={'C': 2}: no op of [buf0] iterates dim C; hint ignored "
        "(remove it, or build the ops that iterate C inside the scope)",
    )
    assert result.ops["buf0"].hinted


def test_a_hint_dim_some_ops_of_the_scope_lack_splits_only_the_others():
    g = fspyre.GraphBuilder("h")
    g.dim("A", 64)
    g.dim("B", 128)
    x = g.input("x", ["A", "B"], "float32")
    with g.hint(work_div={"B": 2}):
        s = g.sum(x, ["B"])  # iterates B (reduction)
        y = g.neg(s)  # iterates only A
    g.output("y", y)
    result = plan(g.build())
    assert result.warnings == ()
    assert result.ops["buf0"].splits["B"] == 2
    assert "B" not in result.ops["buf1"].splits


def test_a_hint_may_not_split_var_or_two_reduction_dims():
    g = fspyre.GraphBuilder("h")
    g.dim("A", 64)
    g.dim("B", 128)
    x = g.input("x", ["A", "B"], "float32")
    with g.hint(work_div={"B": 2}):
        v = g.var(x, ["B"])
    with g.hint(work_div={"A": 2, "B": 2}):
        s = g.sum(x, ["A", "B"])
    g.output("v", v)
    g.output("s", s)
    graph = g.build()
    with pytest.raises(HintError, match="partial variances"):
        divide_work(untiled_tree(graph), M32, SplitOptions())
    without_var = fspyre.GraphBuilder("h2")
    without_var.dim("A", 64)
    without_var.dim("B", 128)
    x = without_var.input("x", ["A", "B"], "float32")
    with without_var.hint(work_div={"A": 2, "B": 2}):
        s = without_var.sum(x, ["A", "B"])
    without_var.output("s", s)
    graph = without_var.build()
    with pytest.raises(HintError, match="at most one reduction dim"):
        divide_work(untiled_tree(graph), M32, SplitOptions())


def test_index_coefficients_key_the_splits_like_the_anchor():
    # The anchor's hint test: [M=128, K=256] @ [K, N] with work_div {M: 2, K: 4}.
    g = fspyre.GraphBuilder("mm")
    g.dim("M", 128)
    g.dim("K", 256)
    g.dim("N", 64)
    a = g.input("a", ["M", "K"], "float16")
    b = g.input("b", ["K", "N"], "float16")
    with g.hint(work_div={"M": 2, "K": 4}):
        c = g.matmul(a, b)
    g.output("c", c)
    graph = g.build()
    split = plan(graph).ops["buf0"]
    assert dict(split.splits) == {"M": 2, "N": 1, "K": 4}
    assert dict(split.output_coeffs) == {64: 2}  # M's coefficient in c's index 64*M + N
    assert dict(split.reduction_coeffs) == {1: 4}  # K's in a's index 256*M + K
    assert splits_from_index_coeffs(graph.ops[0], split) == dict(split.splits)
    assert fspyre.check(graph, comp=compile(graph, tiling="none")).equal


# -- the plan as data --------------------------------------------------------------------------


@pytest.mark.parametrize("graph", [add_mul(256, 512), softmax(128, 256, row_tiles=2)], ids=["add_mul", "softmax"])
def test_accesses_are_the_coordinates_the_program_uses(graph):
    comp = compile(graph)
    tree = comp.stages["loop_tree"]
    counts = loop_counts(tree)
    emitted = {s.name: s for s in _op_specs(comp.program)}
    for node in op_nodes(tree):
        mine = op_accesses(node, counts[node.name], tree.buffer_table(), M32)
        theirs = emitted[node.name].args
        assert [(a.buffer, a.coords) for a in mine] == [(t.name, t.device_coordinates) for t in theirs]


def _op_specs(program):
    from fspyre.ir.program import op_specs

    return op_specs(program)


def test_split_plans_round_trip_and_are_deterministic():
    graph = softmax(128, 256, row_tiles=2)
    tree = compile(graph).stages["loop_tree"]
    first = divide_work(tree, M32, SplitOptions())
    assert loads(dumps(first)) == first
    assert divide_work(tree, M32, SplitOptions()) == first


def test_coordinate_terms_group_by_shared_variables():
    from fspyre.machine.rules import coord_bounds, coord_terms

    c1, c2, c3 = sympy.symbols("c1 c2 c3", integer=True, nonnegative=True)
    const, groups = coord_terms(sympy.floor(c1 / 64) + 3 + sympy.Mod(c2, 4) + sympy.floor((2 * c2 + c3) / 8))
    assert const == 3 and sorted(tuple(map(str, v)) for v, _ in groups) == [("c1",), ("c2", "c3")]
    # over cores splitting c2 in 2: the (c2, c3) group is swept as one block per slice
    lows, highs = coord_bounds([sympy.floor((2 * c2 + c3) / 8)], [c2, c3], [(4, 4), (4,)])
    assert lows[:, 0].tolist() == [0, 1] and highs[:, 0].tolist() == [1, 2]
    # uneven slices of c2 (5 and 3): 2 * c2 + c3 runs over 0..11, then 10..17
    lows, highs = coord_bounds([sympy.floor((2 * c2 + c3) / 8)], [c2, c3], [(5, 3), (4,)])
    assert lows[:, 0].tolist() == [0, 1] and highs[:, 0].tolist() == [1, 2]
    lows, highs = coord_bounds([2 * c2 + c3], [c2, c3], [(5, 3), (1, 3)])
    assert lows[:, 0].tolist() == [0, 10, 1, 11] and highs[:, 0].tolist() == [8, 14, 11, 17]
    assert np.array_equal(core_slices(()), np.zeros((1, 0)))


# -- verify_split_plan ---------------------------------------------------------------------------
def test_a_split_plan_made_for_another_graph_is_refused_by_name():
    tree = untiled_tree(add_mul(64, 128, tiled=False))  # ops buf0 (add), buf1 (mul)
    other = plan(pointwise((64, 128)))  # one op, buf0, over the same dims
    with pytest.raises(WorkDivisionError, match=r"split plan has no entry for op buf1 of loop tree add_mul "
                                                r"\(it divides \[buf0\]\).*divide_work\(tree, machine\)"):
        allocate(tree, other, M32)  # was a bare KeyError
    with pytest.raises(WorkDivisionError, match=r"split plan divides op buf1, which loop tree pointwise does not "
                                                r"have \(its ops: \[buf0\]\)"):
        verify_split_plan(untiled_tree(pointwise((64, 128))), plan(add_mul(64, 128, tiled=False)), M32)
    mine = plan(add_mul(64, 128, tiled=False))
    theirs = plan(softmax(64, 128)).ops["buf0"]  # softmax's buf0 (amax) iterates M, N
    with pytest.raises(WorkDivisionError, match=r"op buf0 iterates dims \['A', 'B'\] \(size > 1, in order\) but "
                                                r"its split lists \['M', 'N'\]"):
        verify_split_plan(tree, replace(mine, ops=mine.ops.set("buf0", theirs)), M32)


def test_verify_split_plan_checks_cores_sticks_and_span():
    graph = add_mul(1024, 4096, tiled=False)
    tree = untiled_tree(graph)
    good = plan(graph)
    assert verify_split_plan(tree, good, M32) is good
    assert dict(good.ops["buf0"].splits) == {"A": 32, "B": 1}
    with pytest.raises(WorkDivisionError, match=r"op buf0 runs on 32 cores \({'A': 32, 'B': 1}\), more than the "
                                                r"machine's 8; divide its work for this machine"):
        verify_split_plan(tree, good, fspyre.machine.spyre(cores=8))
    # a core's 32 rows cross all 64 sticks of B, each 1024 rows x 128 bytes apart: 64 x 131072 bytes
    narrow = Machine(span_limit=65536)
    with pytest.raises(WorkDivisionError, match=r"op buf0 spans 8388608 bytes of tensor a per core with splits "
                                                r"{'A': 32, 'B': 1}, over the 65536-byte per-core span limit"):
        verify_split_plan(tree, good, narrow)
    # B of 128 fp16 elements is 2 sticks: 4 slices would put half a stick on each core
    small = pointwise((64, 128))
    base = plan(small)
    mid_stick = OpSplit(splits=FrozenMap({"A": 1, "B": 4}), cores=4, stick_elems=FrozenMap({"B": 64}),
                        slices=FrozenMap({"B": (32, 32, 32, 32)}))
    with pytest.raises(WorkDivisionError, match=r"op buf0 splits dim B \(size 128\) into slices of \[32, 32, 32, 32\] "
                                                r"elements, which are not whole 64-element sticks per core \(only the "
                                                r"last may end in a partial stick\); use "
                                                r"fspyre.machine.rules.slice_extents\(128, 2, 64\)"):
        verify_split_plan(untiled_tree(small), replace(base, ops=base.ops.set("buf0", mid_stick)), M32)


def test_only_the_last_slice_may_end_in_a_partial_stick():
    # B of 192 fp16 elements (3 sticks) in slices of 64, 32 and 96: the second holds half a stick
    # although the last is the only slice that may (a rule checking all but the last two passes it)
    small = pointwise((64, 192))
    base = plan(small)
    odd = OpSplit(splits=FrozenMap({"A": 1, "B": 3}), cores=3, stick_elems=FrozenMap({"B": 64}),
                  slices=FrozenMap({"B": (64, 32, 96)}))
    with pytest.raises(WorkDivisionError, match=r"op buf0 splits dim B \(size 192\) into slices of \[64, 32, 96\] "
                                                r"elements, which are not whole 64-element sticks per core"):
        verify_split_plan(untiled_tree(small), replace(base, ops=base.ops.set("buf0", odd)), M32)
    # the partial stick in the last slice is the layout's own: 64, 64 and 64 + 0
    whole = OpSplit(splits=FrozenMap({"A": 1, "B": 3}), cores=3, stick_elems=FrozenMap({"B": 64}),
                    slices=FrozenMap({"B": (64, 64, 64)}))
    verify_split_plan(untiled_tree(small), replace(base, ops=base.ops.set("buf0", whole)), M32)
