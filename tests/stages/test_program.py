"""verify_program: a program that disagrees with itself is refused, naming the op, tensor and numbers.

Each case plants one corruption in a compiled program (the form a hand-edited or stale
program takes); ``compile`` runs the same check on every program it emits."""

from __future__ import annotations

from dataclasses import replace

import pytest
import sympy
from workloads import add_mul, compile

from fspyre.errors import LoweringError
from fspyre.ir.program import ArgOperand, LoopSpec, OpSpec, op_specs
from fspyre.stages.program import verify_program


@pytest.fixture(scope="module")
def program():
    return compile(add_mul(256, 512)).program  # LoopSpec(2){LoopSpec(4){add buf0, mul buf1}}


def edit_op(program, name, fn):
    def walk(body):
        return tuple(LoopSpec(count=s.count, body=walk(s.body)) if isinstance(s, LoopSpec)
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
