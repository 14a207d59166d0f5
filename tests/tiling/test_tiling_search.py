"""search_tiling: the tiling fspyre finds itself, judged by compiling each candidate.

Every compiled result runs on the interpreter against the untiled reference; figures come
from the traffic report of the program that was emitted."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from workloads import add_mul, softmax

import fspyre
from fspyre.errors import TilingError
from fspyre.ir.kinds import FUSE_MODES
from fspyre.ir.plans import Group, Level, TilingPlan
from fspyre.ir.serialize import dumps, loads
from fspyre.machine.memcheck import check_memory
from fspyre.machine.report import traffic_report
from fspyre.machine.spyre import Machine, spyre
from fspyre.pretty import pretty
from fspyre.stages import tiling_search
from fspyre.stages.tiling_plan import split_at_tiled_reductions
from fspyre.stages.tiling_search import SearchOptions, search_tiling, segment_bound, segment_floor
from fspyre.testing import examples, inputs_for, programs
from fspyre.testing.hints import legal_hint_nests
from fspyre.testing.machines import core_counts, lx_capacities
from fspyre.testing.transformer import (
    layer_norm_matmul,
    logsumexp,
    residual_layernorm,
    rms_norm_matmul,
    silu_mlp,
    softmax_lse,
    transformer_stack,
)

SMALL_LX = spyre(cores=4, lx_bytes=64 * 1024)


def chain(rows: int, cols: int, n: int = 3) -> fspyre.Graph:
    g = fspyre.GraphBuilder("chain")
    g.dim("A", rows)
    g.dim("B", cols)
    x = g.input("x", ["A", "B"], "float16")
    for k in range(n):
        x = g.add(x, g.input(f"w{k}", ["A", "B"], "float16"))
    g.output("y", x)
    return g.build()


def checked(graph: fspyre.Graph, machine: Machine, **kw) -> fspyre.Compilation:
    comp = fspyre.compile(graph, machine=machine, tiling="auto", **kw)
    assert check_memory(comp.program).clean
    report = fspyre.check(graph, machine=machine, comp=comp)
    assert report.equal, str(report)
    return comp


def test_an_intermediate_too_big_for_lx_is_tiled_until_it_fits():
    # y = a + b is [256, 1024] fp16 = 128 KiB per core on 4 cores; LX holds 64 KiB.
    comp = checked(add_mul(256, 1024, tiled=False), SMALL_LX)
    search = comp.stages["tiling_search"]
    (group,) = search.groups
    assert group.ops == ("buf0", "buf1") and [(lv.dims, lv.count) for lv in group.choice.levels] == [(("A",), 2)]
    assert [c.verdict for c in group.candidates[:2]] == ["spills", "fits"]
    assert "buf0 in HBM" in group.candidates[0].reason
    assert traffic_report(comp.program).traffic_ratio == 1.0


def test_a_plan_whose_program_the_verifier_refuses_is_searched_again_verifying_every_candidate(monkeypatch):
    """Candidates' programs are not verified; the program of the plan found is. A verifier
    that refuses every loop refuses the row tiling found unverified, so the search runs again
    verifying each candidate: every tiled candidate is refused and the plan tiles nothing."""
    from fspyre.errors import LoweringError
    from fspyre.ir.program import LoopSpec, walk_specs

    calls = []

    def refuse_loops(program):
        calls.append(program)
        if any(isinstance(s, LoopSpec) for s, _ in walk_specs(program.body)):
            raise LoweringError(f"{program.name}: a loop (this test's verifier refuses loops)")
        return program

    graph = add_mul(256, 1024, tiled=False)
    unverified = search_tiling(graph, SMALL_LX)
    assert any(g.choice.levels for g in unverified.groups)  # the row tiling, as the first test finds
    # the candidates' verifier (tiling_search) and the whole plan's (search_context)
    monkeypatch.setattr(tiling_search, "verify_program", refuse_loops)
    monkeypatch.setattr("fspyre.stages.search_context.verify_program", refuse_loops)
    search = search_tiling(graph, SMALL_LX)
    assert not search.plan.groups and not any(g.choice.levels for g in search.groups)
    assert all(c.verdict == "refused" for g in search.groups for c in g.candidates if c.levels)
    assert search.compiled > unverified.compiled  # the candidates were compiled twice
    assert len(calls) > 2  # not only the hinted plan's program and the plan found


def test_a_graph_that_fits_untiled_is_left_alone():
    comp = checked(add_mul(256, 1024, tiled=False), spyre(cores=4))
    search = comp.stages["tiling_search"]
    # untiled, y stays in LX and the program moves only the compulsory bytes: the bound of
    # both ops together only ties it, which cannot lower the estimated time, so no segment is
    # judged (each op keeps its figures from the hinted program)
    assert search.compiled == 0 and search.screened == 3
    assert all(g.choice.levels == () and len(g.candidates) == 1 for g in search.groups)
    untiled = fspyre.compile(add_mul(256, 1024, tiled=False), machine=spyre(cores=4), tiling="none")
    assert comp.program == untiled.program


def test_softmax_rows_are_tiled_and_estimated_faster_than_untiled():
    graph = softmax(8192, 8192, row_tiles=1)
    auto = traffic_report(fspyre.compile(graph, tiling="auto").program)
    none = traffic_report(fspyre.compile(graph, tiling="none").program)
    assert none.traffic_ratio == 4.0 and auto.traffic_ratio == 1.0  # x is copied to LX once per tile
    assert auto.time_ns < none.time_ns / 2


def test_the_choice_is_never_estimated_slower_than_untiled():
    for graph in (add_mul(2048, 4096, tiled=False), softmax(1024, 8192, row_tiles=1), chain(4096, 2048)):
        search = search_tiling(graph, spyre())
        for group in search.groups:
            untiled = group.candidates[0]
            assert untiled.levels == ()
            assert group.choice.time_ns <= untiled.time_ns


def test_hinted_ops_keep_their_groups():
    graph = add_mul(1024, 4096)  # hinted A:2 / B:4
    search = search_tiling(graph, spyre())
    hinted = fspyre.compile(graph, tiling="hints").stages["tiling_plan"]
    assert search.plan.groups == hinted.groups and search.groups == ()


@pytest.mark.parametrize("fuse", FUSE_MODES)
def test_every_fuse_mode_compiles_correct_programs(fuse):
    comp = checked(softmax(256, 512, row_tiles=1), spyre(cores=2, lx_bytes=32 * 1024), fuse=fuse)
    search = comp.stages["tiling_search"]
    assert search.fuse == fuse
    sizes = [len(g.ops) for g in search.groups]
    assert sum(sizes) == 5
    if fuse == "no-fuse":
        assert sizes == [1, 1, 1, 1, 1]
    if fuse == "max-producers":
        assert sizes == [5]
    if fuse == "only-patterns":
        # sum and the div reading it share a loop, as do amax and the sub reading it
        assert sizes == [2, 1, 2]


def test_unknown_fuse_mode_is_refused():
    with pytest.raises(TilingError, match="fuse='greedy'"):
        SearchOptions(fuse="greedy")


def test_the_search_prints_and_round_trips():
    search = fspyre.compile(add_mul(256, 1024, tiled=False), machine=SMALL_LX, tiling="auto").stages["tiling_search"]
    assert loads(dumps(search)) == search
    short, long = pretty(search), pretty(search, detailed=True)
    assert "group 0 (consumer buf1): [buf0, buf1]  -> A:2" in short
    assert "untiled  spills" in long and "* A:2" in long


@settings(max_examples=examples(40), deadline=None)
@given(prog=programs(max_ops=5), cores=core_counts(), lx=lx_capacities(), seed=st.integers(0, 2**16))
def test_auto_tiling_equals_untiled_on_random_graphs_and_machines(prog, cores, lx, seed):
    graph = prog.graph
    machine = spyre(cores=cores, lx_bytes=lx)
    comp = fspyre.compile(graph, machine=machine, tiling="auto")
    assert check_memory(comp.program).clean
    inputs = inputs_for(graph, seed)
    report = fspyre.check(graph, inputs, machine=machine, comp=comp)
    assert report.equal, str(report)
    untiled = fspyre.compile(graph, machine=machine, tiling="none")
    assert traffic_report(comp.program).time_ns <= traffic_report(untiled.program).time_ns * (1 + 1e-9)
    got, ref = fspyre.run(comp, inputs), fspyre.run(untiled, inputs)
    assert got.keys() == ref.keys()
    for name in ref:
        assert got[name].shape == ref[name].shape and got[name].dtype == ref[name].dtype


def test_the_gallery_mlp_at_4096_tokens_accumulates_over_its_hidden_dim():
    """Without hints, the mlp over 4096 tokens is tiled over its hidden dim H: the second
    matmul accumulates over H, the copy of x runs in the loop's first iteration and the cast
    and bias add writing y in its last, so each weight is read once in one kernel, at the
    token tiling's estimated time (both compute bound). Compile only: test_guarded.py runs the
    same program shape against numpy at a small size."""
    from dataclasses import replace
    from pathlib import Path

    from fspyre.frontend.files import load_torch_file

    graph = load_torch_file(Path(__file__).resolve().parents[2] / "examples" / "mlp.py", tokens=4096).graph
    graph = replace(graph, hints=(), ops=tuple(replace(op, hints=()) for op in graph.ops))
    comp = fspyre.compile(graph, tiling="auto")
    (group,) = comp.stages["tiling_plan"].groups
    assert [lv.dims for lv in group.levels] == [("H",)]
    (record,) = [g for g in comp.stages["tiling_search"].groups if g.ops == tuple(o.name for o in graph.ops)]
    by_tokens = [c for c in record.candidates if c.verdict == "fits" and [lv.dims for lv in c.levels] == [("T",)]]
    chosen = record.candidates[record.chosen]
    assert by_tokens and chosen.time_ns <= min(c.time_ns for c in by_tokens)
    assert chosen.hbm_bytes < min(c.hbm_bytes for c in by_tokens)
    report = traffic_report(comp.program)
    assert report.traffic_ratio == 1.0 and len(report.kernels) == 1
    assert check_memory(comp.program).clean


# -- the time-first search: dynamic programming, memo, screen ------------------------------------
def small_stack(blocks: int) -> fspyre.Graph:
    return transformer_stack(blocks, seq=128, model=128, heads=2, hidden=256)


def estimate(graph: fspyre.Graph, machine: Machine, tiling) -> float:
    return traffic_report(fspyre.compile(graph, machine=machine, tiling=tiling).program).time_ns


def test_the_memo_gives_the_plan_the_search_finds_without_it(monkeypatch):
    graph, machine = small_stack(2), spyre(cores=4, lx_bytes=64 * 1024)
    with_memo = search_tiling(graph, machine)
    assert with_memo.reused > 0  # the second block's segments are the first's
    monkeypatch.setattr(tiling_search, "_structure", lambda canon: (object(),))  # every key new
    without = search_tiling(graph, machine)
    assert without.reused == 0 and without.compiled > with_memo.compiled
    assert without.plan == with_memo.plan
    assert [(g.ops, g.choice) for g in without.groups] == [(g.ops, g.choice) for g in with_memo.groups]


def test_repeated_blocks_are_solved_once():
    machine = spyre()
    compiled = [search_tiling(small_stack(n), machine).compiled for n in (1, 2, 4)]
    # only the segments across a block boundary are new
    assert compiled[2] <= compiled[0] * 1.5, compiled


def test_a_transformer_block_on_a_small_lx_machine_runs_equal_to_untiled():
    machine = spyre(cores=4, lx_bytes=64 * 1024)
    comp = checked(transformer_stack(1, seq=64, model=128, heads=2, hidden=256), machine)
    auto = traffic_report(comp.program).time_ns
    assert auto <= estimate(transformer_stack(1, seq=64, model=128, heads=2, hidden=256), machine, "none")


def test_a_long_one_dim_exp_takes_its_counts_from_divisors():
    g = fspyre.GraphBuilder("exp")
    g.dim("N", 2**24)
    g.output("y", g.exp(g.input("x", ["N"], "float16")))
    graph = g.build()
    ctx_op = graph.ops[0]
    search = search_tiling(graph, spyre())
    assert search.compiled <= 4  # at its bound untiled: nothing else is judged
    counts = tiling_search._counts(search_context(graph), [ctx_op], "N", 2**24)
    assert counts == [2**k for k in range(1, 19)]  # tiles of 2**24 / 2**k elements, whole 64-element sticks


def search_context(graph: fspyre.Graph):
    return tiling_search._Search(graph=graph, machine=spyre(), options=SearchOptions(), ops=graph.op_table(),
                                 buffers=graph.buffer_table(), readers=tiling_search._readers(graph),
                                 outputs=frozenset(o.buffer for o in graph.outputs))


@settings(max_examples=examples(200), deadline=None)
@given(size=st.integers(1, 5000), dtype=st.sampled_from(["float16", "float32", "int32"]))
def test_counts_are_the_whole_stick_divisors_and_the_tailed_counts(size, dtype):
    """The counts equal their definition walked element by element: the divisors into whole
    sticks, and (beside them, not only when none exists) the tailed counts of whole-stick
    tiles of 2**k sticks or of size / 2**k rounded up to sticks; each count is the one
    ``tile`` runs (its tile, rounded up to sticks, gives the count back), and there are at
    most 2 log2(size) more than divisors."""
    g = fspyre.GraphBuilder("one")
    g.dim("N", size)
    g.output("y", g.add(g.input("x", ["N"], dtype), 1))
    graph = g.build()
    stick = 128 // {"float16": 2, "float32": 4, "int32": 4}[dtype]
    got = tiling_search._counts(search_context(graph), graph.ops, "N", size)
    exact = [c for c in range(2, size + 1) if size % c == 0 and (size // c) % stick == 0]
    halves = {-(-size // (stick << k)) * stick for k in range(1, size.bit_length())}
    tailed = {-(-size // t) for t in range(1, size) if t % stick == 0 and ((t // stick) & (t // stick - 1) == 0
                                                                           or t in halves)}
    assert got == sorted(set(exact) | tailed)
    for c in got:
        tile = -(-(-(-size // c)) // stick) * stick
        assert -(-size // tile) == c
    assert len(got) <= len(exact) + 2 * size.bit_length()


@settings(max_examples=examples(30), deadline=None)
@given(prog=programs(max_ops=5), cores=core_counts(), lx=lx_capacities())
def test_the_floor_is_below_every_judged_candidate(prog, cores, lx):
    machine = spyre(cores=cores, lx_bytes=lx)
    search = search_tiling(prog.graph, machine)
    for group in search.groups:
        floor = segment_floor(prog.graph, machine, group.ops)
        assert segment_bound(prog.graph, machine, group.ops) == floor.time_ns
        for cand in group.candidates:
            if cand.verdict != "refused" and cand.reason != tiling_search.IN_CONTEXT:
                assert cand.time_ns >= floor.time_ns * (1 - 1e-9), (group.ops, cand)
                assert cand.hbm_bytes >= floor.hbm_bytes, (group.ops, cand)


@settings(max_examples=examples(40), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
@given(st.data(), core_counts(), lx_capacities())
def test_no_tiling_of_a_graph_is_estimated_below_its_floor(data, cores, lx):
    """The floor the search stops at (``_Judge``) holds for any tiling, not only the ones the
    search judged: the whole graph under legal hints, compiled, is estimated at least the
    floor of all its ops as one segment, in time and in HBM bytes."""
    prog = data.draw(programs(max_ops=5), label="graph")
    hinted = data.draw(legal_hint_nests(prog.graph), label="hints").apply(prog.graph)
    machine = spyre(cores=cores, lx_bytes=lx)
    try:
        comp = fspyre.compile(hinted, machine, tiling="hints")
    except fspyre.FspyreError:
        assume(False)  # refusals belong to the tiling properties
    report = traffic_report(comp.program)
    floor = segment_floor(prog.graph, machine, [op.name for op in prog.graph.ops])
    assert report.time_ns >= floor.time_ns * (1 - 1e-9), (report.time_ns, floor)
    assert report.hbm_bytes >= floor.hbm_bytes, (report.hbm_bytes, floor)


@settings(max_examples=examples(30), deadline=None)
@given(prog=programs(max_ops=5), cores=core_counts(), lx=lx_capacities())
def test_the_dp_is_never_estimated_slower_than_greedy_none_or_hints(prog, cores, lx):
    graph, machine = prog.graph, spyre(cores=cores, lx_bytes=lx)
    auto = estimate(graph, machine, "auto")
    greedy = estimate(graph, machine, search_tiling(graph, machine, SearchOptions(strategy="greedy")).plan)
    assert auto <= min(estimate(graph, machine, "none"), estimate(graph, machine, "hints")) * (1 + 1e-9)
    assert auto <= greedy * (1 + 1e-9)


def test_a_copy_kernel_of_the_hinted_program_is_charged_to_the_op_it_serves():
    # The matmul reads the constant c twice; untiled, keep_resident copies c into LX for it (a
    # kernel of its own). The DP charged the matmul only its own 2.3 ns untiled, so the group
    # [c, matmul] N:2 (9.8 ns, which does without the copy) looked 2.8 ns slower than leaving
    # both untiled, where it saves 1.7 ns: the property below found auto 15.6 ns against
    # greedy's 13.9 ns.
    g = fspyre.GraphBuilder("copy_charged")
    g.dim("M", 2), g.dim("K", 2), g.dim("N", 2), g.dim("L", 1)
    g.output("o0", g.sum(g.neg(g.input("x0", ["M"], "float16")), ["M"]))
    c = g.constant(1.0, "float16", ["N", "K", "L"])
    g.output("o1", g.matmul(c, c, "K"))
    graph, machine = g.build(), spyre(cores=2, lx_bytes=128)
    comp = checked(graph, machine)
    auto = traffic_report(comp.program).time_ns
    greedy = estimate(graph, machine, search_tiling(graph, machine, SearchOptions(strategy="greedy")).plan)
    assert auto <= greedy * (1 + 1e-9)
    assert auto < estimate(graph, machine, "none") * (1 - 1e-3)
    assert [(g.ops, [(lv.dims, lv.count) for lv in g.levels]) for g in comp.stages["tiling_plan"].groups] == [
        (("buf2", "buf3"), [(("N",), 2)])]


def test_a_run_of_ops_that_cost_nothing_joins_a_group_whole():
    # Found by the property below (deep profile): abs -> +1 -> pow of x cost nothing in the
    # untiled program (x and their results stay in LX). The group from abs to the matmul over E
    # (reading x alone) saves 1.3 us; the rule that judges a segment starting at such an op
    # only when the one starting after it gained saw the segments from pow and from add gain
    # nothing more than the one from sin, and the bound ranked the segment from abs first,
    # before the verdicts it waits for: auto 4.26 us, the greedy pass 2.92.
    g = fspyre.GraphBuilder("free_run")
    g.dim("N", 64), g.dim("K", 13), g.dim("E", 33)
    v0 = g.input("x0", ("K", fspyre.Dim("M", 1), "E", "N"), "float32")
    v2 = g.where(v0, v0, g.matmul(v0, v0, contract="K"))
    v5 = g.pow(g.add(g.abs(v0), 1), v0)
    g.output("out0", v2)
    g.output("out1", g.matmul(g.sin(v0), g.tanh(v5), contract="E"))
    graph, machine = g.build(), spyre(cores=2, lx_bytes=118272)
    comp = checked(graph, machine)
    auto = traffic_report(comp.program).time_ns
    assert auto <= estimate(graph, machine, search_tiling(graph, machine, SearchOptions(strategy="greedy")).plan) * (
        1 + 1e-9)
    assert auto < estimate(graph, machine, "none") * 0.8


def test_a_segment_is_worth_its_best_tiling_against_its_ops_in_the_hinted_program():
    # softmax x[1021, 1000] fp16 on 12 cores, 2 MiB LX: the correction's second DP pass found
    # 58.8 us here (the hinted plan, untiled, was 96.2 us: sub's result spilled), as tiling only
    # amax R:2. Since keep_resident judges its reader divisions by parts, untiled is 58.8 us
    # as well, the DP tiles nothing and the correction does not run (its mechanism is pinned
    # on the graphs of the tests below).
    g = fspyre.GraphBuilder("softmax")
    g.dim("R", 1021), g.dim("C", 1000)
    x = g.input("x", ["R", "C"], "float16")
    e = g.exp(g.sub(x, g.amax(x, ["C"], keepdim=True)))
    g.output("y", g.div(e, g.sum(e, ["C"], keepdim=True)))
    graph, machine = g.build(), spyre(cores=12, lx_bytes=2 << 20)
    amax_r2 = TilingPlan(order=tuple(op.name for op in graph.ops), groups=(
        Group(ops=(graph.ops[0].name,), levels=(Level(count=2, dims=("R",), source="test"),)),))
    better = estimate(graph, machine, amax_r2)
    comp = checked(graph, machine)
    assert traffic_report(comp.program).time_ns <= better * (1 + 1e-9)


def rmsnorm_matmul(rows: int, count: int | None = None, cols: int = 2048) -> fspyre.Graph:
    g = fspyre.GraphBuilder("rmsnorm_matmul")
    g.dim("T", rows), g.dim("D", 1024), g.dim("N", cols)
    x, w = g.input("x", ["T", "D"], "float16"), g.input("w", ["D", "N"], "float16")
    gamma = g.input("gamma", ["D"], "float16")
    with g.hint(slices={"T": count}) if count else contextlib.nullcontext():
        y = g.mul(g.mul(x, g.rsqrt(g.add(g.mean(g.mul(x, x), ["D"], keepdim=True), 1e-6))), gamma)
        g.output("out", g.matmul(y, w, "D"))
    return g.build()


def dp_plan(graph: fspyre.Graph, search) -> TilingPlan:
    """The plan of the search's records: the DP's (credited in context when that step changed
    it), before the correction's runner-ups and groups left out, as ``_plan`` builds it."""
    tiled = tuple(Group(ops=r.ops, levels=r.choice.levels) for r in search.groups if r.choice.levels)
    return split_at_tiled_reductions(graph, TilingPlan(order=tuple(op.name for op in graph.ops), groups=tiled),
                                     SearchOptions().online)


