"""GraphBuilder: what it builds (broadcasting by name, views as index expressions, output
copies) and the errors it gives for bad input, each naming the culprit."""

from __future__ import annotations

import pytest
import sympy

import fspyre
from fspyre.errors import FspyreError, GraphError, HintError, MachineError
from fspyre.ir.builder import broadcast_dims
from fspyre.ir.graph import Dim, Load, Pointwise, Reduction, Scalar, TensorType, sym
from fspyre.machine.spyre import Machine, spyre


def builder_with(*dims: tuple[str, int]) -> tuple[fspyre.GraphBuilder, list[Dim]]:
    g = fspyre.GraphBuilder("t")
    return g, [g.dim(n, s) for n, s in dims]


# -- what it builds ----------------------------------------------------------------------------


def test_broadcast_lines_dims_up_by_name_not_position():
    g, (A, B) = builder_with(("A", 4), ("B", 8))
    x = g.input("x", (A, B), "float32")
    bias = g.input("bias", (B,), "float32")
    y = g.add(bias, x)  # the operand with most dims gives the order
    assert y.type.names == ("A", "B")
    g.output("y", y)
    op = g.build().ops[0]
    assert op.operands == (Load(buffer="bias", index=sym("B")), Load(buffer="x", index=8 * sym("A") + sym("B")))


def test_size_one_dim_broadcasts_and_its_variable_drops_out():
    g, (A, B) = builder_with(("A", 4), ("B", 8))
    x = g.input("x", (A, B), "float16")
    col = g.input("col", (A, Dim("B", 1)), "float16")
    y = g.mul(x, col)
    assert y.shape == (4, 8)
    g.output("y", y)
    op = g.build().ops[0]
    assert op.operands[1] == Load(buffer="col", index=sym("A"))


def test_extra_dims_of_a_shorter_operand_follow_the_longest():
    g, (A, B, C) = builder_with(("A", 2), ("B", 3), ("C", 5))
    y = g.add(g.input("x", (A, B), "float32"), g.input("z", (C,), "float32"))
    assert y.type.names == ("A", "B", "C")


def test_scalars_and_dtype_promotion():
    g, (A,) = builder_with(("A", 4))
    i = g.input("i", (A,), "int32")
    h = g.input("h", (A,), "float16")
    b = g.input("b", (A,), "bool")
    assert g.add(i, 1).dtype == "int32"
    assert g.add(i, 0.5).dtype == "float32"  # an int tensor with a float scalar
    assert g.add(h, i).dtype == "float16"
    assert g.add(h, g.input("bf", (A,), "bfloat16")).dtype == "float32"
    assert g.add(b, 1).dtype == "int32"
    assert g.div(i, 2).dtype == "float32"
    assert g.exp(i).dtype == "float32"
    assert g.gt(h, 0).dtype == "bool"
    assert g.where(b, h, 0.0).dtype == "float16"
    y = g.sub(2.0, h)
    assert y.dtype == "float16"
    g.output("y", y)
    assert g.build().ops[-1].operands == (Scalar(value=2.0), Load(buffer="h", index=sym("A")))


def test_permute_is_a_view_with_the_same_index():
    g, (A, B) = builder_with(("A", 4), ("B", 8))
    x = g.input("x", (A, B), "float32")
    xt = g.permute(x, ("B", "A"))
    assert xt.type.names == ("B", "A") and xt.buffer == "x" and xt.index == x.index
    assert g.permute(x, (1, 0)) == xt
    g.output("y", g.neg(xt))
    (op,) = g.build().ops  # the view itself emitted nothing
    assert op.ranges == (B, A) and op.operands == (Load(buffer="x", index=8 * sym("A") + sym("B")),)


