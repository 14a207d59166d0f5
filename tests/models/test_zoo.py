"""Real layers through both front-end paths, ``from_torch`` (compiled, run on the machine-model
interpreter) and ``torch.compile(backend="fspyre")``, against torch eager.

The tolerance is derived, not tuned: the yardstick is float64 eager of the same weights and
inputs, and fspyre's error against it must stay within a stated factor of torch's own error
in the same dtype:
- float32: factor 2. Both compute in float32 with one rounding per op; they differ only in the
  summation order of reductions and matmuls, and two orders' errors are of the same size.
- float16: factor 8. fspyre stores float16 values as DLFloat16, whose unit roundoff (2^-10)
  is twice IEEE float16's (2^-11): 2x. And fspyre rounds at every op boundary, where torch's
  CPU kernels keep intermediates in float32 inside fused attention (SDPA) and norm kernels:
  softmax(q k^T / sqrt(d)) v is rounded after the scale, the max-subtraction, exp, the sum,
  the division and both matmuls (7 stores) against torch's 2: up to 4x more roundings.
The measured ratios are printed with -s (float16 2.0-4.7x, float32 0.3-1.2x)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import fspyre
from fspyre.frontend import capture
from fspyre.testing.zoo import CASES, Case, TinyCausalLM, token_ids

pytest.importorskip("transformers")

FACTOR = {torch.float32: 2.0, torch.float16: 8.0}
MACHINE = fspyre.machine.spyre(cores=8)


def errors(case: Case, dtype: torch.dtype, path: str) -> tuple[float, float]:
    """(torch's max |error|, fspyre's) against float64 eager, for one dtype and path."""
    module, args = case.build(), case.inputs()
    with torch.no_grad():
        exact = copy.deepcopy(module).double()(*(a.double() for a in args)).numpy()
        module, args = module.to(dtype), tuple(a.to(dtype) for a in args)
        eager = module(*args).double().numpy()
        if path == "from_torch":
            cap = capture(module, args)
            comp = fspyre.compile(cap.graph, MACHINE)
            got = fspyre.run(comp, cap.inputs(*args))[cap.output_names[0]]
        else:
            compiled = torch.compile(module, backend="fspyre", options={"cores": 8})
            got = compiled(*args).numpy()
    assert got.shape == exact.shape
    return float(np.abs(eager - exact).max()), float(np.abs(np.asarray(got, np.float64) - exact).max())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("path", ["from_torch", "torch_compile"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_layer_matches_eager(name, path, dtype):
    theirs, ours = errors(CASES[name], dtype, path)
    print(f"{name} {path} {dtype}: torch {theirs:.3g}, fspyre {ours:.3g} ({ours / theirs:.2f}x)")
    assert np.isfinite(ours)
    assert ours <= FACTOR[dtype] * theirs, f"fspyre's error {ours:.3g} > {FACTOR[dtype]} x torch's {theirs:.3g}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("path", ["from_torch", "torch_compile"])
def test_tiny_causal_lm_from_input_ids_to_logits(path, dtype):
    """Embedding lookup of int64 ids, transformers' own causal-and-padding mask, two Llama
    decoder layers, the final norm and the LM head."""
    lm, args = TinyCausalLM(), token_ids()
    with torch.no_grad():
        exact = copy.deepcopy(lm).double()(*args).numpy()
        lm = lm.to(dtype)
        theirs = float(np.abs(lm(*args).double().numpy() - exact).max())
        if path == "from_torch":
            cap = capture(lm, args)
            got = fspyre.run(fspyre.compile(cap.graph, MACHINE), cap.inputs(*args))[cap.output_names[0]]
        else:
            got = torch.compile(lm, backend="fspyre", options={"cores": 8})(*args).numpy()
    ours = float(np.abs(np.asarray(got, np.float64) - exact).max())
    print(f"tiny causal LM {path} {dtype}: torch {theirs:.3g}, fspyre {ours:.3g} ({ours / theirs:.2f}x)")
    assert got.shape == exact.shape == (args[0].shape[0], args[0].shape[1], 256)
    assert ours <= FACTOR[dtype] * theirs, f"fspyre's error {ours:.3g} > {FACTOR[dtype]} x torch's {theirs:.3g}"


# -- the families issue 23 unblocked: convolutions, top-k routers, strided and empty slices ---------
# Whole one-layer models (zoo.FAMILIES), float32, compiled with tiling="none" to keep the suite's
# budget (the layers above cover tiling="auto"). Three run by default (about 40 s of CPU together);
# the rest are marked heavy and run with `pytest --heavy` (`fspyre zoo` runs all 39).
UNBLOCKED = {"vit": False, "phi3": False, "cohere": False, "gptj": True, "convnext": True, "resnet": True,
             "mamba": True, "mixtral_moe": True, "qwen2_moe": True, "olmoe": True}


@pytest.mark.parametrize("path", ["from_torch", "torch_compile"])
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.heavy) if heavy else n
                                  for n, heavy in UNBLOCKED.items()])
def test_family_runs_on_fspyre_within_tolerance(name, path):
    from fspyre.frontend.dynamo import fspyre_backend
    from fspyre.testing.zoo import FAMILIES

    fam = FAMILIES[name]
    module, args = fam.build(), fam.inputs()
    reports = []
    with torch.no_grad():
        exact = copy.deepcopy(module).double()(*(a.double() if a.is_floating_point() else a for a in args)).numpy()
        theirs = float(np.abs(module(*args).double().numpy() - exact).max())
        if path == "from_torch":
            cap = capture(module, args)
            got = fspyre.run(fspyre.compile(cap.graph, MACHINE, tiling="none"), cap.inputs(*args))[cap.output_names[0]]
        else:
            backend = lambda gm, xs: fspyre_backend(  # noqa: E731
                gm, xs, options={"tiling": "none", "cores": 8, "on_report": reports.append})
            got = torch.compile(module, backend=backend)(*args).numpy()
    ours = float(np.abs(np.asarray(got, np.float64) - exact).max())
    print(f"{name} {path}: torch {theirs:.3g}, fspyre {ours:.3g}")
    assert ours <= FACTOR[torch.float32] * theirs, f"fspyre's error {ours:.3g} > 2 x torch's {theirs:.3g}"
    if path == "torch_compile":  # every op on fspyre
        assert reports and all(not r.eager for r in reports), [r.summary() for r in reports]