def corrected(graph: fspyre.Graph, machine: Machine, note: str) -> fspyre.Compilation:
    """Compile auto, which the correction changed as ``note`` says: at least one whole compile,
    the program no slower than the hinted one (``none``) and faster than the DP's plan."""
    comp = checked(graph, machine)
    search = comp.stages["tiling_search"]
    assert search.rechecked >= 1 and note in search.note, search.note
    assert "whole-program recheck" in pretty(search)
    auto = traffic_report(comp.program).time_ns
    before = estimate(graph, machine, dp_plan(graph, search))
    assert auto < before and auto <= estimate(graph, machine, "none") * (1 + 1e-9)
    assert f"({before / 1000:.2f} -> " in search.note  # the note's first figure is the DP's plan
    return comp


@pytest.mark.parametrize("rows", [1003, 1147])
def test_a_hinted_rmsnorm_matmul_is_not_beaten_by_the_dp_s_groups(rows):
    # fp16 D=1024 N=2048 on 8 cores, 128 KiB LX. The DP's groups [x*x, mean] and [rsqrt ..
    # matmul] each beat the chain alone, but together were estimated 285.5 us (1,003 rows)
    # and 345.4 us (1,147) against the hinted T:4 over the whole chain, 265.6 and 296.2 us,
    # until the correction took the runner-up. Since the DP weighs a tiled group with its
    # untiled readers it finds [x*x .. *gamma] T:4 (1,003 rows, 230.6 us, as the hinted plan)
    # and T:8 (1,147 rows, 263.8 us) directly; the correction does not run.
    machine = spyre(cores=8, lx_bytes=128 * 1024)
    hinted = estimate(rmsnorm_matmul(rows, 4), machine, "hints")
    comp = checked(rmsnorm_matmul(rows), machine)
    assert traffic_report(comp.program).time_ns <= hinted * (1 + 1e-9)


