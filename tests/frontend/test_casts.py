"""Float-to-integer conversions convert toward zero, as torch does: ``x.to(torch.long)`` of 2.7
is 2 and of -2.7 is -2 (fspyre used to round to nearest, a silent wrong answer in T5's
relative-position buckets). Checked against torch and against numpy's ``trunc``, through the
reference evaluator and the machine-model interpreter."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import fspyre
from fspyre.frontend import capture

MACHINE = fspyre.machine.spyre(cores=4)


def fspyre_values(fn, *args: torch.Tensor) -> np.ndarray:
    cap = capture(fn, args)
    inputs = cap.inputs(*args)
    report = fspyre.check(cap.graph, inputs, machine=MACHINE)
    assert report.equal, str(report)
    return fspyre.evaluate(cap.graph, inputs)[cap.output_names[0]]


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_float_to_int_converts_toward_zero(dtype):
    # halves, values just either side of an integer, negatives and zero
    x = torch.tensor([2.7, -2.7, 2.5, -2.5, 0.5, -0.5, 3.0, -3.0, 0.0, 1.999, -1.999, 100.25,
                      -7.75, 6.5, -6.5, 0.25] * 4, dtype=torch.float32)
    got = fspyre_values(lambda t: t.to(dtype), x)
    np.testing.assert_array_equal(got, x.to(dtype).numpy())
    np.testing.assert_array_equal(got, np.trunc(x.numpy()).astype(np.int64))


def t5_buckets(x: torch.Tensor) -> torch.Tensor:
    """T5's bidirectional relative-position bucket (transformers' T5Attention._relative_position_bucket,
    32 buckets, max distance 128), plus a float input so the graph has one."""
    q = torch.arange(x.shape[0])[:, None]
    k = torch.arange(x.shape[1])[None, :]
    rel = k - q
    buckets = (rel > 0).to(torch.long) * 16
    rel = torch.abs(rel)
    small = rel < 8
    large = 8 + (torch.log(rel.float() / 8) / math.log(128 / 8) * 8).to(torch.long)
    large = torch.min(large, torch.full_like(large, 15))
    return buckets + torch.where(small, rel, large) + x.to(torch.long)


def test_t5_relative_position_buckets_equal_torch():
    x = torch.zeros(64, 64)
    np.testing.assert_array_equal(fspyre_values(t5_buckets, x), t5_buckets(x).numpy())
