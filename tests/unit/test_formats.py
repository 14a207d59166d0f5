"""Device data formats: exact DLFloat16 rules, IEEE and bf16 against references, properties."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fspyre.errors import ExecutionError, MachineError
from fspyre.machine import formats as F
from fspyre.machine.formats import (
    BF16,
    FORMATS,
    IEEE_FP16,
    IEEE_FP32,
    IEEE_INT32,
    SEN143_FP8,
    SEN169_FP16,
    SENINT8,
    decode,
    describe,
    encode,
    from_bytes,
    round_to,
    to_bytes,
)

MODELLED = [SEN169_FP16, IEEE_FP16, BF16, IEEE_FP32, IEEE_INT32, SENINT8]
FLOATS = [SEN169_FP16, IEEE_FP16, BF16, IEEE_FP32]
ALL_PATTERNS = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
DL_NAN = (ALL_PATTERNS & 0x7FFF) == 0x7FFF


def f32(*xs: float) -> np.ndarray:
    return np.array(xs, dtype=np.float32)


def dl(*xs: float) -> list[int]:
    return [int(v) for v in encode(f32(*xs), SEN169_FP16)]


def f32_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def bits_f32(b: int) -> float:
    return struct.unpack("<f", struct.pack("<I", b))[0]


# --- the format table -------------------------------------------------------------------------

def test_table_sizes_and_sticks():
    expected = {  # name: (nbytes, elems_per_stick, is_float)
        "SEN169_FP16": (2, 64, True), "IEEE_FP16": (2, 64, True), "BF16": (2, 64, True),
        "IEEE_FP32": (4, 32, True), "IEEE_INT32": (4, 32, False),
        "SENINT8": (1, 128, False), "SEN143_FP8": (1, 128, True),
    }
    assert {n: (f.nbytes, f.elems_per_stick, f.is_float) for n, f in FORMATS.items()} == expected
    assert all(FORMATS[f.name] is f for f in [*MODELLED, SEN143_FP8])


def test_describe_is_one_line_naming_the_format():
    for fmt in FORMATS.values():
        text = describe(fmt)
        assert fmt.name in text and "\n" not in text and str(fmt.elems_per_stick) in text


def test_format_validates_itself():
    with pytest.raises(MachineError, match="3 bytes"):
        F.DataFormat(name="ODD", nbytes=3, is_float=False, storage="uint8", summary="")
    with pytest.raises(MachineError, match="storage"):
        F.DataFormat(name="ODD", nbytes=2, is_float=False, storage="uint8", summary="")


def test_fp8_is_declared_but_refuses_to_guess():
    with pytest.raises(MachineError, match="SEN143_FP8 has no numeric model"):
        encode(f32(1.0), SEN143_FP8)
    with pytest.raises(MachineError, match="SEN143_FP8"):
        decode(np.zeros(2, np.uint8), SEN143_FP8)


@pytest.mark.parametrize("fmt", MODELLED, ids=lambda f: f.name)
def test_shapes_and_dtypes(fmt):
    x = np.linspace(-3, 3, 24, dtype=np.float32).reshape(2, 3, 4)
    raw = encode(x, fmt)
    assert raw.shape == x.shape and raw.dtype == np.dtype(fmt.storage)
    out = decode(raw, fmt)
    assert out.shape == x.shape
    assert out.dtype == (np.float32 if fmt.is_float else np.int32)


# --- DLFloat16: every bit pattern -------------------------------------------------------------

def test_dlf16_decodes_every_pattern_by_the_formula():
    # Independent of the bit tricks: value = (-1)^s 2^(e-31) (1 + f/512), in float64.
    p = ALL_PATTERNS.astype(np.int64)
    s, e, f = p >> 15, (p >> 9) & 63, p & 511
    want = (-1.0) ** s * np.ldexp(1 + f / 512, e - 31)
    want[(p & 0x7FFF) == 0] = 0.0
    got = decode(ALL_PATTERNS, SEN169_FP16)
    assert np.isnan(got[DL_NAN]).all() and not np.isnan(got[~DL_NAN]).any()
    assert np.array_equal(got[~DL_NAN].astype(np.float64), want[~DL_NAN])
    assert np.array_equal(np.signbit(got[~DL_NAN]), s[~DL_NAN] == 1)  # -0 stays -0


def test_dlf16_round_trips_every_non_nan_pattern():
    vals = decode(ALL_PATTERNS[~DL_NAN], SEN169_FP16)
    assert np.array_equal(encode(vals, SEN169_FP16), ALL_PATTERNS[~DL_NAN])


def test_dlf16_decode_is_monotonic_and_symmetric():
    pos = decode(np.arange(0, 0x7FFF, dtype=np.uint16), SEN169_FP16)
    assert (np.diff(pos) > 0).all()
    neg = decode(np.arange(0x8000, 0xFFFF, dtype=np.uint16), SEN169_FP16)
    assert np.array_equal(neg, -pos)


# --- DLFloat16: exact values ------------------------------------------------------------------

def test_dlf16_simple_values():
    assert dl(1.0, -2.0, 0.0, -0.0) == [0x3E00, 0xC000, 0x0000, 0x8000]
    assert dl(0.5, 3.0) == [0x3C00, 0x4100]


def test_dlf16_extremes():
    assert F.DLF16_MAX == 8573157376.0
    assert dl(F.DLF16_MAX, -F.DLF16_MAX) == [0x7FFE, 0xFFFE]
    assert decode(np.uint16(0x7FFE), SEN169_FP16) == np.float32(8573157376.0)
    assert F.DLF16_MIN_POSITIVE == 2.0**-31 * (1 + 2.0**-9)
    assert dl(F.DLF16_MIN_POSITIVE) == [0x0001]
    assert decode(np.uint16(0x0001), SEN169_FP16) == np.float32(F.DLF16_MIN_POSITIVE)


def test_dlf16_ties_round_away_from_zero():
    # 1 + 2^-10 is exactly halfway between 1 (even, 0x3E00) and 1 + 2^-9 (odd, 0x3E01):
    # round-to-nearest-even would keep 0x3E00; "nearest up" takes 0x3E01.
    assert dl(1 + 2**-10, -(1 + 2**-10)) == [0x3E01, 0xBE01]
    assert dl(1 + 3 * 2**-10) == [0x3E02]
    just_below = np.nextafter(np.float32(1 + 2**-10), np.float32(0))
    assert dl(just_below) == [0x3E00]
    # A tie that carries out of the fraction into the exponent: 2 - 2^-10 -> 2.0.
    assert dl(2 - 2**-10) == [0x4000]


def test_dlf16_overflow_and_infinity_saturate_nan_stays_nan():
    """DLFloat16 has no infinity: a store saturates to +-max (docs/semantics.md, Special
    values); only NaN takes the NaN/inf code, so no -inf mask becomes a silent NaN."""
    half_ulp_at_max = 2.0**(32 - 10)
    tie = F.DLF16_MAX + half_ulp_at_max
    assert dl(tie, -tie) == [0x7FFE, 0xFFFE]
    assert dl(np.nextafter(np.float32(tie), np.float32(0))) == [0x7FFE]
    assert dl(1e30, np.inf, -np.inf, -3.4e38) == [0x7FFE, 0x7FFE, 0xFFFE, 0xFFFE]
    assert round_to(f32(np.inf, -np.inf), SEN169_FP16).tolist() == [F.DLF16_MAX, -F.DLF16_MAX]
    assert dl(np.nan)[0] & 0x7FFF == 0x7FFF
    assert dl(-np.nan)[0] & 0x7FFF == 0x7FFF
    nan_bits = np.array([0x7FC00000, 0xFF800001, 0x7F800001], np.uint32).view(np.float32)
    assert np.isnan(round_to(nan_bits, SEN169_FP16)).all()


def test_dlf16_encode_table_is_the_arithmetic_on_every_19_bit_prefix():
    """The fast encoder reads a table indexed by a float32's top 19 bits; it must equal the
    arithmetic rule for every prefix with any low 13 bits, and for the NaNs and infinities
    that share an index."""
    rng = np.random.default_rng(0)
    prefix = np.arange(1 << 19, dtype=np.uint32) << 13
    for low in (0, 0x1000, 0x1FFF, 0x0FFF):
        bits = (prefix | low).view(np.float32)
        assert np.array_equal(encode(bits, SEN169_FP16), F._encode_dlf16_bits(bits)), hex(low)
    bits = (prefix | rng.integers(0, 1 << 13, prefix.size, dtype=np.uint32)).view(np.float32)
    assert np.array_equal(encode(bits, SEN169_FP16), F._encode_dlf16_bits(bits))
    # inf next to the NaNs on its table index, in one array, both signs
    tricky = np.array([0x7F800000, 0x7F800001, 0x7F801FFF, 0xFF800000, 0xFF800001, 0x3F800000],
                      np.uint32).view(np.float32)
    assert encode(tricky, SEN169_FP16).tolist() == [0x7FFE, 0x7FFF, 0x7FFF, 0xFFFE, 0xFFFF, 0x3E00]


@pytest.mark.parametrize("fmt", MODELLED, ids=lambda f: f.name)
def test_block_by_block_conversion_keeps_values_shape_and_layout(fmt):
    """Large arrays convert in cache-sized blocks; strided, broadcast and oddly shaped inputs
    give what one whole-array conversion gives, C-contiguous."""
    rng = np.random.default_rng(1)
    x = rng.uniform(-100, 100, (3, 200, 131)).astype(np.float32)
    if not fmt.is_float:
        x = np.rint(x).astype(np.int32)
    for v in (x, x.transpose(2, 0, 1), x[:, ::3, :], np.broadcast_to(x[:1], (70, 200, 131)),
              x.reshape(-1), x.reshape(1, 1, -1)):
        raw = encode(v, fmt)
        assert raw.shape == v.shape and raw.dtype == np.dtype(fmt.storage)
        assert np.array_equal(raw, F._codec(fmt)[0](np.ascontiguousarray(v)))
        back = decode(raw.transpose(*reversed(range(raw.ndim))), fmt)
        assert back.flags.c_contiguous
        assert np.array_equal(back, F._codec(fmt)[1](np.ascontiguousarray(raw.T)))


def test_dlf16_underflow_flushes_to_signed_zero():
    assert dl(1e-30, -1e-30, 1e-45) == [0x0000, 0x8000, 0x0000]
    # 2^-31 would be e=0, f=0 -- the zero pattern -- so it and everything rounding onto it is 0.
    assert dl(2.0**-31, 2.0**-32, -(2.0**-31)) == [0x0000, 0x0000, 0x8000]
    tie = 2.0**-31 * (1 + 2**-10)
    assert dl(tie) == [0x0001]
    assert dl(np.nextafter(np.float32(tie), np.float32(0))) == [0x0000]
    assert np.signbit(round_to(f32(-1e-30), SEN169_FP16)[0])


# --- IEEE fp16 and bf16 against references built from Python ints / struct ----------------------

HAND = [0.0, -0.0, 1.0, -1.5, 3.14159265, 1e-3, 6.1e-5, 1e-7, 2049.0, 2051.0, 65504.0,
        65519.0, 1 + 2**-11, 1 + 3 * 2**-11, 1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-20,
        -7.0e4, 3.0e38, 1e-40]


def fp16_ref(x: float) -> int:
    """binary16 bits by Python's struct (round half even from the exact float64 value)."""
    try:
        return struct.unpack("<H", struct.pack("<e", x))[0]
    except OverflowError:  # struct refuses what IEEE rounds to infinity
        return 0xFC00 if x < 0 else 0x7C00


