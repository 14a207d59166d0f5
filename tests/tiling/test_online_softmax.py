"""Online softmax (fspyre/stages/online_softmax.py; docs/tiling.md, "Online softmax"): a
softmax, log-softmax or attention tiled over its reduction dim equals untiled execution within
the documented tolerance (docs/semantics.md, "Online softmax"), and the float64 reference of
fspyre.testing.numpy_ref within its bound; its carried buffers are explicit in the loop tree;
HBM traffic is the compulsory minimum for attention and one extra read of the input for a
softmax whose result is kept (the second loop)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tiling_examples import attention, softmax_over

import fspyre
from fspyre.check import REDUCTION_RTOL
from fspyre.errors import TilingError
from fspyre.ir.looptree import Loop, LoopTree, OpNode, op_nodes, walk
from fspyre.ir.serialize import dumps, loads
from fspyre.machine.report import traffic_report
from fspyre.stages.loop_tree import verify_loop_tree
from fspyre.stages.online_softmax import LOWEST
from fspyre.testing import examples, numpy_ref

pytestmark = pytest.mark.filterwarnings("ignore::fspyre.FspyreWarning")
SETTINGS = settings(max_examples=examples(12), deadline=None)
U16 = 2.0**-10  # DLFloat16's unit roundoff (9 fraction bits)


def _dlfloat16(x: np.ndarray) -> np.ndarray:
    """``x`` rounded to 10 significant bits, so copy-in to DLFloat16 is exact and the float64
    reference starts from the values the device holds (as the campaign's inputs do)."""
    m, e = np.frexp(x.astype(np.float64))
    return np.ldexp(np.round(m * 2**10) / 2**10, e).astype(x.dtype)


def _run(graph, inputs, tiling, machine):
    comp = fspyre.compile(graph, machine, tiling=tiling)
    return comp, fspyre.run(comp, inputs)


def _loops(tree: LoopTree) -> list[Loop]:
    return [n for n, _ in walk(tree.body) if isinstance(n, Loop)]


def _softmax_ref(x: np.ndarray, kind: str, dtype: str) -> numpy_ref.Ref:
    """float64 softmax / log_softmax over C from the definition, with numpy_ref's bound for the
    ops the front end emits."""
    f = "SEN169_FP16"
    shape = x.shape
    r = numpy_ref.exact(("B", "C"), x, dtype)
    if dtype != "float32":
        r = numpy_ref.pointwise("cast", [r], ("B", "C"), shape, "float32", f)
    m = numpy_ref.reduce("amax", r, ("C",), ("B", "C"), True, "float32", f)
    d = numpy_ref.pointwise("sub", [r, m], ("B", "C"), shape, "float32", f)
    e = numpy_ref.pointwise("exp", [d], ("B", "C"), shape, "float32", f)
    total = numpy_ref.reduce("sum", e, ("C",), ("B", "C"), True, "float32", f)
    if kind == "softmax":
        y = numpy_ref.pointwise("div", [e, total], ("B", "C"), shape, "float32", f)
    else:
        y = numpy_ref.pointwise("sub", [d, numpy_ref.pointwise("log", [total], ("B", "C"), (shape[0], 1),
                                                               "float32", f)], ("B", "C"), shape, "float32", f)
    return numpy_ref.pointwise("cast", [y], ("B", "C"), shape, dtype, f) if dtype != "float32" else y


@given(rows=st.sampled_from([1, 8, 64]), sticks=st.sampled_from([2, 4, 8]), count=st.sampled_from([2, 4]),
       kind=st.sampled_from(["softmax", "log_softmax"]), dtype=st.sampled_from(["float16", "float32"]),
       scale=st.sampled_from([0.5, 4.0, 30.0]), cores=st.sampled_from([1, 4, 32]), outer=st.sampled_from([1, 2]),
       seed=st.integers(0, 2**16))
@SETTINGS
def test_softmax_over_tiled_dim_equals_untiled_and_reference(rows, sticks, count, kind, dtype, scale, cores, outer,
                                                             seed):
    """Also under an outer level over the rows: each row tile gets its own running max and sum."""
    cols = 64 * sticks * count
    outer = outer if rows % outer == 0 else 1
    graph = softmax_over(rows, cols, count, kind, dtype, outer)
    x = _dlfloat16((np.random.default_rng(seed).standard_normal((rows, cols)) * scale).astype(dtype))
    machine = fspyre.machine.spyre(cores=cores)
    comp, got = _run(graph, {"x": x}, "hints", machine)
    _, want = _run(graph, {"x": x}, "none", machine)
    loops = _loops(comp.stages["loop_tree"])
    assert [len(lp.carried) for lp in loops] == [0] * (outer > 1) + [2, 0]  # the first loop carries max and sum
    a, b = got["y"].astype(np.float64), want["y"].astype(np.float64)
    # two loops, same ops on the same values as untiled except the sum's association and
    # rescaling: the tiled-reduction tolerance (docs/tiling.md, Numerics)
    assert np.abs(a - b).max() <= REDUCTION_RTOL[dtype] * max(1.0, np.abs(b).max())
    assert numpy_ref.accept(got["y"], _softmax_ref(x, kind, dtype)).all()
    # check's per-element bound counts the online recurrence's roundings (docs/semantics.md,
    # "Online softmax"), in float32 too
    assert fspyre.check(graph, {"x": x}, machine=machine, comp=comp).equal


def test_check_bounds_the_online_sum_of_a_float32_softmax_with_subnormal_outputs():
    """The case hypothesis found (rows=64, 8 sticks, C:4, scale 30, seed 210): one output of
    8.7e-43, a float32 subnormal, came out one subnormal spacing (2^-149) from untiled, 6.6
    times the bound when a float32 result's rounding was only counted relative to its size."""
    graph = softmax_over(64, 2048, 4, "softmax", "float32")
    x = _dlfloat16((np.random.default_rng(210).standard_normal((64, 2048)) * 30).astype("float32"))
    machine = fspyre.machine.spyre(cores=4)
    comp, got = _run(graph, {"x": x}, "hints", machine)
    _, want = _run(graph, {"x": x}, "none", machine)
    diff = np.abs(got["y"].astype(np.float64) - want["y"])
    assert 0 < diff[8, 590] <= 2.0**-149  # the element: different, by one subnormal spacing
    report = fspyre.check(graph, {"x": x}, machine=machine, comp=comp)
    assert report.equal, str(report)


def _attention_inputs(queries, keys, head, seed, dtype="float16"):
    rng = np.random.default_rng(seed)
    return {n: _dlfloat16(rng.standard_normal((queries if n == "q" else keys, head)).astype(dtype)) for n in "qkv"}


def _attention_ref(ins) -> tuple[numpy_ref.Ref, np.ndarray]:
    """numpy_ref's float64 attention with its bound, and sum_j p_ij |v_j| (the tolerance's scale)."""
    f = "SEN169_FP16"
    q = numpy_ref.exact(("Sq", "E"), ins["q"], "float16")
    k = numpy_ref.exact(("Sk", "E"), ins["k"], "float16")
    v = numpy_ref.exact(("Sk", "E"), ins["v"], "float16")
    sq, sk = ins["q"].shape[0], ins["k"].shape[0]
    s = numpy_ref.matmul(q, k, "E", ("Sq", "Sk"), "float16", f)
    s = numpy_ref.pointwise("mul", [s, 1.0 / ins["q"].shape[1] ** 0.5], ("Sq", "Sk"), (sq, sk), "float16", f)
    s = numpy_ref.pointwise("cast", [s], ("Sq", "Sk"), (sq, sk), "float32", f)
    m = numpy_ref.reduce("amax", s, ("Sk",), ("Sq", "Sk"), True, "float32", f)
    e = numpy_ref.pointwise("exp", [numpy_ref.pointwise("sub", [s, m], ("Sq", "Sk"), (sq, sk), "float32", f)],
                            ("Sq", "Sk"), (sq, sk), "float32", f)
    total = numpy_ref.reduce("sum", e, ("Sk",), ("Sq", "Sk"), True, "float32", f)
    p = numpy_ref.pointwise("div", [e, total], ("Sq", "Sk"), (sq, sk), "float32", f)
    p = numpy_ref.pointwise("cast", [p], ("Sq", "Sk"), (sq, sk), "float16", f)
    o = numpy_ref.matmul(p, v, "Sk", ("Sq", "E"), "float16", f)
    return o, p.value @ np.abs(ins["v"].astype(np.float64))


def online_tolerance(weighted: np.ndarray, out: np.ndarray) -> np.ndarray:
    """docs/semantics.md, "Online softmax": each probability is rounded to DLFloat16 once in
    both programs, at different scales (2u of it), the output once each (a DLFloat16 ulp, at
    most 2u of it), plus the float32 rescaling and reassociation (2^-16 covers 256 tiles)."""
    return (2 * U16 + 2.0**-16) * weighted + 2 * U16 * np.abs(out) + 2.0**-30


@given(queries=st.sampled_from([1, 16, 64]), key_sticks=st.sampled_from([2, 4, 8]), count=st.sampled_from([2, 4]),
       head=st.sampled_from([32, 64]), cores=st.sampled_from([1, 8, 32]), outer=st.sampled_from([1, 2, 4]),
       seed=st.integers(0, 2**16))
@SETTINGS
def test_attention_tiled_over_keys_equals_untiled_and_reference(queries, key_sticks, count, head, cores, outer, seed):
    """Also inside query tiles (Sq outer, Sk inner: flash attention's blocking)."""
    keys = 64 * key_sticks * count
    outer = outer if queries % outer == 0 else 1
    ins = _attention_inputs(queries, keys, head, seed)
    machine = fspyre.machine.spyre(cores=cores)
    comp, got = _run(attention(queries, keys, head, {"Sq": outer, "Sk": count} if outer > 1 else {"Sk": count}),
                     ins, "hints", machine)
    _, want = _run(attention(queries, keys, head, None), ins, "none", machine)
    loop = _loops(comp.stages["loop_tree"])[-1]
    assert loop.count == count and len(loop.carried) == 3
    ref, weighted = _attention_ref(ins)
    a, b = got["o"].astype(np.float64), want["o"].astype(np.float64)
    assert (np.abs(a - b) <= online_tolerance(weighted, b)).all()
    assert numpy_ref.accept(got["o"], ref).all()
    assert numpy_ref.accept(want["o"], ref).all()


# -- the done-when cases -----------------------------------------------------------------
def test_softmax_512x8192_tiled_8_ways_on_its_reduction_dim():
    graph = softmax_over(512, 8192, 8)
    x = _dlfloat16((np.random.default_rng(1).standard_normal((512, 8192)) * 4).astype(np.float16))
    comp, got = _run(graph, {"x": x}, "hints", fspyre.machine.spyre())
    _, want = _run(graph, {"x": x}, "none", fspyre.machine.spyre())
    assert np.abs(got["y"].astype(np.float64) - want["y"]).max() <= REDUCTION_RTOL["float16"]
    assert numpy_ref.accept(got["y"], _softmax_ref(x, "softmax", "float16")).all()
    # the compulsory minimum: each core's 16 rows of x (256 KiB) stay in LX from the first
    # loop to the second, one slot per tile
    assert traffic_report(comp.program).traffic_ratio == pytest.approx(1.0)
    kept = comp.stages["allocation"].buffers["x_lx"]
    assert kept.memory == "lx" and kept.nbytes == 8 * 16 * 1024 * 2
    assert sorted(set(kept.advances.values())) == [(16 * 1024 * 2,)]


def test_softmax_whose_rows_do_not_fit_lx_re_reads_x_in_the_second_loop():
    """With 384 KiB of LX per core, each core's 256 KiB of x does not fit beside the tiles the
    loops compute: the slots are withdrawn and the second loop reads x from HBM again (ratio
    1.5, as before the slots), still equal."""
    graph = softmax_over(512, 8192, 8)
    machine = fspyre.machine.spyre(lx_bytes=384 * 1024)
    comp = fspyre.compile(graph, machine, tiling="hints")
    assert "x_lx" not in comp.stages["allocation"].buffers
    assert traffic_report(comp.program).traffic_ratio == pytest.approx(1.5)
    x = _dlfloat16((np.random.default_rng(3).standard_normal((512, 8192)) * 4).astype(np.float16))
    assert fspyre.check(graph, {"x": x}, machine=machine, comp=comp).equal


def test_attention_4096_keys_tiled_8_ways_reads_q_k_v_once():
    ins = _attention_inputs(128, 4096, 64, 2)
    comp, got = _run(attention(128, 4096, 64, {"Sk": 8}), ins, "hints", fspyre.machine.spyre())
    _, want = _run(attention(128, 4096, 64, None), ins, "none", fspyre.machine.spyre())
    ref, weighted = _attention_ref(ins)
    b = want["o"].astype(np.float64)
    assert (np.abs(got["o"].astype(np.float64) - b) <= online_tolerance(weighted, b)).all()
    assert numpy_ref.accept(got["o"], ref).all()
    assert traffic_report(comp.program).traffic_ratio == pytest.approx(1.0)


def test_auto_reads_the_keys_of_long_attention_once():
    """64 queries over 16384 keys: query tiles re-read k and v (HBM ratio 7 before online
    softmax). Auto picks a plan that reads everything about once, estimated no slower than
    the key tiling: with the fitted cost model, the untiled program (whose scores fit LX)
    beats key tiles, whose matmuls run 2 query rows per core (bandwidth x (2 / 13)^0.68)."""
    graph = attention(64, 16384, 64, None)
    comp = fspyre.compile(graph, fspyre.machine.spyre(), tiling="auto")
    report = traffic_report(comp.program)
    assert report.traffic_ratio < 1.01
    keyed = fspyre.compile(attention(64, 16384, 64, {"Sk": 2}), fspyre.machine.spyre(), tiling="hints")
    assert traffic_report(keyed.program).traffic_ratio < 1.06
    assert report.time_ns <= traffic_report(keyed.program).time_ns


# -- the loop tree -------------------------------------------------------------------------------
def test_carried_buffers_are_explicit_verified_and_round_trip():
    comp = fspyre.compile(attention(64, 512, 64, {"Sk": 4}), fspyre.machine.spyre(cores=4), tiling="hints")
    tree = comp.stages["loop_tree"]
    (loop,) = _loops(tree)
    assert loop.carried == ("buf3_acc", "buf6_acc", "buf9_acc")
    fill = next(n for n in tree.body if isinstance(n, OpNode) and n.op.store.buffer == "buf3_acc")
    assert fill.op.operands[0].value == LOWEST
    assert loads(dumps(tree)) == tree
    i = tree.body.index(loop)
    for wrong in ((), ("buf3_acc", "buf6_acc"), ("buf3_acc", "buf4", "buf6_acc", "buf9_acc")):
        bad = LoopTree(name=tree.name, buffers=tree.buffers, inputs=tree.inputs, outputs=tree.outputs,
                       body=tree.body[:i] + (Loop(count=loop.count, steps=loop.steps, body=loop.body,
                                                  carried=wrong),) + tree.body[i + 1:])
        with pytest.raises(TilingError, match="carried"):
            verify_loop_tree(bad)
    with pytest.raises(TilingError, match="sorted"):
        Loop(count=2, steps=loop.steps, body=loop.body, carried=("b", "a"))


def test_online_softmax_off_leaves_the_group_to_fission_or_refuses_a_whole_one():
    from fspyre.ir.plans import Group, Level, TilingPlan
    from fspyre.stages.loop_tree import tile
    from fspyre.stages.online_softmax import OnlineOptions
    graph = attention(64, 512, 64, {"Sk": 4})
    off = fspyre.compile(graph, fspyre.machine.spyre(cores=4), tiling="hints", online=False)
    assert len(off.stages["tiling_plan"].groups) > 1 and off.stages["tiling_plan"].notes
    whole = TilingPlan(order=tuple(op.name for op in graph.ops),
                       groups=(Group(ops=tuple(op.name for op in graph.ops), levels=(Level(count=4, dims=("Sk",)),)),))
    with pytest.raises(TilingError, match="inside the same loop nest"):
        tile(graph, whole, OnlineOptions(enabled=False))
    assert _loops(tile(graph, whole))[0].carried == ("buf3_acc", "buf6_acc", "buf9_acc")


def _softmax_reading_max(max_is_output: bool):
    g = fspyre.GraphBuilder("max_read")
    B, C = g.dim("B", 8), g.dim("C", 512)
    x = g.input("x", (B, C), "float32")
    with g.hint(slices={"C": 4}):
        m = g.amax(x, ["C"], keepdim=True)
        e = g.exp(g.sub(x, m))
        y = g.div(e, g.sum(e, ["C"], keepdim=True))
        z = g.add(y, m)
    g.output("z", z)
    if max_is_output:
        g.output("m", m)
    return g.build()


def test_the_second_loop_reads_the_final_max():
    graph = _softmax_reading_max(False)
    comp = fspyre.compile(graph, fspyre.machine.spyre(cores=4), tiling="hints")
    assert len(_loops(comp.stages["loop_tree"])) == 2
    assert fspyre.check(graph, machine=fspyre.machine.spyre(cores=4), comp=comp).equal


def test_a_softmax_whose_max_is_read_after_the_loop_is_left_to_fission():
    """Only the recurrence reads the running max; an output of it would need a finish that
    the online rewrite does not make, so loop fission splits the group instead."""
    graph = _softmax_reading_max(True)
    machine = fspyre.machine.spyre(cores=4)
    comp = fspyre.compile(graph, machine, tiling="hints")
    assert comp.stages["tiling_plan"].notes and len(comp.stages["tiling_plan"].groups) == 3
    assert not any(n.op.store.buffer.endswith("_alpha") for n in op_nodes(comp.stages["loop_tree"]))
    assert fspyre.check(graph, machine=machine, comp=comp).equal