def test_unsqueeze_and_expand_are_views():
    g, (A, B) = builder_with(("A", 4), ("B", 8))
    v = g.input("v", (B,), "float32")
    u = g.unsqueeze(v, 0, "A")
    assert u.type.dims == (Dim("A", 1), B)
    e = g.expand(u, ("A", "B"))
    assert e.shape == (4, 8) and e.buffer == "v" and e.index == sym("B")
    g.output("y", g.neg(e))
    (op,) = g.build().ops
    assert op.ranges == (A, B) and op.operands == (Load(buffer="v", index=sym("B")),)


def test_contiguous_reshape_is_a_view_and_a_permuted_one_copies_first():
    # A and B whole sticks of 32 float32 elements: either can be the regrouped stick dim
    g, (A, B) = builder_with(("A", 32), ("B", 64))
    F = g.dim("F", 2048)
    x = g.input("x", (A, B), "float32")
    r = g.reshape(x, (F,))
    assert r.buffer == "x" and r.index == sym("F")
    rt = g.reshape(g.permute(x, ("B", "A")), (F,))
    g.output("r", g.neg(r))
    g.output("rt", g.neg(rt))
    copy, neg_r, neg_rt = g.build().ops
    assert copy.fn == "copy" and copy.ranges == (B, A) and rt.buffer == copy.store.buffer
    assert neg_r.operands == (Load(buffer="x", index=sym("F")),)
    assert neg_rt.operands == (Load(buffer=copy.store.buffer, index=sym("F")),)


def test_reshape_across_sticks_is_a_view_the_compiler_verifies_or_refuses():
    g, (A, B) = builder_with(("A", 4), ("B", 96))
    x = g.input("x", (A, B), "float16")
    r = g.reshape(x, (g.dim("P", 8), g.dim("Q", 48)))
    assert r.buffer == "x"
    g.output("y", g.neg(r))
    graph = g.build()
    try:
        report = fspyre.check(graph, tiling="none")
    except FspyreError as err:  # refused at compile time, with the reason
        assert "device_coordinates" in str(err) or "coordinate" in str(err)
        return
    assert report.equal


def test_keepdim_reduction_keeps_size_one_dims():
    g, (A, B) = builder_with(("A", 4), ("B", 8))
    x = g.input("x", (A, B), "float16")
    s = g.sum(x, ["B"], keepdim=True)
    assert s.type.dims == (A, Dim("B", 1))
    assert g.sum(x, ["B"]).type.dims == (A,)
    m = g.mean(g.input("i", (A, B), "int32"), ["A", "B"])
    assert m.type.dims == () and m.dtype == "float32"
    assert g.sum(g.input("b", (A,), "bool"), ["A"]).dtype == "int32"
    g.output("s", s)
    op = g.build().ops[0]
    assert isinstance(op, Reduction) and op.ranges == (A,) and op.reduction_ranges == (B,)
    assert op.store.index == sym("A")


def test_matmul_batch_dims_come_first():
    g, (S, M, K, N) = builder_with(("S", 2), ("M", 3), ("K", 5), ("N", 7))
    a = g.input("a", (S, M, K), "float16")
    b = g.input("b", (S, K, N), "float16")
    y = g.matmul(a, b, contract="K")
    assert y.type.dims == (S, M, N)
    assert g.matmul(a, g.input("w", (K, N), "float16")).type.names == ("S", "M", "N")  # default: a's last dim
    g.output("y", y)
    op = g.build().ops[0]
    assert op.fn == "matmul" and op.ranges == (S, M, N) and op.reduction_ranges == (K,)
    s, m, k, n = map(sym, "SMKN")
    assert op.operands == (Load(buffer="a", index=15 * s + 5 * m + k), Load(buffer="b", index=35 * s + 7 * k + n))


def test_outputs_are_whole_buffers_of_their_own():
    g, (A, B) = builder_with(("A", 4), ("B", 8))
    x = g.input("x", (A, B), "float32")
    g.output("same", x)  # an input: copied
    g.output("t", g.permute(x, ("B", "A")))  # a view: copied
    y = g.neg(x)
    g.output("y", y)  # its own buffer: not copied
    graph = g.build()
    assert [op.fn for op in graph.ops] == ["copy", "copy", "neg"]
    assert graph.outputs[2].buffer == y.buffer


