"""verify_program: a program that disagrees with itself is refused, naming the op, tensor and numbers.

Each case plants one corruption in a compiled program (the form a hand-edited or stale
program takes); ``compile`` runs the same check on every program it emits."""

from __future__ import annotations

from dataclasses import replace

import pytest
import sympy
from workloads import add_mul, compile

import fspyre
from fspyre.errors import LoweringError
from fspyre.ir.program import ArgOperand, LoopSpec, OpSpec, op_specs
from fspyre.machine.spyre import spyre
from fspyre.stages.program import verify_program


@pytest.fixture(scope="module")
def program():
    return compile(add_mul(256, 512)).program  # LoopSpec(2){LoopSpec(4){add buf0, mul buf1}}


def edit_op(program, name, fn):
    def walk(body):
        return tuple(replace(s, body=walk(s.body)) if isinstance(s, LoopSpec)
                     else fn(s) if s.name == name else s for s in body)

    return replace(program, body=walk(program.body))


def edit_arg(program, op, tensor, **changes):
    return edit_op(program, op, lambda s: replace(s, args=tuple(replace(a, **changes) if a.name == tensor else a
                                                                for a in s.args)))


def refused(program, match):
    with pytest.raises(LoweringError, match=match):
        verify_program(program)


def test_a_compiled_program_verifies(program):
    assert verify_program(program) is program
    assert [len(s.tiled_symbols) for s in op_specs(program)] == [2, 2]


def test_kernel_arguments_are_numbered_once_and_fit_hbm(program):
    args = program.kernel_args
    refused(replace(program, kernel_args=(args[0], replace(args[1], arg_index=7), *args[2:])),
            r"kernel argument b \(buffer b\) has arg_index 7; the 4 argument buffers must be numbered 0..3, one number "
            r"per buffer")
    refused(replace(program, hbm_bytes=args[1].address + 128),
            rf"kernel argument b at {args[1].address} ends at byte {args[2].address}, past the program's "
            rf"{args[1].address + 128} bytes of HBM")


def test_ops_fit_the_program_cores_and_loops(program):
    refused(replace(program, cores=4), r"op buf0 runs on 32 cores, more than the program's 4")
    refused(edit_op(program, "buf0", lambda s: replace(s, tiled_symbols=s.tiled_symbols[:1])),
            r"op buf0 sits in 2 loops but lists tiled_symbols for 1")
    refused(edit_arg(program, "buf1", "c", tile_advance=(0,)),
            r"op buf1: tensor c has 1 tile advances inside 2 loops; give one per enclosing loop")
    Q = sympy.Symbol("Q", integer=True, nonnegative=True)
    refused(edit_op(program, "buf0", lambda s: replace(s, tiled_symbols=((Q,), ()))),
            r"op buf0: tiled symbol Q is not in its iteration space \['A', 'B'\]")


def test_args_operands_and_coordinates_agree(program):
    def out_first(s: OpSpec) -> OpSpec:
        return replace(s, args=(s.args[-1], *s.args[:-1]))

    refused(edit_op(program, "buf1", out_first),
            r"op buf1: its args must be its inputs, then its one output; got is_input \[False, True, True\]")

    def swapped(s: OpSpec) -> OpSpec:
        return replace(s, op_info=replace(s.op_info, operands=(ArgOperand(index=1), ArgOperand(index=0))))

    refused(edit_op(program, "buf1", swapped),
            r"op buf1: operands refer to args \[1, 0\], but it has 2 input args; each input must be an operand "
            r"once, in order")
    Q = sympy.Symbol("Q", integer=True, nonnegative=True)
    a = op_specs(program)[0].args[0]
    refused(edit_arg(program, "buf0", "a", device_coordinates=(Q, *a.device_coordinates[1:])),
            r"op buf0: tensor a coordinates use \['Q'\], which its iteration space \['A', 'B'\] does not hold")


