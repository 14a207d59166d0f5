"""Every IR node checks its local invariants when built: counts >= 1, non-empty bodies,
positive sizes, tuples and FrozenMaps (never a list or dict, which would make a frozen node
mutable). Each refusal is an FspyreError naming the node and the value."""

from __future__ import annotations

from dataclasses import replace

import pytest
import sympy
from workloads import add_mul, compile

from fspyre.errors import AllocationError, GraphError, LoweringError, TilingError, WorkDivisionError
from fspyre.ir.frozen import FrozenMap
from fspyre.ir.graph import Dim, HintScope, Load, Pointwise, Store, TensorType
from fspyre.ir.looptree import Loop, LoopTree, OpNode, TileStep
from fspyre.ir.plans import Allocation, Group, Level, OpSplit, Placement, SplitPlan
from fspyre.ir.program import ArgOperand, LoopSpec, ScalarOperand, op_specs
from fspyre.lower.sdsc import anchor_op_info

A = sympy.Symbol("A", integer=True, nonnegative=True)


@pytest.fixture(scope="module")
def comp():
    return compile(add_mul(256, 512))


def an_op():
    return Pointwise(name="p", fn="neg", operands=(Load(buffer="x", index=A),), ranges=(Dim("A", 4),),
                     store=Store(buffer="p", index=A))


# -- program ------------------------------------------------------------------------------------
def test_loop_specs_need_a_positive_count_and_a_body(comp):
    spec = op_specs(comp.program)[0]
    with pytest.raises(LoweringError, match=r"loop count 0 must be an integer >= 1"):
        LoopSpec(count=0, body=(spec,))
    with pytest.raises(LoweringError, match=r"loop count True must be an integer >= 1"):
        LoopSpec(count=True, body=(spec,))
    with pytest.raises(LoweringError, match=r"loop of count 3: body must not be empty"):
        LoopSpec(count=3, body=())
    with pytest.raises(LoweringError, match=r"loop of count 2: body must be a tuple, got a list"):
        LoopSpec(count=2, body=[spec])
    with pytest.raises(LoweringError, match=r"loop of count 2: body must hold LoopSpec or OpSpec, got a str"):
        LoopSpec(count=2, body=("buf0",))


def test_op_specs_and_tensor_args_refuse_plain_dicts_and_bad_sizes(comp):
    spec = op_specs(comp.program)[0]
    arg = spec.args[0]
    with pytest.raises(LoweringError, match=r"op buf0: iteration_space must be a FrozenMap, got a dict"):
        replace(spec, iteration_space=dict(spec.iteration_space))
    with pytest.raises(LoweringError, match=r"op buf0: op_info must be an OpInfo, got a dict"):
        replace(spec, op_info=anchor_op_info(spec))
    with pytest.raises(LoweringError, match=r"op info: compute 'float16' must be one of \['float32', 'int32'\]"):
        replace(spec.op_info, compute="float16")
    with pytest.raises(LoweringError, match=r"op info: operands must hold ArgOperand or ScalarOperand, got a tuple"):
        replace(spec.op_info, operands=(("arg", 0),))
    with pytest.raises(LoweringError, match=r"arg operand: index -1 must be an integer >= 0"):
        ArgOperand(index=-1)
    with pytest.raises(LoweringError, match=r"scalar operand '1' must be a bool, int or float"):
        ScalarOperand(value="1")
    with pytest.raises(LoweringError, match=r"op buf0: args must not be empty"):
        replace(spec, args=())
    with pytest.raises(LoweringError, match=r"tensor a: memory 'dram' must be one of \['hbm', 'lx'\]"):
        replace(arg, memory="dram")
    with pytest.raises(LoweringError, match=r"tensor a: address -128 must be an integer >= 0"):
        replace(arg, address=-128)
    with pytest.raises(LoweringError, match=r"tensor a: device_dtype 'FP13' must be one of \['SEN169_FP16', "):
        replace(arg, device_dtype="FP13")
    with pytest.raises(LoweringError, match=r"kernel argument a: device_dtype 'FP13' must be one of "):
        replace(comp.program.kernel_args[0], device_dtype="FP13")
    with pytest.raises(LoweringError, match=r"tensor a: device_size \[.*0.*\] must be positive"):
        replace(arg, device_size=(0,) * len(arg.device_size))
    with pytest.raises(LoweringError, match=r"tensor a: arg_index -2 must be an integer >= -1"):
        replace(arg, arg_index=-2)
    with pytest.raises(LoweringError, match=r"tensor a: tile_advance must be a tuple, got a list"):
        replace(arg, tile_advance=list(arg.tile_advance))


