"""``torch.isinf`` and ``torch.isnan`` (T5 guards float16 overflow with ``isinf(h).any()``),
against torch and numpy, through the evaluator and the machine-model interpreter."""

from __future__ import annotations

import numpy as np
import torch

import fspyre
from fspyre.frontend import capture


def overflow_flags(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    big = x * 1e30  # float32 overflows to ±inf past 3.4e38
    return torch.isinf(big), torch.isnan(big - big), torch.isinf(big).any()


def test_isinf_isnan_equal_torch_and_numpy():
    x = torch.tensor([1.0, -1e10, 0.0, 2.0, 3e9, -5.0, 1e-3, 7.0] * 8)
    cap = capture(overflow_flags, (x,))
    inputs = cap.inputs(x)
    report = fspyre.check(cap.graph, inputs, machine=fspyre.machine.spyre(cores=4))
    assert report.equal, str(report)
    got = fspyre.evaluate(cap.graph, inputs)
    want = [t.numpy() for t in overflow_flags(x)]
    big = x.numpy().astype(np.float32) * np.float32(1e30)
    numpy_ref = [np.isinf(big), np.isnan(big - big), np.isinf(big).any()]
    for name, w, n in zip(cap.output_names, want, numpy_ref):
        np.testing.assert_array_equal(got[name], w)
        np.testing.assert_array_equal(got[name], n)
    assert got[cap.output_names[0]].any() and got[cap.output_names[1]].any()  # the flags do fire
