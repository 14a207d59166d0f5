"""Ops that run only in the first or last iteration of their loop (``OpNode.runs``,
``OpSpec.runs``): ``keep_resident`` moves the copies, fills and finishes that run just before
or just after a loop into it (``guard_boundaries``), so they are part of the loop's kernel.

Every program here runs on the interpreter against the same graph compiled without the
stage (no guarded ops), against numpy from the definition, and through the static memory
check; planted wrong guards are caught."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from test_tiling_properties import GRAPHS, agree, reassociates, untiled_run
from tiling_examples import attention, softmax_over

import fspyre
from fspyre.check import compare
from fspyre.errors import ExecutionError, FspyreError, LoweringError, SerializationError, TilingError
from fspyre.ir.graph import Pointwise, Store
from fspyre.ir.looptree import Loop, OpNode, TileStep, op_nodes, walk
from fspyre.ir.program import LoopSpec, OpSpec, op_specs
from fspyre.ir.serialize import FORMAT, dumps, loads
from fspyre.lower.generic import mlir_generic
from fspyre.lower.unroll import unroll
from fspyre.machine.hostio import random_inputs, wide_inputs
from fspyre.machine.interpreter import RunOptions, run_program
from fspyre.machine.memcheck import check_memory
from fspyre.machine.reference import evaluate_with_bounds
from fspyre.machine.report import traffic_report
from fspyre.machine.spyre import spyre
from fspyre.stages.allocation import allocate
from fspyre.stages.program import emit_program
from fspyre.stages.residency import place_copies
from fspyre.stages.split_plan import divide_work
from fspyre.testing import examples, inputs_for
from fspyre.testing.hints import legal_hint_nests

pytestmark = pytest.mark.filterwarnings("ignore::fspyre.FspyreWarning")


def mlp(tokens: int, d: int, h: int, hidden_tiles: int) -> fspyre.Graph:
    """y = gelu(x @ w1 + b1) @ w2 + b2, tiled over the hidden dim H: the second matmul is a
    K-accumulation whose fill, finish and bias add run around the loop."""
    g = fspyre.GraphBuilder("mlp_hidden")
    T, D, H = g.dim("T", tokens), g.dim("D", d), g.dim("H", h)
    x = g.input("x", (T, D), "float16")
    w1, w2 = g.input("w1", (D, H), "float16"), g.input("w2", (H, D), "float16")
    b1, b2 = g.input("b1", (H,), "float16"), g.input("b2", (D,), "float16")
    with g.hint(slices={"H": hidden_tiles}):
        y = g.add(g.matmul(g.gelu(g.add(g.matmul(x, w1), b1)), w2), b2)
    g.output("y", y)
    return g.build()


def guards(program) -> dict[str, str]:
    return {s.name: s.runs for s in op_specs(program) if s.runs != "every"}


def both(graph, machine=None):
    machine = machine or spyre()
    return fspyre.compile(graph, machine, tiling="hints"), fspyre.compile(graph, machine, tiling="hints",
                                                                         residency=False)


def _gelu(x: np.ndarray) -> np.ndarray:
    from math import erf, sqrt
    return 0.5 * x * (1 + np.vectorize(erf)(x / sqrt(2)))


# -- the two programs issue #10 asked for -----------------------------------------------------------
def test_attention_over_keys_copies_fills_and_finishes_inside_its_loop():
    graph = attention(256, 1024, 64, {"Sk": 4})
    comp, plain = both(graph)
    (loop,) = comp.stages["resident_tree"].body
    assert isinstance(loop, Loop) and loop.count == 4
    firsts = [n.name for n in loop.body if isinstance(n, OpNode) and n.runs == "first"]
    lasts = [n.name for n in loop.body if isinstance(n, OpNode) and n.runs == "last"]
    assert "q_lx_copy" in firsts and any(n.endswith("_fill") for n in firsts) and lasts == ["buf9_finish"]
    report, before = traffic_report(comp.program), traffic_report(plain.program)
    assert len(report.kernels) == 1  # one loop kernel: nothing runs before or after it
    assert report.traffic_ratio == 1.0 and report.time_ns <= before.time_ns
    copy = next(o for o in report.ops if o.name == "q_lx_copy")
    assert copy.iterations == 1 and copy.hbm_read == 256 * 64 * 2  # q read once, not once per tile
    assert check_memory(comp.program).clean
    inputs = inputs_for(graph, 2)
    got = fspyre.run(comp, inputs)["o"]
    np.testing.assert_array_equal(got, fspyre.run(plain, inputs)["o"])  # the guards move no arithmetic
    q, k, v = (inputs[n].astype(np.float64) for n in "qkv")
    s = q @ k.T / 8.0
    p = np.exp(s - s.max(axis=1, keepdims=True))
    np.testing.assert_allclose(got, (p / p.sum(axis=1, keepdims=True)) @ v, rtol=2**-7, atol=2**-9)


def test_mlp_over_its_hidden_dim_reads_each_weight_once_in_one_kernel():
    graph = mlp(256, 128, 512, 4)
    comp, plain = both(graph)
    (loop,) = comp.stages["resident_tree"].body
    runs = {n.name: n.runs for n in loop.body if isinstance(n, OpNode)}
    assert runs["x_lx_copy"] == "first" and runs["buf3_fill"] == "first"
    assert runs["buf3_finish"] == "last" and runs["buf4"] == "last"  # the cast and the bias add writing y
    report = traffic_report(comp.program)
    assert len(report.kernels) == 1 and report.traffic_ratio == 1.0
    assert report.time_ns <= traffic_report(plain.program).time_ns
    assert check_memory(comp.program).clean
    inputs = inputs_for(graph, 4)
    got = fspyre.run(comp, inputs)["y"]
    assert fspyre.check(graph, inputs, comp=comp).equal
    x, w1, w2, b1, b2 = (inputs[n].astype(np.float64) for n in ("x", "w1", "w2", "b1", "b2"))
    want = _gelu(x @ w1 + b1) @ w2 + b2
    np.testing.assert_allclose(got, want, rtol=2**-7, atol=2**-6 * np.abs(want).max())


@pytest.mark.parametrize("build", [lambda: attention(64, 512, 64, {"Sk": 4}), lambda: mlp(64, 128, 256, 2)])
def test_guarded_programs_unroll_round_trip_and_lower(build):
    graph = build()
    comp = fspyre.compile(graph, tiling="hints")
    program = comp.program
    assert guards(program)
    flat = unroll(program)
    assert all(s.runs == "every" for s in flat.body)
    inputs = inputs_for(graph)
    looped, _ = run_program(program, inputs)
    unrolled, _ = run_program(flat, inputs)
    for name in looped:
        np.testing.assert_array_equal(looped[name], unrolled[name])
    assert loads(dumps(program)) == program
    tree = comp.stages["resident_tree"]
    assert loads(dumps(tree)) == tree
    text = mlir_generic(program)
    assert text.count('"scf.if"') == len(guards(program))
    # the generic form parses with a real MLIR parser, one scf.if per guarded op
    from xdsl.context import Context
    from xdsl.dialects.affine import Affine
    from xdsl.dialects.arith import Arith
    from xdsl.dialects.builtin import Builtin
    from xdsl.dialects.func import Func
    from xdsl.dialects.scf import Scf
    from xdsl.parser import Parser
    ctx = Context(allow_unregistered=True)
    for dialect in (Builtin, Func, Arith, Scf, Affine):
        ctx.load_dialect(dialect)
    module = Parser(ctx, text).parse_module()
    module.verify()
    assert sum(op.name == "scf.if" for op in module.walk()) == len(guards(program))


def test_what_a_first_iteration_op_writes_lives_across_the_whole_loop():
    comp = fspyre.compile(attention(256, 1024, 64, {"Sk": 4}), tiling="hints")
    tree, alloc = comp.stages["resident_tree"], comp.stages["allocation"]
    (loop,) = tree.body
    ops = op_nodes(tree)
    assert alloc.buffers["q_lx"].memory == "lx"
    # the copy writes q_lx at time 0; the loop body spans every op: q_lx lives over all of it,
    # so nothing the iterations write takes its LX
    assert alloc.buffers["q_lx"].live == (0, len(ops))
    acc = next(n.op.store.buffer for n in loop.body if isinstance(n, OpNode) and n.runs == "last")
    finish = next(n for n in loop.body if isinstance(n, OpNode) and n.runs == "last")
    assert acc == "buf9" and all(alloc.buffers[ld.buffer].live[1] == len(ops) for ld in finish.op.loads)
    from fspyre.pretty.dot import to_dot
    from fspyre.pretty.text import pretty
    assert "(first iteration)" in to_dot(tree) and "(last iteration)" in to_dot(tree)
    assert "[first iteration]" in pretty(tree) and "[last iteration]" in pretty(tree)


# -- construction and verification --------------------------------------------------------------------
def _copy(runs: str, tiling=((),)) -> OpNode:
    from fspyre.ir.graph import Dim, Load
    op = Pointwise(name="c", fn="copy", operands=(Load(buffer="x", index=Dim("A", 4).symbol),),
                   ranges=(Dim("A", 4),), store=Store(buffer="y", index=Dim("A", 4).symbol))
    return OpNode(op=op, tiling=tiling, runs=runs)


def test_a_guarded_op_sits_in_a_loop_it_does_not_move_at_the_head_or_tail():
    with pytest.raises(TilingError, match="sits in no loop"):
        _copy("first", ())
    with pytest.raises(TilingError, match="moves \\[A\\+4\\] there"):
        _copy("last", ((TileStep(dim="A", extent=4),),))
    with pytest.raises(TilingError, match="runs .* must be one of"):
        _copy("second")
    every = dataclasses.replace(_copy("first"), runs="every", op=dataclasses.replace(_copy("first").op, name="d"))
    Loop(count=2, steps=(), body=(_copy("first"), every))
    with pytest.raises(TilingError, match="op c runs in the first iteration only but is not at the head"):
        Loop(count=2, steps=(), body=(every, _copy("first")))
    with pytest.raises(TilingError, match="op c runs in the last iteration only but is not at the tail"):
        Loop(count=2, steps=(), body=(_copy("last"), every))


def test_a_program_op_guarded_out_of_place_is_refused():
    program = fspyre.compile(attention(64, 512, 64, {"Sk": 4}), tiling="hints").program
    (loop,) = [s for s in program.body if isinstance(s, LoopSpec)]
    first = loop.body[0]
    assert first.runs == "first"
    with pytest.raises(LoweringError, match="runs in the first iteration only but is not at the head of the body"):
        dataclasses.replace(loop, body=(dataclasses.replace(first, runs="last"),) + loop.body[1:])
    with pytest.raises(LoweringError, match="runs 'sometimes'"):
        dataclasses.replace(first, runs="sometimes")
    # the copy of q alone, at the top level, still guarded
    alone = dataclasses.replace(first, args=tuple(dataclasses.replace(a, tile_advance=()) for a in first.args),
                                tiled_symbols=())
    with pytest.raises(ExecutionError, match="sits in no loop"):
        run_program(dataclasses.replace(program, body=(alone,)), inputs_for(attention(64, 512, 64, {"Sk": 4})))
    with pytest.raises(SerializationError, match=f"reads only format {FORMAT}"):
        loads(dumps(program).replace(f'"_format": {FORMAT}', f'"_format": {FORMAT - 1}'))


# -- planted wrong guards are caught ------------------------------------------------------------------
def _replanted(program, target: OpSpec, runs: str):
    """``program`` with ``target`` guarded by ``runs`` instead, moved to the head (first) or the
    tail (last) of its loop body, or (every) right after the body's first-iteration ops."""
    def walk(body):
        out = []
        for s in body:
            if isinstance(s, LoopSpec):
                inner = walk(s.body)
                if target in s.body:
                    rest = tuple(x for x in inner if x is not target)
                    moved = dataclasses.replace(target, runs=runs)
                    heads = sum(1 for x in rest if isinstance(x, OpSpec) and x.runs == "first")
                    inner = ((moved,) + rest if runs == "first" else rest + (moved,) if runs == "last"
                             else rest[:heads] + (moved,) + rest[heads:])
                out.append(dataclasses.replace(s, body=inner))
            else:
                out.append(s)
        return tuple(out)

    return dataclasses.replace(program, body=walk(program.body))


