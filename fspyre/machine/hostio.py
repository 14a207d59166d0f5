"""Host <-> device values: checking user arrays, rounding them to the device format, and
turning device values back into host arrays. Shared by the evaluator and the interpreter."""

from __future__ import annotations

import functools
from collections.abc import Mapping

import numpy as np

from fspyre.errors import ExecutionError
from fspyre.ir.dtypes import HOST_NUMPY, is_float
from fspyre.ir.graph import TensorType
from fspyre.machine import formats
from fspyre.machine.spyre import Machine


def check_inputs(types: Mapping[str, TensorType], inputs: Mapping[str, object]) -> dict[str, np.ndarray]:
    """Validate names, shapes and dtypes; returns host arrays of the expected numpy dtype."""
    if not isinstance(inputs, Mapping):
        raise ExecutionError(
            f"inputs: expected a dict {{input name: array}} for {list(types)}, got {type(inputs).__name__}"
        )
    missing = [n for n in types if n not in inputs]
    extra = [n for n in inputs if n not in types]
    if missing or extra:
        raise ExecutionError(
            f"inputs: missing {missing or 'none'}, unexpected {extra or 'none'}; the graph takes {list(types)}"
        )
    out = {}
    for name, t in types.items():
        try:
            arr = np.asarray(inputs[name])
        except (ValueError, TypeError) as err:
            raise ExecutionError(f"input {name}: not an array ({err}); pass a numpy array of shape {list(t.shape)}") \
                from err
        if arr.shape != t.shape:
            raise ExecutionError(f"input {name}: shape {list(arr.shape)} but the graph declares {list(t.shape)} ({t})")
        want = HOST_NUMPY[t.dtype]
        if arr.dtype != want:
            ok = np.can_cast(arr.dtype, want, casting="same_kind") or (t.dtype == "bool" and arr.dtype.kind in "iub")
            if not ok:
                raise ExecutionError(
                    f"input {name}: dtype {arr.dtype} cannot be used as {t.dtype}; pass a {want} array"
                )
            if want.kind == "i" and arr.dtype.kind in "iu" and arr.size:
                # astype would wrap an out-of-range integer silently.
                info = np.iinfo(want)
                lo, hi = int(arr.min()), int(arr.max())
                if lo < info.min or hi > info.max:
                    bad = lo if lo < info.min else hi
                    raise ExecutionError(
                        f"input {name}: value {bad} does not fit {t.dtype} ({info.min}..{info.max})"
                    )
            if want.kind == "f" and arr.dtype.kind == "f" and arr.size:
                # astype would turn a finite value past the format's range into inf silently
                finite = np.isfinite(arr)
                big = np.abs(np.where(finite, arr, 0)).max()
                if big > np.finfo(want).max:
                    raise ExecutionError(f"input {name}: value {big:g} does not fit {t.dtype} "
                                         f"(largest finite {np.finfo(want).max:g})")
            arr = arr.astype(want)
        out[name] = arr
    return out


def device_values(host: np.ndarray, dtype: str, machine: Machine) -> np.ndarray:
    """What the device holds after the host copies ``host`` in: values rounded to the device
    format, as float32 (float formats, bool) or int32."""
    fmt = formats.FORMATS[machine.device_format(dtype)]
    return formats.round_to(compute_values(host, dtype), fmt)


def compute_values(host: np.ndarray, dtype: str) -> np.ndarray:
    if is_float(dtype) or dtype == "bool":
        return np.asarray(host, dtype=np.float32)
    return np.asarray(host, dtype=np.int32)


def to_host(values: np.ndarray, dtype: str) -> np.ndarray:
    """Device values -> the host array the user gets back."""
    if dtype == "bool":
        return values != 0
    with np.errstate(over="ignore"):  # DLFloat16 values past float16's range become +-inf (semantics.md)
        return values.astype(HOST_NUMPY[dtype])


# A float16 host array has 65,536 bit patterns and a 2-byte device format as many: copy-in and
# copy-out of such tensors are one table lookup per element, the tables being the copy rules
# above applied once to every pattern.


def device_bits(host: np.ndarray, dtype: str, fmt: formats.DataFormat) -> np.ndarray:
    """The bit patterns a copy-in stores: ``encode(compute_values(host, dtype), fmt)``."""
    if host.dtype == np.float16:
        return formats.lookup16(_copy_in_table(dtype, fmt), host.view(np.uint16))
    return formats.encode(compute_values(host, dtype), fmt)


def host_array(raw: np.ndarray, fmt: formats.DataFormat, dtype: str) -> np.ndarray:
    """What a copy-out of the bit patterns ``raw`` gives back: ``to_host(decode(raw, fmt), dtype)``."""
    if fmt.nbytes == 2 and HOST_NUMPY[dtype] == np.float16:
        return formats.lookup16(_copy_out_table(fmt, dtype), np.asarray(raw, dtype=np.uint16)).view(np.float16)
    return to_host(formats.decode(raw, fmt), dtype)


@functools.lru_cache(maxsize=None)
def _copy_in_table(dtype: str, fmt: formats.DataFormat) -> np.ndarray:
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    table = formats.encode(compute_values(every, dtype), fmt)
    table.setflags(write=False)
    return table


@functools.lru_cache(maxsize=None)
def _copy_out_table(fmt: formats.DataFormat, dtype: str) -> np.ndarray:
    table = to_host(formats.decode(np.arange(1 << 16, dtype=np.uint32).astype(np.uint16), fmt), dtype).view(np.uint16)
    table.setflags(write=False)
    return table


def random_inputs(types: Mapping[str, TensorType], seed: int = 0) -> dict[str, np.ndarray]:
    """Deterministic test inputs: floats in [-2, 2), ints in [-8, 8), bools fair coins."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, t in types.items():
        if is_float(t.dtype):
            v = rng.uniform(-2.0, 2.0, size=t.shape).astype(np.float32)
            if t.dtype == "bfloat16":
                v = formats.round_to(v, formats.BF16)
            out[name] = v.astype(HOST_NUMPY[t.dtype])
        elif t.dtype == "int32":
            out[name] = rng.integers(-8, 8, size=t.shape, dtype=np.int32)
        else:
            out[name] = rng.integers(0, 2, size=t.shape).astype(bool)
    return out


def wide_inputs(types: Mapping[str, TensorType], seed: int = 0) -> dict[str, np.ndarray]:
    """``random_inputs`` that defeat shift and scale invariances: each row (index of the first
    dim) of a float tensor shifted by its own constant in [-64, 64) and each element scaled by
    2^k, k in [-4, 4] (a softmax with the wrong running max underflows where a row lies far
    below 0, a mean with the wrong count or a normalisation by the wrong scale shows, where
    values of one magnitude around 0 may hide them). Ints and bools as ``random_inputs``."""
    out = random_inputs(types, seed)
    rng = np.random.default_rng(seed + 1)
    for name, t in types.items():
        if is_float(t.dtype):
            v = out[name].astype(np.float32) * np.exp2(rng.integers(-4, 5, size=t.shape)).astype(np.float32)
            rows = t.shape[:1] + (1,) * (len(t.shape) - 1)
            v = v + rng.uniform(-64.0, 64.0, size=rows).astype(np.float32)
            if t.dtype == "bfloat16":
                v = formats.round_to(v, formats.BF16)
            out[name] = v.astype(HOST_NUMPY[t.dtype])
    return out
