"""Capture: torch programs become the graphs GraphBuilder would build, with names and hints.

Numbers are checked against eager here only where the capture itself decides them (renamed
operands, broadcasting); the gallery and the OpInfo coverage check numerics at large."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import fspyre
from fspyre.errors import FrontendError
from fspyre.frontend import capture, declare_tensor_dim, from_torch, name_tensor_dims, spyre_hint
from fspyre.frontend.annotations import node_hints
from fspyre.frontend.capture import _as_module, export
from fspyre.ir.builder import GraphBuilder
from fspyre.ir.graph import Pointwise, Reduction


def f16(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float16)


def f32(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def evaluate(cap, *args) -> list[np.ndarray]:
    out = fspyre.evaluate(cap.graph, cap.inputs(*args))
    return [out[n] for n in cap.output_names]


def dims_of(graph, op_index: int) -> list[str]:
    op = graph.ops[op_index]
    return [d.name for d in op.ranges]


# -- the seed's example: capture builds exactly what the builder builds ----------------------


def add_mul(a, b, c):
    with spyre_hint(slices={"A": 2}):
        with spyre_hint(slices={"B": 4}):
            y = a + b
            z = y * c
    return z


def test_add_mul_is_the_builder_graph() -> None:
    declare_tensor_dim("A", 8)
    declare_tensor_dim("B", 16)
    args = [name_tensor_dims(f16(8, 16, seed=i), ["A", "B"]) for i in range(3)]

    g = GraphBuilder("add_mul")
    A, B = g.dim("A", 8), g.dim("B", 16)
    a, b, c = (g.input(n, (A, B), "float16") for n in "abc")
    with g.hint(slices={"A": 2}):
        with g.hint(slices={"B": 4}):
            z = g.mul(g.add(a, b), c)
    g.output("out", z)

    assert from_torch(add_mul, args) == g.build()


def test_hints_survive_export_and_decomposition() -> None:
    """meta["custom"] is kept by torch.export and by the decomposition re-trace: every ATen
    node softmax and layer_norm decompose into carries its scope. If a torch upgrade drops
    it, this fails here rather than as an untiled program."""

    def f(x, w):
        with spyre_hint(slices={"R": 2}):
            return F.layer_norm(torch.softmax(x, -1), (16,), w)

    module, _ = _as_module(f, [1, 2])
    ep, graph = export(module, (f32(8, 16), f32(16)), "f")
    ops = [n for n in graph.nodes if n.op == "call_function"]
    assert len(ops) > 8
    assert all(len(node_hints(n.meta)) == 1 for n in ops)
    assert len({node_hints(n.meta)[0].id for n in ops}) == 1


def test_one_torch_scope_is_one_hint_scope() -> None:
    def f(x):
        with spyre_hint(slices={"x_0": 2}, work_div={"x_1": 4}):
            y = torch.softmax(x, -1)
        with spyre_hint(num_tiles_per_dim={"x_0": 4}):
            return y * 2

    graph = from_torch(f, [f32(8, 16)])
    assert [(h.id, dict(h.slices), dict(h.work_div)) for h in graph.hints] == [
        (0, {"x_0": 2}, {"x_1": 4}),
        (1, {"x_0": 4}, {}),
    ]
    assert [op.hints for op in graph.ops] == [(0,)] * (len(graph.ops) - 1) + [(1,)]


def test_nested_scopes_order_outermost_first() -> None:
    def f(x):
        with spyre_hint(slices={"x_0": 2}):
            y = x + 1
            with spyre_hint(slices={"x_1": 2}):
                z = y * 3
            return z - y

    graph = from_torch(f, [f32(4, 8)])
    assert [op.hints for op in graph.ops] == [(0,), (0, 1), (0,)]


def test_hint_aliases_conflict() -> None:
    with pytest.raises(FrontendError, match="aliases"):
        spyre_hint(slices={"A": 2}, num_tiles_per_dim={"A": 2})
    with pytest.raises(FrontendError, match="integer >= 1"):
        spyre_hint(slices={"A": 0})


# -- names -----------------------------------------------------------------------------------


def test_generated_names_are_stable_readable_identifiers() -> None:
    def f(x, y):
        return torch.softmax(x @ y, -1).sum(0)

    one = from_torch(f, [f32(4, 8), f32(8, 6)])
    two = from_torch(f, [f32(4, 8, seed=1), f32(8, 6, seed=1)])
    assert one == two
    names = {d.name for op in one.ops for d in op.ranges + op.reduction_ranges}
    assert names == {"x_0", "x_1", "y_1"}
    assert all(n.isidentifier() for n in names)


def test_pointwise_broadcast_lines_dims_up_by_position() -> None:
    def f(x, b, col):
        return x + b, x * col  # b: [8] is x's dim 1; col: [4, 1] broadcasts along it

    x, b, col = f32(4, 8), f32(8, seed=1), f32(4, 1, seed=2)
    cap = capture(f, [x, b, col])
    buffers = cap.graph.buffer_table()
    assert buffers["b"].type.names == ("x_1",)
    assert buffers["col"].type.shape == (4, 1) and buffers["col"].type.names[0] == "x_0"
    for got, want in zip(evaluate(cap, x, b, col), f(x, b, col)):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-6)


def test_outer_product_broadcasts_size_one_dims() -> None:
    def f(a, b):
        return a * b

    a, b = f32(4, 1), f32(1, 5, seed=1)
    cap = capture(f, [a, b])
    assert [d.size for d in cap.graph.ops[0].ranges] == [4, 5]
    np.testing.assert_allclose(evaluate(cap, a, b)[0], (a * b).numpy(), rtol=1e-6)


def test_reductions_drop_the_reduced_names() -> None:
    declare_tensor_dim("M", 4)
    x = name_tensor_dims(f32(4, 8, 2), ["M", "N", "K"])
    graph = from_torch(lambda x: x.sum(dim=(1, 2)), [x])
    (op,) = graph.ops
    assert isinstance(op, Reduction)
    assert [d.name for d in op.ranges] == ["M"] and [d.name for d in op.reduction_ranges] == ["N", "K"]


def test_matmul_keeps_batch_m_n_and_contracts_k() -> None:
    q = name_tensor_dims(f32(2, 4, 8), ["B", "M", "K"])
    k = name_tensor_dims(f32(2, 8, 6), ["B", "K", "N"])
    graph = from_torch(lambda q, k: q @ k, [q, k])
    (mm,) = [op for op in graph.ops if isinstance(op, Reduction)]
    assert [d.name for d in mm.ranges] == ["B", "M", "N"] and [d.name for d in mm.reduction_ranges] == ["K"]


def test_views_are_not_copies() -> None:
    def f(x, y):
        t = x.transpose(0, 1)  # [8, 4]
        u = t.unsqueeze(0).expand(3, 8, 4)  # [3, 8, 4]
        v = y.view(3, 2, 16).reshape(3, 32)  # contiguous reshapes
        return u.sum(1) + 1, v * 2

    x, y = f32(4, 8), f32(3, 32)
    cap = capture(f, [x, y])
    assert [op.fn for op in cap.graph.ops] == ["sum", "add", "mul"]
    for got, want in zip(evaluate(cap, x, y), f(x, y)):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6)  # summation order


def test_x_times_x_transposed_gets_two_dims() -> None:
    """Rows and columns of x @ x.T both come from x's first dim; the capture renames the
    second operand's so the product has two dims, not a diagonal."""
    x = f32(5, 3)
    cap = capture(lambda x: x @ x.T, [x])
    mm = next(op for op in cap.graph.ops if op.fn == "matmul")
    assert len({d.name for d in mm.ranges}) == 2
    np.testing.assert_allclose(evaluate(cap, x)[0], (x @ x.T).numpy(), rtol=1e-5)