def _outcome(program, inputs, clean) -> str:
    try:
        outs, _ = run_program(program, inputs)
    except ExecutionError as err:
        return f"execution error: {str(err).splitlines()[0]}"
    if any(not np.array_equal(outs[n], clean[n], equal_nan=True) for n in clean):
        return "numeric mismatch"
    return "missed"


@pytest.mark.parametrize("build", [lambda: attention(64, 512, 64, {"Sk": 4}), lambda: mlp(64, 128, 256, 2)])
def test_every_wrong_guard_is_caught(build):
    """A first-iteration op run in the last iteration instead (its readers read LX nobody
    wrote), a last-iteration op run in the first (the finish reads the fills), and a fill run in
    every iteration (the accumulator restarts). A copy of a loop-invariant operand run in every
    iteration computes the same values -- more HBM traffic, which the report counts -- so it is
    no corruption of the results."""
    graph = build()
    program = fspyre.compile(graph, tiling="hints").program
    inputs = inputs_for(graph)
    clean, _ = run_program(program, inputs)
    outcomes = {}
    for spec in op_specs(program):
        if spec.runs == "every":
            continue
        other = "last" if spec.runs == "first" else "first"
        outcomes[f"{spec.name} {spec.runs}->{other}"] = _outcome(_replanted(program, spec, other), inputs, clean)
        if spec.op == "full":
            outcomes[f"{spec.name} unguarded"] = _outcome(_replanted(program, spec, "every"), inputs, clean)
        elif spec.op == "copy":
            unguarded = _replanted(program, spec, "every")
            assert _outcome(unguarded, inputs, clean) == "missed"
            assert traffic_report(unguarded).hbm_read > traffic_report(program).hbm_read
    assert outcomes and not [k for k, v in outcomes.items() if v == "missed"], outcomes
    assert any("never written" in v for v in outcomes.values())


