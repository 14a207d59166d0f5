"""torch.compile(backend="fspyre"): registration, the entry point, options and refusals;
fallback to eager around what fspyre cannot lower, specialisation per input shape, hint scopes
without recompiles, and torch.nn attention layers. (The gallery test runs every example
through it.)"""

from __future__ import annotations

import warnings
from importlib.metadata import entry_points

import pytest
import torch

import fspyre
from fspyre.errors import FrontendError, FspyreError, FspyreWarning
from fspyre.frontend import explain, name_tensor_dims, spyre_hint
from fspyre.frontend.coverage import FP32_TOL
from fspyre.frontend.dynamo import BACKEND_NAME, PartitionReport, fspyre_backend, register_backend


def test_register_backend_is_idempotent() -> None:
    register_backend()
    register_backend()
    assert BACKEND_NAME in torch._dynamo.list_backends()
    from torch._dynamo.backends.registry import lookup_backend

    assert lookup_backend("fspyre") is fspyre_backend


def test_entry_point_names_the_backend() -> None:
    (ep,) = [e for e in entry_points(group="torch_dynamo_backends") if e.name == "fspyre"]
    assert ep.value == "fspyre.frontend.dynamo:fspyre_backend"
    assert ep.load() is fspyre_backend


def test_compiled_function_returns_torch_tensors_and_keeps_hints() -> None:
    register_backend()

    def f(x, y):
        with spyre_hint(slices={"R": 2}):
            return torch.softmax(x @ y, -1), x.sum(-1)

    x = name_tensor_dims(torch.randn(8, 16), ["R", "K"])
    y = torch.randn(16, 4)
    graphs = []
    compiled = torch.compile(f, backend="fspyre", options={"tiling": "none", "cores": 4, "on_graph": graphs.append})
    with torch.no_grad():
        got = compiled(x, y)
    want = f(x, y)
    assert isinstance(got, tuple) and all(isinstance(t, torch.Tensor) for t in got)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
    (graph,) = graphs
    assert [dict(h.slices) for h in graph.hints] == [{"R": 2}]


def test_unknown_option_is_refused() -> None:
    compiled = torch.compile(lambda x: x * 2, backend=fspyre_backend, options={"tilling": "none"})
    with pytest.raises(Exception, match=r"unknown options \['tilling'\]"):
        compiled(torch.randn(4))


def test_a_graph_compiled_for_inference_refuses_a_call_that_needs_gradients() -> None:
    """Dynamo guards on grad mode, so torch.compile recompiles for training (test_training);
    the backend called by hand on inputs that need no gradients makes an inference graph."""
    lin = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4)
    gm = torch.fx.symbolic_trace(lambda x, w: x @ w)
    with torch.no_grad():
        run = fspyre_backend(gm, [x, lin.weight.detach()], options={"tiling": "none"})
    with pytest.raises(FrontendError, match="compiled for inference .* this call needs gradients"):
        run(x, lin.weight)


# Each order of first use, in a fresh process: torch's entry-point loading imports fspyre,
# and fspyre's import registers the backend when torch is loaded; the two must not collide.
_FRESH_ORDERS = {
    "torch_only_entry_point": "import torch\n",
    "torch_then_fspyre": "import torch\nimport fspyre\n",
    "fspyre_then_torch": "import fspyre\nimport torch\n",
}
_FRESH_CALL = """
def f(x):
    return x * 2 + 1

compiled = torch.compile(f, backend="fspyre", options={"tiling": "none", "cores": 1})
with torch.no_grad():
    got = compiled(torch.arange(4, dtype=torch.float32))
assert got.tolist() == [1.0, 3.0, 5.0, 7.0], got
import fspyre
print(fspyre.__file__)
"""


@pytest.mark.parametrize("order", sorted(_FRESH_ORDERS))
def test_backend_name_works_in_a_fresh_process_in_every_import_order(order: str) -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, "-c", _FRESH_ORDERS[order] + _FRESH_CALL], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    # The fspyre under test, not another installed copy, answered the call.
    assert Path(done.stdout.strip().splitlines()[-1]).resolve().is_relative_to(root)


# -- partitioning, specialisation, hint scopes, nn modules ----------------------------------------
# Tolerance: both sides compute in float32 and differ only in the order of reduction and matmul
# sums (fspyre's tiles and cores), so torch.testing.assert_close's float32 default (FP32_TOL,
# the coverage table's) applies unchanged.


