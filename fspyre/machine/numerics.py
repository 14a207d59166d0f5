"""The numeric rules, written once and shared by the reference evaluator and the
machine-model interpreter (docs/semantics.md). Both call these functions on the same
decoded values, which is why pointwise results are bit-exact between them.

Compute precision: float32 when the result or any operand is a float type, else int32.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from fspyre.ir.dtypes import is_float

Value = np.ndarray | float | int | bool


def _erf(x: np.ndarray) -> np.ndarray:
    # numpy has no erf; torch (a dependency already) computes it vectorized in float32.
    import torch

    x = np.asarray(x, dtype=np.float32)
    # ascontiguousarray would turn a 0-d array into 1-d; keep the shape.
    return torch.special.erf(torch.from_numpy(np.array(x, dtype=np.float32, order="C"))).numpy().reshape(x.shape)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return (np.float32(1) / (np.float32(1) + np.exp(-x))).astype(np.float32)


def _gelu(x: np.ndarray) -> np.ndarray:
    # erf form (torch's default, approximate="none")
    return (np.float32(0.5) * x * (np.float32(1) + _erf(x * np.float32(0.7071067811865476)))).astype(np.float32)


POINTWISE: dict[str, Callable[..., np.ndarray]] = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "pow": np.power,
    "neg": np.negative,
    "abs": np.abs,
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: np.float32(1) / np.sqrt(x),
    "reciprocal": lambda x: np.float32(1) / x,
    "relu": lambda x: np.maximum(x, x.dtype.type(0)),
    "sigmoid": _sigmoid,
    "tanh": np.tanh,
    "gelu": _gelu,
    "silu": lambda x: x * _sigmoid(x),
    "copy": lambda x: x,
    "cast": lambda x: x,
    "logical_not": lambda x: x == 0,
    "eq": np.equal,
    "ne": np.not_equal,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
    "where": lambda c, a, b: np.where(c != 0, a, b),
}

# identity element and pairwise combine of each reduction (used across cores and tiles)
REDUCE_IDENTITY: dict[str, float] = {
    "sum": 0.0, "mean": 0.0, "matmul": 0.0, "prod": 1.0, "amax": -np.inf, "amin": np.inf,
}
REDUCE_COMBINE: dict[str, str] = {
    "sum": "add", "mean": "add", "matmul": "add", "prod": "mul", "amax": "maximum", "amin": "minimum",
}


def compute_dtype(out_dtype: str, operand_dtypes: Sequence[str]) -> np.dtype:
    if is_float(out_dtype) or any(is_float(d) for d in operand_dtypes):
        return np.dtype(np.float32)
    return np.dtype(np.int32)


def _as(value: Value, dtype: np.dtype) -> Value:
    if isinstance(value, np.ndarray):
        return value.astype(dtype, copy=False)
    return dtype.type(value)


def pointwise(fn: str, operands: Sequence[Value], ctype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """Apply ``fn`` elementwise in compute dtype ``ctype``; the result has ``shape``."""
    if fn == "full":
        return np.full(shape, _as(operands[0], ctype), dtype=ctype)
    args = [_as(v, ctype) for v in operands]
    with np.errstate(all="ignore"):  # inf/nan follow IEEE, as on the device
        out = POINTWISE[fn](*args)
    out = np.asarray(out)
    if out.dtype == np.bool_:
        out = out.astype(ctype)
    return np.broadcast_to(out.astype(ctype, copy=False), shape)


def reduce(fn: str, operands: Sequence[np.ndarray], axes: tuple[int, ...], ctype: np.dtype,
           count: int, grid: tuple[int, ...], correction: int = 0) -> np.ndarray:
    """Reduce over ``axes`` (the trailing axes of the iteration ``grid``) in ``ctype``.

    ``count`` is the number of elements the full reduction covers (mean, var divide by it)."""
    x = [_as(v, ctype) for v in operands]
    if fn != "matmul":
        x = [np.broadcast_to(v, grid) for v in x]
    with np.errstate(all="ignore"):
        if fn == "matmul":
            return _contract(x[0], x[1], axes, grid).astype(ctype, copy=False)
        v = x[0]
        if fn in ("sum", "mean"):
            out = np.sum(v, axis=axes, dtype=ctype)
            return (out * ctype.type(1.0 / count)).astype(ctype) if fn == "mean" else out
        if fn == "prod":
            return np.prod(v, axis=axes, dtype=ctype)
        if fn == "amax":
            return np.max(v, axis=axes)
        if fn == "amin":
            return np.min(v, axis=axes)
        if fn == "var":
            mean = np.sum(v, axis=axes, dtype=ctype, keepdims=True) * ctype.type(1.0 / count)
            sq = np.sum((v - mean) ** 2, axis=axes, dtype=ctype)
            return (sq / ctype.type(max(count - correction, 0))).astype(ctype)
    raise KeyError(fn)


def _contract(a: np.ndarray, b: np.ndarray, axes: tuple[int, ...], grid: tuple[int, ...]) -> np.ndarray:
    """sum over ``axes`` of a*b, with a and b broadcast over the grid, as one batched float32
    BLAS matmul (``np.matmul``: [batch, M, K] @ [batch, K, N]) without materialising the
    product grid. Accumulation is BLAS's float32 order."""
    nd = len(grid)
    a = a.reshape((1,) * (nd - a.ndim) + a.shape)
    b = b.reshape((1,) * (nd - b.ndim) + b.shape)
    in_a = [a.shape[i] != 1 for i in range(nd)]
    in_b = [b.shape[i] != 1 for i in range(nd)]
    red = set(axes)
    # A reduced axis only one operand varies along is summed in that operand first; one neither
    # varies along still counts its points: the sum of n equal terms.
    only_a = tuple(i for i in red if in_a[i] and not in_b[i])
    only_b = tuple(i for i in red if in_b[i] and not in_a[i])
    if only_a:
        a = np.sum(a, axis=only_a, keepdims=True, dtype=a.dtype)
    if only_b:
        b = np.sum(b, axis=only_b, keepdims=True, dtype=b.dtype)
    repeat = math.prod(grid[i] for i in red if not in_a[i] and not in_b[i])
    k_ax = [i for i in sorted(red) if in_a[i] and in_b[i]]
    out_axes = [i for i in range(nd) if i not in red]
    batch = [i for i in out_axes if in_a[i] and in_b[i]]
    m_ax = [i for i in out_axes if in_a[i] and not in_b[i]]
    n_ax = [i for i in out_axes if in_b[i] and not in_a[i]]
    drop = [i for i in range(nd) if i not in k_ax + batch + m_ax + n_ax]  # size-1 in both
    size = lambda ax: math.prod(grid[i] for i in ax)  # noqa: E731
    am = np.transpose(a, batch + m_ax + k_ax + [i for i in range(nd) if i not in batch + m_ax + k_ax])
    bm = np.transpose(b, batch + k_ax + n_ax + [i for i in range(nd) if i not in batch + k_ax + n_ax])
    am = am.reshape(size(batch), size(m_ax), size(k_ax))
    bm = bm.reshape(size(batch), size(k_ax), size(n_ax))
    res = np.matmul(am, bm)
    if repeat != 1:
        res = res * res.dtype.type(repeat)
    # back to grid order over the output axes; axes neither operand carries come back as size 1
    res = res.reshape([grid[i] for i in batch + m_ax + n_ax] + [1] * len([i for i in drop if i in out_axes]))
    order = batch + m_ax + n_ax + [i for i in drop if i in out_axes]
    res = np.transpose(res, [order.index(i) for i in out_axes])
    return np.broadcast_to(res, [grid[i] for i in out_axes])


def combine(fn: str, acc: np.ndarray, part: np.ndarray) -> np.ndarray:
    """Fold a partial result of reduction ``fn`` into an accumulator (cross-core, cross-tile)."""
    with np.errstate(all="ignore"):
        return POINTWISE[REDUCE_COMBINE[fn]](acc, part)
