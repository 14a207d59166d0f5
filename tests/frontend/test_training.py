"""Training through ``torch.compile(backend="fspyre")``: aot_autograd's forward and backward
graphs are both compiled by fspyre and run on the machine model; ``loss.backward()`` gives
every parameter and input the gradient eager torch gives.

The tolerance is the model zoo's (tests/models/test_zoo.py), derived rather than tuned: the
yardstick is float64 eager of the same weights and inputs, and fspyre's float32 error
against it must stay within twice torch's own float32 error. Both round once per op in
float32; they differ in the summation order of reductions and matmuls (and torch's fused
norm and softmax backward kernels against fspyre's decomposed ones), and two orders' errors
are of the same size. The loss weights each output by a seeded random cotangent: a plain
``sum`` of a normalised output has gradient 0 up to cancellation, which would measure noise."""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch

from fspyre.errors import FspyreWarning
from fspyre.frontend import name_tensor_dims, spyre_hint
from fspyre.frontend.dynamo import PartitionReport

FACTOR = 2.0


class MLP(torch.nn.Module):
    """Linear, ReLU (threshold_backward), Linear with a bias broadcast over [B, S] (its
    gradient sums to the bias's size), a residual and a LayerNorm."""

    def __init__(self, d: int = 32, inner: int = 64) -> None:
        super().__init__()
        self.up, self.down, self.norm = torch.nn.Linear(d, inner), torch.nn.Linear(inner, d), torch.nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.down(torch.relu(self.up(x))))


class LlamaMLP(torch.nn.Module):
    def __init__(self, d: int = 32, inner: int = 64) -> None:
        super().__init__()
        shapes = ((d, inner), (d, inner), (inner, d))
        self.gate, self.up, self.down = (torch.nn.Linear(a, b, bias=False) for a, b in shapes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))


class GeluMLP(torch.nn.Module):
    """Exact GELU: torch's decomposition of its backward needs erf, fspyre's does not."""

    def __init__(self, d: int = 32, inner: int = 64) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(d, inner), torch.nn.Linear(inner, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.gelu(self.up(x)))


class Embedded(torch.nn.Module):
    """A token embedding of float positions' buckets, then a Linear: the embedding's
    backward is a scatter-add into its table."""

    def __init__(self) -> None:
        super().__init__()
        self.table, self.proj = torch.nn.Embedding(16, 32), torch.nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids = (x.sum(-1).abs() * 4).clamp(max=15).to(torch.int64)
        return self.proj(self.table(ids) + x)


def llama_decoder_layer() -> torch.nn.Module:
    """transformers' LlamaDecoderLayer (rotary, grouped-query eager attention, causal mask),
    as the model zoo builds it, in training mode (its dropout is 0)."""
    pytest.importorskip("transformers")
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1] / "models"))
    from fspyre.testing.zoo import CASES

    return CASES["llama_decoder_layer"].build()


def gradients(model: torch.nn.Module, x: torch.Tensor, **options):
    """(reports, torch's error, fspyre's error) of d loss / d (parameters, x), the errors the
    largest against float64 eager over every gradient."""
    torch.manual_seed(0)
    cot = torch.randn(model(x).shape)
    reports: list[PartitionReport] = []
    runs = {}
    for kind in ("float64", "eager", "fspyre"):
        m = copy.deepcopy(model).train()
        xi = x.clone().requires_grad_(True)
        if kind == "float64":
            m, xi, c = m.double(), x.double().requires_grad_(True), cot.double()
        else:
            c = cot
        if kind == "fspyre":
            m = torch.compile(m, backend="fspyre", options={"cores": 8, "on_report": reports.append, **options})
        out = m(xi)
        (out * c).sum().backward()
        params = (m._orig_mod if kind == "fspyre" else m).parameters()
        runs[kind] = [out.detach().double()] + [t.grad.double() for t in (*params, xi)]
    err = {k: max(float((a - e).abs().max()) for a, e in zip(runs[k], runs["float64"])) for k in ("eager", "fspyre")}
    return reports, err["eager"], err["fspyre"]


CASES = {
    "mlp_relu_layernorm": (MLP, (2, 8, 32)),
    "llama_mlp": (LlamaMLP, (2, 8, 32)),
    "layernorm": (lambda: torch.nn.LayerNorm(32), (4, 32)),
    "gelu_mlp": (GeluMLP, (2, 8, 32)),
    "llama_decoder_layer": (llama_decoder_layer, (2, 16, 64)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_backward_runs_on_fspyre_and_gradients_match_eager(name) -> None:
    make, shape = CASES[name]
    torch.manual_seed(0)
    model = make()
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings():
        warnings.simplefilter("error", FspyreWarning)  # anything left in eager would warn
        reports, theirs, ours = gradients(model, x)
    kinds = sorted(r.name for r in reports)
    assert kinds == ["torch_compiled_backward", "torch_compiled_forward"], kinds
    assert all(not r.eager and sum(r.on_fspyre) > 0 for r in reports), [r.summary() for r in reports]
    print(f"{name}: torch {theirs:.3g}, fspyre {ours:.3g} ({ours / theirs:.2f}x)")
    assert np.isfinite(ours) and ours <= FACTOR * theirs, f"fspyre's error {ours:.3g} > {FACTOR} x torch's {theirs:.3g}"


def test_a_backward_op_fspyre_cannot_lower_runs_in_eager_and_says_so() -> None:
    """An embedding's backward accumulates rows into its table (index_put with accumulate),
    which fspyre has no op for: the backward graph is split around it, the rest runs on
    fspyre, and the gradients are still eager's."""
    x = torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(1))
    with pytest.warns(FspyreWarning, match=r"torch_compiled_backward: .* in eager: aten.index_put.default"):
        reports, theirs, ours = gradients(Embedded(), x, tiling="none")
    (bw,) = [r for r in reports if r.name == "torch_compiled_backward"]
    assert bw.on_fspyre and {f.op for f in bw.eager} >= {"aten.index_put.default"}
    assert ours <= FACTOR * theirs


def test_a_slice_backward_is_a_slice_scatter_on_fspyre() -> None:
    """The gradient of a slice is a slice_scatter into zeros (rotary's rotate_half makes
    two): a cat of the zero parts and the incoming gradient, exact."""

    def f(x):
        return torch.cat((-x[..., 8:], x[..., :8]), -1) * x

    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
    compiled = torch.compile(f, backend="fspyre", options={"cores": 4, "tiling": "none"})
    xi, xe = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    cot = torch.randn(4, 16, generator=torch.Generator().manual_seed(2))
    with warnings.catch_warnings():
        warnings.simplefilter("error", FspyreWarning)
        (compiled(xi) * cot).sum().backward()
    (f(xe) * cot).sum().backward()
    torch.testing.assert_close(xi.grad, xe.grad, rtol=0, atol=0)


def test_hints_reach_the_forward_graph_of_a_training_step() -> None:
    """A spyre_hint scope is node metadata that aot_autograd keeps on the forward graph, and
    the dim names of the tensors a call passes name its dims."""

    def f(x, w):
        with spyre_hint(slices={"R": 2}):
            return torch.relu(x @ w)

    graphs = []
    compiled = torch.compile(f, backend="fspyre", options={"cores": 4, "tiling": "none", "on_graph": graphs.append})
    x = name_tensor_dims(torch.randn(8, 16), ["R", "K"])
    w = torch.randn(16, 8, requires_grad=True)
    compiled(x, w).sum().backward()
    forward = graphs[0]
    assert [dict(h.slices) for h in forward.hints] == [{"R": 2}]
