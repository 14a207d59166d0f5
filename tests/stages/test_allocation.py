"""allocate: LX eligibility, lifetimes, in-place reuse, the three solvers, the HBM pool.

Every compiled case runs on the interpreter (per-core LX memories: a buffer wrongly placed in
LX reads another core's bytes or never-written ones) and through the memory checker.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from workloads import add_mul, compile, softmax

import fspyre
from fspyre.errors import AllocationError, WorkDivisionError
from fspyre.ir.frozen import FrozenMap
from fspyre.ir.plans import Placement
from fspyre.ir.program import LoopSpec, op_specs
from fspyre.ir.serialize import dumps, loads
from fspyre.machine.memcheck import check_memory
from fspyre.machine.report import traffic_report
from fspyre.machine.rules import live_intervals
from fspyre.stages.allocation import AllocationOptions, LiveBuffer, _greedy, solve, verify_allocation
from fspyre.stages.program import emit_program
from fspyre.testing.graphs import inputs_for

SOLVERS = ("greedy", "firstfit", "bestfit")


def placements(comp):
    return comp.stages["allocation"].buffers


def run_clean(graph, comp):
    report = fspyre.check(graph, comp=comp)
    assert report.equal, str(report)
    mem = check_memory(comp.program)
    assert mem.clean, str(mem)
    return report


# -- the canonical examples --------------------------------------------------------------------


@pytest.mark.parametrize("solver", SOLVERS)
def test_canonical_add_mul_keeps_y_in_lx(solver):
    graph = add_mul()
    comp = compile(graph, lx_solver=solver)
    p = placements(comp)
    y = p["buf0"]
    # one 512 x 1024 tile split over 32 cores: 16 rows x 16 sticks x 128 B per core
    assert (y.memory, y.address, y.nbytes) == ("lx", 0, 16 * 16 * 128)
    for name in ("a", "b", "c", "buf1"):
        assert p[name].memory == "hbm" and p[name].arg_index >= 0, name
    assert {n: dict(s.splits) for n, s in comp.stages["split_plan"].ops.items()} == {
        "buf0": {"A": 32, "B": 1}, "buf1": {"A": 32, "B": 1}}
    run_clean(graph, comp)
    inputs = inputs_for(graph, 1)
    untiled = fspyre.compile(add_mul(tiled=False), tiling="none",
                             allocation_options=AllocationOptions(lx_planning=False))
    assert np.array_equal(fspyre.run(comp, inputs)["z"], fspyre.run(untiled, inputs)["z"])


def test_canonical_add_mul_traffic_tiled_versus_untiled():
    tiled = traffic_report(compile(add_mul()).program)
    untiled = traffic_report(compile(add_mul(tiled=False), tiling="none", lx_planning=False).program)
    size = 1024 * 4096 * 2
    assert tiled.compulsory_bytes == 4 * size
    assert tiled.hbm_bytes == 4 * size and tiled.traffic_ratio == 1.0
    assert untiled.hbm_bytes == 6 * size and untiled.traffic_ratio == 1.5  # y written and read back


@pytest.mark.parametrize("solver", SOLVERS)
def test_softmax_tiled_over_rows_keeps_every_intermediate_in_lx(solver):
    rows, cols = 512, 1024
    graph = softmax(rows, cols)
    comp = compile(graph, lx_solver=solver)
    report = traffic_report(comp.program)
    # x is read from HBM by amax and again by sub; everything else stays on chip
    assert report.hbm_read == 2 * rows * cols * 2 and report.hbm_write == rows * cols * 2
    p = placements(comp)
    assert [n for n, x in p.items() if x.memory == "lx"] == ["buf0", "buf1", "buf2", "buf3"]
    run_clean(graph, comp)


# -- eligibility -------------------------------------------------------------------------------


def test_lx_planning_off_keeps_everything_in_hbm():
    comp = compile(add_mul(), lx_planning=False)
    assert all(p.memory == "hbm" for p in placements(comp).values())
    assert placements(comp)["buf0"].reason == "LX planning is off"
    run_clean(add_mul(), comp)


def test_a_consumer_slicing_differently_keeps_the_buffer_in_hbm():
    g = fspyre.GraphBuilder("mismatch")
    g.dim("A", 32)
    g.dim("B", 2048)
    a = g.input("a", ["A", "B"], "float16")
    y = g.exp(a)  # split over A: core c holds row c
    g.output("s", g.sum(y, ["A"]))  # split over B's 32 sticks: core c reads stick c of every row
    graph = g.build()
    comp = compile(graph, tiling="none")
    y = placements(comp)["buf0"]
    assert y.memory == "hbm"
    assert "op buf1 slices it differently from op buf0 on core 0" in y.reason, y.reason
    run_clean(graph, comp)


def test_a_split_reduction_result_stays_in_hbm():
    g = fspyre.GraphBuilder("ksplit")
    g.dim("A", 64)
    g.dim("B", 128)
    x = g.input("x", ["A", "B"], "float32")
    s = g.sum(x, ["A", "B"], keepdim=True)  # no output dim: A's reduction splits over 32 cores
    g.output("y", g.mul(x, s))
    graph = g.build()
    comp = compile(graph, tiling="none")
    assert "splits reduction dim A across cores" in placements(comp)["buf0"].reason
    run_clean(graph, comp)


def test_a_buffer_a_loop_advances_stays_in_hbm():
    g = fspyre.GraphBuilder("escapes")
    g.dim("A", 64)
    g.dim("B", 256)
    a, b = g.input("a", ["A", "B"], "float16"), g.input("b", ["A", "B"], "float16")
    with g.hint(slices={"A": 2}):
        y = g.add(a, b)
        z = g.exp(y)
    g.output("z", z)
    g.output("w", g.neg(y))  # y is read after the loop: a full buffer the loop writes tile by tile
    graph = g.build()
    comp = compile(graph)
    y = placements(comp)["buf0"]
    assert y.memory == "hbm" and "advances it with an enclosing loop" in y.reason, y.reason
    run_clean(graph, comp)


def test_capacity_exhaustion_moves_buffers_to_hbm():
    graph = softmax()
    big = placements(compile(graph, fspyre.machine.spyre(lx_bytes=8704)))
    assert all(big[n].memory == "lx" for n in ("buf0", "buf1", "buf2", "buf3"))
    comp = compile(graph, fspyre.machine.spyre(lx_bytes=8192))
    p = placements(comp)
    assert p["buf1"].memory == "hbm" and p["buf1"].reason.startswith("no room in LX during [1, 3]"), p["buf1"].reason
    run_clean(graph, comp)
    tiny = compile(graph, fspyre.machine.spyre(lx_bytes=1024))
    assert placements(tiny)["buf1"].reason == "needs 8192 bytes of LX per core, more than the 1024 the machine has"
    run_clean(graph, tiny)
    none = compile(graph, fspyre.machine.spyre(lx_bytes=0))
    assert all(x.memory == "hbm" for x in placements(none).values())
    run_clean(graph, none)


def test_an_accumulator_lives_in_lx_across_its_loop():
    g = fspyre.GraphBuilder("row_sum")
    g.dim("A", 64)
    g.dim("N", 1024)
    x = g.input("x", ["A", "N"], "float16")
    with g.hint(slices={"N": 4}):
        s = g.sum(x, ["N"], keepdim=True)
    g.output("y", g.mul(s, 2.0))
    graph = g.build()
    comp = compile(graph)
    acc = placements(comp)["buf0_acc"]
    # filled before the loop (time 0), combined in it (time 2), finished after it (time 3)
    assert acc.memory == "lx" and acc.live == (0, 4)
    run_clean(graph, comp)


# -- in-place reuse ----------------------------------------------------------------------------


def chain_graph():
    g = fspyre.GraphBuilder("chain")
    g.dim("A", 64)
    g.dim("B", 256)
    x = g.input("x", ["A", "B"], "float16")
    g.output("y", g.abs(g.neg(g.exp(x))))
    return g.build()


@pytest.mark.parametrize("solver", SOLVERS)
def test_a_pointwise_child_takes_its_parents_slot(solver):
    graph = chain_graph()
    comp = compile(graph, tiling="none", lx_solver=solver)
    p = placements(comp)
    assert p["buf0"].memory == p["buf1"].memory == "lx"
    assert p["buf1"].in_place_of == "buf0" and p["buf1"].address == p["buf0"].address
    assert "buf1: in place of buf0" in comp.stages["allocation"].notes
    run_clean(graph, comp)


@pytest.mark.parametrize("solver", SOLVERS)
def test_solvers_place_in_place_only_into_a_parent_at_least_as_large(solver):
    parent = LiveBuffer(name="p", size=256, start=0, end=2)
    fits = LiveBuffer(name="c", size=256, start=1, end=3, parents=("p",))
    assert solve([parent, fits], 4096, solver) == {"p": (0, ""), "c": (0, "p")}
    bigger = LiveBuffer(name="c", size=384, start=1, end=3, parents=("p",))
    got = solve([parent, bigger], 4096, solver)
    assert got["c"][1] == "" and got["c"][0] >= 256


# -- the solvers -------------------------------------------------------------------------------


@pytest.mark.parametrize("solver", SOLVERS)
def test_solvers_align_to_128_bytes(solver):
    items = [LiveBuffer(name=f"b{i}", size=100 + i, start=0, end=3) for i in range(4)]
    got = solve(items, 4096, solver)
    assert sorted(a for a, _ in got.values()) == [0, 128, 256, 384]


@pytest.mark.parametrize("solver", SOLVERS)
def test_solvers_leave_out_what_does_not_fit(solver):
    items = [LiveBuffer(name="a", size=1024, start=0, end=2), LiveBuffer(name="b", size=1024, start=1, end=3),
             LiveBuffer(name="huge", size=8192, start=0, end=1)]
    got = solve(items, 1536, solver)
    assert len(got) == 1 and "huge" not in got


@pytest.mark.parametrize("solver", SOLVERS)
def test_solvers_reuse_addresses_across_lifetime_gaps(solver):
    items = [LiveBuffer(name="a", size=512, start=0, end=2), LiveBuffer(name="b", size=512, start=2, end=4),
             LiveBuffer(name="c", size=512, start=1, end=3)]
    got = solve(items, 1024, solver)
    assert set(got) == {"a", "b", "c"}
    assert got["a"][0] == got["b"][0] != got["c"][0]


def test_first_fit_and_best_fit_choose_different_gaps():
    # A, E die at 5; B, F live on. X (5..20) sees free [0, 384) and [640, 896): first fit
    # takes the lowest, best fit the tightest. (Uses order the placement: X goes last.)
    items = [
        LiveBuffer(name="A", size=256, start=0, end=5, uses=10),
        LiveBuffer(name="E", size=128, start=0, end=5, uses=9),
        LiveBuffer(name="B", size=128, start=0, end=20, uses=10),
        LiveBuffer(name="F", size=128, start=0, end=20, uses=9),
        LiveBuffer(name="X", size=256, start=5, end=20, uses=1),
    ]
    ff, bf = solve(items, 896, "firstfit"), solve(items, 896, "bestfit")
    assert {n: a for n, (a, _) in ff.items()} == {"A": 0, "E": 256, "B": 384, "F": 512, "X": 0}
    assert bf["X"][0] == 640
    greedy = solve(items, 896, "greedy")  # input order at time 0, then X into the gap A and E left
    assert {n: a for n, (a, _) in greedy.items()} == {"A": 0, "E": 256, "B": 384, "F": 512, "X": 0}


def test_an_unknown_solver_is_refused():
    with pytest.raises(AllocationError, match="lx_solver='ilp'"):
        AllocationOptions(lx_solver="ilp")


# -- lifetimes and the HBM pool ----------------------------------------------------------------


def test_lifetimes_stretch_over_a_loop_only_when_the_value_crosses_it():
    spans = {0: (1, 4)}  # loop 0 holds times 1, 2, 3
    uses = {
        "inside": [(1, (0,)), (3, (0,))],  # per-tile: within one iteration
        "across": [(0, ()), (2, (0,))],  # written before, read inside: the whole loop
        "after": [(2, (0,)), (5, ())],
    }
    assert live_intervals(uses, spans) == {"inside": (1, 4), "across": (0, 4), "after": (1, 6)}
    assert live_intervals({"one": [(2, (0,))]}, spans) == {"one": (2, 3)}


def test_the_hbm_pool_reuses_the_space_of_dead_buffers():
    g = fspyre.GraphBuilder("long")
    g.dim("A", 64)
    g.dim("B", 256)
    x = g.input("x", ["A", "B"], "float16")
    g.output("y", g.neg(g.exp(g.abs(g.neg(x)))))
    graph = g.build()
    reuse = compile(graph, tiling="none", lx_planning=False)
    bump = compile(graph, tiling="none", lx_planning=False, hbm_reuse=False)
    p = placements(reuse)
    assert [p[n].live for n in ("buf0", "buf1", "buf2")] == [(0, 2), (1, 3), (2, 4)]
    assert p["buf2"].address == p["buf0"].address  # buf0 is dead when buf2 is born
    tensor = 64 * 256 * 2
    assert bump.stages["allocation"].hbm_bytes - reuse.stages["allocation"].hbm_bytes == tensor
    for comp in (reuse, bump):
        run_clean(graph, comp)
        assert all(x.address % 128 == 0 for x in placements(comp).values())


def test_allocations_round_trip_and_are_deterministic():
    comp = compile(softmax(128, 256, row_tiles=2))
    alloc = comp.stages["allocation"]
    assert loads(dumps(alloc)) == alloc
    assert compile(softmax(128, 256, row_tiles=2)).stages["allocation"] == alloc


# -- HBM capacity ------------------------------------------------------------------------------


def test_a_program_needing_more_hbm_than_the_machine_has_is_refused_with_the_numbers():
    graph = softmax(rows=64, cols=256)
    need = compile(graph, fspyre.machine.spyre(lx_bytes=0), hbm_reuse=False).stages["allocation"].hbm_bytes
    tensor = 64 * 256 * 2  # x and y, float16
    assert need > 2 * tensor  # the pool holds the intermediates
    exact = compile(graph, fspyre.machine.spyre(lx_bytes=0, hbm_bytes=need), hbm_reuse=False)
    assert exact.stages["allocation"].hbm_bytes == need
    with pytest.raises(AllocationError) as info:
        compile(graph, fspyre.machine.spyre(lx_bytes=0, hbm_bytes=need - 128), hbm_reuse=False)
    message = str(info.value)
    for part in (f"needs {need} bytes of HBM", f"inputs {tensor}", f"outputs {tensor}",
                 f"intermediate pool {need - 2 * tensor}", f"the machine's {need - 128}", "hbm_bytes"):
        assert part in message, message


def test_the_default_hbm_is_the_cards_seven_16_gib_segments_and_fits_the_workloads():
    machine = fspyre.machine.spyre()
    assert machine.hbm_bytes == 7 * (16 << 30)
    for graph in (add_mul(), softmax()):
        assert compile(graph, machine).stages["allocation"].hbm_bytes < machine.hbm_bytes


@pytest.mark.parametrize("bad", [0, -128, 100, True, 2.0**30])
def test_hbm_capacity_is_validated(bad):
    with pytest.raises(fspyre.errors.MachineError, match=f"hbm_bytes={bad!r}"):
        fspyre.machine.spyre(hbm_bytes=bad)


# -- the greedy solver against its plain statement -------------------------------------------


def _plain_greedy(items, capacity, prefer_gaps=False):
    """The greedy rule as written in its docstring, re-sorting every live span per placement."""
    def first_gap(spans, size):
        cur = 0
        for a, s in sorted(spans):
            start = -(-cur // 128) * 128
            if start + size <= a:
                return start
            cur = max(cur, a + s)
        start = -(-cur // 128) * 128
        return start if capacity is None or start + size <= capacity else None

    live, taken, out = {}, set(), {}
    for t in sorted({it.start for it in items} | {it.end for it in items}):
        for it in items:
            if it.end == t:
                live.pop(it.name, None)
        for it in (it for it in items if it.start == t):
            if capacity is not None and it.size > capacity:
                continue
            addr, parent = None, ""
            for p in it.parents:
                if p in live and p not in taken and it.size <= live[p][1]:
                    addr, parent = live[p][0], p
                    taken.add(p)
                    break
            if addr is None:
                spans = list(live.values())
                if not spans or min(a for a, _ in spans) >= it.size:
                    addr = 0
                elif prefer_gaps:
                    addr = first_gap(spans, it.size)
                else:
                    top = -(-max(a + s for a, s in spans) // 128) * 128
                    fits = capacity is None or top + it.size <= capacity
                    addr = top if fits else first_gap(spans, it.size)
            if addr is not None:
                live[it.name] = (addr, it.size)
                out[it.name] = (addr, parent)
    return out


@st.composite
def live_buffers(draw):
    items = []
    for i in range(draw(st.integers(1, 40))):
        start = draw(st.integers(0, 30))
        end = start + draw(st.integers(1, 12))
        # in-place parents: earlier buffers ending where this one starts + 1 (a child is born at
        # its parent's last use)
        earlier = [b.name for b in items if b.end == start + 1]
        parents = tuple(draw(st.lists(st.sampled_from(earlier), max_size=2, unique=True))) if earlier else ()
        items.append(LiveBuffer(name=f"b{i}", size=draw(st.integers(1, 8)) * draw(st.sampled_from([1, 100, 128])),
                                start=start, end=end, parents=parents))
    return items


@settings(max_examples=300, deadline=None)
@given(live_buffers(), st.sampled_from([None, 512, 1024, 4096]), st.booleans())
def test_greedy_places_exactly_as_the_plain_rule(items, capacity, prefer_gaps):
    got = _greedy(items, capacity, prefer_gaps)
    assert got == _plain_greedy(items, capacity, prefer_gaps)
    # and what it places never overlaps a live buffer other than the slot it took over
    by = {it.name: it for it in items}
    chain = {n: p for n, (_, p) in got.items() if p}

    def root(n):
        while n in chain:
            n = chain[n]
        return n

    for x in got:
        for y in got:
            a, b = by[x], by[y]
            if x < y and a.start < b.end and b.start < a.end and root(x) != root(y):
                (ax, _), (ay, _) = got[x], got[y]
                assert ax + a.size <= ay or ay + b.size <= ax, (x, y, got[x], got[y])
    if capacity is not None:
        assert all(got[n][0] + by[n].size <= capacity for n in got)


# -- verify_allocation -----------------------------------------------------------------------------
def test_emit_program_refuses_a_split_and_allocation_made_for_another_tree():
    tiled = compile(add_mul(1024, 4096))
    untiled = compile(add_mul(1024, 4096), tiling="none")
    m = tiled.machine
    tree, split, alloc = (tiled.stages[k] for k in ("loop_tree", "split_plan", "allocation"))
    assert emit_program(tree, split, alloc, m) == tiled.program
    # buf0 is one [512, 1024] tile in the tiled tree, the whole [1024, 4096] tensor untiled: the
    # split plan's slice extents (16 rows per core, 32 untiled) already give the plan away
    with pytest.raises(WorkDivisionError, match=r"op buf0 splits dim A \(size 1024\) into 32 slices but has slices "
                                                r"of 512 elements in all; the plan was made for another tree"):
        emit_program(untiled.stages["loop_tree"], split, alloc, m)  # was accepted, and ran
    with pytest.raises(WorkDivisionError, match=r"op buf0 splits dim A \(size 512\) into 32 slices but has slices "
                                                r"of 1024 elements in all"):
        emit_program(tree, untiled.stages["split_plan"], untiled.stages["allocation"], m)
    # the same split plan with another tree's allocation: the LX footprints differ
    with pytest.raises(AllocationError, match=r"LX buffer buf0 is placed with 262144 bytes per core, but op buf0 uses "
                                              r"32768 of it per core with splits {'A': 32, 'B': 1}; allocate"):
        emit_program(tree, split, untiled.stages["allocation"], m)


def test_verify_allocation_names_the_buffer_and_the_numbers():
    comp = compile(add_mul(1024, 4096))
    m = comp.machine
    tree, split, alloc = (comp.stages[k] for k in ("loop_tree", "split_plan", "allocation"))
    assert verify_allocation(tree, split, alloc, m) is alloc
    p = alloc.buffers

    def refused(match, **changes):
        buffers = FrozenMap((n, replace(b, **changes[n]) if n in changes else b) for n, b in p.items())
        with pytest.raises(AllocationError, match=match):
            verify_allocation(tree, split, replace(alloc, buffers=buffers), m)

    refused(r"buffer a is kernel argument 0 \(inputs, then outputs\) but is placed in hbm with arg_index 1",
            a={"arg_index": 1}, b={"arg_index": 0})
    refused(r"buffer buf0 is an intermediate \(arg_index -1\) but is placed in lx with arg_index 4",
            buf0={"arg_index": 4})
    refused(r"HBM buffer buf1 is placed with 4096 bytes, but its device layout \[64, 1024, 64\] takes 8388608",
            buf1={"nbytes": 4096})
    top = m.lx_bytes - 128
    refused(rf"LX buffer buf0 at {top} \+ 32768 bytes per core ends past the machine's {m.lx_bytes}-byte LX",
            buf0={"address": top})
    with pytest.raises(AllocationError, match=r"HBM buffer buf1 at 25165824 \+ 8388608 bytes ends past the "
                                              r"allocation's 33550336 bytes of HBM"):
        verify_allocation(tree, split, replace(alloc, hbm_bytes=alloc.hbm_bytes - 4096), m)
    with pytest.raises(AllocationError, match=r"allocation uses 33554432 bytes of HBM, more than the machine's "
                                              r"16777216; allocate for this machine"):
        verify_allocation(tree, split, alloc, fspyre.machine.spyre(hbm_bytes=16777216))
    with pytest.raises(AllocationError, match=r"no placement for buffer buf0 of loop tree add_mul"):
        verify_allocation(tree, split, replace(alloc, buffers=FrozenMap((n, b) for n, b in p.items() if n != "buf0")),
                          m)
    with pytest.raises(AllocationError, match=r"places buffer ghost, which loop tree add_mul does not have"):
        verify_allocation(tree, split, replace(alloc, buffers=p.set("ghost", p["buf0"])), m)


def test_verify_allocation_refuses_an_advancing_buffer_in_lx():
    g = fspyre.GraphBuilder("advance")
    A, B = g.dim("A", 256), g.dim("B", 512)
    a, b = (g.input(n, (A, B), "float16") for n in "ab")
    with g.hint(slices={"A": 2}):
        y = g.add(a, b)  # written tile by tile into its full buffer: read again after the loop
    g.output("z", g.neg(y))
    comp = compile(g.build())
    tree, split, alloc = (comp.stages[k] for k in ("loop_tree", "split_plan", "allocation"))
    assert alloc.buffers["buf0"].memory == "hbm"
    moved = alloc.buffers.set("buf0", Placement(memory="lx", address=0, nbytes=4096))
    with pytest.raises(AllocationError, match=r"LX buffer buf0: op buf0 advances it with an enclosing loop \(loop "
                                              r"counts and element steps \[2x65536\]\), op buf1 walks it otherwise "
                                              r"\(\[\]\).*; place it in HBM"):
        verify_allocation(tree, split, replace(alloc, buffers=moved), comp.machine)


# -- LX slots: a region sibling loops walk, kept in LX between them ----------------------------
def _softmax_over_row(count: int = 4):
    """Softmax over C tiled over C: two online loops, x copied into LX slots by the first and
    read back by the second."""
    g = fspyre.GraphBuilder("online")
    B, C = g.dim("B", 64), g.dim("C", 1024)
    x = g.input("x", (B, C), "float16")
    with g.hint(slices={"C": count}):
        e = g.exp(g.sub(x, g.amax(x, ["C"], keepdim=True)))
        g.output("y", g.div(e, g.sum(e, ["C"], keepdim=True)))
    return g.build()


def test_lx_slots_hold_one_box_per_iteration_and_round_trip():
    graph = _softmax_over_row(4)
    comp = fspyre.compile(graph, machine=fspyre.machine.spyre(cores=8), tiling="hints")
    tree, split, alloc = (comp.stages[k] for k in ("resident_tree", "split_plan", "allocation"))
    slots = alloc.buffers["x_lx"]
    box = 8 * 4 * 128  # per core: 8 rows x 4 sticks of C (a tile of 256) x 128 bytes
    assert slots.memory == "lx" and slots.nbytes == 4 * box
    # every op walking it steps one box per iteration, in the first loop and in the second
    assert set(slots.advances.values()) == {(box,)} and len(slots.advances) >= 3
    assert loads(dumps(alloc)) == alloc
    args = [a for spec in op_specs(comp.program) for a in spec.args if a.name == "x_lx"]
    assert args and all(a.memory == "lx" and a.tile_advance == (box,) for a in args)
    assert check_memory(comp.program).clean
    assert fspyre.check(graph, comp=comp, machine=fspyre.machine.spyre(cores=8)).equal
    # an allocation whose slots are laid out otherwise is refused, naming buffer and numbers
    op = next(iter(slots.advances))
    for bad in (replace(slots, advances=slots.advances.set(op, (2 * box,))), replace(slots, advances=FrozenMap()),
                replace(slots, nbytes=box)):
        with pytest.raises(AllocationError, match="x_lx"):
            verify_allocation(tree, split, replace(alloc, buffers=alloc.buffers.set("x_lx", bad)), comp.machine)


def test_memory_check_sees_an_lx_tensor_walking_past_its_slots():
    comp = fspyre.compile(_softmax_over_row(4), machine=fspyre.machine.spyre(cores=8), tiling="hints")
    program = comp.program

    def wider(spec):
        if isinstance(spec, LoopSpec):
            return replace(spec, body=tuple(wider(s) for s in spec.body))
        return replace(spec, args=tuple(replace(a, tile_advance=tuple(8 * s for s in a.tile_advance))
                                        if a.name == "x_lx" else a for a in spec.args))

    bad = replace(program, body=tuple(wider(s) for s in program.body))
    issues = check_memory(bad).issues
    # its last slot now lies past its allocation, over the buffers placed after it
    assert any(i.kind == "overlap" and "x_lx" in (i.tensor + i.message) for i in issues), issues


def test_a_placement_refuses_slots_in_hbm_or_off_the_lx_grid():
    with pytest.raises(AllocationError, match="advances are for LX slots"):
        Placement(memory="hbm", address=0, nbytes=256, advances=FrozenMap({"op": (256,)}))
    with pytest.raises(AllocationError, match="multiples of 128"):
        Placement(memory="lx", address=0, nbytes=256, advances=FrozenMap({"op": (100,)}))


def test_a_buffer_no_op_uses_takes_no_hbm():
    # an intermediate of a loaded tree that no op reads or writes: placed, but alive at no time,
    # so it shares the pool with the live buffers and the program's HBM does not grow
    comp = compile(add_mul(64, 128, tiled=False), tiling="none")
    tree, splits = comp.stages["resident_tree"], comp.stages["split_plan"]
    extra = replace(tree, buffers=tree.buffers + (replace(tree.buffers[-1], name="unused_buf"),))
    options = AllocationOptions(lx_planning=False)
    machine = fspyre.machine.spyre()
    without = fspyre.stages.allocate(tree, splits, machine, options)
    unused = fspyre.stages.allocate(extra, splits, machine, options)
    assert unused.hbm_bytes == without.hbm_bytes
    assert unused.buffers["unused_buf"].live == (0, 0) and unused.buffers["unused_buf"].reason == "no op uses it"
    assert all(unused.buffers[n] == p for n, p in without.buffers.items())


@pytest.mark.parametrize("solver", ["firstfit", "bestfit"])
def test_fit_solvers_place_in_place_partners_first_among_equals(solver):
    # x and p live equally long and are used equally often, and only one fits; p is the parent
    # its child c may take over in place, so p goes first (its score drops by the partner bonus)
    # and c then reuses p's slot: both fit where x alone would have left p and c out
    items = [LiveBuffer(name="x", size=1024, start=0, end=2), LiveBuffer(name="p", size=1024, start=0, end=2),
             LiveBuffer(name="c", size=1024, start=2, end=3, parents=("p",))]
    got = solve(items, 1024, solver)
    assert "p" in got and "x" not in got
    assert got["c"] == (got["p"][0], "p")