# -- the report counts what the program does ------------------------------------------------------
@pytest.mark.parametrize("build", [lambda: attention(64, 512, 64, {"Sk": 4}), lambda: mlp(64, 128, 256, 2)])
def test_report_counts_a_guarded_op_once_as_the_interpreter_touches_it(build):
    comp = fspyre.compile(build(), tiling="hints")
    report = traffic_report(comp.program)
    _, state = run_program(comp.program, inputs_for(comp.graph), RunOptions(trace_hbm=True))
    assert state.hbm_trace is not None
    guarded = guards(comp.program)
    for claimed, traced in zip(report.ops, state.hbm_trace, strict=True):
        assert claimed.iterations == len(traced.reads)
        assert (claimed.hbm_read, claimed.hbm_write) == (traced.hbm_read, traced.hbm_write)
        if claimed.name in guarded:
            assert claimed.iterations == 1
    assert {o.kernel for o in report.ops} == {0}


# -- properties -------------------------------------------------------------------------------------
@settings(max_examples=examples(40), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
@given(st.data(), st.integers(1, 32), st.sampled_from([1 << 14, 1 << 16, 1 << 21]))
def test_guarded_programs_equal_unguarded_ones(data, cores, lx):
    """Random graphs under random legal hints, and the search: the program whose copies, fills
    and finishes run in their loop's first or last iteration computes what the program without
    the residency stage (no guarded ops) and the untiled program compute, and passes the
    memory check."""
    graph = data.draw(GRAPHS, label="graph")
    hinted = data.draw(st.sampled_from(["hints", "auto"]), label="tiling")
    if hinted == "hints":
        graph = data.draw(legal_hint_nests(graph), label="hints").apply(graph)
    machine = spyre(cores=cores, lx_bytes=lx)
    try:
        comp = fspyre.compile(graph, machine, tiling=hinted)
        plain = fspyre.compile(graph, machine, tiling=comp.stages["tiling_plan"], residency=False)
    except FspyreError:
        assume(False)
    event(f"guarded ops: {min(len(guards(comp.program)), 3)}{'+' if len(guards(comp.program)) > 2 else ''}")
    assert check_memory(comp.program).clean
    inputs = inputs_for(graph, 5)
    got = fspyre.run(comp, inputs)
    agree(graph, got, fspyre.run(plain, inputs), not reassociates(graph), hinted)
    agree(graph, got, untiled_run(graph, machine, inputs), not reassociates(graph), hinted)


def test_a_buffer_a_guarded_op_writes_whole_and_the_loop_walks_stays_in_hbm():
    """The fill writes the accumulator whole in the first iteration; the combine walks it one
    row per iteration (a tile of one element: the dim leaves the iteration space but still
    moves the address). LX tensors advance only through slots every use walks alike, so the
    allocator keeps it in HBM; with the step judged on the index after size-1 dims were
    dropped, both looked still and core 1 read LX nobody wrote."""
    g = fspyre.GraphBuilder("walked_accumulator")
    A, B = g.dim("A", 8), g.dim("B", 64)
    x = g.input("x", (A, B), "float16")
    # B: 2 would cut sticks, so its level makes no loop (a warning) but still makes the sum an
    # accumulation; A: 8 walks the rows one at a time
    with g.hint(slices={"B": 2, "A": 8}):
        s = g.sum(x, ["B"], keepdim=True)
    g.output("s", s)
    graph = g.build()
    comp = fspyre.compile(graph, spyre(cores=8, lx_bytes=16384), tiling="hints")
    (loop,) = comp.stages["resident_tree"].body
    assert [n.runs for n in loop.body] == ["first", "every", "every", "last"]
    assert comp.stages["allocation"].buffers["buf0_acc"].memory == "hbm"
    assert check_memory(comp.program).clean
    inputs = inputs_for(graph, 1)
    want = inputs["x"].astype(np.float64).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(fspyre.run(comp, inputs)["s"], want, rtol=2**-8, atol=2**-8)


def test_only_ops_that_run_for_a_loop_join_it():
    """u feeds nothing in the loop and w reads nothing it wrote: they stay kernels of their own.
    v reads the loop's result: it joins the last iteration. Joining u or w would only overlap,
    in the estimate, work the loop neither waits for nor feeds."""
    g = fspyre.GraphBuilder("neighbours")
    g.dim("A", 256)
    g.dim("B", 512)
    x, b, c = (g.input(n, ["A", "B"], "float16") for n in "xbc")
    u = g.exp(c)  # before the loop, for nobody in it
    with g.hint(slices={"A": 4}):
        y = g.mul(g.add(x, b), b)
    v = g.neg(y)  # after the loop, reads its result
    w = g.abs(c)  # after the loop, reads only an input
    for name, t in (("u", u), ("v", v), ("w", w)):
        g.output(name, t)
    graph = g.build()
    comp = fspyre.compile(graph, spyre(cores=4), tiling="hints")
    tree = comp.stages["resident_tree"]
    top = [n.name for n in tree.body if isinstance(n, OpNode)]
    (loop,) = [n for n in tree.body if isinstance(n, Loop)]
    assert u.buffer in top and w.buffer in top
    assert [(n.name, n.runs) for n in loop.body if isinstance(n, OpNode) and n.guarded] == [(v.buffer, "last")]
    report = fspyre.check(graph, machine=spyre(cores=4), comp=comp)
    assert report.equal and report.safe, str(report)


def test_an_op_joins_a_loop_only_past_ops_that_do_not_touch_its_buffers():
    """Found by the residency property in CI: the matmul's main part and its tail (K: 2 on 192
    runs one tile of 128 in place, then a tail of 64) both write buf4_part, each read by an
    accumulate in between. Both read y, which the first loop writes, so both looked like its
    finishes; moved into its last iteration, the tail's write overtook the first accumulate.
    An op now joins only past ops that neither write what it reads nor read or write what it
    writes."""
    g = fspyre.GraphBuilder("tail_writes")
    g.dim("K", 192)
    g.dim("M", 4)
    g.dim("N", 6)
    x = g.input("x", ["K", "M", "N"], "float16")
    w = g.input("w", ["M", "N", "K"], "float16")
    with g.hint(slices={"K": 2}):
        y = g.neg(x)
    with g.hint(slices={"K": 2}):
        z = g.matmul(y, w, contract="K")
    g.output("z", z)
    graph = g.build()
    machine = spyre(cores=1)
    comp = fspyre.compile(graph, machine, tiling="hints")
    plain = fspyre.compile(graph, machine, tiling=comp.stages["tiling_plan"], residency=False)
    inputs = inputs_for(graph, 2)
    assert np.array_equal(fspyre.run(comp, inputs)["z"], fspyre.run(plain, inputs)["z"])
    report = fspyre.check(graph, inputs, machine=machine, comp=comp)
    assert report.equal and report.safe, str(report)


# -- a loaded tree's guards ----------------------------------------------------------------------------
def _reguarded(body, name: str, runs: str):
    return tuple(dataclasses.replace(n, body=_reguarded(n.body, name, runs)) if isinstance(n, Loop)
                 else dataclasses.replace(n, runs=runs) if n.name == name else n for n in body)


def _guard_edits(tree) -> list[tuple[str, str]]:
    """(op, runs): each op in a loop that its innermost loop does not move (only such an op
    can be guarded), with each other guard."""
    return [(n.name, runs) for n, depth in walk(tree.body) if isinstance(n, OpNode) and depth and not n.tiling[-1]
            for runs in ("every", "first", "last") if runs != n.runs]


@settings(max_examples=examples(30), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
@given(st.data(), st.integers(1, 8))
def test_a_loaded_tree_with_a_guard_changed_is_refused_or_runs_equal(data, cores):
    """Any op's guard changed in a loop tree or a resident tree loaded from JSON and handed to
    the next stage alone (tests/unit/stage_doors.py, over random graphs): the stages refuse it
    with an FspyreError, or its program equals the reference on random inputs and on inputs
    that defeat shift and scale invariances. A guard that makes the iterations' work unseen --
    a combine guarded last drops all partials but the last -- must not pass silently."""
    family = data.draw(st.sampled_from(["random", "softmax", "attention", "mlp"]), label="family")
    if family == "random":
        base = data.draw(GRAPHS, label="graph")
        graph = data.draw(legal_hint_nests(base), label="hints").apply(base)
    elif family == "softmax":  # an online softmax: running max and sum, rescaled
        graph = softmax_over(data.draw(st.sampled_from([8, 16])), data.draw(st.sampled_from([128, 256])),
                             data.draw(st.sampled_from([2, 4])), data.draw(st.sampled_from(["softmax", "log_softmax"])),
                             data.draw(st.sampled_from(["float16", "float32"])), data.draw(st.sampled_from([1, 2])))
    elif family == "attention":
        graph = attention(16, data.draw(st.sampled_from([128, 256])), 64, {"Sk": data.draw(st.sampled_from([2, 4]))})
    else:  # a K-accumulation with its fill, finish and bias add around the loop
        graph = mlp(16, 64, data.draw(st.sampled_from([128, 256])), data.draw(st.sampled_from([2, 4])))
    machine = spyre(cores=cores)
    try:
        comp = fspyre.compile(graph, machine, tiling="hints")
    except FspyreError:
        assume(False)
    stage = data.draw(st.sampled_from(["loop_tree", "resident_tree"]), label="stage")
    tree = comp.stages[stage]
    edits = _guard_edits(tree)
    assume(edits)
    name, runs = data.draw(st.sampled_from(edits), label="edit")
    event(f"{stage}: {runs}")
    try:
        loaded = loads(dumps(dataclasses.replace(tree, body=_reguarded(tree.body, name, runs))))
        if stage == "loop_tree":
            program = place_copies(loaded, machine).program
        else:
            split = divide_work(loaded, machine)
            program = emit_program(loaded, split, allocate(loaded, split, machine), machine)
        table = graph.buffer_table()
        types = {n: table[n].type for n in graph.inputs}
        for inputs in (random_inputs(types, 0), wide_inputs(types, 0)):
            report = compare(graph, fspyre.run(program, inputs), *evaluate_with_bounds(graph, inputs, machine))
            assert report.equal, f"{stage}: op {name} runs={runs!r} passed silently: {report}"
    except FspyreError as err:
        event(f"refused: {str(err).split(':')[0]}")
