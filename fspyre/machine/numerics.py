"""The numeric rules, written once and shared by the reference evaluator and the
machine-model interpreter (docs/semantics.md). Both call these functions on the same
decoded values, which is why pointwise results are bit-exact between them.

Compute precision: float32 when the result or any operand is a float type, else int32.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from fspyre.ir.dtypes import is_float

Value = np.ndarray | float | int | bool


@contextlib.contextmanager
def _one_thread() -> Iterator[Any]:
    """torch, on the calling thread only, for the duration. The oracle runs everywhere at once
    (parallel test workers, fuzz jobs) on hosts with few cores: library thread pools that
    spin-wait then fight each other and the other processes, and one call that takes 0.1 ms
    alone took 15 ms (measured: 8 BertLayer matmuls 250-380 ms through numpy's threaded BLAS,
    13-31 ms single-threaded, same run, load 3 on 2 CPUs). The results do not depend on it."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield torch
    finally:
        torch.set_num_threads(n)


def _erf(x: np.ndarray) -> np.ndarray:
    # numpy has no erf; torch (a dependency already) computes it vectorized in float32.
    x = np.asarray(x, dtype=np.float32)
    with _one_thread() as torch:
        # ascontiguousarray would turn a 0-d array into 1-d; keep the shape.
        return torch.special.erf(torch.from_numpy(np.array(x, dtype=np.float32, order="C"))).numpy().reshape(x.shape)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return (np.float32(1) / (np.float32(1) + np.exp(-x))).astype(np.float32)


def _gelu(x: np.ndarray) -> np.ndarray:
    # erf form (torch's default, approximate="none")
    return (np.float32(0.5) * x * (np.float32(1) + _erf(x * np.float32(0.7071067811865476)))).astype(np.float32)


def _where(c: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.where(c != 0, a, b)


# maximum and minimum order -0 below +0 (IEEE 754-2019 maximum/minimum), so they commute bit
# for bit: numpy's return one zero or the other by operand order, and a swapped operand, a
# tile or a core split of an amax would otherwise change the sign of a zero result. For two
# zeros a + b is +0 unless both are -0, and -((-a) + (-b)) is -0 unless both are +0.
def _maximum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    r = np.maximum(a, b)
    if r.dtype.kind == "f":
        zeros = (np.asarray(a) == 0) & (np.asarray(b) == 0)
        if zeros.any():
            r = np.where(zeros, a + b, r)
    return r


def _minimum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    r = np.minimum(a, b)
    if r.dtype.kind == "f":
        zeros = (np.asarray(a) == 0) & (np.asarray(b) == 0)
        if zeros.any():
            r = np.where(zeros, -((-a) + (-b)), r)
    return r


def _zero_sign(r: np.ndarray, v: np.ndarray, axes: tuple[int, ...], fn: str) -> np.ndarray:
    """An amax (amin) whose result is a zero: +0 (-0) if any reduced zero is one, as the pairwise
    ``_maximum`` (``_minimum``) gives in every order."""
    if r.dtype.kind != "f":
        return r
    zero = np.asarray(r) == 0
    if not zero.any():
        return r
    want_neg = fn == "amin"
    has = np.any((v == 0) & (np.signbit(v) == want_neg), axis=axes)
    sign = r.dtype.type(-0.0 if want_neg else 0.0)
    return np.where(zero, np.where(has, sign, -sign), r)


POINTWISE: dict[str, Callable[..., np.ndarray]] = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
    "maximum": _maximum,
    "minimum": _minimum,
    "pow": np.power,
    "neg": np.negative,
    "abs": np.abs,
    "exp": np.exp,
    "log": np.log,
    "log1p": np.log1p,
    "fmod": np.fmod,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: np.float32(1) / np.sqrt(x),
    "reciprocal": lambda x: np.float32(1) / x,
    "relu": lambda x: np.maximum(x, x.dtype.type(0)),
    "sigmoid": _sigmoid,
    "tanh": np.tanh,
    "sin": np.sin,
    "cos": np.cos,
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
    "where": _where,
}

# identity element and pairwise combine of each reduction (used across cores and tiles)
# (gather: every part but the one holding the selected position contributes 0)
REDUCE_IDENTITY: dict[str, float] = {
    "sum": 0.0, "mean": 0.0, "matmul": 0.0, "prod": 1.0, "amax": -np.inf, "amin": np.inf, "gather": 0.0,
}
REDUCE_COMBINE: dict[str, str] = {
    "sum": "add", "mean": "add", "matmul": "add", "prod": "mul", "amax": "maximum", "amin": "minimum",
    "gather": "add",
}


