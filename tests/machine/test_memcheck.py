"""check_memory: each kind of fault, planted into a correct program, is reported with its op,
tensor, core and address; correct programs are clean."""

from __future__ import annotations

import pickle
from dataclasses import replace

import pytest
from workloads import add_mul, compile, softmax

import fspyre
from fspyre.check import check_memory_and_run
from fspyre.errors import ExecutionError
from fspyre.ir.program import LoopSpec, OpSpec
from fspyre.machine.memcheck import check_memory, execution_issue
from fspyre.testing.graphs import inputs_for


def replant(comp, **placements):
    """The program ``comp`` made, with some tensors placed elsewhere in every op that uses
    them: what ``check_memory`` must catch (``emit_program`` refuses such an allocation)."""

    def move(spec: OpSpec) -> OpSpec:
        args = []
        for a in spec.args:
            change = placements.get(a.name)
            if change:
                a = replace(a, memory=change.get("memory", a.memory), address=change.get("address", a.address),
                            arg_index=change.get("arg_index", a.arg_index))
            args.append(a)
        return replace(spec, args=tuple(args))

    return replace(comp.program, body=_map_specs(comp.program.body, move))


def kinds(report):
    return [(i.kind, i.op, i.tensor, i.memory) for i in report.issues]


def test_correct_programs_are_clean():
    for comp in (compile(add_mul(256, 512)), compile(softmax(128, 256, row_tiles=2)),
                 compile(add_mul(256, 512, tiled=False), tiling="none", lx_planning=False)):
        report = check_memory_and_run(comp.program)
        assert report.clean, str(report)
        assert "CLEAN" in str(report)


def test_overlapping_live_hbm_buffers():
    comp = compile(add_mul(256, 512, tiled=False), tiling="none", lx_planning=False)
    program = replant(comp, buf0={"address": 0})  # y on top of input a, both live at time 0
    report = check_memory(program)
    assert ("overlap", "buf0", "a", "hbm") in kinds(report) or ("overlap", "buf0", "buf0", "hbm") in kinds(report)
    issue = next(i for i in report.issues if i.kind == "overlap")
    assert "a [0x0," in issue.message and "buf0 [0x0," in issue.message and issue.core == -1


def test_overlapping_live_lx_buffers():
    comp = compile(softmax(128, 256, row_tiles=2))
    p = comp.stages["allocation"].buffers
    at = p["buf2"].address
    assert p["buf2"].live == (2, 5) and p["buf3"].live == (3, 5) and p["buf3"].address != at
    program = replant(comp, buf3={"address": at})  # the row sums on top of exp's values
    report = check_memory(program)
    issue = next(i for i in report.issues if i.kind == "overlap")
    assert issue.memory == "lx" and issue.core == 0 and issue.address == at
    assert "buf2" in issue.message and "buf3" in issue.message and "on core 0" in issue.message
    assert fspyre.check(softmax(128, 256, row_tiles=2), comp=replace(comp, program=program)).equal is False


def test_lx_overflow():
    comp = compile(add_mul(256, 512))
    program = replant(comp, buf0={"address": comp.machine.lx_bytes - 128})
    report = check_memory(program)
    issue = next(i for i in report.issues if i.kind == "lx_overflow")
    assert (issue.op, issue.tensor, issue.core) == ("buf0", "buf0", 0)
    assert f"past the {comp.machine.lx_bytes}-byte LX" in issue.message


def _map_specs(body, fn):
    return tuple(replace(s, body=_map_specs(s.body, fn)) if isinstance(s, LoopSpec) else fn(s)
                 for s in body)


def test_out_of_bounds_hbm():
    comp = compile(add_mul(256, 512))
    short = replace(comp.program, hbm_bytes=comp.program.hbm_bytes - 4096)
    issue = next(i for i in check_memory(short).issues if i.kind == "out_of_bounds")
    assert issue.tensor == "buf1" and "ends past HBM" in issue.message

    def double_advance(spec: OpSpec) -> OpSpec:
        args = tuple(replace(a, tile_advance=tuple(2 * x for x in a.tile_advance)) if a.name == "c" else a
                     for a in spec.args)
        return replace(spec, args=args)

    program = replace(comp.program, body=_map_specs(comp.program.body, double_advance))
    issue = next(i for i in check_memory(program).issues if i.kind == "out_of_bounds")
    assert (issue.op, issue.tensor) == ("buf1", "c") and "outside its allocation" in issue.message


def mismatch_graph():
    g = fspyre.GraphBuilder("mismatch")
    g.dim("A", 32)
    g.dim("B", 2048)
    a = g.input("a", ["A", "B"], "float16")
    y = g.exp(a)  # core c writes row c
    g.output("s", g.sum(y, ["A"]))  # core c reads stick c of every row
    return g.build()