def bf16_ref(x: float) -> int:
    """bfloat16 bits: truncate the float32 pattern, then round half even by hand."""
    b = f32_bits(x)
    upper, dropped = b >> 16, b & 0xFFFF
    if dropped > 0x8000 or (dropped == 0x8000 and upper & 1):
        upper += 1
    return upper


@pytest.mark.parametrize("x", HAND)
def test_fp16_matches_struct(x):
    x32 = float(np.float32(x))  # the reference must start from the same float32 value
    assert int(encode(f32(x), IEEE_FP16)[0]) == fp16_ref(x32)


@pytest.mark.parametrize("x", HAND)
def test_bf16_matches_integer_rounding(x):
    assert int(encode(f32(x), BF16)[0]) == bf16_ref(x)


def test_bf16_hand_values():
    assert [int(v) for v in encode(f32(1.0, 1 + 2**-8, 1 + 3 * 2**-8, -2.0), BF16)] == \
        [0x3F80, 0x3F80, 0x3F82, 0xC000]  # two ties: one to even below, one to even above
    assert int(encode(f32(3.4028235e38), BF16)[0]) == 0x7F80  # rounds up past the max: inf
    # A NaN whose payload lives only in the low half must not become infinity.
    nan = np.array([0x7F800001, 0xFF800001], np.uint32).view(np.float32)
    assert np.isnan(round_to(nan, BF16)).all()