def test_each_tensor_has_one_place_and_kernel_arguments_match(program):
    y = op_specs(program)[0].args[-1]
    assert y.name == "buf0" and y.memory == "lx"
    refused(edit_arg(program, "buf1", "buf0", memory="lx", address=y.address + 128),
            rf"op buf1: tensor buf0 is placed as lx at {y.address + 128}, size \[.*\], SEN169_FP16, arg_index -1, "
            rf"but an earlier op placed it as lx at {y.address}, .*; one tensor has one place")
    refused(edit_arg(program, "buf0", "buf0", memory="lx", address=program.lx_bytes),
            rf"op buf0: LX tensor buf0 at {program.lx_bytes} is past the {program.lx_bytes}-byte LX")
    b = program.kernel_args[1]
    refused(edit_arg(program, "buf0", "a", arg_index=1),
            rf"op buf0: tensor a \(at 0, size \[.*\]\) claims kernel argument 1, which is b at {b.address}")
    refused(replace(program, hbm_bytes=program.kernel_args[-1].address),
            r"kernel argument z at .* past the program's")
    a = program.kernel_args[0]  # argument 0 is checked like any other
    assert (a.name, a.arg_index) == ("a", 0)
    refused(edit_arg(program, "buf0", "a", address=a.address + 128),
            rf"op buf0: tensor a \(at {a.address + 128}, .*\) claims kernel argument 0, which is a at {a.address}")


# -- programs of every kind verify and run equal; each field the device reads is checked ---------
def _kinds():
    g = fspyre.GraphBuilder("matmul_k")  # a K-accumulation: fill, accumulate and cast guarded in its loop
    M, K, N = g.dim("M", 32), g.dim("K", 256), g.dim("N", 128)
    a, b = g.input("a", (M, K), "float16"), g.input("b", (K, N), "float16")
    with g.hint(slices={"K": 2}):
        g.output("y", g.matmul(a, b))
    yield g.build()
    g = fspyre.GraphBuilder("reductions")  # float reductions, a bool output, an int32 op
    A, B = g.dim("A", 16), g.dim("B", 128)
    x, y = g.input("x", (A, B), "float32"), g.input("k", (A, B), "int32")
    g.output("s", g.sum(x, ["B"]))
    g.output("m", g.mean(x, ["B"]))
    g.output("gt", g.gt(x, 0.5))
    g.output("k3", g.mul(y, 3))
    yield g.build()


@pytest.fixture(scope="module")
def kinds():
    return [(graph, compile(graph, spyre(cores=4))) for graph in _kinds()]


def test_programs_of_every_kind_verify_and_run_equal(kinds):
    for graph, comp in kinds:
        assert verify_program(comp.program) is comp.program
        report = fspyre.check(graph, comp=comp)
        assert report.equal, str(report)
        # a bool is stored as one only where the output is a bool
        bools = {o.buffer for o in graph.outputs if graph.buffer_table()[o.buffer].type.dtype == "bool"}
        assert {s.args[-1].name for s in op_specs(comp.program) if s.op_info.bool_store} <= bools | {
            s.args[-1].name for s in op_specs(comp.program) if s.op in ("gt", "copy")}
        assert all(not s.op_info.bool_store for s in op_specs(comp.program) if s.args[-1].device_dtype == "IEEE_FP32")


def _matmul_k(kinds):
    return kinds[0][1].program


def test_a_loop_s_ops_list_the_symbols_it_tiles(kinds):
    program = _matmul_k(kinds)
    mm = next(s for s in op_specs(program) if s.op == "batchmatmul")
    assert [[str(x) for x in t] for t in mm.tiled_symbols] == [["K"]]
    refused(edit_op(program, mm.name, lambda s: replace(s, tiled_symbols=((),))), r"must list \['K'\]")
    M = next(x for x in mm.iteration_space if x.name == "M")
    K = next(x for x in mm.iteration_space if x.name == "K")
    refused(edit_op(program, mm.name, lambda s: replace(s, tiled_symbols=((K, M),))), "must list")


def _edit_loops(program, fn):
    def walk(body):
        return tuple(fn(replace(s, body=walk(s.body))) if isinstance(s, LoopSpec) else s for s in body)
    return replace(program, body=walk(program.body))


def test_a_loop_records_the_dims_it_tiles_and_its_ops_follow_the_record(kinds):
    program = _matmul_k(kinds)
    (loop,) = [s for s in program.body if isinstance(s, LoopSpec)]
    assert [str(s) for s in loop.tiled_symbols] == ["K"] and loop.count == 2
    refused(_edit_loops(program, lambda lp: replace(lp, tiled_symbols=())), "a loop of count 2 tiles no dim")
    M = next(x for x in op_specs(program)[0].iteration_space if x.name == "M")
    # the record names another dim: every op iterating K lists what the loop does not tile
    refused(_edit_loops(program, lambda lp: replace(lp, tiled_symbols=(M,))), r"loop tiles \['M'\]")
    with pytest.raises(LoweringError, match="repeat a symbol"):
        replace(loop, tiled_symbols=(M, M))


