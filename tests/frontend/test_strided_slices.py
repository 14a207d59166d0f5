"""Slices of every step (issue 23): ``x[..., ::2]`` (GPT-J / Cohere interleaved rotary) reads the
stick dim with a stride, which the stick rule cannot express; the exact digit form must carry it.
Each case is captured from torch, compared with eager exactly (a slice moves data), and compiled
and run on the machine model against the untiled reference (``fspyre.check``)."""

from __future__ import annotations

import numpy as np
import sympy
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fspyre
from fspyre.frontend import capture
from fspyre.machine import formats
from fspyre.machine.layout import _matches_digits, exact_coordinates, stick_layout

MACHINE = fspyre.machine.spyre(cores=4)
DL16 = formats.FORMATS["SEN169_FP16"]


def dl16(a: np.ndarray) -> np.ndarray:
    return np.asarray(formats.round_to(np.asarray(a, np.float32), DL16), np.float32).reshape(np.shape(a))


def _run_equal(fn, x: torch.Tensor) -> None:
    cap = capture(fn, (x,))
    inputs = cap.inputs(x)
    got = fspyre.evaluate(cap.graph, inputs)
    with torch.no_grad():
        want = fn(x)
    for name, w in zip(cap.output_names, want if isinstance(want, tuple) else (want,)):
        np.testing.assert_array_equal(np.asarray(got[name], np.float32), w.to(torch.float32).numpy())
    report = fspyre.check(cap.graph, inputs, machine=MACHINE)
    assert report.equal, str(report)


def interleaved_rotary(x: torch.Tensor) -> torch.Tensor:
    """GPT-J's rotate_every_two: pairs (x[2i], x[2i+1]) become (-x[2i+1], x[2i])."""
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def test_interleaved_rotary_runs_on_the_machine() -> None:
    _run_equal(interleaved_rotary, torch.randn(2, 4, 64))


@settings(max_examples=12, deadline=None)
@given(rows=st.integers(1, 5), cols=st.sampled_from([16, 33, 64, 96]), axis=st.sampled_from([0, 1]),
       start=st.integers(0, 3), step=st.integers(2, 5), half=st.booleans())
def test_every_slice_step_of_either_dim_runs_equal(rows: int, cols: int, axis: int, start: int, step: int,
                                                   half: bool) -> None:
    size = (rows, cols)[axis]
    start = min(start, size - 1)
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(rows * cols + step))
    if half:  # drawn as DLFloat16 values, so copy-in does not round them
        x = torch.from_numpy(dl16(x.numpy())).to(torch.float16)

    def f(t: torch.Tensor) -> torch.Tensor:
        return (t[start::step] if axis == 0 else t[:, start::step]) * 2

    _run_equal(f, x)


def test_the_exact_form_of_a_stride_two_stick_read_is_right() -> None:
    """sympy 1.14 folds Mod(2*Mod(s, 32), 32) to 2*Mod(s, 32), wrong for s >= 16: the exact
    digit form must not nest the stick's Mod inside the dim's when eps divides the dim."""
    layout = stick_layout((4, 64), 32)
    a, s = (sympy.Symbol(n, integer=True, nonnegative=True) for n in ("a", "s"))
    index, ranges = 64 * a + 2 * s, {a: 4, s: 32}
    assert _matches_digits(exact_coordinates(layout, index, ranges), layout, index, ranges)


@settings(max_examples=60, deadline=None)
@given(shape=st.lists(st.integers(1, 70), min_size=1, max_size=4), eps=st.sampled_from([32, 64]),
       step=st.integers(1, 5), start=st.integers(0, 4), data=st.data())
def test_the_exact_form_addresses_every_strided_read(shape, eps, step, start, data) -> None:
    """A strided slice of the last (stick) dim, the other dims whole or sliced too, on the
    default layout: the exact digit form must address every element it reads (sympy's nested
    Mod folding made it wrong, e.g. 2*Mod(Mod(s, 8)**2, 16) for a 16-wide stick dim)."""
    shape = tuple(shape)
    layout = stick_layout(shape, eps)
    strides = [int(np.prod(shape[i + 1:])) for i in range(len(shape))]
    syms, ranges, index = [], {}, 0
    for i, n in enumerate(shape):
        st_i = step if i == len(shape) - 1 else data.draw(st.integers(1, 2))
        lo = min(start, n - 1)
        count = -(-(n - lo) // st_i)
        s = sympy.Symbol(f"d{i}", integer=True, nonnegative=True)
        syms.append(s)
        ranges[s] = count
        index += strides[i] * (lo + st_i * s)
    index = sympy.expand(index)
    assert _matches_digits(exact_coordinates(layout, index, ranges), layout, index, ranges)