def compute_dtype(out_dtype: str, operand_dtypes: Sequence[str], scalars: Sequence[object] = ()) -> np.dtype:
    """float32 when the result, a tensor operand or a scalar operand is a float; else int32.
    A float scalar counts (as torch promotes it): ``int_tensor < 2.5`` compares in float32,
    not against a truncated 2."""
    if (is_float(out_dtype) or any(is_float(d) for d in operand_dtypes)
            or any(isinstance(v, float) for v in scalars)):
        return np.dtype(np.float32)
    return np.dtype(np.int32)


def _as(value: Value, dtype: np.dtype) -> Value:
    if isinstance(value, np.ndarray):
        return value.astype(dtype, copy=False)
    return dtype.type(value)


# Pointwise fns whose every result is exact or correctly rounded by IEEE, so no numpy kernel
# choice (``_dense``) can change it: computed once where the operands do not vary, their
# result may be spread afterwards.
EXACT_POINTWISE = frozenset({"add", "sub", "mul", "div", "maximum", "minimum", "fmod", "neg", "abs", "sqrt", "relu",
                             "copy", "cast", "logical_not", "eq", "ne", "lt", "le", "gt", "ge", "where"})


def pointwise(fn: str, operands: Sequence[Value], ctype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """Apply ``fn`` elementwise in compute dtype ``ctype``; the result has ``shape``."""
    if fn == "full":
        return np.full(shape, _as(operands[0], ctype), dtype=ctype)
    size = math.prod(shape)
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
    if isinstance(v, np.ndarray) and v.shape == tuple(shape):
        a = v.reshape(size)  # the common case, without broadcast_to's Python
    else:
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
    if fn == "gather":
        hit = _gather_hits(operands, grid)
        with np.errstate(all="ignore"):
            return np.sum(np.where(hit, _as(operands[2], ctype), ctype.type(0)), axis=axes, dtype=ctype)
    x = [np.asarray(_as(v, ctype)) for v in operands]
    if fn != "matmul":
        x = [np.broadcast_to(v, grid) for v in x]
    with np.errstate(all="ignore"):
        if fn == "matmul":
            return _contract(x[0], x[1], axes, grid, ctype)
        v = x[0]
        if fn == "amax":
            return _zero_sign(np.max(v, axis=axes), v, axes, fn)
        if fn == "amin":
            return _zero_sign(np.min(v, axis=axes), v, axes, fn)
        # numpy's summation order follows the operand's memory layout (pairwise along a
        # contiguous axis, sequential across strided ones), so the same values summed from a
        # tile and from the whole tensor could round differently. One contiguous flattened
        # reduced axis makes the order a function of the values alone.
        flat = _reduced_last(v, axes)
        if fn in ("sum", "mean"):
            out = np.sum(flat, axis=-1, dtype=ctype)
            return (out * ctype.type(1.0 / count)).astype(ctype) if fn == "mean" else out
        if fn == "prod":
            return np.prod(flat, axis=-1, dtype=ctype)
        if fn == "var":
            mean = np.sum(flat, axis=-1, dtype=ctype, keepdims=True) * ctype.type(1.0 / count)
            sq = np.sum((flat - mean) ** 2, axis=-1, dtype=ctype)
            return (sq / ctype.type(max(count - correction, 0))).astype(ctype)
    raise KeyError(fn)


def _reduced_last(v: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """``v`` with the reduced ``axes`` moved last and flattened into one contiguous axis."""
    kept = [i for i in range(v.ndim) if i not in axes]
    moved = np.ascontiguousarray(np.transpose(v, kept + list(axes)))
    return moved.reshape(tuple(v.shape[i] for i in kept) + (math.prod(v.shape[i] for i in axes),))


def _contract(a: np.ndarray, b: np.ndarray, axes: tuple[int, ...], grid: tuple[int, ...],
              ctype: np.dtype | None = None) -> np.ndarray:
    """sum over ``axes`` of a*b, with a and b broadcast over the grid, as one batched BLAS
    matmul (``np.matmul``: [batch, M, K] @ [batch, K, N]) without materialising the product
    grid. Float operands go to one float32 GEMM (its K-sum in BLAS's order, docs/semantics.md
    rule 5), the result in ``ctype`` (default: the operands' dtype); integers to numpy's."""
    ctype = a.dtype if ctype is None else ctype
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
    # (in ``ctype``, from ``ctype`` values: widened operands sum as the narrow ones would)
    if only_a:
        a = np.sum(a.astype(ctype, copy=False), axis=only_a, keepdims=True, dtype=ctype)
    if only_b:
        b = np.sum(b.astype(ctype, copy=False), axis=only_b, keepdims=True, dtype=ctype)
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
    if am.dtype.kind == "f":
        # one float32 GEMM (torch's, single-threaded: see _one_thread) over the stacked
        # per-core operands, accumulating in float32 like any other sum: its order is BLAS's,
        # within check's bound for any order (docs/semantics.md)
        with _one_thread() as torch:
            res = torch.matmul(_float32(torch, am, ctype), _float32(torch, bm, ctype)).numpy().astype(ctype)
    else:
        res = np.matmul(am, bm)
    if repeat != 1:
        res = res * res.dtype.type(repeat)
    # back to grid order over the output axes; axes neither operand carries come back as size 1
    res = res.reshape([grid[i] for i in batch + m_ax + n_ax] + [1] * len([i for i in drop if i in out_axes]))
    order = batch + m_ax + n_ax + [i for i in drop if i in out_axes]
    res = np.transpose(res, [order.index(i) for i in out_axes])
    return np.broadcast_to(res, [grid[i] for i in out_axes])


def _gather_hits(operands: Sequence[Value], grid: tuple[int, ...]) -> np.ndarray:
    """Where a gather's index equals the position (compared as integers, not in the compute
    dtype: float32 would merge indices past 2^24), broadcast over ``grid``."""
    index, positions = (np.asarray(v).astype(np.int64) for v in operands[:2])
    return np.broadcast_to(index == positions, grid)


def gather_misses(operands: Sequence[Value], axes: tuple[int, ...], grid: tuple[int, ...]) -> str | None:
    """None when every index of a gather equals exactly one position over ``axes`` (all of
    the reduced axes, across every core's part); else what is wrong, for the ExecutionError."""
    hits = np.sum(_gather_hits(operands, grid), axis=axes)
    if np.all(hits == 1):
        return None
    # the reduced axes trail the grid (both callers order it so): an output point is a prefix
    index = np.broadcast_to(np.asarray(operands[0]).astype(np.int64), grid)
    pos = np.asarray(operands[1]).astype(np.int64)
    bad = tuple(int(i[0]) for i in np.nonzero(hits != 1))
    return (f"index {int(index[bad + (0,) * len(axes)])} at {list(bad)} matches {int(hits[bad])} of the "
            f"positions {int(pos.min())}..{int(pos.max())}; every index must name exactly one")
def _float32(torch, x: np.ndarray, ctype: np.dtype):
    """``x`` as a torch tensor of ``ctype``; operands already of it go in as they lie (BLAS
    takes a transposed matrix by its strides; GEMM packs either layout into the same panels)."""
    if x.dtype == ctype and x.flags.writeable and min(x.strides, default=0) >= 0:
        return torch.from_numpy(x)
    return torch.from_numpy(np.ascontiguousarray(x, dtype=ctype))


def combine(fn: str, acc: np.ndarray, part: np.ndarray) -> np.ndarray:
    """Fold a partial result of reduction ``fn`` into an accumulator (cross-core, cross-tile)."""
    with np.errstate(all="ignore"):
        return POINTWISE[REDUCE_COMBINE[fn]](acc, part)


# ---------------------------------------------------------------------------------------------
# Error bounds (docs/semantics.md, "What check promises"). Each function returns, per element,
# an upper bound on |machine value - reference value| given bounds on the operands, or None
# when the result is exactly equal (same operands, same function: the pointwise rule).

UNIT_ROUNDOFF = 2.0**-24  # float32, round to nearest
_F32_SUBNORMAL = 2.0**-149  # float32's spacing below its normal range
# a numpy/torch float32 library function is within a few ulps of exact; both sides evaluate it
# on different operands, so each contributes its own error once
_FN_ULPS = 4.0
_LIPSCHITZ = {"neg": 1.0, "abs": 1.0, "relu": 1.0, "copy": 1.0, "cast": 1.0, "sin": 1.0, "cos": 1.0,
              "gelu": 1.13,  # max |d/dx x·Φ(x)| = 1.1289 at x = √2
              "silu": 1.10}  # max |d/dx x·σ(x)| = 1.0998 at x ≈ 2.4
_COMPARE = {"eq", "ne", "lt", "le", "gt", "ge"}
# fn -> operand positions where the function has a pole or leaves its domain at 0
_POLES = {"div": (1,), "reciprocal": (0,), "rsqrt": (0,), "log": (0,), "sqrt": (0,), "pow": (0,)}
# (log1p's pole is at -1: the corner evaluation gives -inf or nan there, hence an infinite bound)


def _f64(v: Value, shape: tuple[int, ...]) -> np.ndarray:
    return np.broadcast_to(np.asarray(v, dtype=np.float64), shape)


def pointwise_bound(fn: str, operands: Sequence[Value], errors: Sequence[np.ndarray | None],
                    shape: tuple[int, ...]) -> np.ndarray | None:
    """Bound on the change of ``fn``'s float32 result when each operand may be off by its error.

    Monotone functions and bilinear ones (add, sub, mul, div, maximum, minimum, pow, exp, log,
    sqrt, rsqrt, reciprocal, sigmoid, tanh) take their extremes over the operand box at its
    corners, evaluated in float64; a box that touches a pole or the edge of the domain gives
    an infinite bound. Non-monotone smooth functions use their Lipschitz constant; comparisons,
    logical_not and where's condition give the full jump where the operands could cross."""
    if fn == "full" or all(e is None for e in errors):
        return None
    x = [_f64(v, shape) for v in operands]
    e = [np.zeros(shape) if er is None else _f64(er, shape) for er in errors]
    with np.errstate(all="ignore"):
        if fn in _COMPARE:
            return np.where(np.abs(x[0] - x[1]) <= e[0] + e[1], 1.0, 0.0)
        if fn == "logical_not":
            return np.where(np.abs(x[0]) <= e[0], 1.0, 0.0)
        if fn == "fmod":
            # a - trunc(a / b) * b: Lipschitz in a (1) and b (|trunc(a / b)|) while the
            # quotient cannot change over the operand box; where it can, the result jumps by
            # about |b|: anything goes, like where's condition
            a, b = x
            q = np.trunc(a / b)
            corners = [np.trunc((a + sa * e[0]) / (b + sb * e[1])) for sa in (-1, 1) for sb in (-1, 1)]
            jumps = np.any([c != q for c in corners], axis=0) | (np.abs(b) <= e[1]) | np.isnan(q)
            d = np.where(jumps, np.inf, e[0] + np.abs(q) * e[1])
            return np.where(d > 0, d + 2 * _FN_ULPS * np.maximum(UNIT_ROUNDOFF * np.abs(a), _F32_SUBNORMAL), 0.0)
        if fn == "where":
            c, a, b = x
            may_flip = ~(np.abs(c) > e[0])
            return np.where(may_flip, np.abs(a - b) + np.maximum(e[1], e[2]), np.where(c != 0, e[1], e[2]))
        if fn in _LIPSCHITZ:
            d = _LIPSCHITZ[fn] * e[0]
            y = np.abs(x[0]) + d
        else:
            f = POINTWISE[fn]
            y0 = f(*x)
            d = np.zeros(shape)
            for corner in range(1 << len(x)):
                pts = [xi + (ei if corner >> i & 1 else -ei) for i, (xi, ei) in enumerate(zip(x, e))]
                fc = f(*pts)
                # a NaN result at a corner as at the centre: NaN on both sides (check requires
                # the machine's NaN where the reference has one), no change
                d = np.maximum(d, np.where(np.isnan(fc) & np.isnan(y0), 0.0, np.abs(fc - y0)))
            for i in _POLES.get(fn, ()):
                d = np.where(np.abs(x[i]) <= e[i], np.inf, d)
            d = np.where(np.isnan(d), np.inf, d)  # the box leaves the domain: anything goes
            y = np.abs(y0) + d
        # exactly equal operands give exactly equal results: no slack where nothing came in.
        # Each side's float32 result is within the library's ulps of exact: relative above
        # float32's normal range, one subnormal spacing (2^-149) each below it.
        return np.where(d > 0, d + 2 * _FN_ULPS * np.maximum(UNIT_ROUNDOFF * y, _F32_SUBNORMAL), 0.0)


_F32_MAX = float(np.finfo(np.float32).max)
_F32_TINY = 2.0**-126  # float32's smallest normal: below it a product loses its relative accuracy


def _order_free_of_overflow(bound: np.ndarray, result: np.ndarray, magnitude: np.ndarray) -> np.ndarray:
    """A reduction's order term made sound where the float32 error model does not hold.

    - A NaN term (a NaN operand, ``inf - inf``, ``0 * inf``) makes the result NaN in every
      order: nothing to bound (check requires NaN on both sides), 0 -- not the NaN the
      magnitudes give.
    - Where ``magnitude`` -- the largest value a partial result may reach in some order
      (Σ|tᵢ| for a sum) -- passes float32's largest finite value, one order overflows to ±inf
      (then ``inf - inf`` to NaN) where another does not: any value, an infinite bound."""
    with np.errstate(invalid="ignore"):
        over = magnitude * (1 + 4 * UNIT_ROUNDOFF) >= _F32_MAX  # False where NaN
    nan = np.isnan(np.asarray(result, dtype=np.float64)) & ~over
    return np.where(nan, 0.0, np.where(over, np.inf, bound))


def _gamma(n: int) -> float:
    """γₙ = n·u/(1 − n·u): relative error bound of an n-term float32 sum or product in any
    order (Higham, Accuracy and Stability of Numerical Algorithms, §3.1, §4.2)."""
    nu = n * UNIT_ROUNDOFF
    return nu / (1 - nu) if nu < 1 else np.inf


def reduce_bound(fn: str, operands: Sequence[np.ndarray], errors: Sequence[np.ndarray | None],
                 axes: tuple[int, ...], ctype: np.dtype, count: int, grid: tuple[int, ...],
                 result: np.ndarray, correction: int = 0) -> np.ndarray | None:
    """Bound on |machine − reference| of a reduction's float32/int32 result.

    Two parts: the *order* term -- the machine may split the reduction across cores and tiles,
    so each side is within γₙ·Σ|terms| of the exact sum (n = ``count``) and the two within
    2γₙ·Σ|terms| (0 for amax/amin and for integers, which are exact in any order) -- and the
    *incoming* term, the operands' own errors carried through the reduction."""
    order_free = ctype.kind != "f" or fn in ("amax", "amin")  # exact in any order
    if order_free and all(e is None for e in errors):
        return None
    exact_ints = ctype.kind != "f"
    g2 = 0.0 if exact_ints else 2 * _gamma(count)
    absr = np.abs(np.asarray(result, dtype=np.float64))
    absr = np.where(np.isnan(absr), 0.0, absr)  # a NaN result rounds to NaN on both sides: no slack
    with np.errstate(all="ignore"):
        if fn == "gather":
            # the selected value itself: its own error, unless the index or a position is
            # uncertain (another row could be selected: anything goes)
            if any(er is not None and np.any(er) for er in errors[:2]):
                return np.full(np.shape(result), np.inf)
            if errors[2] is None:
                return None
            hit = _gather_hits(operands, grid)
            return np.sum(np.where(hit, np.broadcast_to(np.asarray(errors[2], dtype=np.float64), grid), 0.0),
                          axis=axes)
        if fn == "matmul":
            a, b = (np.abs(np.asarray(v, dtype=np.float64)) for v in operands)
            ea, eb = (np.zeros(()) if er is None else np.asarray(er, dtype=np.float64) for er in errors)
            mag = _contract(a, b, axes, grid)
            bound = g2 * mag
            if not exact_ints:
                bound = _order_free_of_overflow(bound, result, mag)
            for p, q in ((a, eb), (ea, b), (ea, eb)):
                if np.any(p) and np.any(q):
                    bound = bound + _contract(p, q, axes, grid)
            return bound
        x = np.broadcast_to(np.asarray(operands[0], dtype=np.float64), grid)
        e = np.zeros(()) if errors[0] is None else np.broadcast_to(np.asarray(errors[0], dtype=np.float64), grid)
        e = np.broadcast_to(e, grid)
        if fn in ("amax", "amin"):
            return np.max(e, axis=axes)
        if fn in ("sum", "mean"):
            mag = np.sum(np.abs(x), axis=axes)
            bound = g2 * mag
            if not exact_ints:
                bound = _order_free_of_overflow(bound, result, mag)
            bound = bound + np.sum(e, axis=axes)
            # mean: both sides scale by the same float32 1/N, each rounding once more
            return bound / count + 2 * UNIT_ROUNDOFF * absr if fn == "mean" else bound
        if fn == "prod":
            ax = np.abs(x)
            mag = np.prod(ax, axis=axes)
            # (a NaN term: NaN in every order, its error nothing to carry)
            incoming = np.where(np.isnan(result), 0.0, np.prod(ax + e, axis=axes) - mag)
            if exact_ints:
                return g2 * mag + incoming
            # A partial product of any order multiplies a subset of the terms, so it lies
            # between the product of the terms below 1 and of those above. Above float32's
            # range some order overflows (prod_bound); below its normal range a rounding is
            # absolute, 2^-150, and grows by at most the product of the later terms, at most
            # that of the terms above 1.
            big = np.prod(np.where(ax > 1, ax, 1.0), axis=axes)
            small = np.prod(np.where(ax < 1, ax, 1.0), axis=axes)
            bound = g2 * mag + np.where(small < _F32_TINY, 2 * count * 2.0**-150 * (1 + g2) * big, 0.0)
            return _order_free_of_overflow(bound, result, big) + incoming
        if fn == "var":
            mean = np.mean(x, axis=axes, keepdims=True)
            d = np.abs(x - mean)
            # the mean's own error (order + incoming) moves every deviation by at most ebar
            ebar = (g2 * np.sum(np.abs(x), axis=axes, keepdims=True) + np.sum(e, axis=axes, keepdims=True)) / count
            de = e + ebar
            denom = max(count - correction, 1)
            sq = np.sum((d + de) ** 2, axis=axes)
            order = _order_free_of_overflow(g2 * sq, result, np.maximum(sq, np.sum(np.abs(x), axis=axes)))
            bound = (np.sum(2 * d * de + de * de, axis=axes) + order) / denom
            return bound + 2 * UNIT_ROUNDOFF * absr
    raise KeyError(fn)


def online_sum_bound(e: np.ndarray, err: np.ndarray | None, axis: int, count: int, grid: tuple[int, ...],
                     d_format: str, e_format: str) -> np.ndarray:
    """Bound on |machine − reference| of ``l = sum(e)`` over ``axis`` where ``e = exp(d)``,
    ``d = s − amax(s)`` (a softmax's denominator), for any compilation: untiled, tiled (the
    reassociation of any sum) or the online recurrence (docs/semantics.md, "Online softmax"),
    which computes each term against the running max ``m_j`` of its tile j and rescales the
    running sum by ``alpha_k = exp(m_{k-1} − m_k)`` at every later tile k that raises the max.

    Counting the roundings per term i, against the exact ``exp(s_i − M)``:

    - both programs round the exponent's argument, the online one once in ``s_i − m_j`` and
      once in each ``m_{k-1} − m_k``; those magnitudes add up to ``M − s_i = |d_i|`` (the max
      only grows), so each side's arguments are off by at most ``u_d·|d_i|`` (u_d: d's store
      format, at least float32's) plus the format's flush floor, a factor ``exp(u_d·|d_i|)``;
    - each exp (the term's, and every alpha after it) is within the library's 4 ulps: 8u;
    - each alpha ≠ 1 multiplies the running sum, one float32 rounding (u); an alpha of a tile
      that does not raise the max is exp(0) = 1 and exact;
    - each term is stored in e's format (u_e, 0 for float32), and the sums of both sides are
      within γₙ of their exact sums in any order.

    Only a tile holding a new prefix maximum of ``s`` raises the max, and its largest term is
    then at least every earlier term (to the library's tolerance), so the rises after term i
    are at most ``R_i``, the weak prefix records of ``e`` after position i. ``|d_i|`` is read
    back from ``e_i`` (``|ln e_i|``, which a term of 0 does not need)."""
    x = np.broadcast_to(np.asarray(e, dtype=np.float64), grid)
    x = np.abs(np.moveaxis(x, axis, -1))
    u, lib = UNIT_ROUNDOFF, 2 * _FN_ULPS * UNIT_ROUNDOFF
    u_d, floor_d = max(unit_roundoff(d_format)[0], u), unit_roundoff(d_format)[1]
    u_e, floor_e = unit_roundoff(e_format)
    with np.errstate(all="ignore"):
        # weak prefix records: e_i at least the largest earlier term, to the exp's tolerance
        before = np.concatenate([np.zeros(x.shape[:-1] + (1,)), np.maximum.accumulate(x, axis=-1)[..., :-1]], axis=-1)
        record = x >= before * (1 - 2 * lib - 4 * u_e)
        after = record.sum(axis=-1, keepdims=True) - np.cumsum(record, axis=-1)  # R_i
        arg = np.exp(u_d * (np.where(x > 0, np.abs(np.log(x)), 0.0) + 2 ** -20) + floor_d)
        ref = arg * (1 + lib) * (1 + u_e) - 1
        online = arg * (1 + lib) ** (1 + after) * (1 + u) ** after * (1 + u_e) - 1
        g = _gamma(count)
        terms = x * (1 + 2 * ref) * (ref + online + 2 * g * (1 + online)) + 2 * floor_e
        bound = np.sum(terms, axis=-1)
        # the terms' sum in float32, and the NaN of a NaN row, as for any sum
        bound = _order_free_of_overflow(bound, np.sum(x, axis=-1), np.sum(x, axis=-1))
    if err is not None:
        bound = bound + np.sum(np.broadcast_to(np.asarray(err, dtype=np.float64), grid), axis=axis)
    return bound


def unit_roundoff(fmt_name: str) -> tuple[float, float]:
    """(relative, absolute near zero) error of one round-to-nearest store to a float format:
    half a unit in the last place, and the spacing below which it flushes or goes subnormal
    (float32 stores are exact: the compute type is float32)."""
    if fmt_name not in _STORE_GRID:
        return 0.0, 0.0
    bits, floor, _ = _STORE_GRID[fmt_name]
    return 2.0 ** -(bits + 1), floor


# (fraction bits, smallest spacing near zero, largest finite) of each float device format: a
# store rounds to nearest, so two values |a − b| apart are stored at most |a − b| + ulp apart,
# ulp taken at the larger magnitude; near zero the spacing is the smallest step the format
# takes there (DLFloat16 flushes below 2^-31, so it can jump by 2^-30).
_STORE_GRID = {
    "SEN169_FP16": (9, 2.0**-30, 8573157376.0),
    "IEEE_FP16": (10, 2.0**-24, 65504.0),
    "BF16": (7, 2.0**-133, 3.3895313892515355e38),
}


def ulp(magnitude: np.ndarray, fraction_bits: int, floor: float) -> np.ndarray:
    """Spacing of a binary float format with ``fraction_bits`` at ``magnitude``, at least ``floor``."""
    with np.errstate(divide="ignore"):
        exp = np.floor(np.log2(np.maximum(magnitude, floor)))
    return np.maximum(np.exp2(exp - fraction_bits), floor)


def store_bound(pre: np.ndarray, err: np.ndarray | None, fmt_name: str, dtype: str) -> np.ndarray | None:
    """Bound after a store of ``pre`` (the reference's float32/int32 value) with error ``err``
    to format ``fmt_name`` for host dtype ``dtype`` (bool stores keep value != 0)."""
    if err is None:
        return None
    pre = np.abs(np.asarray(pre, dtype=np.float64))
    with np.errstate(all="ignore"):
        if dtype == "bool":
            return np.where(~(pre > err), 1.0, 0.0)
        if fmt_name in ("IEEE_INT32", "SENINT8"):
            return np.where(err > 0, err + 1.0, 0.0)  # truncation of two values d apart: ints < d + 1 apart
        if fmt_name not in _STORE_GRID:
            return err  # IEEE_FP32: the float32 result is stored as it is
        bits, floor, top = _STORE_GRID[fmt_name]
        m = pre + err
        out = np.where(err > 0, err + ulp(m, bits, floor), 0.0)
        # a NaN stores as NaN on both sides: the bound it had (finite: NaN must match NaN)
        return np.where(np.isnan(pre), err, np.where(m > top, np.inf, out))


def host_bound(values: np.ndarray, err: np.ndarray, fmt_name: str, dtype: str) -> np.ndarray:
    """Copy-out of a DLFloat16 value to a float16 host array rounds once more (float16 has
    subnormals below 2^-14 and ends at 65504)."""
    if dtype != "float16" or fmt_name != "SEN169_FP16":
        return err
    v = np.abs(np.asarray(values, dtype=np.float64))
    m = v + err
    with np.errstate(invalid="ignore"):
        out = np.where(err > 0, err + ulp(m, 10, 2.0**-24), 0.0)
        return np.where(np.isnan(v), err, np.where(m > 65504.0, np.inf, out))