def test_hint_scopes_are_recorded_on_ops():
    g, (A, B) = builder_with(("A", 4), ("B", 8))
    x = g.input("x", (A, B), "float32")
    with g.hint(slices={"A": 2}) as outer:
        with g.hint(work_div={"B": 2}) as inner:
            y = g.neg(x)
        z = g.abs(y)
    g.output("z", z)
    graph = g.build()
    assert graph.hints == (outer, inner) and (outer.id, inner.id) == (0, 1)
    assert graph.ops[0].hints == (0, 1) and graph.ops[1].hints == (0,)


def test_built_graph_is_frozen_and_hashable():
    g, (A,) = builder_with(("A", 4))
    g.output("y", g.neg(g.input("x", (A,), "float32")))
    graph = g.build()
    assert hash(graph) == hash(g.build()) and graph == g.build()
    with pytest.raises(AttributeError):
        graph.name = "other"  # type: ignore[misc]


# -- errors ------------------------------------------------------------------------------------


def raises(cls, *words):
    """pytest.raises that also checks the message names each of ``words``."""

    class _Ctx:
        def __enter__(self):
            self.ctx = pytest.raises(cls)
            self.info = self.ctx.__enter__()
            return self.info

        def __exit__(self, *exc):
            out = self.ctx.__exit__(*exc)
            msg = str(self.info.value)
            for w in words:
                assert str(w) in msg, f"message {msg!r} does not name {w!r}"
            assert issubclass(self.info.type, FspyreError)
            assert "\n" not in msg, f"a report is one line: {msg!r}"
            return out

    return _Ctx()


@pytest.mark.parametrize("dtype", ["float64", "int8", "fp16", "Float16", ""])
def test_unknown_dtype_is_named(dtype):
    g, (A,) = builder_with(("A", 4))
    with raises(GraphError, repr(dtype), "input x", "float16"):
        g.input("x", (A,), dtype)
    x = g.input("y", (A,), "float32")
    with raises(GraphError, repr(dtype), "cast"):
        g.cast(x, dtype)
    with raises(GraphError, repr(dtype), "constant"):
        g.constant(1.0, dtype, ("A",))


@pytest.mark.parametrize("size", [0, -3, 2.5, True, "4"])
def test_dim_size_must_be_a_positive_integer(size):
    g = fspyre.GraphBuilder("t")
    with raises(GraphError, "'D'", repr(size)):
        g.dim("D", size)


@pytest.mark.parametrize("name", ["1x", "a-b", "", "two words"])
def test_dim_and_graph_names_must_be_identifiers(name):
    with raises(GraphError, repr(name)):
        Dim(name, 3)
    with raises(GraphError, repr(name)):
        fspyre.GraphBuilder(name)


def test_dim_declared_twice_with_different_sizes():
    g, (A,) = builder_with(("A", 4))
    with raises(GraphError, "A", 4, 5):
        g.dim("A", 5)
    with raises(GraphError, "A", 4, 6):
        g.input("x", (Dim("A", 6),), "float32")
    assert g.dim("A", 4) == A  # the same declaration again is fine


def test_undeclared_dim_name_in_an_input():
    g, _ = builder_with(("A", 4))
    with raises(GraphError, "'Z'", "input x", "g.dim"):
        g.input("x", ("A", "Z"), "float32")


def test_shape_mismatch_between_operands_names_the_dim_and_sizes():
    with raises(GraphError, "add", "dim B", 8, 5):
        broadcast_dims(
            TensorType(dims=(Dim("A", 4), Dim("B", 8)), dtype="float32"),
            TensorType(dims=(Dim("B", 5),), dtype="float32"),
            where="add",
        )