def test_self_attention_from_one_input() -> None:
    class SelfAttention(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q, self.k, self.v = (torch.nn.Linear(8, 8) for _ in range(3))

        def forward(self, x):
            return torch.softmax(self.q(x) @ self.k(x).T, -1) @ self.v(x)

    torch.manual_seed(0)
    model, x = SelfAttention(), f32(6, 8)
    cap = capture(model, [x])
    with torch.no_grad():
        np.testing.assert_allclose(evaluate(cap, x)[0], model(x).numpy(), rtol=1e-5, atol=1e-6)


def test_user_names_are_kept_and_the_first_wins() -> None:
    """a[A, B] + b[C, B]: torch lines A and C up; A (first) names the result, and b is read
    through a renaming view, as in the anchor."""
    a = name_tensor_dims(f32(4, 8), ["A", "B"])
    b = name_tensor_dims(f32(4, 8, seed=1), ["C", "B"])
    cap = capture(lambda a, b: a + b, [a, b])
    assert cap.graph.buffer_table()["b"].type.names == ("C", "B")
    assert dims_of(cap.graph, -1) == ["A", "B"]
    np.testing.assert_allclose(evaluate(cap, a, b)[0], (a + b).numpy(), rtol=1e-6)


def test_same_name_different_sizes_names_both_tensors() -> None:
    a = name_tensor_dims(f32(4, 8), ["A", "B"])
    b = name_tensor_dims(f32(5, 8), ["A", "B"])
    with pytest.raises(FrontendError, match=r"dim 0 of input a has size 4 but dim 0 of input b has size 5"):
        from_torch(lambda a, b: a.sum(0) + b.sum(0), [a, b])


def test_declared_size_must_match() -> None:
    declare_tensor_dim("A", 16)
    with pytest.raises(FrontendError, match=r"declared with size 16"):
        name_tensor_dims(f32(4, 8), ["A", "B"])


@pytest.mark.parametrize(("names", "match"), [
    (["A"], "one name per dim"),
    (["A", "A"], "repeat a name"),
    (["A", "not a name"], "identifier"),
])
def test_name_tensor_dims_checks_its_names(names, match) -> None:
    with pytest.raises(FrontendError, match=match):
        name_tensor_dims(f32(4, 8), names)


def test_name_tensor_dims_inside_traced_code() -> None:
    def f(x):
        s = name_tensor_dims(x @ x.T, ["R", "C"])
        with spyre_hint(slices={"C": 2}):
            return torch.softmax(s, -1)

    x = f32(8, 4)
    cap = capture(f, [x])
    assert dims_of(cap.graph, -1) == ["R", "C"]
    assert dict(cap.graph.hints[0].slices) == {"C": 2}
    np.testing.assert_allclose(evaluate(cap, x)[0], f(x).numpy(), rtol=1e-5)


def test_parameters_are_named_inputs_with_values() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    name_tensor_dims(model[0].weight, ["H", "D"])
    x = f32(3, 8)
    cap = capture(model, [x])
    assert cap.graph.inputs == ("p0_weight", "p0_bias", "p2_weight", "p2_bias", "input")
    assert cap.graph.buffer_table()["p0_weight"].type.names == ("H", "D")
    np.testing.assert_array_equal(cap.params["p0_weight"], model[0].weight.detach().numpy())
    with torch.no_grad():
        np.testing.assert_allclose(evaluate(cap, x)[0], model(x).numpy(), rtol=1e-5, atol=1e-6)


def test_several_outputs_and_their_structure() -> None:
    def f(x):
        return {"mean": x.mean(-1), "parts": (x.amax(-1), x.var(-1))}

    x = f32(4, 8)
    cap = capture(f, [x])
    assert cap.output_names == ("out0", "out1", "out2")
    got = cap.unflatten(fspyre.evaluate(cap.graph, cap.inputs(x)))
    np.testing.assert_allclose(got["parts"][1], x.var(-1).numpy(), rtol=1e-5)


def test_bfloat16_inputs_travel_as_float32() -> None:
    x = torch.randn(4, 8, dtype=torch.bfloat16)
    cap = capture(lambda x: x * 2, [x])
    host = cap.inputs(x)["x"]
    assert host.dtype == np.float32 and cap.graph.buffer_table()["x"].type.dtype == "bfloat16"
    np.testing.assert_array_equal(evaluate(cap, x)[0], (x * 2).float().numpy())


# -- errors name the op, its shapes and what to change ---------------------------------------


def test_unsupported_op_names_op_shapes_line_and_supported_set() -> None:
    def f(x):
        return torch.atan(x) + 1

    with pytest.raises(FrontendError) as err:
        from_torch(f, [f32(4, 8)])
    msg = str(err.value)
    assert "aten.atan.default(float32[4, 8]) -> float32[4, 8]" in msg
    assert "test_capture.py" in msg and "torch.atan(x)" in msg
    assert "Supported:" in msg and "aten.exp.default" in msg


@pytest.mark.parametrize(("fn", "args", "match"), [
    (lambda x: x.to(torch.int16), [f32(4, 8)], r"int16 is not an fspyre dtype \(use int32\)"),
    (lambda x: x * 2, [torch.randn(3, dtype=torch.float64)], r"float64 is not an fspyre dtype \(use float32\)"),
    (lambda x: x * 2, [torch.randn(0, 3)], "zero-size dim"),
    (lambda x: x * 2 if x.sum() > 0 else x, [f32(3)], "data-dependent control flow"),
    (lambda x: x.add_(1), [f32(3)], "writes x in place"),
    (lambda x: x * 2, [3.0], "pass torch tensors"),
    (lambda x: x.cumprod(1), [f32(4, 8)], "aten.cumprod.default"),
])
def test_bad_programs_are_frontend_errors(fn, args, match) -> None:
    with pytest.raises(FrontendError, match=match):
        from_torch(fn, args)


def test_hint_on_an_unknown_dim_lists_the_dims() -> None:
    def f(x):
        with spyre_hint(slices={"Q": 2}):
            return x * 2

    with pytest.raises(FrontendError, match=r"unknown dim 'Q'; declared dims are \['x_0', 'x_1'\]"):
        from_torch(f, [f32(4, 8)])


def test_ops_record_pointwise_and_reduction_kinds() -> None:
    graph = from_torch(lambda x: torch.softmax(x, -1), [f16(4, 8)])
    kinds = [(type(op).__name__, op.fn) for op in graph.ops]
    assert kinds == [
        ("Pointwise", "cast"), ("Reduction", "amax"), ("Pointwise", "sub"), ("Pointwise", "exp"),
        ("Reduction", "sum"), ("Pointwise", "div"), ("Pointwise", "cast"),
    ]
    assert all(isinstance(op, (Pointwise, Reduction)) for op in graph.ops)