@given(st.floats(width=32, allow_nan=False))
def test_bf16_matches_reference_everywhere(x):
    assert int(encode(f32(x), BF16)[0]) == bf16_ref(x)


@given(st.floats(width=32, allow_nan=False))
def test_fp16_matches_reference_everywhere(x):
    assert int(encode(f32(x), IEEE_FP16)[0]) == fp16_ref(x)


def test_fp32_is_identity_bit_for_bit():
    x = np.array([0x7FC01234, 0x80000000, 0x00000001, 0x3F800000], np.uint32).view(np.float32)
    assert np.array_equal(encode(x, IEEE_FP32), x.view(np.uint32))
    assert np.array_equal(round_to(x, IEEE_FP32).view(np.uint32), x.view(np.uint32))


# --- integers --------------------------------------------------------------------------------

def test_int32_converts_floats_toward_zero_and_saturates():
    # toward zero, as torch's .to(torch.int32) / .to(torch.long)
    x = np.array([2.5, 3.5, -2.5, -0.5, 0.7, -1.7, np.nan, 1e10, -1e10, np.inf, 2147483647.0])
    assert round_to(x, IEEE_INT32).tolist() == \
        [2, 3, -2, 0, 0, -1, 0, 2**31 - 1, -(2**31), 2**31 - 1, 2**31 - 1]
    ints = np.array([5, -7, 2**40, -(2**40)], np.int64)
    assert round_to(ints, IEEE_INT32).tolist() == [5, -7, 2**31 - 1, -(2**31)]
    assert round_to(np.array(-2.7, np.float32), IEEE_INT32).tolist() == -2  # a 0-d value
    assert round_to(np.array([2**63], np.uint64), IEEE_INT32).tolist() == [2**31 - 1]
    assert int(encode(np.int32(-1), IEEE_INT32)) == 0xFFFFFFFF