def test_programs_and_kernel_args_check_their_numbers(comp):
    program = comp.program
    with pytest.raises(LoweringError, match=r"program add_mul: cores 0 must be an integer >= 1"):
        replace(program, cores=0)
    with pytest.raises(LoweringError, match=r"program add_mul: body must be a tuple, got a list"):
        replace(program, body=list(program.body))
    k = program.kernel_args[0]
    with pytest.raises(LoweringError, match=r"kernel argument a: arg_index -1 must be an integer >= 0"):
        replace(k, arg_index=-1)
    with pytest.raises(LoweringError, match=r"kernel argument a: host_shape must be a tuple, got a list"):
        replace(k, host_shape=list(k.host_shape))


# -- loop tree ----------------------------------------------------------------------------------
def test_loop_tree_nodes_check_counts_bodies_and_steps():
    node = OpNode(op=an_op(), tiling=((TileStep(dim="A", extent=2),),))
    step = TileStep(dim="A", extent=2)
    with pytest.raises(TilingError, match=r"tile step of dim A: extent 0 must be an integer >= 1"):
        TileStep(dim="A", extent=0)
    with pytest.raises(TilingError, match=r"loop count 0 must be a positive integer"):
        Loop(count=0, steps=(step,), body=(node,))
    with pytest.raises(TilingError, match=r"loop of count 2: body must not be empty"):
        Loop(count=2, steps=(step,), body=())
    with pytest.raises(TilingError, match=r"loop of count 2: steps \[A\+2, A\+2\] repeat a \(dim, extent\) pair"):
        Loop(count=2, steps=(step, step), body=(node,))
    with pytest.raises(TilingError, match=r"loop of count 2: steps must hold TileStep, got a tuple"):
        Loop(count=2, steps=(("A", 2),), body=(node,))
    assert Loop(count=2, steps=(step, TileStep(dim="A", extent=4)), body=(node,)).dims == ("A",)
    with pytest.raises(TilingError, match=r"op p: tiling must be a tuple, got a list"):
        OpNode(op=an_op(), tiling=[(step,)])
    with pytest.raises(TilingError, match=r"an op node holds a Pointwise or Reduction, got a str"):
        OpNode(op="p")
    with pytest.raises(TilingError, match=r"loop tree t: inputs must be a tuple, got a list"):
        LoopTree(name="t", buffers=(), inputs=["x"], outputs=(), body=(node,))


# -- graph --------------------------------------------------------------------------------------
def test_graph_nodes_refuse_lists_and_dicts():
    with pytest.raises(GraphError, match=r"hint scope 0: slices must be a FrozenMap, got a dict"):
        HintScope(id=0, slices={"A": 2})
    with pytest.raises(GraphError, match=r"op p: ranges must be a tuple, got a list"):
        replace(an_op(), ranges=[Dim("A", 4)])
    with pytest.raises(GraphError, match=r"tensor dims must hold Dim, got a str"):
        TensorType(dims=("A",), dtype="float32")


# -- plans --------------------------------------------------------------------------------------
def test_plans_refuse_plain_dicts_and_bad_numbers():
    with pytest.raises(TilingError, match=r"loop level: op_dims must be a FrozenMap, got a dict"):
        Level(count=2, dims=("A",), op_dims={"p": ("A",)})
    with pytest.raises(TilingError, match=r"a group's ops must not be empty"):
        Group(ops=(), levels=())
    with pytest.raises(WorkDivisionError, match=r"op split: splits must be a FrozenMap, got a dict"):
        OpSplit(splits={"A": 2}, cores=2)
    with pytest.raises(WorkDivisionError, match=r"split plan: ops must be a FrozenMap, got a dict"):
        SplitPlan(ops={})
    with pytest.raises(WorkDivisionError, match=r"split plan: op p maps to a dict, not an OpSplit"):
        SplitPlan(ops=FrozenMap({"p": {"A": 2}}))
    with pytest.raises(AllocationError, match=r"lx placement at 0: nbytes -128 must be an integer >= 0"):
        Placement(memory="lx", address=0, nbytes=-128)
    with pytest.raises(AllocationError, match=r"live \(3, 1\) must be a \(first, last \+ 1\) pair"):
        Placement(memory="lx", address=0, nbytes=128, live=(3, 1))
    with pytest.raises(AllocationError, match=r"allocation: buffers must be a FrozenMap, got a dict"):
        Allocation(buffers={}, hbm_bytes=0)
    with pytest.raises(AllocationError, match=r"allocation: hbm_bytes -1 must be an integer >= 0"):
        Allocation(buffers=FrozenMap(), hbm_bytes=-1)


def test_an_allocation_maps_each_buffer_to_a_placement():
    with pytest.raises(AllocationError, match=r"allocation: buffer x maps to a str, not a Placement"):
        Allocation(buffers=FrozenMap({"x": "hbm at 0"}), hbm_bytes=0)
