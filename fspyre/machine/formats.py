"""Device data formats of the Spyre machine model, with vectorized encode/decode.

A *format* is how one element is laid out in device memory. The machine model computes in
float32 (float formats) or int32 (integer formats); a store to memory keeps
``round_to(value, fmt)`` and writes the bit pattern ``encode(value, fmt)``.

Every conversion is whole-array integer arithmetic on the float32 bit pattern: no per-element
Python. That arithmetic is the definition; the hot paths read tables built from it (decoding a
2-byte format: one entry per bit pattern; encoding DLFloat16: one entry per top 19 bits of a
float32, see ``_dlf16_encode_table``), and large arrays go block by block so each step's
temporaries stay in the CPU cache (4M values: DLFloat16 encode 25 -> 6 ms, decode 10 -> 4 ms).

SEN169_FP16 = IBM DLFloat16
---------------------------
Sources, abbreviated in the comments below:

- [ARITH19] A. Agrawal et al., "DLFloat: A 16-b Floating Point Format Designed for Deep Learning
  Training and Inference", ARITH 2019 (abstract on research.ibm.com): 1 sign, 6 exponent and
  9 fraction bits; no subnormals; fewer rounding modes and corner cases than IEEE.
- [PATENT] US 10,656,913 B2 / US 2019/0369960 (IBM), "Enhanced low precision binary
  floating-point formatting": the lowest binade holds zero *and* normal numbers; the highest
  binade gives one point to a merged NaN/infinity and keeps the rest finite; the signs of zero
  and NaN/infinity are "don't care"; the only rounding mode is "round to nearest up".
- [NNP1] onnx-mlir ``src/Accelerators/NNPA/Support/Stickify/DLF16Conversion.hpp``, class
  ``NNP1`` (IBM's reference software conversion for the same format on the z16 NNPA), plus
  ``DLF16_MAX`` in onnx-mlir and ``DLF16_MAX_AS_FP32`` in IBM/zDNN ``zdnn_private.h``.

The rules implemented, all as in [NNP1] bit for bit:

- value = (-1)^s * 2^(e - 31) * (1 + f/512); bias 31 = 2^(6-1) - 1.
- e = 0 is an ordinary normal binade, except that pattern e=0, f=0 is zero [PATENT]. So the
  smallest positive value is 2^-31 * (1 + 2^-9); 2^-31 itself is *not* representable.
- e = 63, f = 511 (0x7FFF, and 0xFFFF since the sign is ignored) is the single NaN/infinity
  code; it decodes to a float32 quiet NaN. e = 63, f = 510 is the largest finite value,
  2^32 * (1 + 510/512) = 8573157376.
- float32 -> DLFloat16 rounds the magnitude to nearest with ties *away from zero* ("nearest
  up"): add half an ulp (1 << 13) to the float32 magnitude bits and truncate 14 bits; a carry
  out of the fraction bumps the exponent for free.
- Overflow (|x| beyond max + half an ulp) and +-inf *saturate* to +-DLF16_MAX (0x7FFE with the
  input's sign); only NaN encodes to the NaN/infinity code. [NNP1]'s plain conversion maps
  overflow to the NaN/inf code, and onnx-mlir and zDNN clip to +-DLF16_MAX before converting
  when they want saturation; the machine model makes every store saturate, so a -inf constant
  (a causal mask, a running-max start) stays the most negative number instead of becoming NaN
  (docs/semantics.md, "Special values").
- Underflow: a rounded result whose exponent falls below the lowest binade flushes to a zero
  carrying the input's sign (decoded as +-0.0). So does a result that rounds onto the zero
  pattern: 2^-31 <= |x| < 2^-31 * (1 + 2^-10) encodes to zero, not to 2^-31.

The other formats
-----------------
- IEEE_FP16: numpy float16 (IEEE 754 binary16, round to nearest even, overflow to inf).
- BF16: the top half of float32, rounded to nearest even; NaN stays NaN (quiet bit forced so a
  payload living only in the dropped half cannot turn it into infinity).
- IEEE_FP32: identity.
- IEEE_INT32, SENINT8: two's complement. A float is converted toward zero (as torch's
  ``x.to(torch.int32)`` and C: 2.7 -> 2, -2.7 -> -2; docs/deviations.md, "Float-to-integer
  conversion"), then saturated to the type's range, NaN becomes 0 -- saturation because it is
  the only choice that never wraps a large value to the wrong sign. An integer is saturated.
  SENINT8 being plain two's complement int8 is an assumption: torch-spyre documents it only as
  "Spyre native 8-bit integer".
- SEN143_FP8: declared (its stick holds 128 elements) but not modelled; torch-spyre documents
  it only as an "E4M3 variant", and its bias, NaN encoding and subnormal rule are unpublished.
  encode/decode raise MachineError rather than guess.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
import numpy.typing as npt

from fspyre.errors import ExecutionError, MachineError
from fspyre.ir.kinds import DeviceFormat

# A stick is the 128-byte unit the Spyre data path moves; elements per stick follow from it.
STICK_BYTES = 128  # BYTES_IN_STICK (torch-spyre csrc/spyre_tensor_impl.cpp)


@dataclass(frozen=True, slots=True, kw_only=True)
class DataFormat:
    """One device element format: its size, kind and how a raw element is stored."""

    name: DeviceFormat
    nbytes: int
    is_float: bool
    # numpy dtype of the raw bit pattern: always unsigned, so raw values are plain bit patterns.
    storage: str
    summary: str

    def __post_init__(self) -> None:
        if self.nbytes not in (1, 2, 4):
            raise MachineError(f"data format {self.name}: {self.nbytes} bytes per element; "
                               f"the machine model knows 1-, 2- and 4-byte elements")
        if np.dtype(self.storage) != np.dtype(f"u{self.nbytes}"):
            raise MachineError(f"data format {self.name}: storage dtype {self.storage} does not "
                               f"hold exactly {self.nbytes} byte(s) unsigned")

    @property
    def elems_per_stick(self) -> int:
        return STICK_BYTES // self.nbytes


SEN169_FP16 = DataFormat(
    name="SEN169_FP16", nbytes=2, is_float=True, storage="uint16",
    summary="IBM DLFloat16: 1 sign, 6 exponent (bias 31), 9 fraction bits; no subnormals, "
            "one NaN/inf code, round to nearest ties away from zero",
)
IEEE_FP16 = DataFormat(
    name="IEEE_FP16", nbytes=2, is_float=True, storage="uint16",
    summary="IEEE 754 binary16: 1-5-10 bits, round to nearest even",
)
BF16 = DataFormat(
    name="BF16", nbytes=2, is_float=True, storage="uint16",
    summary="bfloat16: top half of IEEE binary32 (1-8-7 bits), round to nearest even",
)
IEEE_FP32 = DataFormat(
    name="IEEE_FP32", nbytes=4, is_float=True, storage="uint32",
    summary="IEEE 754 binary32: 1-8-23 bits",
)
IEEE_INT32 = DataFormat(
    name="IEEE_INT32", nbytes=4, is_float=False, storage="uint32",
    summary="32-bit two's complement integer; floats convert toward zero and saturate",
)
SENINT8 = DataFormat(
    name="SENINT8", nbytes=1, is_float=False, storage="uint8",
    summary="8-bit two's complement integer (assumed); floats convert toward zero and saturate",
)
SEN143_FP8 = DataFormat(
    name="SEN143_FP8", nbytes=1, is_float=True, storage="uint8",
    summary="Spyre 8-bit float, 1-4-3 bits (E4M3 variant); no numeric model yet",
)

FORMATS: Mapping[DeviceFormat, DataFormat] = MappingProxyType({
    f.name: f for f in (SEN169_FP16, IEEE_FP16, BF16, IEEE_FP32, IEEE_INT32, SENINT8, SEN143_FP8)
})


def describe(fmt: DataFormat) -> str:
    """One line for docs and printers: name, bytes, elements per stick, numeric rule."""
    return (f"{fmt.name}: {fmt.nbytes} B/elem, {fmt.elems_per_stick} elems/stick; "
            f"{fmt.summary}")


# ---------------------------------------------------------------------------------------------
# DLFloat16 constants, all derived from the field widths so the derivation is checkable.

_F32_FRAC_BITS = 23
_DL_FRAC_BITS = 9  # [ARITH19]
_DL_EXP_BITS = 6  # [ARITH19]
DLF16_BIAS = (1 << (_DL_EXP_BITS - 1)) - 1  # 31 [NNP1] FPFormat::EXPONENT_BIAS
_REBIAS = 127 - DLF16_BIAS  # 96: float32 biased exponent minus DLFloat16 biased exponent
_DROP = _F32_FRAC_BITS - _DL_FRAC_BITS  # 14 float32 fraction bits that do not survive
_HALF_ULP = 1 << (_DROP - 1)  # [NNP1] FP32::NNP1_ROUND: added, then truncated = ties away
DLF16_NAN_INF = 0x7FFF  # [NNP1] NNP1::NINF = EXPONENT | FRACTION; sign is don't-care [PATENT]
DLF16_MAX_BITS = 0x7FFE  # [NNP1] NNP1::NMAX = EXPONENT | (FRACTION - 1)
DLF16_MAX = 2.0**32 * (1 + 510 / 512)  # 8573157376.0 [NNP1] DLF16_MAX, zDNN DLF16_MAX_AS_FP32
DLF16_MIN_POSITIVE = 2.0**-DLF16_BIAS * (1 + 2.0**-_DL_FRAC_BITS)  # pattern 0x0001 [PATENT]
# Largest float32 magnitude that still rounds to DLF16_MAX: [NNP1] FP32::NNP1_NMAX. One more
# and the round-up lands on the NaN/inf code.
_F32_LAST_FINITE = (((63 + _REBIAS) << _F32_FRAC_BITS) | (510 << _DROP) | (_HALF_ULP - 1))
_F32_QNAN = 0x7FC00000


def _as_f32_bits(values: np.ndarray) -> np.ndarray:
    # A fresh float32 array, so a view of its bits never aliases the caller's data.
    return np.array(values, dtype=np.float32).view(np.uint32)


def _encode_dlf16_bits(values: np.ndarray) -> np.ndarray:
    """The rule, as arithmetic on the float32 bits (the table below is built from it)."""
    # In-place steps on one private uint32 copy.
    mag = _as_f32_bits(values)
    sign = mag >> 16
    sign &= 0x8000
    mag &= 0x7FFFFFFF
    overflow = mag > _F32_LAST_FINITE  # also +-inf and NaN
    is_nan = mag > 0x7F800000
    mag += _HALF_ULP  # never overflows uint32: mag <= 0x7FFFFFFF
    underflow = mag < (_REBIAS << _F32_FRAC_BITS)  # rounded exponent below the lowest binade
    # After dropping 14 bits the exponent sits at bit 9, exactly where DLFloat16 keeps it, so
    # rebiasing is one subtraction. It wraps for underflowing values, which are replaced next.
    mag >>= _DROP
    mag -= _REBIAS << _DL_FRAC_BITS
    np.copyto(mag, 0, where=underflow)  # flush to zero, sign kept below
    # The device saturates: overflow and +-inf keep their sign at the largest finite value
    # (a -inf mask then stays a huge negative and exp() of it is 0); only NaN is the NaN code.
    np.copyto(mag, DLF16_MAX_BITS, where=overflow)
    np.copyto(mag, DLF16_NAN_INF, where=is_nan)
    mag |= sign
    return mag.astype(np.uint16)


@functools.lru_cache(maxsize=None)
def _dlf16_encode_table() -> np.ndarray:
    """DLFloat16 bits of every float32 bit pattern ``i << 13``. Rounding ties away from zero
    looks at one dropped bit (the half ulp), and the overflow and underflow limits are whole
    multiples of 2^13, so a float32's encoding is a function of its top 19 bits -- except
    that +-inf shares its index with the NaNs whose payload lies only in the low 13 bits
    (``_encode_dlf16`` sends any NaN to the arithmetic)."""
    table = _encode_dlf16_bits((np.arange(1 << 19, dtype=np.uint32) << _DROP - 1).view(np.float32))
    table.setflags(write=False)
    return table


def _encode_dlf16(values: np.ndarray) -> np.ndarray:
    f = np.asarray(values, dtype=np.float32)
    if np.isnan(f).any():
        return _encode_dlf16_bits(f)
    # take converts the uint32 index to intp itself, faster than a shift into intp
    return np.asarray(_dlf16_encode_table().take(np.right_shift(f.view(np.uint32), _DROP - 1), mode="clip"))


def _decode_dlf16(raw: np.ndarray) -> np.ndarray:
    body = np.asarray(raw, dtype=np.uint16).astype(np.uint32)
    sign = body >> 15
    sign <<= 31
    body &= 0x7FFF
    is_zero = body == 0  # the e=0, f=0 pattern is zero, not 2^-31
    is_nan = body == DLF16_NAN_INF
    body += _REBIAS << _DL_FRAC_BITS
    body <<= _DROP
    np.copyto(body, 0, where=is_zero)
    body |= sign
    np.copyto(body, _F32_QNAN, where=is_nan)
    return body.view(np.float32)


def _encode_fp16(values: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # overflow to inf is the IEEE rule, not an accident
        return np.array(values, dtype=np.float32).astype(np.float16).view(np.uint16)


def _decode_fp16(raw: np.ndarray) -> np.ndarray:
    return np.asarray(raw, dtype=np.uint16).view(np.float16).astype(np.float32)


def _encode_bf16(values: np.ndarray) -> np.ndarray:
    bits = _as_f32_bits(values)
    # Round to nearest even: add 0x7FFF plus the bit that will become the last kept bit, so an
    # exact tie rounds up only when that bit is odd. A carry into the exponent is correct
    # (it also turns the largest finite values into inf, as RNE must).
    rounded = (bits + (0x7FFF + ((bits >> 16) & 1))) >> 16
    is_nan = (bits & 0x7FFFFFFF) > 0x7F800000
    return np.where(is_nan, (bits >> 16) | 0x0040, rounded).astype(np.uint16)


def _decode_bf16(raw: np.ndarray) -> np.ndarray:
    return (np.asarray(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def _encode_fp32(values: np.ndarray) -> np.ndarray:
    return _as_f32_bits(values)


def _decode_fp32(raw: np.ndarray) -> np.ndarray:
    return np.array(raw, dtype=np.uint32).view(np.float32)


def _saturating_int(values: np.ndarray, int_dtype: type[np.signedinteger]) -> np.ndarray:
    info = np.iinfo(int_dtype)
    v = np.asarray(values)
    if v.dtype.kind == "f":
        # Toward zero, as torch's (and C's) float-to-int conversion: `x.to(torch.long)` of 2.7
        # is 2 and of -2.7 is -2. float64 holds every int32 exactly, so the clip bounds are
        # exact, unlike in float32.
        f = np.array(np.trunc(v.astype(np.float64)), dtype=np.float64)  # 0-d stays an array
        np.clip(f, info.min, info.max, out=f)
        np.copyto(f, 0.0, where=np.isnan(f))
        return f.astype(int_dtype)
    if v.dtype.kind == "u":
        return np.minimum(v, info.max).astype(int_dtype)
    if v.dtype.kind in "ib":
        return np.clip(v.astype(np.int64), info.min, info.max).astype(int_dtype)
    raise MachineError(f"cannot store values of dtype {v.dtype} as {np.dtype(int_dtype)}; "
                       f"pass integer or float numbers")


def _encode_int32(values: np.ndarray) -> np.ndarray:
    return _saturating_int(values, np.int32).view(np.uint32)


def _decode_int32(raw: np.ndarray) -> np.ndarray:
    return np.array(raw, dtype=np.uint32).view(np.int32)


def _encode_int8(values: np.ndarray) -> np.ndarray:
    return _saturating_int(values, np.int8).view(np.uint8)


def _decode_int8(raw: np.ndarray) -> np.ndarray:
    return np.asarray(raw, dtype=np.uint8).view(np.int8).astype(np.int32)


_Codec = tuple[Callable[[np.ndarray], np.ndarray], Callable[[np.ndarray], np.ndarray]]
_CODECS: Mapping[str, _Codec] = MappingProxyType({
    SEN169_FP16.name: (_encode_dlf16, _decode_dlf16),
    IEEE_FP16.name: (_encode_fp16, _decode_fp16),
    BF16.name: (_encode_bf16, _decode_bf16),
    IEEE_FP32.name: (_encode_fp32, _decode_fp32),
    IEEE_INT32.name: (_encode_int32, _decode_int32),
    SENINT8.name: (_encode_int8, _decode_int8),
})


def _codec(fmt: DataFormat) -> _Codec:
    codec = _CODECS.get(fmt.name)
    if codec is None:
        raise MachineError(
            f"data format {fmt.name} has no numeric model yet: its exact encoding (bias, NaN "
            f"and subnormal rules) is unpublished; keep such tensors in "
            f"{SEN169_FP16.name} or add a model to fspyre/machine/formats.py")
    return codec


# Elements per block of a large conversion: a block's temporaries (uint32 or intp) stay in the
# CPU cache. Each conversion makes several whole-array passes; over memory-sized arrays every
# pass would pay for memory traffic and fresh pages.
_BLOCK = 1 << 15


def _blocks(shape: tuple[int, ...]) -> Iterator[tuple[int | slice, ...]]:
    """Index tuples cutting an array of ``shape`` into pieces of at most ``_BLOCK`` elements
    (or one row of the last axis), each whole along the axes after the one it is cut along,
    so a piece of a C-contiguous array is C-contiguous."""
    inner, ax = 1, len(shape)
    while ax > 0 and inner * shape[ax - 1] <= _BLOCK:
        ax -= 1
        inner *= shape[ax]
    if ax == 0:
        yield (slice(None),)
        return
    ax -= 1  # cut along this axis, ``step`` at a time
    step = max(1, _BLOCK // inner)
    for outer in itertools.product(*(range(n) for n in shape[:ax])):
        for start in range(0, shape[ax], step):
            yield (*outer, slice(start, start + step))


def _blockwise(fn: Callable[[np.ndarray], np.ndarray], values: np.ndarray, dtype: npt.DTypeLike) -> np.ndarray:
    """``fn`` (elementwise, returning ``dtype``) over ``values`` block by block, C-contiguous."""
    if values.size <= _BLOCK:
        out = fn(values)
        return out if out.flags.c_contiguous else np.array(out, order="C")
    out = np.empty(values.shape, dtype)
    for b in _blocks(values.shape):
        out[b] = fn(values[b])
    return out


def encode(values: np.ndarray, fmt: DataFormat) -> np.ndarray:
    """Compute values -> raw bit patterns of ``fmt`` (unsigned, ``fmt.storage``), same shape.

    Float formats first take the values as float32, the machine's compute type.
    """
    return _blockwise(_codec(fmt)[0], np.asarray(values), fmt.storage)


def decode(raw: np.ndarray, fmt: DataFormat) -> np.ndarray:
    """Raw bit patterns of ``fmt`` -> float32 (float formats) or int32 (integer formats),
    C-contiguous whatever the layout of ``raw`` (a strided view of a memory, say)."""
    if fmt.nbytes == 2:
        # 65,536 patterns: one gather from a 256 KiB table beats the bit arithmetic (the
        # interpreter decodes every element it reads).
        return _lookup16(_decode_table(fmt), np.asarray(raw, dtype=np.uint16))
    return _blockwise(_codec(fmt)[1], np.asarray(raw), np.float32 if fmt.is_float else np.int32)


def lookup16(table: np.ndarray, raw: np.ndarray) -> np.ndarray:
    """``table[raw]`` for a table with an entry for each of the 65,536 patterns of ``raw``
    (uint16), C-contiguous. numpy converts a whole index array to intp before it gathers;
    block by block that copy stays in the cache."""
    if table.shape != (1 << 16,) or raw.dtype != np.uint16:
        raise MachineError(f"lookup16: needs a table of 65536 entries and uint16 patterns, "
                           f"got {table.shape} and {raw.dtype}")
    return _lookup16(table, raw)


def _lookup16(table: np.ndarray, raw: np.ndarray) -> np.ndarray:
    # mode="clip" only skips the bounds check: every uint16 is an index of the table
    return _blockwise(lambda r: np.asarray(table.take(r, mode="clip")), raw, table.dtype)


@functools.lru_cache(maxsize=None)
def _decode_table(fmt: DataFormat) -> np.ndarray:
    table = _codec(fmt)[1](np.arange(1 << 16, dtype=np.uint16))
    table.setflags(write=False)
    return table


def round_to(values: np.ndarray, fmt: DataFormat) -> np.ndarray:
    """The value a store to ``fmt`` keeps: ``decode(encode(values))``."""
    return decode(encode(values, fmt), fmt)


def to_bytes(values: np.ndarray, fmt: DataFormat) -> np.ndarray:
    """Encode and lay out as flat little-endian bytes (the device's byte order), C order."""
    raw = encode(values, fmt).astype(np.dtype(fmt.storage).newbyteorder("<"), copy=False)
    return np.ascontiguousarray(raw).reshape(-1).view(np.uint8)


def from_bytes(b: np.ndarray, fmt: DataFormat, count: int) -> np.ndarray:
    """Decode the first ``count`` elements of ``fmt`` from little-endian bytes ``b``."""
    b = np.asarray(b)
    if b.dtype != np.uint8 or b.ndim != 1:
        raise ExecutionError(f"reading {fmt.name}: expected a flat uint8 byte array, got "
                             f"{b.dtype} with shape {b.shape}")
    need = count * fmt.nbytes
    if count < 0 or need > b.size:
        raise ExecutionError(f"reading {count} {fmt.name} element(s) needs {need} bytes, "
                             f"only {b.size} available")
    le = np.dtype(fmt.storage).newbyteorder("<")
    raw = np.ascontiguousarray(b[:need]).view(le).astype(fmt.storage)
    return decode(raw, fmt)
