"""The graph IR: local invariants checked at construction, whole-graph ``verify_graph``, and
immutability of every IR class."""

from __future__ import annotations

import dataclasses
import sys
import typing

import pytest
import sympy

from fspyre.errors import GraphError
from fspyre.ir import graph as graph_ir
from fspyre.ir import looptree, plans, program
from fspyre.ir.frozen import FrozenMap
from fspyre.ir.graph import (
    Buffer,
    Dim,
    Graph,
    HintScope,
    Load,
    Output,
    Pointwise,
    Reduction,
    Scalar,
    Store,
    TensorType,
    iteration_dims,
    sym,
    verify_graph,
)

A, B = Dim("A", 4), Dim("B", 8)
a, b = sym("A"), sym("B")
T = TensorType(dims=(A, B), dtype="float32")


def pw(name, fn, operands, store, ranges=(A, B)):
    store_ = Store(buffer=store, index=8 * a + b)
    return Pointwise(name=name, fn=fn, operands=tuple(operands), ranges=ranges, store=store_)


def small_graph(**changes) -> Graph:
    base = dict(
        name="g",
        buffers=(Buffer(name="x", type=T), Buffer(name="y", type=T)),
        inputs=("x",),
        ops=(pw("y", "neg", [Load(buffer="x", index=8 * a + b)], "y"),),
        outputs=(Output(name="out", buffer="y"),),
    )
    return Graph(**{**base, **changes})


def test_dim_is_a_named_size_with_an_integer_symbol():
    assert Dim("A", 4) == A and hash(Dim("A", 4)) == hash(A) and Dim("A", 5) != A
    assert A.symbol == sympy.Symbol("A", integer=True, nonnegative=True)
    assert A.symbol != sympy.Symbol("A")  # assumptions are part of a symbol's identity
    assert str(A) == "A=4"


def test_tensor_type_shape_strides_and_index():
    t = TensorType(dims=(Dim("A", 2), Dim("U", 1), Dim("B", 3)), dtype="bool")
    assert t.shape == (2, 1, 3) and t.names == ("A", "U", "B") and t.numel == 6
    assert t.strides() == (3, 3, 1)
    assert t.contiguous_index() == 3 * sym("A") + sym("B")  # a size-1 dim contributes nothing
    assert TensorType(dims=(), dtype="float16").contiguous_index() == 0


def test_tensor_type_checks_dtype_and_repeated_names():
    with pytest.raises(GraphError, match="'float64'"):
        TensorType(dims=(A,), dtype="float64")
    with pytest.raises(GraphError, match=r"\['A', 'A'\]"):
        TensorType(dims=(A, Dim("A", 1)), dtype="float32")


def test_pointwise_checks_fn_and_arity():
    with pytest.raises(GraphError, match="op p: unknown pointwise fn 'atan'"):
        pw("p", "atan", [Scalar(value=1.0)], "y")
    with pytest.raises(GraphError, match="op p: add takes 2 operands, got 1"):
        pw("p", "add", [Scalar(value=1.0)], "y")
    with pytest.raises(GraphError, match="where takes 3"):
        pw("p", "where", [Scalar(value=1.0)] * 2, "y")


def test_reduction_checks_fn_arity_dims():
    load = Load(buffer="x", index=8 * a + b)
    ok = dict(name="r", fn="sum", operands=(load,), ranges=(A,), reduction_ranges=(B,),
              store=Store(buffer="r", index=a))
    assert Reduction(**ok).loads == (load,)
    for change, match in [
        (dict(fn="median"), "unknown reduction fn 'median'"),
        (dict(fn="matmul"), "matmul takes 2 operands, got 1"),
        (dict(reduction_ranges=()), "needs at least one reduced dim"),
        (dict(ranges=(A,), reduction_ranges=(Dim("A", 4),)), r"dims \['A', 'A'\] repeat"),
    ]:
        with pytest.raises(GraphError, match=match):
            Reduction(**{**ok, **change})


def test_iteration_dims_are_ranges_then_reduction_ranges():
    r = Reduction(name="r", fn="amax", operands=(Load(buffer="x", index=8 * a + b),), ranges=(A,),
                  reduction_ranges=(B,), store=Store(buffer="r", index=a))
    assert iteration_dims(r) == (A, B)
    assert iteration_dims(pw("p", "neg", [Load(buffer="x", index=8 * a + b)], "y")) == (A, B)