@pytest.mark.parametrize(("rows", "note"), [
    (1003, "buf4..buf6 D:2 for buf5..buf6 (215.88 -> 177.56 us)"),
    (1147, "buf4..buf6 D:2 for buf5..buf6 (243.83 -> 200.01 us)")])
def test_a_group_gives_way_to_its_runner_up_when_the_whole_program_disagrees(rows, note):
    # rmsnorm -> matmul fp16 D=1024 N=2048 on 12 cores, 2 MiB LX (found by a sweep of rows,
    # cores and LX): the DP took [x*x .. rsqrt] T:2 and [*gamma, matmul] D:2 (buf5..buf6),
    # 215.88 us as a whole over 1,003 rows (243.83 over 1,147), which did not bear out their
    # claims; the runner-up the DP weighed for the matmul, [x*r, *gamma, matmul] D:2, gives
    # 177.56 us (200.01). Figures: the search's note.
    corrected(rmsnorm_matmul(rows), spyre(cores=12, lx_bytes=2 << 20), note)


def test_a_group_the_whole_program_does_not_bear_out_is_left_out():
    # A block S=128, D=256, F=688 on 4 cores, 128 KiB LX (found by a sweep of block sizes,
    # cores and LX): the DP tiled the MLP's gate and up projections
    # (buf26, buf28: one kind) S:2, the whole program 34.30 us; the second pass and the
    # runner-ups compile nothing new, and with both left out (one whole compile: other
    # groups stay) it is 32.73 us; then the DP's two runner-up plans, compiled whole as the
    # claims were not borne out: the first 30.54 us, the second no faster (with segments
    # charged for the free results they read, ``_charged``; before, 30.74 then 30.54 us).
    # Figures: the note.
    comp = corrected(transformer_stack(1, seq=128, model=256, hidden=688), spyre(cores=4, lx_bytes=128 * 1024),
                     "left out buf26 S:2 and 1 alike (34.30 -> 32.73 us); the runner-up 0.41 us behind by its "
                     "claims (32.73 -> 30.54 us)")
    assert comp.stages["tiling_search"].rechecked == 3
    assert any(g.levels for g in comp.stages["tiling_plan"].groups)  # not the hinted plan


