"""An independent numpy reference with a per-element error bound, for the random-program campaign.

Written from the op definitions in docs/semantics.md, not from fspyre's numerics, IR or
evaluator: the campaign's generator calls these functions beside each ``GraphBuilder`` call, on
values it holds itself, so a bug shared by ``fspyre.evaluate`` and the interpreter (both use
``fspyre.machine.numerics``) still shows as a difference here.

A ``Ref`` is a tensor's *ideal* value, computed in float64 with no intermediate rounding, plus
``err``: an element-wise bound on how far any execution allowed by the semantics may land from
it. The bound grows, per op, by

- propagation of the operands' bounds through the op: the exact spread of the op over the
  box ``[x - e, x + e]`` of each operand (monotone ops and binary ops at the box corners),
  a Lipschitz constant for ``gelu``/``silu``, the classical bounds for sums and products;
- the op's float32 computation: ``C · 2⁻²⁴ · |v|`` (C = 2 for basic ops, 8 for transcendental
  ones; reductions of n terms: ``n · 2⁻²⁴ · Σ|x|``, the worst-case bound of any summation order);
- the store's rounding into the device format: ``u · |v| + tiny``, u = 2⁻¹⁰ for DLFloat16
  (9 fraction bits, ties away), 2⁻¹¹ for IEEE fp16, 2⁻⁹ for bfloat16, 2⁻²⁴ for fp32, and
  ``tiny`` the format's smallest spacing near zero (DLFloat16 has no subnormals: 2⁻³⁰).

Discontinuous ops (comparisons, ``where``, casts to bool/int32, ``logical_not``) are exact
where the operands are decided (farther apart than their bounds) and carry an error of one
unit (bool) or ``floor(e) + 1`` (int) where they are not. A result is accepted when
``|got − v| ≤ 2·err`` element-wise (``accept``): the factor 2 covers the first-order
terms neglected in the propagation; a real compiler bug is off by far more.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

F32 = 2.0**-24
UNIT = {"SEN169_FP16": 2.0**-10, "IEEE_FP16": 2.0**-11, "BF16": 2.0**-9, "IEEE_FP32": 2.0**-24}
TINY = {"SEN169_FP16": 2.0**-30, "IEEE_FP16": 2.0**-24, "BF16": 2.0**-126, "IEEE_FP32": 2.0**-126}
SAFETY = 2.0
TRANSCENDENTAL = ("exp", "log", "log1p", "sqrt", "rsqrt", "sigmoid", "tanh", "gelu", "silu", "pow", "reciprocal", "div",
                  "sin", "cos")


def device_format(dtype: str, fp16_format: str) -> str:
    return {"float16": fp16_format, "bfloat16": "BF16", "float32": "IEEE_FP32",
            "int32": "IEEE_INT32", "bool": "BOOL"}[dtype]


@dataclass(frozen=True, slots=True)
class Ref:
    """A tensor's ideal value over named axes ``names`` and its error bound (same shape)."""

    names: tuple[str, ...]
    value: np.ndarray
    err: np.ndarray
    dtype: str

    def aligned(self, names: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Value and bound with axes reordered to ``names`` (missing axes become size 1)."""
        have = [n for n in names if n in self.names]
        assert set(have) == set(self.names), (self.names, names)
        perm = [self.names.index(n) for n in have]
        v, e = self.value.transpose(perm), self.err.transpose(perm)
        shape = [self.value.shape[self.names.index(n)] if n in self.names else 1 for n in names]
        return v.reshape(shape), e.reshape(shape)


def exact(names: Sequence[str], value: np.ndarray, dtype: str) -> Ref:
    v = np.asarray(value, dtype=np.float64)
    return Ref(tuple(names), v, np.zeros_like(v), dtype)


def _store(names, v, e, dtype: str, fp16_format: str, compute: float) -> Ref:
    """Round an ideal result ``v`` (bound ``e`` before this op's own compute error) into ``dtype``."""
    v = np.asarray(v, dtype=np.float64)
    e = np.broadcast_to(np.asarray(e, dtype=np.float64), v.shape).copy()
    if dtype == "bool":
        undecided = (e > 0) & (np.abs(v) <= e)
        return Ref(tuple(names), (v != 0).astype(np.float64), undecided.astype(np.float64), dtype)
    if dtype == "int32":
        # a float converts toward zero (torch's .to(int)); an integer bound came from integer
        # ops (exact), a fractional one from float compute, whose truncation may land one
        # further away
        return Ref(tuple(names), np.trunc(v), np.where(e == np.floor(e), e, np.floor(e) + 1), dtype)
    fmt = device_format(dtype, fp16_format)
    e = e + compute * F32 * np.abs(v) + UNIT[fmt] * np.abs(v) + TINY[fmt]
    return Ref(tuple(names), v, e, dtype)


def _spread(f, x, ex):
    """max |f(x') - f(x)| over x' in [x - ex, x + ex], for f monotone on that interval."""
    with np.errstate(all="ignore"):
        v = f(x)
        d = np.maximum(np.abs(f(x + ex) - v), np.abs(f(x - ex) - v))
    return v, np.where(ex > 0, np.where(np.isnan(d), np.inf, d), 0.0)


def _erf(x):
    from math import erf

    return np.vectorize(erf, otypes=[np.float64])(x)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "neg": np.negative, "abs": np.abs, "relu": lambda x: np.maximum(x, 0.0), "copy": lambda x: x,
    "exp": np.exp, "log": np.log, "log1p": np.log1p, "sqrt": np.sqrt, "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "reciprocal": lambda x: 1.0 / x, "sigmoid": _sigmoid, "tanh": np.tanh, "sin": np.sin, "cos": np.cos,
    "gelu": lambda x: 0.5 * x * (1.0 + _erf(x / np.sqrt(2.0))), "silu": lambda x: x * _sigmoid(x),
}
LIPSCHITZ = {"abs": 1.0, "relu": 1.0, "gelu": 1.13, "silu": 1.1, "sin": 1.0, "cos": 1.0}  # not monotone: |f'| <= L
BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
    "maximum": np.maximum, "minimum": np.minimum, "pow": np.power,
}
COMPARE = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
           "gt": np.greater, "ge": np.greater_equal}