def test_int8_converts_floats_toward_zero_and_saturates():
    x = np.array([0.5, 1.5, -127.6, 127.5, 300.0, -300.0, np.nan, -128.9], np.float32)
    assert round_to(x, SENINT8).tolist() == [0, 1, -127, 127, 127, -128, 0, -128]
    assert encode(np.array([-1, 200]), SENINT8).tolist() == [0xFF, 0x7F]
    assert decode(np.arange(256, dtype=np.uint8), SENINT8).tolist() == \
        list(range(128)) + list(range(-128, 0))


def test_int_formats_reject_non_numbers():
    with pytest.raises(MachineError, match="dtype"):
        encode(np.array(["a"]), IEEE_INT32)


# --- properties --------------------------------------------------------------------------------

# (lowest positive normal, largest finite, fraction bits) of each rounding float format.
NORMAL_RANGE = {
    SEN169_FP16.name: (F.DLF16_MIN_POSITIVE, F.DLF16_MAX, 9),
    IEEE_FP16.name: (2.0**-14, 65504.0, 10),
    BF16.name: (2.0**-126, (2 - 2.0**-7) * 2.0**127, 7),
}


def normal_arrays(lo: float, hi: float):
    magnitude = st.floats(lo, hi, width=32)
    element = st.one_of(magnitude, magnitude.map(lambda v: -v))
    return hnp.arrays(np.float32, hnp.array_shapes(max_dims=2, max_side=16), elements=element)