def test_a_dim_tiled_to_one_element_moves_tensors_without_being_listed(monkeypatch):
    """A grouped convolution whose group dim is tiled one group per iteration: the group dim
    leaves the ops' iteration spaces, and x advances by one group's bytes per iteration, which
    equals another symbol's tile step. The old rule (an advance equal to a listed symbol's step
    must be listed) refused the plan, so the search verified every candidate to dodge it; the
    loop's record of the dims it tiles says so instead. Compiled here with the search's
    per-candidate verification off: the plan it picks verifies and runs equal."""
    import torch
    import torch.nn.functional as F

    import fspyre.stages.tiling_search as search
    from fspyre.frontend import capture

    monkeypatch.setattr(search, "verify_program", lambda p: p)
    x = torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(8))
    w = torch.randn(6, 2, 1, generator=torch.Generator().manual_seed(1))
    cap = capture(lambda x, w: F.conv1d(x, w, None, stride=2, groups=2), (x, w))
    machine = spyre(cores=4)
    comp = fspyre.compile(cap.graph, machine=machine)  # compile runs verify_program on what it emits
    squeezed = [(spec.name, [str(s) for s in loop.tiled_symbols]) for spec, chain in _ops_in_loops(comp.program)
                for loop, listed in zip(chain, spec.tiled_symbols) if loop.tiled_symbols and not listed]
    assert squeezed, "no op sits in a loop tiling only dims it does not iterate"
    assert fspyre.check(cap.graph, machine=machine, comp=comp).equal


def _ops_in_loops(program):
    def walk(body, chain):
        for s in body:
            if isinstance(s, LoopSpec):
                yield from walk(s.body, chain + (s,))
            else:
                yield s, chain
    return walk(program.body, ())


def test_a_matmul_s_operands_take_the_roles_its_op_info_records(kinds):
    program = _matmul_k(kinds)
    mm = next(s for s in op_specs(program) if s.op == "batchmatmul")
    assert [str(s) for s in mm.op_info.rows] == ["M"] and [str(s) for s in mm.op_info.cols] == ["N"]
    refused(edit_op(program, mm.name, lambda s: replace(s, args=(s.args[1], s.args[0], s.args[2]))),
            "do not take the roles")
    info = mm.op_info
    refused(edit_op(program, mm.name, lambda s: replace(s, op_info=replace(info, rows=info.cols, cols=info.rows))),
            "do not take the roles")
    refused(edit_op(program, mm.name, lambda s: replace(s, op_info=replace(info, rows=(), cols=()))),
            "do not take the roles")
    add = next(s for s in op_specs(program) if s.op == "add")
    refused(edit_op(program, add.name, lambda s: replace(s, op_info=replace(s.op_info, rows=info.rows))),
            "only a batchmatmul")


def test_a_matmul_with_an_operand_broadcast_over_a_batch_dim_verifies():
    """a[M, K] expanded over B and contracted with b[B, K, N]: B is carried by b alone, so it
    takes a column's role (the product is a 2-D one with B folded into N) and comes before M in
    the output. The old order rule (a's symbols before b's) refused it; the record accepts it,
    and still refuses the operands swapped."""
    g = fspyre.GraphBuilder("broadcast_matmul")
    B, M, K, N = g.dim("B", 4), g.dim("M", 32), g.dim("K", 64), g.dim("N", 64)
    a, b = g.input("a", (M, K), "float16"), g.input("b", (B, K, N), "float16")
    g.output("y", g.matmul(g.expand(a, (B, M, K)), b, "K"))
    graph = g.build()
    for tiling in ("none", "hints", "auto"):
        comp = fspyre.compile(graph, machine=spyre(cores=4), tiling=tiling)
        mm = next(s for s in op_specs(comp.program) if s.op == "batchmatmul")
        assert [str(s) for s in mm.op_info.rows] == ["M"] and [str(s) for s in mm.op_info.cols] == ["B", "N"]
        assert fspyre.check(graph, machine=spyre(cores=4), comp=comp).equal
        refused(edit_op(comp.program, mm.name, lambda s: replace(s, args=(s.args[1], s.args[0], s.args[2]))),
                "do not take the roles")


def test_compute_and_bool_store_agree_with_the_formats(kinds):
    program = kinds[1][1].program
    s = next(s for s in op_specs(program) if s.op == "sum")
    refused(edit_op(program, s.name, lambda s: replace(s, op_info=replace(s.op_info, compute="int32"))),
            "float format")
    refused(edit_op(program, s.name, lambda s: replace(s, op_info=replace(s.op_info, bool_store=True))),
            "stores bools")