def _operand(x, names):
    if isinstance(x, Ref):
        return x.aligned(names)
    return np.float64(x), np.float64(0.0)


def pointwise(fn: str, xs: Sequence[Ref | float], names: Sequence[str], shape: Sequence[int],
              dtype: str, fp16_format: str) -> Ref:
    """The ideal value and bound of ``fn`` over ``xs`` (Refs or Python scalars), broadcast by
    name to ``names`` and stored as ``dtype``."""
    ops = [_operand(x, names) for x in xs]
    e: np.ndarray | float
    with np.errstate(all="ignore"):
        if fn == "full":
            v, e = np.full(shape, ops[0][0]), 0.0
        elif fn in UNARY:
            (x, ex), = ops
            if fn in LIPSCHITZ:
                v, e = UNARY[fn](x), LIPSCHITZ[fn] * ex
            else:
                v, e = _spread(UNARY[fn], x, ex)
        elif fn == "cast" or fn == "logical_not":
            (x, ex), = ops
            if fn == "logical_not":
                und = (ex > 0) & (np.abs(x) <= ex)
                return Ref(tuple(names), np.broadcast_to(x == 0, shape).astype(np.float64),
                           np.broadcast_to(und, shape).astype(np.float64), "bool")
            v, e = x, ex
        elif fn == "fmod":
            # a - trunc(a / b) * b, exact in float64 for these operands; the quotient may
            # change inside the operand box (a jump of |b|): then anything goes
            (a, ea), (b, eb) = ops
            v = np.fmod(a, b)
            q = np.trunc(a / b)
            moves = np.any([np.trunc((a + sa * ea) / (b + sb * eb)) != q for sa in (-1, 1) for sb in (-1, 1)], axis=0)
            e = np.where(moves | (np.abs(b) <= eb), np.inf, ea + np.abs(q) * eb)
        elif fn in BINARY:
            (a, ea), (b, eb) = ops
            f = BINARY[fn]
            v = f(a, b)
            e = np.zeros(np.broadcast_shapes(np.shape(a), np.shape(b)))
            for sa in (-1, 1):
                for sb in (-1, 1):
                    e = np.maximum(e, np.abs(f(a + sa * ea, b + sb * eb) - v))
            if fn == "div":  # the box must not contain 0
                e = np.where(np.abs(b) <= eb, np.inf, e)
        elif fn in COMPARE:
            (a, ea), (b, eb) = ops
            v = COMPARE[fn](a, b).astype(np.float64)
            und = (ea + eb > 0) & (np.abs(a - b) <= ea + eb)
            return Ref(tuple(names), np.broadcast_to(v, shape).copy(),
                       np.broadcast_to(und, shape).astype(np.float64), "bool")
        elif fn == "where":
            (c, ec), (a, ea), (b, eb) = ops
            und = (ec > 0) & (np.abs(c) <= ec)
            v = np.where(c != 0, a, b)
            e = np.where(und, np.abs(a - b) + np.maximum(ea, eb), np.where(c != 0, ea, eb))
        else:
            raise KeyError(fn)
    v = np.broadcast_to(v, shape)
    return _store(names, v, e, dtype, fp16_format, 8.0 if fn in TRANSCENDENTAL else 2.0)