def test_the_dp_credits_segments_in_context_when_the_whole_program_disagrees():
    # A block S=192, D=384, F=1024 on 4 cores, 128 KiB LX (found by a sweep of block sizes,
    # cores and LX): the DP's plan was 128.35 us as a whole (130.14 while keep_resident's
    # readers taking their producer's slices were judged with copies they left in HBM); crediting
    # each segment with its candidate of least change against its ops in the hinted program,
    # the second pass's plan was 110.39 us, and leaving its [buf26 .. buf31] F:2 out 101.92 us.
    # Since a segment is charged for the results of the free ops just before it that it reads
    # (``_charged``), the DP's plan is 110.25 us, the second pass's 101.64, the runner-up
    # [buf27 .. buf29] F:4 for [buf26 .. buf29] 101.03 and leaving out [buf9 .. buf16] H:2
    # 99.14 us. The records are the second pass's (so ``dp_plan`` is its 101.64 us).
    # Figures: the note.
    comp = corrected(transformer_stack(1, seq=192, model=384, hidden=1024), spyre(cores=4, lx_bytes=128 * 1024),
                     "the groups credited in context (110.25 -> 101.64 us); "
                     "buf27..buf29 F:4 for buf26..buf29 (101.64 -> 101.03 us); "
                     "left out buf9..buf16 H:2 (101.03 -> 99.14 us)")
    # whole compiles: the second pass's plan, the trials (runner-ups and groups left out), then
    # the DP's two runner-up plans (correction step 4: no faster)
    assert comp.stages["tiling_search"].rechecked == 12