def test_repeated_dim_name_in_one_tensor():
    g, (A,) = builder_with(("A", 4))
    with raises(GraphError, "['A', 'A']"):
        g.input("x", (A, A), "float32")


def test_reduction_over_a_dim_the_operand_lacks():
    g, (A, B) = builder_with(("A", 4), ("B", 8))
    x = g.input("x", (A,), "float32")
    with raises(GraphError, "sum", "'B'", "['A']"):
        g.sum(x, ["B"])
    with raises(GraphError, "amax", "at least one dim"):
        g.amax(x, [])


def test_matmul_errors_name_the_dims():
    g, (M, K, N, L) = builder_with(("M", 2), ("K", 3), ("N", 4), ("L", 5))
    a = g.input("a", (M, K), "float32")
    with raises(GraphError, "matmul", "'K'", "['N', 'L']"):
        g.matmul(a, g.input("b", (N, L), "float32"))
    with raises(GraphError, "matmul", "no dims"):
        g.matmul(g.input("v", (K,), "float32"), g.input("w", (K,), "float32"))
    with raises(GraphError, "batch dim M", 2, 1):
        g.matmul(a, g.input("c", (Dim("M", 1), K, N), "float32"), contract="K")


def test_view_errors():
    g, (A, B) = builder_with(("A", 4), ("B", 8))
    C = g.dim("C", 3)
    x = g.input("x", (A, B), "float32")
    with raises(GraphError, "permute", "['A', 'A']"):
        g.permute(x, ("A", "A"))
    with raises(GraphError, "reshape", 32, "[3]"):
        g.reshape(x, (C,))
    with raises(GraphError, "expand", "['A']", "drop ['C']"):
        g.expand(g.input("y", (C,), "float32"), ("A",))


def test_other_builder_errors():
    g, (A,) = builder_with(("A", 4))
    x = g.input("x", (A,), "float32")
    with raises(GraphError, "input x", "already used"):
        g.input("x", (A,), "float32")
    with raises(GraphError, "'like'", "eq"):
        g.compare("like", x, x)
    g.output("y", x)
    with raises(GraphError, "output y", "already used"):
        g.output("y", x)
    with raises(GraphError, "graph e", "no outputs"):
        fspyre.GraphBuilder("e").build()


def test_unknown_dim_in_a_hint():
    g, (A, B) = builder_with(("A", 4), ("B", 8))
    with raises(HintError, "slices", "'Z'", "['A', 'B']"):
        with g.hint(slices={"Z": 2}):
            pass
    with raises(HintError, "work_div", "'Q'"):
        with g.hint(work_div={"Q": 2}):
            pass


@pytest.mark.parametrize("count", [0, -1, 1.5, True])
def test_hint_counts_must_be_positive_integers(count):
    g, (A,) = builder_with(("A", 4))
    with raises(HintError, "'A'", repr(count)):
        with g.hint(slices={"A": count}):
            pass


@pytest.mark.parametrize("cores", [0, -1, 33, 64, True, 2.0])
def test_cores_outside_1_to_32(cores):
    with raises(MachineError, f"cores={cores!r}", "1..32"):
        spyre(cores=cores)
    with raises(MachineError, f"cores={cores!r}"):
        Machine(cores=cores)


def test_machine_accepts_the_whole_core_range():
    assert [spyre(cores=c).cores for c in (1, 17, 32)] == [1, 17, 32]


def test_index_expressions_are_sympy_with_nonnegative_integer_symbols():
    g, (A, B) = builder_with(("A", 4), ("B", 8))
    x = g.input("x", (A, B), "float32")
    assert x.index == 8 * sym("A") + sym("B")
    s = sym("A")
    assert s.is_integer and s.is_nonnegative and isinstance(s, sympy.Symbol)
    g.output("y", g.neg(x))
    assert isinstance(g.build().ops[0], Pointwise)