def reduce(fn: str, x: Ref, over: Sequence[str], out_names: Sequence[str], keepdim: bool, dtype: str,
           fp16_format: str, correction: int = 0) -> Ref:
    axes = tuple(x.names.index(n) for n in over)
    n = int(np.prod([x.value.shape[a] for a in axes]))
    v0, e0 = x.value, x.err
    with np.errstate(all="ignore"):
        if fn in ("sum", "mean"):
            v = v0.sum(axis=axes, keepdims=keepdim)
            e = e0.sum(axis=axes, keepdims=keepdim) + n * F32 * np.abs(v0).sum(axis=axes, keepdims=keepdim)
            if fn == "mean":
                v, e = v / n, e / n
        elif fn in ("amax", "amin"):
            v = (v0.max if fn == "amax" else v0.min)(axis=axes, keepdims=keepdim)
            e = e0.max(axis=axes, keepdims=keepdim)
        elif fn == "prod":  # operands are bounded away from zero by the generator
            v = v0.prod(axis=axes, keepdims=keepdim)
            rel = (e0 / np.maximum(np.abs(v0) - e0, 0.0)).sum(axis=axes, keepdims=keepdim)
            e = np.abs(v) * (np.expm1(rel) + 2 * n * F32)
        elif fn == "var":
            m = v0.mean(axis=axes, keepdims=True)
            d = v0 - m
            ed = e0 + e0.max(axis=axes, keepdims=True) + 2 * n * F32 * np.abs(v0).max(axis=axes, keepdims=True)
            denom = max(n - correction, 0)
            v = (d * d).sum(axis=axes, keepdims=keepdim) / denom
            e = ((2 * np.abs(d) * ed + ed * ed).sum(axis=axes, keepdims=keepdim)
                 + 4 * n * F32 * (d * d).sum(axis=axes, keepdims=keepdim)) / denom
        else:
            raise KeyError(fn)
    if dtype in ("int32",):  # integer reductions are exact (wrap-free for the generator's ranges)
        return Ref(tuple(out_names), v, e, dtype)
    return _store(out_names, v, e, dtype, fp16_format, 2.0)


def matmul(a: Ref, b: Ref, k: str, out_names: Sequence[str], dtype: str, fp16_format: str) -> Ref:
    letters: dict[str, str] = {}
    for nm in list(a.names) + list(b.names):
        letters.setdefault(nm, "abcdefghijklmnopqrstuvwxyz"[len(letters)])
    sa = "".join(letters[n] for n in a.names)
    sb = "".join(letters[n] for n in b.names)
    so = "".join(letters[n] for n in out_names)
    spec = f"{sa},{sb}->{so}"
    kk = a.value.shape[a.names.index(k)]
    ein = lambda x, y: np.einsum(spec, x, y)  # noqa: E731
    v = ein(a.value, b.value)
    e = (ein(np.abs(a.value), b.err) + ein(a.err, np.abs(b.value)) + ein(a.err, b.err)
         + kk * F32 * ein(np.abs(a.value), np.abs(b.value)))
    return _store(out_names, v, e, dtype, fp16_format, 2.0)


def reshape(x: Ref, names: Sequence[str], shape: Sequence[int]) -> Ref:
    return Ref(tuple(names), x.value.reshape(shape), x.err.reshape(shape), x.dtype)