def test_a_group_of_the_dp_s_plan_not_borne_out_on_a_wide_rmsnorm_is_not_chosen():
    # rmsnorm -> matmul fp16 [1517, 1024] @ [1024, 512] on 12 cores, 512 KiB LX: the DP's
    # [x*x .. rsqrt] T:8 and [x*r, *gamma, matmul] T:3 were estimated 113.7 us together until
    # the correction left the second out, 76.6 us. Since the DP weighs a tiled group with its
    # untiled readers it finds [x*x .. rsqrt] T:8 alone directly; the correction does not run.
    graph, machine = rmsnorm_matmul(1517, cols=512), spyre(cores=12, lx_bytes=512 * 1024)
    first = TilingPlan(order=tuple(op.name for op in graph.ops), groups=(
        Group(ops=("buf0", "buf1", "buf2", "buf3"), levels=(Level(count=8, dims=("T",), source="test"),)),))
    better = estimate(graph, machine, first)
    assert better < estimate(graph, machine, "none") * 0.9
    comp = checked(graph, machine)
    assert traffic_report(comp.program).time_ns <= better * (1 + 1e-9)


@settings(max_examples=examples(30), deadline=None)
@given(prog=programs(max_ops=5), cores=core_counts(), lx=lx_capacities())
def test_the_search_hands_on_the_program_compiling_its_plan_gives(prog, cores, lx):
    """compile(tiling="auto") takes the loop tree and placement the search judged its plan by:
    the program is the one compiling that plan again gives, hash for hash, and the stages it
    records are the recompile's."""
    graph, machine = prog.graph, spyre(cores=cores, lx_bytes=lx)
    auto = fspyre.compile(graph, machine=machine, tiling="auto")
    again = fspyre.compile(graph, machine=machine, tiling=auto.stages["tiling_plan"])
    assert auto.program == again.program and hash(auto.program) == hash(again.program)
    for name in ("loop_tree", "resident_tree", "split_plan", "allocation"):
        assert auto.stages[name] == again.stages[name], name