def compiled(fn, **options):
    """``fn`` under torch.compile(backend="fspyre"), and the list its reports and the list its
    Dynamo graphs are appended to."""
    reports: list[PartitionReport] = []
    graphs: list[object] = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return fspyre_backend(gm, example_inputs,
                              options={"tiling": "none", "cores": 4, "on_report": reports.append, **options})

    torch._dynamo.reset()
    return torch.compile(fn, backend=backend), reports, graphs


def assert_eager(got, want) -> None:
    rtol, atol = FP32_TOL
    def flat(x):
        return tuple(x) if isinstance(x, (tuple, list)) else (x,)

    for g, w in zip(flat(got), flat(want), strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=rtol, atol=atol)


def test_an_unsupported_op_falls_back_to_eager_between_two_fspyre_subgraphs() -> None:
    def f(x, w):
        y = torch.relu(x @ w)
        return torch.softmax(torch.cumprod(y, -1), -1) * 2

    x, w = torch.randn(4, 8), torch.randn(8, 16)
    fn, reports, _ = compiled(f)
    with torch.no_grad(), pytest.warns(FspyreWarning, match=r"1 in eager: aten.cumprod.default \(no fspyre lowering\)"):
        got = fn(x, w)
    assert_eager(got, f(x, w))
    (report,) = reports
    assert len(report.on_fspyre) == 2 and [e.op for e in report.eager] == ["aten.cumprod.default"]
    assert report.summary().count("\n") == 0


def test_a_float64_result_stays_in_eager_and_says_why() -> None:
    def f(x):
        return (x * 4).to(torch.float64) + 1, x.exp()

    x = torch.randn(4, 8)
    fn, reports, _ = compiled(f)
    with torch.no_grad(), pytest.warns(FspyreWarning, match="dtype float64"):
        got = fn(x)
    assert_eager(got, f(x))
    assert {e.reason for e in reports[0].eager} == {"dtype float64"}


def test_a_graph_fully_on_fspyre_does_not_warn() -> None:
    fn, reports, _ = compiled(lambda x: torch.tanh(x) + 1)
    x = torch.randn(4, 8)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", FspyreWarning)
        assert_eager(fn(x), torch.tanh(x) + 1)
    assert reports[0].summary().endswith("2 of 2 ops on fspyre in 1 subgraph; none in eager")


def test_new_shapes_specialise_through_the_cache_not_dynamo() -> None:
    lin = torch.nn.Linear(8, 4).eval()
    fn, reports, graphs = compiled(lin)  # dynamic=None: Dynamo's default
    with torch.no_grad():
        for rows in (2, 3, 5, 7, 3):
            x = torch.randn(rows, 8)
            assert_eager(fn(x), lin(x))
    # Dynamo: a static graph, then one with symbolic sizes at the second shape; fspyre: one
    # specialisation per distinct shape, the repeated shape from the cache.
    assert len(graphs) == 2
    rows = [next(s[0] for s in r.shapes if isinstance(s, tuple) and s != (4, 8) and len(s) == 2) for r in reports]
    assert rows == [2, 3, 5, 7]


def test_hint_scopes_do_not_make_dynamo_recompile() -> None:
    def f(x):
        with spyre_hint(slices={"R": 2}):
            return torch.softmax(x, -1) * 3

    x = name_tensor_dims(torch.randn(8, 16), ["R", "C"])
    seen = []
    fn, _, graphs = compiled(f, on_graph=seen.append)
    with torch.no_grad():
        for _ in range(10):
            assert_eager(fn(x), f(x))
    assert len(graphs) == 1 and len(seen) == 1
    assert [dict(h.slices) for h in seen[0].hints] == [{"R": 2}]