def permute(x: Ref, names: Sequence[str]) -> Ref:
    perm = [x.names.index(n) for n in names]
    return Ref(tuple(names), x.value.transpose(perm), x.err.transpose(perm), x.dtype)


def expand(x: Ref, names: Sequence[str], shape: Sequence[int]) -> Ref:
    v, e = x.aligned(names)
    return Ref(tuple(names), np.broadcast_to(v, shape), np.broadcast_to(e, shape), x.dtype)


def squeeze(x: Ref, name: str) -> Ref:
    ax = x.names.index(name)
    return Ref(tuple(n for n in x.names if n != name), x.value.squeeze(ax), x.err.squeeze(ax), x.dtype)


def concat(xs: Sequence[Ref], axis: int, names: Sequence[str]) -> Ref:
    """The pieces one after another along axis ``axis``; each piece's axes are ``names`` but
    there, where it has its own. A copy: exact, each piece's bound carried."""
    for x in xs:
        if len(x.names) != len(names) or any(a != b for j, (a, b) in enumerate(zip(x.names, names)) if j != axis):
            raise ValueError(f"concat: piece axes {x.names} do not match {tuple(names)} but at {axis}")
    return Ref(tuple(names), np.concatenate([x.value for x in xs], axis), np.concatenate([x.err for x in xs], axis),
               xs[0].dtype)


def accept(got: np.ndarray, ref: Ref) -> np.ndarray:
    """Element-wise: is ``got`` (host array in ``ref.names`` order) within the bound?"""
    g = np.asarray(got).astype(np.float64)
    if g.shape != ref.value.shape:
        return np.zeros(ref.value.shape, dtype=bool)
    err = ref.err
    if ref.dtype == "float16":
        # a float16 output reaches the host as IEEE float16 whatever the device format: one
        # more rounding, with IEEE's subnormal step near zero (DLFloat16 has finer steps there)
        err = err + UNIT["IEEE_FP16"] * np.abs(ref.value) + TINY["IEEE_FP16"]
    with np.errstate(all="ignore"):
        ok = np.abs(g - ref.value) <= SAFETY * err
    return ok | (g == ref.value) | (np.isnan(g) & np.isnan(ref.value))  # NaN matches NaN (docs/semantics.md)