def test_a_consumer_slicing_an_lx_buffer_differently_is_caught():
    graph = mismatch_graph()
    comp = compile(graph, tiling="none")
    assert comp.stages["allocation"].buffers["buf0"].memory == "hbm"
    program = replant(comp, buf0={"memory": "lx", "address": 0, "arg_index": -1})
    report = check_memory(program)
    issue = next(i for i in report.issues if i.kind == "lx_slice_mismatch")
    assert (issue.op, issue.tensor, issue.core, issue.memory) == ("buf1", "buf0", 0, "lx")
    assert "wrote the box at [0, 0, 0] extent [32, 1, 64]" in issue.message, issue.message
    # and the interpreter, whose cores each read only their own LX, gets it wrong
    bad = replace(comp, program=program)
    try:
        report = fspyre.check(graph, comp=bad)
    except ExecutionError as err:
        assert "never written" in str(err)
    else:
        assert not report.equal


def test_reads_before_writes_are_caught_statically_and_by_running():
    comp = compile(add_mul(64, 128, tiled=False), tiling="none", lx_planning=False)
    program = replace(comp.program, body=tuple(reversed(comp.program.body)))
    report = check_memory_and_run(program)
    assert ("unwritten_read", "buf1", "buf0", "hbm") in kinds(report)
    run = next(i for i in report.issues if i.kind == "execution")
    assert run.op == "buf1" and run.tensor == "buf0" and "never written" in run.message


def test_inconsistent_placements_of_one_tensor_are_caught():
    comp = compile(add_mul(64, 128, tiled=False), tiling="none", lx_planning=False)

    def move_y_in_mul(spec: OpSpec) -> OpSpec:
        if spec.name != "buf1":
            return spec
        args = tuple(replace(a, memory="hbm", address=a.address + 4096) if a.name == "buf0" else a
                     for a in spec.args)
        return replace(spec, args=args)

    program = replace(comp.program, body=_map_specs(comp.program.body, move_y_in_mul))
    assert any("every access of a tensor must use one allocation" in i.message for i in check_memory(program).issues)


@pytest.mark.parametrize("lx", [0, 512, 8192])
def test_high_water_marks_follow_the_allocation(lx):
    comp = compile(softmax(128, 256, row_tiles=2), fspyre.machine.spyre(lx_bytes=lx))
    report = check_memory(comp.program)
    assert report.clean, str(report)
    assert max(report.lx_high_water) == comp.stages["allocation"].lx_peak_bytes


def test_execution_errors_carry_where_they_happened():
    comp = compile(add_mul(64, 128, tiled=False), tiling="none", lx_planning=False)
    program = replace(comp.program, body=tuple(reversed(comp.program.body)))  # mul reads y before add writes it
    y = next(a for a in comp.program.body[0].args if a.name == "buf0")
    with pytest.raises(ExecutionError) as info:
        fspyre.run(program, inputs_for(add_mul(64, 128, tiled=False)))
    err = info.value
    assert (err.op, err.tensor, err.core, err.memory, err.address) == ("buf1", "buf0", 0, "hbm", y.address)
    assert f"address {y.address:#x}, which was never written" in str(err)
    again = pickle.loads(pickle.dumps(err))
    assert (again.op, again.tensor, again.core, again.memory, again.address, str(again)) == (
        err.op, err.tensor, err.core, err.memory, err.address, str(err))
    issue = execution_issue(err)  # the memory report's finding, from the fields (no parsing of the text)
    assert (issue.kind, issue.op, issue.tensor, issue.core, issue.memory, issue.address) == (
        "execution", "buf1", "buf0", 0, "hbm", y.address)


def test_an_lx_execution_error_names_the_core_and_lx():
    graph = add_mul(256, 512)
    comp = compile(graph)
    top = comp.machine.lx_bytes - 128
    program = replant(comp, buf0={"address": top})  # y's per-core box runs past the end of LX
    with pytest.raises(ExecutionError) as info:
        fspyre.run(program, inputs_for(graph))
    err = info.value
    assert (err.op, err.tensor, err.memory) == ("buf0", "buf0", "lx") and err.core >= 0
    assert err.address >= top and f"op buf0 tensor buf0 core {err.core}:" in str(err)
    assert f"address {err.address:#x} is outside LX" in str(err)


def test_a_kernel_argument_past_hbm_is_reported_at_copy_in():
    graph = add_mul(64, 128, tiled=False)
    program = compile(graph, tiling="none").program
    a = program.kernel_args[0]
    short = replace(program, hbm_bytes=a.address + 128)
    with pytest.raises(ExecutionError) as info:
        fspyre.run(short, inputs_for(graph))
    err = info.value
    assert (err.op, err.tensor, err.core, err.memory) == ("", "a", -1, "hbm")
    assert str(err).startswith("copy-in of a: address ") and f"{err.address:#x} is outside HBM" in str(err)