def test_the_stages_caches_change_no_program():
    """Divisions, accesses and report shapes are remembered across compiles by what they are
    made from: a compile with every table emptied first gives the same programs and plan."""
    from fspyre.machine import report
    from fspyre.stages import access, split_plan

    machine = spyre(cores=4, lx_bytes=64 * 1024)
    graphs = [transformer_stack(1, seq=64, model=128, heads=2, hidden=256), softmax(256, 512)]
    warm = [fspyre.compile(g, machine=machine, tiling="auto") for g in graphs]
    for g, comp in zip(graphs, warm):
        for table in (split_plan._DIVIDED, access._ANALYSED, report._SHAPES):
            table.clear()
        cold = fspyre.compile(g, machine=machine, tiling="auto")
        assert cold.program == comp.program and cold.stages["tiling_plan"] == comp.stages["tiling_plan"]


@pytest.mark.parametrize(("rows", "hinted_count"), [(2047, 8)])
def test_rows_a_product_of_two_primes_take_tailed_counts(rows, hinted_count):
    """2,047 rows (23 x 89) divide only into tiles of 89 or 23 rows; auto chose T:23 at
    445.8 us against the hinted T:8 (tiles of 256, a tail of 255) at 333.2 us, because the
    tailed counts were offered only to a dim with no divisor. 4,087 (61 x 67): T:67 at
    1,285.8 us against T:16 at 692.6 us."""
    machine = spyre(cores=16, lx_bytes=256 * 1024)
    auto = estimate(layer_norm_matmul(rows), machine, "auto")
    assert auto <= estimate(layer_norm_matmul(rows, hinted_count), machine, "hints") * (1 + 1e-9)


@pytest.mark.parametrize(("rows", "cols", "dtype", "cores", "count"),
                         [(4093, 256, "float32", 32, 4), (333, 4096, "float16", 8, 16)])
def test_pointwise_columns_are_weighed_against_rows(rows, cols, dtype, cores, count):
    """x[R, C]: shrinking stopped at R, the first dim with a count that fits, so the
    whole-stick column tiling (every row in each tile) was never judged: auto R:4 85.2 us
    against C:4 79.9 us on exp(-x[4093, 256]) fp32, 32 cores, 32 KiB; R:37 73.4 against C:16 52.0
    on x[333, 4096]."""
    g = fspyre.GraphBuilder("columns")
    g.dim("R", rows), g.dim("C", cols)
    x = g.input("x", ["R", "C"], dtype)
    g.output("y", g.exp(g.neg(x)))
    graph, machine = g.build(), spyre(cores=cores, lx_bytes=32 * 1024)
    columns = TilingPlan(order=tuple(op.name for op in graph.ops), groups=(Group(ops=tuple(op.name for op in graph.ops),
                                       levels=(Level(count=count, dims=("C",), source="test"),)),))
    assert estimate(graph, machine, "auto") <= estimate(graph, machine, columns) * (1 + 1e-9)


def test_a_dim_that_fits_only_past_three_spilling_counts_is_still_judged():
    """y = silu(x @ w1 + b1) @ w2, fp32 S=257 D=320 F=1280 on 3 cores and 64 KiB: the first
    matmul, bias and silu fit only from F:8, their hidden dim's 5th count (F:2 to F:5 spill,
    each estimate higher than the last as x is read once per tile). The walk of a dim other
    than the first gave up after 3 counts that do not fit, so auto kept S tiles at 82.3 us;
    the three ops F:8 and the second matmul untiled are 70.2 us."""
    graph, machine = silu_mlp(), spyre(cores=3, lx_bytes=64 * 1024)
    names = tuple(op.name for op in graph.ops)
    plan = TilingPlan(order=names, groups=(Group(ops=names[:3], levels=(Level(count=8, dims=("F",), source="test"),)),))
    comp = checked(graph, machine)
    assert traffic_report(comp.program).time_ns <= estimate(graph, machine, plan) * (1 + 1e-9)


@pytest.mark.parametrize("rows", [1003, 1147])
def test_rms_norm_matmul_over_odd_rows_is_not_estimated_slower_than_the_hint(rows):
    """RMSNorm -> matmul fp16 D=1024 N=2048 on 8 cores, 128 KiB: the search's two groups (the
    square and its mean; the scaling and the matmul) met keep_resident's bundled trials in
    the whole program -- a losing reader division kept a winning one out (1,003 rows: 285.5 us
    against the hinted T:4 265.6), a copy across two tailed loops was refused with every
    other copy (1,147 rows: 334.2 against 296.2)."""
    machine = spyre(cores=8, lx_bytes=128 * 1024)
    comp = checked(rms_norm_matmul(rows), machine)
    assert traffic_report(comp.program).time_ns <= estimate(rms_norm_matmul(rows, 4), machine, "hints") * (1 + 1e-9)


@pytest.mark.parametrize(("graph", "machine", "head", "count"), [
    (rms_norm_matmul(1147), spyre(cores=8, lx_bytes=128 * 1024), 2, 3),
    (layer_norm_matmul(1003), spyre(cores=16, lx_bytes=256 * 1024), 8, 16)])
def test_a_norm_loop_whose_matmul_reader_joins_it_is_scored_with_it(graph, machine, head, count):
    """A norm tiled alone with the matmul after it untiled: in the whole program the matmul
    (and what reads the loop's results before it) runs in the loop's last iteration, one
    kernel whose compute hides the loop's memory time. Scored as the sum of the norm's
    segment and the matmul's own kernel in the untiled program, that plan lost to others
    slower as a whole: rmsnorm over 1,147 rows, the square and its mean T:3, 263.8 us
    against auto's 286.7 (two groups); layernorm over 1,003 rows T:16, 152.0 against 163.7
    (T:2 over all)."""
    names = tuple(op.name for op in graph.ops)
    plan = TilingPlan(order=names, groups=(Group(ops=names[:head],
                                                 levels=(Level(count=count, dims=("T",), source="test"),)),))
    comp = checked(graph, machine)
    assert traffic_report(comp.program).time_ns <= estimate(graph, machine, plan) * (1 + 1e-9)