# -- ops the front end lowers to several graph ops, each from torch's definition of the op --------
# These take exact inputs (the tests' random values); their bound is the op's own computation.
def convolution(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, stride: Sequence[int],
                padding: Sequence[int], dilation: Sequence[int], groups: int, dtype: str,
                fp16_format: str = "SEN169_FP16") -> Ref:
    """``out[n, o, y...] = bias[o] + sum over c in o's group and taps k of
    x_padded[n, c, y * stride + k * dilation] * w[o, c, k]`` (1-d or 2-d), summed tap by tap in
    float64; the bound is a float32 sum of the R = channels/groups * taps products."""
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    spatial = x.ndim - 2
    xp = np.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in padding])
    taps = w.shape[2:]
    outs = [(xp.shape[2 + j] - dilation[j] * (taps[j] - 1) - 1) // stride[j] + 1 for j in range(spatial)]
    n, c = x.shape[:2]
    o = w.shape[0]
    cg, og = c // groups, o // groups
    v = np.zeros((n, o, *outs))
    mag = np.zeros_like(v)
    for k in np.ndindex(*taps):
        window = tuple(slice(k[j] * dilation[j], k[j] * dilation[j] + stride[j] * (outs[j] - 1) + 1, stride[j])
                       for j in range(spatial))
        xs = xp[(slice(None), slice(None)) + window]  # [n, c, outs...]
        for gi in range(groups):
            part = xs[:, gi * cg:(gi + 1) * cg]
            wk = w[gi * og:(gi + 1) * og, :, *k]  # [og, cg]
            v[:, gi * og:(gi + 1) * og] += np.einsum("nc...,oc->no...", part, wk)
            mag[:, gi * og:(gi + 1) * og] += np.einsum("nc...,oc->no...", np.abs(part), np.abs(wk))
    r = cg * int(np.prod(taps))
    e = r * F32 * mag
    if bias is not None:
        b = np.asarray(bias, np.float64).reshape((1, o) + (1,) * spatial)
        v = v + b
        e = e + 2 * F32 * np.abs(v)
    names = tuple(f"d{i}" for i in range(v.ndim))
    return _store(names, v, e, dtype, fp16_format, 2.0)


def topk(x: np.ndarray, k: int, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """The k largest values along ``axis`` in descending order and their positions: ties in
    position order, NaN larger than every number (torch's order). Exact."""
    x = np.asarray(x, np.float64)
    key = np.where(np.isnan(x), np.inf, x)
    # descending by value, NaN first, then by position: a stable sort of (-key, nan-first)
    order = np.lexsort((np.broadcast_to(np.arange(x.shape[axis]).reshape(
        [-1 if i == axis % x.ndim else 1 for i in range(x.ndim)]), x.shape), -key, ~np.isnan(x)), axis=axis)
    idx = np.take(order, np.arange(k), axis=axis)
    return np.take_along_axis(x, idx, axis=axis), idx


def constant_pad(x: np.ndarray, pad: Sequence[int], value: float) -> np.ndarray:
    """torch's ``constant_pad_nd``: ``pad`` lists (before, after) from the last axis backwards;
    a negative count removes elements. Exact."""
    x = np.asarray(x)
    for i in range(len(pad) // 2):
        axis, before, after = x.ndim - 1 - i, pad[2 * i], pad[2 * i + 1]
        lo, hi = max(-before, 0), x.shape[axis] - max(-after, 0)
        x = np.take(x, np.arange(lo, hi), axis=axis)
        widths = [(0, 0)] * x.ndim
        widths[axis] = (max(before, 0), max(after, 0))
        x = np.pad(x, widths, constant_values=value)
    return x


def repeat(x: np.ndarray, repeats: Sequence[int]) -> np.ndarray:
    """torch's ``Tensor.repeat``: ``x`` (with leading size-1 axes up to len(repeats)) tiled
    ``repeats[i]`` times along axis i. Exact."""
    x = np.asarray(x)
    x = x.reshape((1,) * (len(repeats) - x.ndim) + x.shape)
    out = x
    for axis, r in enumerate(repeats):
        out = np.concatenate([out] * r, axis=axis) if r else np.take(out, [], axis=axis)
    return out


def batch_norm_eval(x: np.ndarray, weight: np.ndarray | None, bias: np.ndarray | None, mean: np.ndarray,
                    var: np.ndarray, eps: float, dtype: str, fp16_format: str = "SEN169_FP16") -> Ref:
    """``(x - mean) / sqrt(var + eps) * weight + bias`` over axis 1, in float64; the bound is
    float32's for the five operations."""
    shape = (1, -1) + (1,) * (np.ndim(x) - 2)
    x = np.asarray(x, np.float64)
    v = (x - np.reshape(mean, shape)) / np.sqrt(np.reshape(var, shape) + eps)
    if weight is not None:
        v = v * np.reshape(weight, shape)
    if bias is not None:
        v = v + np.reshape(bias, shape)
    mag = np.abs(x - np.reshape(mean, shape)) / np.sqrt(np.reshape(var, shape) + eps)
    if weight is not None:
        mag = mag * np.abs(np.reshape(weight, shape))
    e = 16 * F32 * (mag + np.abs(v))
    return _store(tuple(f"d{i}" for i in range(v.ndim)), v, e, dtype, fp16_format, 2.0)


def max_pool2d(x: np.ndarray, kernel: Sequence[int], stride: Sequence[int], padding: Sequence[int],
               dilation: Sequence[int]) -> np.ndarray:
    """``out[..., y, x] = max over taps (i, j) of x_padded[..., y*stride + i*dilation, x*stride + j*dilation]``,
    padded with -inf. Exact."""
    x = np.asarray(x, np.float64)
    xp = np.pad(x, [(0, 0)] * (x.ndim - 2) + [(p, p) for p in padding], constant_values=-np.inf)
    outs = [(xp.shape[x.ndim - 2 + j] - dilation[j] * (kernel[j] - 1) - 1) // stride[j] + 1 for j in range(2)]
    best = np.full(x.shape[:-2] + tuple(outs), -np.inf)
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            a, b = i * dilation[0], j * dilation[1]
            best = np.maximum(best, xp[..., a:a + stride[0] * (outs[0] - 1) + 1:stride[0],
                                       b:b + stride[1] * (outs[1] - 1) + 1:stride[1]])
    return best