def test_a_kernel_argument_in_lx_is_refused(program):
    refused(edit_arg(program, "buf0", "a", memory="lx"), "kernel argument 0 but placed in LX")


def test_a_loop_that_tiles_nothing_and_moves_nothing_is_refused(program):
    # the inner loop (count 4) with every op listing nothing there and no tensor advancing:
    # it would run the same work four times
    def still(s):
        return replace(s, tiled_symbols=(s.tiled_symbols[0], ()),
                       args=tuple(replace(a, tile_advance=(a.tile_advance[0], 0)) for a in s.args))
    (outer,) = program.body
    (inner,) = outer.body
    assert [str(s) for s in inner.tiled_symbols] == ["B"]
    quiet = edit_op(edit_op(program, "buf0", still), "buf1", still)
    refused(quiet, r"but that loop tiles \['B'\] .* it must list \['B'\]")  # the loop's record says B moves

    def inner_loop(**change):
        return replace(quiet, body=(replace(outer, body=(replace(quiet.body[0].body[0], **change),)),))
    refused(inner_loop(tiled_symbols=()), "a loop of count 4 tiles no dim")
    # a record naming a dim none of its ops iterates: a dim tiled to one element per tile moves
    # some tensor; this one moves none
    refused(inner_loop(tiled_symbols=(sympy.Symbol("Z", integer=True, nonnegative=True),)),
            r"tiles \['Z'\], which none of its ops iterates, and moves no tensor")
    # a loop of count 1 repeats nothing
    verify_program(inner_loop(count=1, tiled_symbols=()))


def test_a_guarded_op_outside_loops_or_moving_with_its_loop_is_refused():
    program = compile(next(_kinds()), spyre(cores=4), residency=True).program  # the fill joins the loop
    (loop,) = [s for s in program.body if isinstance(s, LoopSpec)]
    fill = next(s for s in loop.body if isinstance(s, OpSpec) and s.runs == "first")
    alone = replace(fill, tiled_symbols=(), args=tuple(replace(a, tile_advance=()) for a in fill.args))
    refused(replace(program, body=(alone, *program.body)), "runs only in the first iteration .* it sits in no loop")
    moved = edit_op(program, fill.name, lambda s: replace(s, args=tuple(replace(a, tile_advance=(128,))
                                                                         for a in s.args)))
    refused(moved, rf"tensor {fill.args[0].name} advances there")


def test_refusals_name_the_op_and_what_it_is(kinds):
    program = _matmul_k(kinds)
    mm = next(s for s in op_specs(program) if s.op == "batchmatmul")
    refused(edit_op(program, mm.name, lambda s: replace(s, tiled_symbols=())),
            rf"op {mm.name} sits in 1 loops but lists no tiled_symbols")
    refused(edit_op(program, mm.name, lambda s: replace(s, is_reduction=False)),
            r"program op 'batchmatmul' is a reduction, but is_reduction=False")
    add = next(s for s in op_specs(program) if s.op == "add")
    refused(edit_op(program, add.name, lambda s: replace(s, is_reduction=True)),
            r"program op 'add' is not a reduction, but is_reduction=True")


def test_a_tile_advance_is_remembered_and_a_misaligned_one_refused_with_each_callers_names():
    from fspyre.errors import TilingError
    from fspyre.ir.looptree import TileStep
    from fspyre.machine.layout import device_coordinates, stick_layout
    from fspyre.stages.program import tile_advance

    r, c = sympy.symbols("r c", integer=True, nonnegative=True)
    layout = stick_layout((3, 100), 64)  # fp16 rows of 100: two sticks a row, the second padded
    coords = device_coordinates(layout, 100 * r + c, {r: 3, c: 100})
    aligned = ((TileStep(dim="r", extent=1),),)
    assert tile_advance("x", "op0", layout, coords, (r, c), aligned, (3,), {"r": 3, "c": 100}) == (128,)
    assert tile_advance("y", "op1", layout, coords, (r, c), aligned, (3,), {"r": 3, "c": 100}) == (128,)
    # 50 columns a tile cross a stick boundary in one tile and not in the next
    half = ((TileStep(dim="c", extent=50),),)
    for name, op in (("x", "op0"), ("y", "op1")):  # the second from the cache, with its own names
        with pytest.raises(TilingError, match=f"op {op}: tensor {name} cannot advance by one fixed address step"):
            tile_advance(name, op, layout, coords, (r, c), half, (2,), {"r": 3, "c": 100})
