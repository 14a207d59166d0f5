"""``torch.cumsum`` against torch and numpy's ``cumsum``: bool masks and ints exactly (their
int64 result is int32 on the device), floats within check's bound, on the interpreter too."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fspyre
from fspyre.frontend import capture

MACHINE = fspyre.machine.spyre(cores=4)
GEN = torch.Generator().manual_seed(0)
CASES = {
    "bool mask, last dim": (lambda m: m.cumsum(-1), torch.rand(2, 16, generator=GEN) > 0.3, -1),
    "int32, first dim": (lambda m: m.cumsum(0), torch.randint(-5, 5, (8, 4), generator=GEN, dtype=torch.int32), 0),
    "float32, middle dim": (lambda x: torch.cumsum(x, 1), torch.randn(3, 64, 5, generator=GEN), 1),
}


@pytest.mark.parametrize("name", CASES)
def test_cumsum(name):
    fn, x, dim = CASES[name]
    cap = capture(fn, (x,))
    inputs = cap.inputs(x)
    report = fspyre.check(cap.graph, inputs, machine=MACHINE)
    assert report.equal, str(report)
    got = fspyre.evaluate(cap.graph, inputs)[cap.output_names[0]]
    ref = np.cumsum(x.numpy().astype(np.float64), axis=dim)
    if x.dtype.is_floating_point:
        np.testing.assert_allclose(got, fn(x).numpy(), rtol=1e-6, atol=1e-5)
        np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-5)
    else:
        np.testing.assert_array_equal(got, fn(x).numpy())
        np.testing.assert_array_equal(got, ref)