def test_verify_graph_accepts_a_well_formed_graph():
    g = small_graph()
    assert verify_graph(g) is g
    assert g.buffer_table()["x"].type == T and g.op_table()["y"].fn == "neg"


@pytest.mark.parametrize(
    "changes, match",
    [
        (dict(buffers=(Buffer(name="x", type=T), Buffer(name="x", type=T))), "duplicate buffer names"),
        (dict(inputs=("x", "nope")), "input nope has no buffer"),
        (dict(ops=(pw("y", "neg", [Load(buffer="z", index=a)], "y"),)), "op y reads z before it is written"),
        (dict(ops=(pw("y", "neg", [Load(buffer="x", index=sym("C"))], "y"),)), r"load of x uses \['C'\]"),
        (dict(ops=(pw("y", "neg", [Scalar(value=1)], "q"),)), "op y writes unknown buffer q"),
        (dict(ops=(pw("y", "neg", [Scalar(value=1)], "x"),)), "op y writes x, which is already written"),
        (dict(ops=(pw("y", "neg", [Scalar(value=1)], "y"), pw("z", "abs", [Scalar(value=1)], "y"))),
         "op y writes y, which z also writes; several ops may write one buffer only each in a region"),
        (dict(outputs=(Output(name="out", buffer="q"),)), "graph output out names unknown buffer q"),
    ],
)
def test_verify_graph_rejects(changes, match):
    with pytest.raises(GraphError, match=match):
        verify_graph(small_graph(**changes))


def test_graph_and_ops_are_frozen_and_hashable():
    g = small_graph(hints=(HintScope(id=0, slices=FrozenMap({"A": 2})),))
    assert hash(g) == hash(small_graph(hints=(HintScope(id=0, slices=FrozenMap({"A": 2})),)))
    for obj, field in [(g, "name"), (g.ops[0], "fn"), (A, "size"), (T, "dtype"), (g.hints[0], "id")]:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, field, None)
    with pytest.raises((AttributeError, TypeError)):
        g.extra = 1  # slots: no attributes stamped onto nodes


IR_MODULES = (graph_ir, looptree, plans, program)
IR_CLASSES = sorted(
    {obj for m in IR_MODULES for obj in vars(m).values()
     if isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__module__ == m.__name__},
    key=lambda c: c.__qualname__,
)


@pytest.mark.parametrize("cls", IR_CLASSES, ids=lambda c: c.__name__)
def test_every_ir_class_is_frozen_with_slots_and_no_mutable_fields(cls):
    assert cls.__dataclass_params__.frozen, f"{cls.__name__} is not frozen"
    assert "__slots__" in vars(cls), f"{cls.__name__} has no slots"
    hints = typing.get_type_hints(cls, vars(sys.modules[cls.__module__]))
    for f in dataclasses.fields(cls):
        text = str(hints.get(f.name, f.type))
        for bad in ("list[", "dict[", "set[", "List[", "Dict[", "Set[", "<class 'list'>", "<class 'dict'>"):
            assert bad not in text, f"{cls.__name__}.{f.name} is declared {text}"


def test_a_store_must_address_its_buffers_dims():
    # the buffer y of [M=8, N=64] is written through 64*M + N; with its dims swapped, or one
    # dropped, under the same store it would hold a reshaped (not transposed) result
    import fspyre
    from fspyre.ir.serialize import dumps, loads

    g = fspyre.GraphBuilder("store")
    m, n = g.dim("M", 8), g.dim("N", 64)
    x = g.input("x", (m, n), "float16")
    g.output("y", g.exp(x))
    graph = graph_ir.verify_graph(g.build())
    (y,) = [b for b in graph.buffers if b.name == graph.outputs[0].buffer]
    for dims, need in (((n, m), r"dim [MN]'s stride \d+"), ((m,), r"dim M's stride 1"),
                       ((n,), r"the stride of one of its dims \[1\]")):
        edited = dataclasses.replace(y, type=dataclasses.replace(y.type, dims=dims))
        bad = dataclasses.replace(graph, buffers=tuple(edited if b is y else b for b in graph.buffers))
        with pytest.raises(GraphError, match=rf"graph store: op buf0 stores into buf0 float16\[.*\] through index "
                                             rf"64\*M \+ N, which moves [MN] by \d+ elements where the buffer's dims "
                                             rf"need {need}"):
            graph_ir.verify_graph(bad)
        with pytest.raises(GraphError, match="stores into buf0"):
            loads(dumps(bad))