@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_encoder_layer_fast_path(norm_first: bool) -> None:
    """In eval mode under no_grad torch runs the layer as one fused op; fspyre decomposes it
    into what the layer's slow path computes (and eager, the reference here, runs the fused op)."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True, norm_first=norm_first).eval()
    x = torch.randn(2, 4, 16)
    causal = torch.nn.Transformer.generate_square_subsequent_mask(4)
    fn, reports, _ = compiled(layer)
    with torch.no_grad():
        assert_eager(fn(x), layer(x))
        assert_eager(fn(x, src_mask=causal), layer(x, src_mask=causal))
    assert all(not r.eager for r in reports)
    with torch.no_grad():
        got = fspyre.evaluate(*_captured(layer, x))
    torch.testing.assert_close(torch.from_numpy(got["out"]), layer(x).detach(), rtol=FP32_TOL[0], atol=FP32_TOL[1])


def test_multihead_attention() -> None:
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(16, 2, batch_first=True).eval()
    x = torch.randn(2, 4, 16)
    fn, reports, _ = compiled(mha)
    with torch.no_grad():
        assert_eager(fn(x, x, x), mha(x, x, x))
    assert all(not r.eager for r in reports)


def test_explain_prints_one_line_per_graph(capsys) -> None:
    def f(x):
        return torch.cumprod(x.exp(), 0).sin()

    (report,) = explain(f, (torch.randn(4, 8),))
    out = capsys.readouterr().out.splitlines()
    assert out == [report.summary()]
    assert "2 of 3 ops on fspyre in 2 subgraphs; 1 in eager: aten.cumprod.default (no fspyre lowering)" in out[0]


def _captured(module, *args):
    from fspyre.frontend import capture

    cap = capture(module, args)
    return cap.graph, cap.inputs(*args)


def test_int64_ids_and_positions_round_trip_as_int64() -> None:
    def f(ids, x):
        return ids + torch.arange(ids.shape[-1]), x + torch.arange(x.shape[-1]).float()

    ids, x = torch.randint(0, 1000, (2, 6)), torch.randn(2, 6)
    fn, reports, _ = compiled(f)
    with torch.no_grad():
        got = fn(ids, x)
    assert got[0].dtype == torch.int64 and torch.equal(got[0], f(ids, x)[0])
    assert_eager(got, f(ids, x))
    assert not reports[0].eager
    big = ids.clone()
    big[0, 0] = -(2**33)
    # fspyre's int32 cannot hold it: the subgraph runs in eager for this call (never a wrong
    # value, never a failed call), and the warning says why
    with torch.no_grad(), pytest.warns(FspyreWarning, match=r"ran in eager: .*value -8589934592 does not fit int32"):
        got = fn(big, x)
    assert torch.equal(got[0], f(big, x)[0])


def test_tiny_lm_compiles_whole_for_each_sequence_length() -> None:
    from tests.frontend.test_model_ops import TinyLM

    model = TinyLM().eval()
    fn, reports, _ = compiled(model)
    with torch.no_grad():
        for seq in (8, 5):
            ids = torch.randint(0, 48, (2, seq), generator=torch.Generator().manual_seed(seq))
            assert_eager(fn(ids), model(ids))
    assert [len(r.on_fspyre) for r in reports] == [1, 1] and not any(r.eager for r in reports)


def test_explain_numbers_the_graphs_of_a_graph_break(capsys) -> None:
    def f(x):
        y = torch.tanh(x) * 2
        torch._dynamo.graph_break()
        return torch.cumprod(y, 0).exp()

    reports = explain(f, (torch.randn(4, 8),))
    assert capsys.readouterr().out.splitlines() == [f"graph {i}: {r.summary()}" for i, r in enumerate(reports)]
    assert len(reports) == 2 and not reports[0].eager and [e.op for e in reports[1].eager] == ["aten.cumprod.default"]


def test_llama_decoder_layer_compiles_whole() -> None:
    from tests.frontend.test_model_ops import LlamaDecoderLayer

    torch.manual_seed(0)
    layer = LlamaDecoderLayer().eval()
    x = name_tensor_dims(torch.randn(2, 8, 32), ["B", "S", "D"])
    seen = []
    fn, reports, _ = compiled(layer, on_graph=seen.append)
    with torch.no_grad():
        assert_eager(fn(x), layer(x))
    (report,) = reports
    assert len(report.on_fspyre) == 1 and not report.eager
    assert [dict(h.slices) for h in seen[0].hints] == [{"S": 4}]


def test_a_hint_on_an_unknown_dim_is_raised_not_run_in_eager() -> None:
    from tests.frontend.test_model_ops import LlamaMLP

    fn, _, _ = compiled(LlamaMLP().eval())
    with torch.no_grad(), pytest.raises(Exception, match=r"hint slices=\{'S': 4\}: unknown dim 'S'"):
        fn(torch.randn(2, 8, 32))


# -- dynamic=True: one symbolic program (docs/tiling.md, "Symbolic sizes") ------------------------
def _dynamic(model, **options):
    """``model`` under torch.compile(dynamic=True) with fspyre, and the fspyre graphs compiled."""
    seen: list[object] = []
    torch._dynamo.reset()
    fn = torch.compile(model, backend="fspyre", dynamic=True,
                       options={"cores": 8, "on_graph": seen.append, **options})
    return fn, seen


def test_dynamic_llama_mlp_compiles_its_first_shape_then_once_for_every_length() -> None:
    """dynamic=True makes B, S and D symbolic; the first call is compiled for its shape, the
    second names S as the size that moves: the S hint of the MLP (a fixed count of 4) becomes
    the count form of a symbolic S. on_graph is called before every fspyre compile."""
    from tests.frontend.test_model_ops import LlamaMLP

    torch.manual_seed(0)
    model = LlamaMLP(hidden=64, inner=128).eval()
    fn, seen = _dynamic(model)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore", FspyreWarning)
        for length in (256, 512, 768):
            x = name_tensor_dims(torch.randn(2, length, 64), ["B", "S", "D"])
            assert_eager(fn(x), model(x))
    assert [g.symbolic for g in seen] == [False, True]
    assert [dict(h.slices) for h in seen[1].hints] == [{"S": 4}]
    # B did not move, so it keeps its value 2
    with torch.no_grad(), pytest.warns(FspyreWarning, match=r"a size of 3 where the symbolic program takes 2"):
        x = name_tensor_dims(torch.randn(3, 256, 64), ["B", "S", "D"])
        assert_eager(fn(x), model(x))
    assert [g.symbolic for g in seen] == [False, True, False]


def test_dynamic_never_makes_a_reduction_dim_that_did_not_change_symbolic() -> None:
    """An MLP first called with S = 64, less than its hidden 128: the symbolic size is S,
    which changed, not the larger hidden dim the matmuls reduce over (which would be refused
    and compiled per shape at every length)."""
    from tests.frontend.test_model_ops import LlamaMLP

    torch.manual_seed(0)
    model = LlamaMLP(hidden=128, inner=128).eval()
    fn, seen = _dynamic(model)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", FspyreWarning)  # no "compiled for each input shape"
        for length in (64, 256, 512):
            x = name_tensor_dims(torch.randn(1, length, 128), ["B", "S", "D"])
            assert_eager(fn(x), model(x))
    assert [g.symbolic for g in seen] == [False, True]
    assert {d.name for b in seen[1].buffers for d in b.type.dims if not isinstance(d.size, int)} == {"S"}


def test_dynamic_attention_over_a_cache_length_is_one_program() -> None:
    """Keys and values of one length L are two torch symbols that move by one step: one size.
    Softmax and the probabilities times v reduce over L: the whole form, any L."""
    torch.manual_seed(0)

    def attend(q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2) / 8, -1) @ v

    fn, seen = _dynamic(attend, tiling="none")  # the whole form holds all of L either way
    q = torch.randn(2, 1, 64)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", FspyreWarning)
        for length in (5, 9, 37, 70):
            k, v = torch.randn(2, length, 64), torch.randn(2, length, 64)
            assert_eager(fn(q, k, v), attend(q, k, v))
    assert [g.symbolic for g in seen] == [False, True]


def test_dynamic_graph_whose_fspyre_part_reads_no_input() -> None:
    """A graph that reads only its input's size: the fspyre subgraph has no inputs (once an
    IndexError in the backend)."""
    def ones(x):
        return torch.ones(x.shape[0], 64).exp()

    fn, seen = _dynamic(ones)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FspyreWarning)
        for rows in (64, 128, 192):
            x = torch.randn(rows, 64)
            assert_eager(fn(x), ones(x))
    assert seen and not seen[0].symbolic


def test_dynamic_without_hints_takes_a_fixed_tile_and_compiles_a_size_it_cannot_take() -> None:
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 128, bias=False).eval()

    def model(x):
        return torch.nn.functional.silu(lin(x))

    fn, seen = _dynamic(model)
    with torch.no_grad():
        x = torch.randn(128, 64)
        assert_eager(fn(x), model(x))
        with pytest.warns(FspyreWarning, match="fixed tiles of 64"):
            x = torch.randn(192, 64)
            assert_eager(fn(x), model(x))
        with pytest.warns(FspyreWarning, match=r"size 100 breaks .*% 64 == 0; compiling this shape on its own"):
            x = torch.randn(100, 64)
            assert_eager(fn(x), model(x))
    assert [g.symbolic for g in seen] == [False, True, False]


def test_dynamic_reduction_over_the_changing_size_is_one_program() -> None:
    def model(x):
        return torch.softmax(x, 0)  # a reduction over the sequence: the whole form

    fn, seen = _dynamic(model)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", FspyreWarning)
        for rows in (128, 192, 100, 7):
            x = torch.randn(rows, 16)
            assert_eager(fn(x), model(x))
    assert [g.symbolic for g in seen] == [False, True]


def test_dynamic_embedding_whose_float_attribute_dynamo_passes_as_a_tensor() -> None:
    """dynamic=True passes an embedding's norm_type as a 0-d tensor the graph reads with
    .item(): the trace takes its value (a fake tensor has none: once a crash of every
    LlamaForCausalLM.generate under dynamic=True)."""
    torch.manual_seed(0)
    emb, lin = torch.nn.Embedding(64, 64).eval(), torch.nn.Linear(64, 64).eval()

    def model(ids):
        return lin(emb(ids)).relu()

    fn, seen = _dynamic(model, tiling="none")
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FspyreWarning)
        for n in (5, 9):
            ids = torch.randint(0, 64, (1, n), generator=torch.Generator().manual_seed(n))
            assert_eager(fn(ids), model(ids))
    assert seen


# -- the backend never fails the user's call --------------------------------------------------
# Every stage a subgraph passes through on its way to the interpreter, by the module attribute
# the caller looks it up under ("+": each of those modules; under tiling="auto" the search (its
# candidates in tiling_search, the whole program in search_context)
# tiles and places the plan it hands on). Each is planted with a failure in turn; the call
# must return eager's values and warn naming the ops and the failure.
STAGES = (
    ("fspyre.frontend.dynamo", "decompose"),  # Dynamo graph -> core ATen
    ("fspyre.frontend.dynamo", "lower_with_constants"),  # ATen subgraph -> fspyre Graph
    ("fspyre.pipeline", "search_placed"),
    ("fspyre.pipeline+fspyre.stages.tiling_search+fspyre.stages.search_context", "tile"),
    ("fspyre.pipeline+fspyre.stages.tiling_search+fspyre.stages.search_context", "place_copies"),
    ("fspyre.pipeline", "verify_loop_tree"),
    ("fspyre.pipeline", "verify_program"),
    ("fspyre.machine.interpreter", "run_outputs"),  # the interpreter, at call time
)


@pytest.mark.parametrize("error", [FspyreError, KeyError])
@pytest.mark.parametrize("module,stage", STAGES)
def test_a_failure_planted_in_any_stage_falls_back_to_eager(monkeypatch, module, stage, error) -> None:
    import importlib

    def fail(*args, **kwargs):
        raise error(f"planted in {stage}")

    for name in module.split("+"):
        monkeypatch.setattr(importlib.import_module(name), stage, fail)

    def f(x, w):
        return torch.softmax(torch.relu(x @ w), -1) * 2

    x, w = torch.randn(4, 8), torch.randn(8, 16)
    fn, _, _ = compiled(f, tiling="auto")
    with torch.no_grad(), pytest.warns(FspyreWarning, match=f"planted in {stage}") as record:
        got = fn(x, w)
    assert_eager(got, f(x, w))
    text = " ".join(str(r.message) for r in record)
    assert "eager" in text and (stage == "decompose" or "aten.mm" in text)


def test_a_strided_slice_no_longer_fails_and_a_failing_one_would_not_crash_the_call() -> None:
    """The issue's case: ``x[..., ::2]`` failed in fspyre.compile inside the backend's
    compiled-function constructor, uncaught. It now runs on fspyre, with no warning."""

    def f(x):
        return x[..., ::2] * 2 + x[..., 1::2]

    fn, reports, _ = compiled(f, tiling="auto")
    x = torch.randn(4, 64)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", FspyreWarning)
        got = fn(x)
    assert_eager(got, f(x))
    assert not reports[0].eager