# -- sibling consumers of one intermediate -----------------------------------------------------
def shared(rows: int, cols: int, dtype: str, fn: str, outputs: int, chain: int = 0,
           branch: bool = False) -> fspyre.Graph:
    """e = fn(x) (after ``chain`` producers), read by ``outputs`` siblings o_k = e op p_k (or
    with ``branch`` o_k = neg(e op p_k)): no sibling reads another, so a producer chain never
    holds two of them."""
    g = fspyre.GraphBuilder("shared")
    g.dim("R", rows), g.dim("C", cols)
    x = g.input("x", ["R", "C"], dtype)
    for k in range(chain):
        x = g.mul(x, g.input(f"w{k}", ["R", "C"], dtype))
    e = getattr(g, fn)(x)
    for k, op in enumerate(["mul", "add", "sub", "maximum"][:outputs]):
        y = getattr(g, op)(e, g.input(f"p{k}", ["R", "C"], dtype))
        g.output(f"o{k}", g.neg(y) if branch else y)
    return g.build()


def one_group(graph: fspyre.Graph, dim: str, count: int) -> TilingPlan:
    ops = tuple(op.name for op in graph.ops)
    return TilingPlan(order=ops, groups=(Group(ops=ops, levels=(Level(count=count, dims=(dim,), source="test"),)),))


@pytest.mark.parametrize(("graph", "machine", "dim", "count"), [
    # the audit's graphs: auto left them untiled at 302.6 us against 200.8 (+50.7 %), and at 311.9
    # against 224.3 (+39.1 %): the DP's segments were a consumer and its producers
    (shared(1023, 1500, "float16", "sigmoid", 3), spyre(cores=8, lx_bytes=64 * 1024), "R", 10),
    (shared(640, 2050, "bfloat16", "exp", 4), spyre(cores=32, lx_bytes=32 * 1024), "C", 3),
    # the shared intermediate behind a producer chain of its own
    (shared(512, 1024, "float16", "tanh", 3, chain=2), spyre(cores=8, lx_bytes=64 * 1024), "R", 8),
    # branches of two ops each: [e, y1, z1, y2, z2, y3, z3], auto 281.7 us against 216.7
    (shared(1023, 1500, "float16", "sigmoid", 3, branch=True), spyre(cores=8, lx_bytes=64 * 1024), "R", 16),
], ids=["sigmoid-by-3", "exp-by-4", "tanh-chain-by-3", "sigmoid-by-3-branches"])
def test_siblings_sharing_an_intermediate_join_its_group(graph, machine, dim, count):
    comp = checked(graph, machine)
    assert traffic_report(comp.program).time_ns <= estimate(graph, machine, one_group(graph, dim, count)) * (1 + 1e-9)
    ops = tuple(op.name for op in graph.ops)
    assert any(g.ops == ops for g in comp.stages["tiling_plan"].groups)


_SIBLINGS = ("mul", "add", "sub", "maximum", "neg", "sum", "amax")


@st.composite
def sibling_graphs(draw) -> fspyre.Graph:
    """x (through up to two producers) -> e = fn(x), read by 2 to 4 siblings that are graph
    outputs: pointwise with an input of their own, unary, or a row reduction of e; a
    pointwise one sometimes through a neg (a branch of two ops)."""
    rows = draw(st.one_of(st.sampled_from([1, 63, 64, 65, 128, 129, 192]), st.integers(1, 256)))
    cols = draw(st.one_of(st.sampled_from([1, 32, 64, 65, 128, 192, 256]), st.integers(1, 256)))
    dtype = draw(st.sampled_from(["float16", "bfloat16", "float32"]))
    g = fspyre.GraphBuilder("siblings")
    g.dim("R", rows), g.dim("C", cols)
    x = g.input("x", ["R", "C"], dtype)
    for k in range(draw(st.integers(0, 2))):
        x = g.mul(x, g.input(f"w{k}", ["R", "C"], dtype)) if draw(st.booleans()) else g.neg(x)
    e = getattr(g, draw(st.sampled_from(["exp", "sigmoid", "tanh", "neg", "abs"])))(x)
    for k, fn in enumerate(draw(st.lists(st.sampled_from(_SIBLINGS), min_size=2, max_size=4))):
        if fn in ("sum", "amax"):
            y = getattr(g, fn)(e, ["C"], keepdim=True)
        elif fn == "neg":
            y = g.neg(e)
        else:
            y = getattr(g, fn)(e, g.input(f"p{k}", ["R", "C"], dtype))
            y = g.neg(y) if draw(st.booleans()) else y
        g.output(f"o{k}", y)
    return g.build()


@settings(max_examples=examples(30), deadline=None)
@given(graph=sibling_graphs(), cores=core_counts(), lx=lx_capacities())
def test_siblings_are_weighed_with_their_intermediate_on_random_machines(graph, cores, lx):
    """The segment of e's writer (and its producers) with every sibling is weighed for the
    last sibling, judged or screened by its bound, when it is at most the window long; the
    plan runs equal to untiled with a clean memory check and is estimated no slower than
    untiled or that segment as one group at the tiling the search judged best for it. (Not
    asserted here: no slower than greedy, which the DP's additivity can break by a fraction
    of a percent on these graphs: the test below, where the correction compiles the DP's
    runner-up whole.)"""
    machine = spyre(cores=cores, lx_bytes=lx)
    comp = checked(graph, machine)
    auto = traffic_report(comp.program).time_ns
    assert auto <= estimate(graph, machine, "none") * (1 + 1e-9)
    ops = tuple(op.name for op in graph.ops)
    if len(ops) > SearchOptions().window:
        return
    (whole,) = [a for a in comp.stages["tiling_search"].groups[-1].alternatives if a.ops == ops]
    if whole.choice is not None and whole.choice.levels:
        plan = TilingPlan(order=ops, groups=(Group(ops=ops, levels=whole.choice.levels),))
        assert auto <= estimate(graph, machine, plan) * (1 + 1e-9)


def shared_exp_siblings() -> fspyre.Graph:
    """exp(x * w) read by three outputs (one through a neg, one an amax), x[129, 237] fp16."""
    g = fspyre.GraphBuilder("siblings")
    g.dim("R", 129), g.dim("C", 237)
    e = g.exp(g.mul(g.input("x", ["R", "C"], "float16"), g.input("w0", ["R", "C"], "float16")))
    g.output("o0", g.neg(g.mul(e, g.input("p0", ["R", "C"], "float16"))))
    g.output("o1", g.amax(e, ["C"], keepdim=True))
    g.output("o2", g.mul(e, g.input("p2", ["R", "C"], "float16")))
    return g.build()