@pytest.mark.parametrize("fmt", [SEN169_FP16, IEEE_FP16, BF16], ids=lambda f: f.name)
@settings(deadline=None)
@given(data=st.data())
def test_error_is_at_most_half_an_ulp(fmt, data):
    lo, hi, frac_bits = NORMAL_RANGE[fmt.name]
    x = data.draw(normal_arrays(lo, hi)).astype(np.float64)
    r = round_to(x, fmt).astype(np.float64)
    _, exp = np.frexp(np.abs(x))  # |x| = m 2^exp, m in [0.5, 1): the binade is 2^(exp-1)
    half_ulp = np.ldexp(1.0, exp - 1 - frac_bits - 1)
    assert (np.abs(r - x) <= half_ulp).all()
    assert np.array_equal(round_to(r, fmt), r.astype(np.float32))  # representable


any_f32 = hnp.arrays(np.float32, hnp.array_shapes(max_dims=2, max_side=16),
                     elements=st.floats(width=32))


@pytest.mark.parametrize("fmt", MODELLED, ids=lambda f: f.name)
@settings(deadline=None)
@given(x=any_f32)
def test_round_to_is_idempotent(fmt, x):
    once = round_to(x, fmt)
    twice = round_to(once, fmt)
    if fmt.is_float:
        assert np.array_equal(once, twice, equal_nan=True)
        assert np.array_equal(np.signbit(once), np.signbit(twice))
    else:
        assert np.array_equal(once, twice)


@pytest.mark.parametrize("fmt", MODELLED, ids=lambda f: f.name)
@settings(deadline=None)
@given(x=any_f32)
def test_bytes_round_trip(fmt, x):
    b = to_bytes(x, fmt)
    assert b.dtype == np.uint8 and b.shape == (x.size * fmt.nbytes,)
    back = from_bytes(b, fmt, x.size)
    assert np.array_equal(back, round_to(x, fmt).reshape(-1), equal_nan=fmt.is_float)


def test_bytes_are_little_endian_and_checked():
    assert to_bytes(f32(1.0), SEN169_FP16).tolist() == [0x00, 0x3E]
    assert to_bytes(f32(1.0), IEEE_FP32).tolist() == [0x00, 0x00, 0x80, 0x3F]
    assert from_bytes(np.array([0x00, 0x3E, 0xFF], np.uint8), SEN169_FP16, 1).tolist() == [1.0]
    with pytest.raises(ExecutionError, match="needs 4 bytes, only 3"):
        from_bytes(np.zeros(3, np.uint8), SEN169_FP16, 2)
    with pytest.raises(ExecutionError, match="uint8"):
        from_bytes(np.zeros(4, np.uint16), SEN169_FP16, 1)


def test_a_float_stored_as_int32_converts_toward_zero_and_saturates():
    """The rule formats.py documents (and docs/deviations.md, "Float-to-integer conversion")."""
    import numpy as np

    from fspyre.machine.formats import FORMATS, decode, encode

    fmt = FORMATS["IEEE_INT32"]
    got = decode(encode(np.array([2.7, -2.7, 2.5, -0.5, 1e12, -1e12, np.nan], np.float32), fmt), fmt)
    assert got.tolist() == [2, -2, 2, 0, 2**31 - 1, -(2**31), 0]
