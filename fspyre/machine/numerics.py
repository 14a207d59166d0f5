"""The numeric rules, written once and shared by the reference evaluator and the
machine-model interpreter (docs/semantics.md). Both call these functions on the same
decoded values, which is why pointwise results are bit-exact between them.

Compute precision: float32 when the result or any operand is a float type, else int32.
"""

from __future__ import annotations

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
    size = int(np.prod(shape, dtype=np.int64))
    args = [_dense(_as(v, ctype), shape, size) for v in operands]
    with np.errstate(all="ignore"):  # inf/nan follow IEEE, as on the device
        out = np.asarray(POINTWISE[fn](*args))
    return out.astype(ctype, copy=False).reshape(shape)


def _dense(v: Value, shape: tuple[int, ...], size: int) -> np.ndarray:
    """``v`` broadcast to ``shape`` as a 1-d array with unit stride. numpy picks its kernel by
    operand stride: np.power with a stride-0 exponent of 2, 0.5 or -1 (a 0-d value, a scalar,
    or a one-element tile broadcast over a row -- numpy counts a size-1 array of stride 0 as
    contiguous) is square/sqrt/reciprocal, correctly rounded, while unit-stride arrays go
    through a SIMD powf that is not. One layout for every shape makes each element's result
    independent of the tile it is computed in."""
    a = np.broadcast_to(v, shape).reshape(size)
    if a.strides != (a.itemsize,):
        a = a.copy()
    return a


def bool_store(values: np.ndarray) -> np.ndarray:
    """What a store to a bool buffer keeps: 1 where the value is nonzero (NaN included, as
    torch's ``bool(nan)``), else 0 -- so a bool buffer only ever holds 0.0 / 1.0."""
    return (values != 0).astype(values.dtype)


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
    """sum over ``axes`` of a*b, with a and b broadcast over the grid; einsum avoids
    materialising the full product grid (BLAS underneath)."""
    nd = len(grid)
    letters = "abcdefghijklmnopqrstuvwxyz"

    def subs(x: np.ndarray) -> tuple[np.ndarray, str]:
        x = x.reshape((1,) * (nd - x.ndim) + x.shape)
        keep = [i for i in range(nd) if x.shape[i] != 1 or grid[i] == 1]
        return x.reshape([x.shape[i] for i in keep]), "".join(letters[i] for i in keep)

    (xa, sa), (xb, sb) = subs(a), subs(b)
    out_axes = [i for i in range(nd) if i not in axes]
    so = "".join(letters[i] for i in out_axes)
    res = np.einsum(f"{sa},{sb}->{''.join(c for c in so if c in sa + sb)}", xa, xb, optimize=True)
    # A reduced axis neither operand varies along still counts its points: sum of n equal terms.
    repeat = 1
    for i in axes:
        if letters[i] not in sa + sb:
            repeat *= grid[i]
    if repeat != 1:
        res = res * res.dtype.type(repeat)
    # axes that neither operand carries (size 1 in the grid) come back as size-1 axes
    return np.broadcast_to(res.reshape([grid[i] if letters[i] in sa + sb else 1 for i in out_axes]),
                           [grid[i] for i in out_axes])


def combine(fn: str, acc: np.ndarray, part: np.ndarray) -> np.ndarray:
    """Fold a partial result of reduction ``fn`` into an accumulator (cross-core, cross-tile)."""
    with np.errstate(all="ignore"):
        return POINTWISE[REDUCE_COMBINE[fn]](acc, part)