def test_a_sibling_group_is_not_chosen_over_a_faster_plan_by_the_dp_s_additivity():
    """exp(x * w) read by three outputs (one through a neg), x[129, 237] fp16, 6 cores, 9,088 B
    of LX: the DP takes all six ops R:3, 6,649.8 ns whole (summed change -1,615.1), over the
    producer chain C:2 with the amax and the last mul untiled, 6,625.4 ns whole, which greedy
    finds; judged alone that chain's group costs 4,280.1 ns, in the whole program 4,187.9
    (summed change -1,519.8 against -1,639.5): the program-wide read/write turnaround charges
    each kernel by the whole program's mix. Found by the property above at
    HYPOTHESIS_PROFILE=explore --hypothesis-seed=21; in 300 other draws the DP was never
    slower than greedy and 14 times faster (10.6 % on average). The chain is the DP's
    runner-up at the last consumer, its claims 1.4 % behind: the correction compiles it whole
    (``plan_correction._RUNNER_UP``)."""
    graph, machine = shared_exp_siblings(), spyre(cores=6, lx_bytes=9088)
    greedy = search_tiling(graph, machine, SearchOptions(strategy="greedy")).plan
    assert estimate(graph, machine, "auto") <= estimate(graph, machine, greedy) * (1 + 1e-9)


@pytest.mark.parametrize(("rows", "cols", "machine"), [
    (129, 3000, spyre(cores=8, lx_bytes=64 * 1024)),
    (129, 2000, spyre(cores=8, lx_bytes=64 * 1024)),
    (129, 6000, spyre(cores=8, lx_bytes=128 * 1024))])
def test_a_screened_segment_is_a_runner_up_when_the_whole_program_disagrees(rows, cols, machine):
    # logsumexp fp16 x[129, 3000], 8 cores, 64 KiB (an audit's reproducer): the DP took
    # [amax .. sum] C:2 (its amax on 5 of 8 cores: its float32 partial [R] has R as its stick
    # dim, 5 sticks), claimed -28.26 us, and screened [sub, exp, sum] by its bound (-27.86).
    # The claim was off by the amax's share in place of the untiled sub's and exp's read/write
    # turnaround: 12.29 us as a whole against 11.33 for [sub, exp, sum] R:2 with the amax
    # untiled (+8.5 %; over 2,000 columns 8.73 against 8.02 us, +8.7 %; over 6,000 on 128 KiB
    # 22.56 against 21.67, +4.1 %). The correction had no runner-up to swap in; it now judges
    # the segment inside the group that the DP screened with the least bound.
    graph = logsumexp(rows, cols)
    ops = tuple(op.name for op in graph.ops)
    rows_r2 = split_at_tiled_reductions(graph, TilingPlan(order=ops, groups=(
        Group(ops=ops[1:4], levels=(Level(count=2, dims=("R",), source="test"),)),)), SearchOptions().online)
    better = estimate(graph, machine, rows_r2)
    comp = checked(graph, machine)
    report = traffic_report(comp.program)
    assert report.time_ns <= better * (1 + 1e-9)
    assert [o.cores for o in report.ops if o.op == "amax"] == [machine.cores]
    search = comp.stages["tiling_search"]
    # whole compiles: the swap, then the DP's runner-up plan (correction step 4: no faster)
    assert search.rechecked == 2 and "buf1..buf3 R:2 for buf0..buf3" in search.note, search.note


def _one_loop(graph: fspyre.Graph, first: int, count: int, dim: str) -> TilingPlan:
    """The graph's ops from ``first`` on as one group of one level."""
    ops = tuple(op.name for op in graph.ops)
    return split_at_tiled_reductions(graph, TilingPlan(order=ops, groups=(
        Group(ops=ops[first:], levels=(Level(count=count, dims=(dim,), source="test"),)),)), SearchOptions().online)


@pytest.mark.parametrize("rows, cols, dtype", [(4093, 256, "float16"), (6007, 128, "bfloat16")])
def test_a_consumer_s_producers_with_a_sibling_branch_between_them_are_one_segment(rows, cols, dtype):
    # 8 cores, 64 KiB LX: the lse's producer chain [log, add] skips the probabilities' branch,
    # and the segment of all 9 ops was past the window: auto took ops 0-7 R:16, 75.97 us
    # (4093 x 256; 6007 x 128 bf16: 67.97), against 51.05 (43.16) for all 9 ops R:16.
    graph, machine = softmax_lse(rows, cols, dtype), spyre(cores=8, lx_bytes=64 * 1024)
    named = estimate(graph, machine, _one_loop(graph, 0, 16, "R"))
    comp = checked(graph, machine)
    assert traffic_report(comp.program).time_ns <= named * 1.05
    assert estimate(graph, machine, "none") > named * 2  # the graph is one where the loop pays


@pytest.mark.parametrize("rows, cores, lx_kib", [(4093, 11, 256), (3001, 11, 256)])
def test_a_segment_is_charged_for_the_free_results_it_reads(rows, cores, lx_kib):
    # mean(h) and h - mean cost nothing untiled in the hinted program (their results stay in
    # LX beside h's kernel), so the DP scored [hc*hc .. + beta] T:2 and [mean .. + beta] T:2
    # alike; in the whole program the first sends h - mean through HBM: auto 119.92 us
    # (4093 rows; 3001: 87.93) against 93.92 for ops 1-9 T:2 (auto now takes all 10 ops T:2,
    # 79.95 us).
    graph, machine = residual_layernorm(rows, 256), spyre(cores=cores, lx_bytes=lx_kib * 1024)
    named = estimate(graph, machine, _one_loop(graph, 1, 2, "T"))
    comp = checked(graph, machine)
    auto = traffic_report(comp.program).time_ns
    assert auto <= named * 1.05
    # the group holds mean and sub: h - mean is not written to HBM
    (group,) = comp.stages["tiling_plan"].groups
    assert {graph.ops[1].name, graph.ops[2].name} <= set(group.ops)
