"""The Spyre device stick layout: where each host element of a tensor lives in device memory.

Device storage is row-major over ``device_size``; the last device dim is the stick, a 128-byte
row of ``elems_per_stick`` elements. ``stride_map[i]`` is the host-element stride that one step
of device dim ``i`` stands for (-1 for a synthetic, padded or size-1 dim), so for every stored
element ``host_offset == sum(coord[i] * stride_map[i] for stride_map[i] > 0)``.

The default layout (torch-spyre ``SpyreTensorLayout(size, dtype, dim_order)``) sticks the last
host dim of ``dim_order`` and tiles along its first entry::

    [1024, 4096] fp16  ->  device_size (64, 1024, 64), stride_map (64, 4096, 1)

``device_coordinates`` turns a flat host index expression into one coordinate expression per
device dim (``(floor(c1/64), c0, Mod(c1, 64))`` above); ``fspyre.machine.indexing`` evaluates
those expressions on arrays.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import sympy

from fspyre.errors import ExecutionError, GraphError, LoweringError
from fspyre.machine.formats import STICK_BYTES
from fspyre.machine.indexing import as_expr, compile_index, free_names
from fspyre.machine.rules import device_bytes, row_major_strides

# torch-spyre: host rank <= 6 (a sparse dim_order adds the trailing -1, so up to 7 entries).
MAX_HOST_RANK = 6


@dataclass(frozen=True, slots=True, kw_only=True)
class StickLayout:
    """A tensor's device layout; the fields are those of torch-spyre's SpyreTensorLayout.

    ``dim_order`` lists host dims; its last entry is the stick host dim, and a trailing -1
    makes the layout *sparse* (one element per stick). A scalar has ``dim_order == ()``.
    """

    host_size: tuple[int, ...]
    device_size: tuple[int, ...]
    stride_map: tuple[int, ...]
    dim_order: tuple[int, ...]
    elems_per_stick: int

    def __post_init__(self) -> None:
        for name in ("host_size", "device_size", "stride_map", "dim_order"):
            value = getattr(self, name)
            if not isinstance(value, tuple) or not all(_is_int(v) for v in value):
                raise GraphError(f"StickLayout.{name} must be a tuple of ints, got {value!r}")
        eps = self.elems_per_stick
        if not _is_int(eps) or eps <= 0 or STICK_BYTES % eps:
            raise GraphError(
                f"StickLayout.elems_per_stick {eps!r} must divide the {STICK_BYTES}-byte stick "
                f"(sub-byte formats are not supported)"
            )
        if any(s <= 0 for s in self.host_size):
            raise GraphError(f"StickLayout: host sizes must be > 0, got {self.host_size}")
        _check_dim_order(self.host_size, self.dim_order)
        device_rank = max(len(self.dim_order), 1) + 1
        if len(self.device_size) != device_rank or len(self.stride_map) != device_rank:
            raise GraphError(
                f"StickLayout: dim_order {self.dim_order} needs {device_rank} device dims, got "
                f"device_size {self.device_size} and stride_map {self.stride_map}"
            )
        if any(s <= 0 for s in self.device_size):
            raise GraphError(f"StickLayout: device sizes must be > 0, got {self.device_size}")
        if self.device_size[-1] != eps:
            raise GraphError(
                f"StickLayout: the last device dim is the stick and must hold elems_per_stick = {eps}, "
                f"got device_size {self.device_size}"
            )
        if any(s == 0 or s < -1 for s in self.stride_map):
            raise GraphError(f"StickLayout: stride_map entries must be > 0 or -1, got {self.stride_map}")

    @property
    def nbytes(self) -> int:
        """Bytes the tensor occupies on the device, padded sticks included."""
        return device_bytes(self.device_size, self.elem_bytes)

    @property
    def elem_bytes(self) -> int:
        return STICK_BYTES // self.elems_per_stick

    @property
    def dim_map(self) -> tuple[int, ...]:
        """Host dim of each device dim (-1 = synthetic); the stick host dim appears twice."""
        return _dim_map(self.dim_order)

    @property
    def device_strides(self) -> tuple[int, ...]:
        """Row-major element strides of the device dims."""
        return row_major_strides(self.device_size)


def stick_layout(host_size: Sequence[int], elems_per_stick: int, dim_order: Sequence[int] | None = None) -> StickLayout:
    """The default layout of a contiguous host tensor, sticked on ``dim_order[-1]``.

    1. ``dim_map`` (device dim -> host dim): ``[o0, o0]`` for one entry, else
       ``[o1, ..., o(k-1), o0, o(k-1)]``: the non-first dims in order, the first, the stick again.
    2. ``device_size``: ``elems_per_stick`` for the stick; ``ceil(n / eps)`` at the stick host
       dim's outer occurrence (1 when sparse); the host size elsewhere (1 for -1).
    3. ``stride_map`` right to left: -1 for a synthetic or size-1 host dim; the host stride at a
       host dim's inner occurrence; inner stride * inner device size at its outer occurrence.
    A scalar is ``device_size (1, eps)``, ``stride_map (-1, -1)``.
    """
    host = tuple(int(s) for s in host_size)
    order = tuple(range(len(host))) if dim_order is None else tuple(int(d) for d in dim_order)
    return _stick_layout(host, order, int(elems_per_stick))


def strides_without_unit_dims(host_size: Sequence[int], stride_map: Sequence[int]) -> tuple[int, ...]:
    """``stride_map`` of a default-order stick layout of ``host_size`` with -1 at each device dim
    whose host dim has one element, as ``stick_layout`` writes it (rule 3). A layout fitted over
    sizes >= 2 (a symbolic program's) carries the stride such a dim has at every larger size; at
    size 1 that stride is never stepped, so the two layouts place every element alike."""
    dmap = _dim_map(tuple(range(len(host_size))))
    return tuple(-1 if h != -1 and host_size[h] == 1 else int(st) for h, st in zip(dmap, stride_map))


# Cached: the stages ask for the layout of every buffer of every tree they are given (a tiling
# search's candidates and keep_resident's trials ask for the same few shapes thousands of
# times); a layout is a pure function of these integers and immutable. A refusal raises anew.
@functools.lru_cache(maxsize=4096)
def _stick_layout(host: tuple[int, ...], order: tuple[int, ...], eps: int) -> StickLayout:
    _check_dim_order(host, order)
    if any(s <= 0 for s in host):
        raise GraphError(f"stick_layout: host sizes must be > 0, got {host}")
    dmap = _dim_map(order)
    stick = dmap[-1]
    last = len(dmap) - 1

    device = [1] * len(dmap)
    device[last] = eps
    for i in range(last):
        h = dmap[i]
        if h == stick:
            device[i] = 1 if h == -1 else -(-host[h] // eps)
        elif h != -1:
            device[i] = host[h]

    hstrides = row_major_strides(host)
    strides = [-1] * len(dmap)
    inner: dict[int, int] = {}  # host dim -> device dim of its innermost occurrence
    for i in range(last, -1, -1):
        h = dmap[i]
        if h == -1 or host[h] == 1:
            continue
        if h in inner:
            j = inner[h]
            strides[i] = strides[j] * device[j]
        else:
            strides[i] = hstrides[h]
            inner[h] = i

    return StickLayout(
        host_size=host,
        device_size=tuple(device),
        stride_map=tuple(strides),
        dim_order=order,
        elems_per_stick=eps,
    )


def device_coordinates(
    layout: StickLayout, index: sympy.Expr, ranges: Mapping[sympy.Symbol, int]
) -> tuple[sympy.Expr, ...]:
    """One coordinate expression per device dim for the flat host index ``index``.

    The stick rule (``stick_coordinates``) gives the hardware-friendly form, but it can be
    silently wrong for views that regroup elements across a padded stick or misaligned dims.
    So its result is checked against the exact digit form on every single-var sweep and a
    fixed sample of grid points; where they differ (or the rule refuses), the exact form
    (``exact_coordinates``: floor/Mod of host digits) is used, which is always right.
    """
    index = as_expr(index, "device_coordinates")
    free = free_names(index)
    key = tuple(sorted(((s, int(n)) for s, n in ranges.items() if s.name in free), key=lambda p: p[0].name))
    return _device_coordinates(layout, index, key)


@functools.lru_cache(maxsize=16384)
def _device_coordinates(
    layout: StickLayout, index: sympy.Expr, key: tuple[tuple[sympy.Symbol, int], ...]
) -> tuple[sympy.Expr, ...]:
    # Cached: divide_work analyzes each tree once (allocate and emit_program read its record),
    # but keep_resident and the tiling search analyze rewritten trees and candidate subgraphs
    # whose ops mostly repeat, and ops in a chain share coordinates; without the cache a
    # 300-op chain compiles 2x slower and 3x slower with tiling="auto".
    ranges = dict(key)
    _check_index(layout, index, ranges)
    try:
        rule = stick_coordinates(layout, index, ranges)
    except LoweringError:
        rule = None
    if rule is not None and (_walks_box(layout, index, ranges) or _matches_digits(rule, layout, index, ranges)):
        return rule
    exact = exact_coordinates(layout, index, ranges)
    if _matches_digits(exact, layout, index, ranges):
        return exact
    raise LoweringError(
        f"device_coordinates: no coordinate form found for index {index} on layout {_describe(layout)} "
        f"with ranges {dict(ranges)}; copy the tensor to a contiguous buffer first"
    )


def _walks_box(layout: StickLayout, index: sympy.Expr, ranges: Mapping[sympy.Symbol, int]) -> bool:
    """Whether ``index`` walks a box of ``layout``'s host tensor in row-major order on the
    tensor's default layout: each var of range > 1 steps by the host stride of its own dim of
    size > 1, the constant is the box's corner (host digits ``o``, with ``o + range`` inside
    each walked dim) and the corner's stick digit is a whole number of sticks. The stick rule is
    then exact without a check: each var steps by its dim's device stride and no other device
    stride but the stick's outer one lies between its step and limit, so a dim's var lands in
    its device dim alone and the stick var in floor(v / eps) and Mod(v, eps); the corner's
    digits are peeled positionally. Most accesses of a tiled program are such (per-tile
    buffers, whole tensors, a tail's remainder), and the sweeps of the check cost a tiling
    search 13 % of its time (tested against the check: tests/machine/test_coordinate_forms.py)."""
    host = layout.host_size
    eps = layout.elems_per_stick
    if not host or layout != stick_layout(host, eps):
        return False
    strides = row_major_strides(host)
    dim_of = {st: k for k, (n, st) in enumerate(zip(host, strides)) if n > 1}
    spans: dict[int, int] = {}
    corner = 0
    for term, coeff in index.as_coefficients_dict().items():
        if not coeff.is_Integer:
            return False
        if term is sympy.S.One:
            corner = int(coeff)
            continue
        if not isinstance(term, sympy.Symbol) or term not in ranges:
            return False
        extent = int(ranges[term])
        if extent <= 1:
            continue  # never stepped: the rule leaves it out
        k = dim_of.get(int(coeff))
        if k is None or k in spans:
            return False
        spans[k] = extent
    digits = [corner // st % n for n, st in zip(host, strides)]
    if sum(o * st for o, st in zip(digits, strides)) != corner or digits[-1] % eps:
        return False
    return all(digits[k] + extent <= host[k] for k, extent in spans.items())


def _check_index(layout: StickLayout, index: sympy.Expr, ranges: Mapping[sympy.Symbol, int]) -> None:
    """An index must be integer-linear in ranged vars and stay inside the tensor."""
    const, terms = index.as_coeff_Add()
    if not const.is_Integer:
        raise LoweringError(f"device_coordinates: index {index} has a non-integer constant")
    lo = hi = int(const)
    for term in sympy.Add.make_args(terms):
        if term == 0:
            continue
        coef, var = term.as_coeff_Mul()
        if not coef.is_Integer or not var.is_Symbol:
            raise LoweringError(f"device_coordinates: index {index} is not integer-linear (term {term})")
        if var not in ranges:
            raise LoweringError(f"device_coordinates: index {index} uses {var}, which has no range in {dict(ranges)}")
        span = int(coef) * (int(ranges[var]) - 1)
        lo, hi = lo + min(span, 0), hi + max(span, 0)
    numel = math.prod(layout.host_size)
    if lo < 0 or hi >= max(numel, 1):
        raise LoweringError(
            f"device_coordinates: index {index} reaches host elements {lo}..{hi}, outside the "
            f"{numel} elements of layout {_describe(layout)}"
        )


def _matches_digits(coords: Sequence[sympy.Expr], layout: StickLayout, index: sympy.Expr,
                    ranges: Mapping[sympy.Symbol, int]) -> bool:
    """Check ``coords`` against the true device position of each host element, computed in
    numpy from host digits, on a sweep of each var (others 0) and 257 fixed random points."""
    syms = sorted(index.free_symbols | {s for e in coords for s in e.free_symbols}, key=lambda s: s.name)
    size = [int(ranges.get(s, 1)) for s in syms]
    periods = _periods(layout)
    sweeps = [_sweep(n, _coefficient(index, s), periods) for s, n in zip(syms, size)]
    rng = np.random.default_rng(0)
    total = sum(len(sw) for sw in sweeps)
    points = [np.concatenate([np.zeros(total, np.int64), rng.integers(0, n, 257)]) for n in size]
    at = 0
    for i, sw in enumerate(sweeps):
        points[i][at:at + len(sw)] = sw
        at += len(sw)
    npts = len(points[0]) if points else 1
    h = np.broadcast_to(np.asarray(compile_index(index, syms)(*points)), (npts,))
    host, hstr, eps = layout.host_size, row_major_strides(layout.host_size), layout.elems_per_stick
    stick, seen = layout.dim_map[-1], set()
    for i, k in enumerate(layout.dim_map):
        if k == -1 or host[k] == 1:
            want = np.zeros(npts, np.int64)
        else:
            digit = (h // hstr[k]) % host[k]
            if k == stick:
                want = digit % eps if k in seen else digit // eps
            else:
                want = digit
            seen.add(k)
        if i == len(layout.dim_map) - 1 and stick == -1:
            want = np.zeros(npts, np.int64)
        try:
            got = np.broadcast_to(np.asarray(compile_index(coords[i], syms)(*points)), (npts,))
        except LoweringError:
            return False
        if not np.array_equal(got, want):
            return False
    return True


_SWEEP = 4096  # a var's first and last values swept whole; past them, only where a digit wraps


def _sweep(n: int, coef: int, periods: Sequence[int]) -> np.ndarray:
    """Values of a var of range ``n`` to check a coordinate form on: all of them for a short
    range; otherwise the first and last ``_SWEEP`` and both sides of every point where
    ``coef * var`` crosses a multiple of a period longer than that (a host or device stride or
    size, where a digit wraps). A coordinate form and the digits differ by a linear part plus
    a part periodic in those periods, so a disagreement shows within one short period of the
    start or at a long period's wrap: the work grows with a dim's tiles, not its elements."""
    if n <= 2 * _SWEEP:
        return np.arange(n, dtype=np.int64)
    parts = [np.arange(_SWEEP, dtype=np.int64), np.arange(n - _SWEEP, n, dtype=np.int64)]
    step = max(abs(coef), 1)
    for m in periods:
        if m // step > _SWEEP // 2:
            at = np.arange(m, step * n, m, dtype=np.int64) // step
            parts += [at - 1, at, at + 1]
    out = np.unique(np.concatenate(parts))
    return out[(out >= 0) & (out < n)]


def _periods(layout: StickLayout) -> tuple[int, ...]:
    strides = row_major_strides(layout.host_size)
    return tuple(sorted({int(x) for x in (*layout.host_size, *strides, *layout.device_size, *layout.stride_map)
                         if int(x) > 1}))


def _coefficient(index: sympy.Expr, var: sympy.Symbol) -> int:
    coef = index.coeff(var)
    return int(coef) if coef.is_Integer else 1


def exact_coordinates(
    layout: StickLayout, index: sympy.Expr, ranges: Mapping[sympy.Symbol, int]
) -> tuple[sympy.Expr, ...]:
    """Device coordinates as floor/Mod of the host digits of ``index``: correct for every
    index that stays inside the tensor, but not a form stick DMA understands."""
    host = layout.host_size
    strides = row_major_strides(host)
    eps = layout.elems_per_stick
    seen: set[int] = set()
    coords: list[sympy.Expr] = []
    for h in layout.dim_map:
        if h == -1 or host[h] == 1:
            coords.append(sympy.S.Zero)
            continue
        digit = sympy.floor(index / strides[h]) if strides[h] > 1 else index
        stick, inner = h == layout.dim_map[-1], h in seen
        # sympy 1.14 folds nested Mods wrongly: Mod(2*Mod(s, 32), 32) becomes 2*Mod(s, 32)
        # (wrong for s >= 16), and Mod(Mod(2*s + 16*x, 16), 32) becomes 2*Mod(Mod(s, 8)**2, 16);
        # a strided read of the stick dim (x[..., ::2]) makes both. So a stick digit is built
        # without nesting where a Mod is redundant: by the dim's size under the stick's Mod
        # when eps divides it, and the stick's own when the dim fits one stick.
        if stick and inner and host[h] % eps == 0:
            digit = sympy.Mod(digit, eps)
        else:
            if h > 0:  # the index stays inside the tensor (_check_index), so dim 0 needs no Mod
                digit = sympy.Mod(digit, host[h])
            if stick and host[h] <= eps:
                digit = digit if inner else sympy.S.Zero
            elif stick:  # a dim over several sticks, not a multiple of eps: kept unevaluated
                digit = sympy.Mod(digit, eps, evaluate=False) if inner else sympy.floor(digit / eps)
        seen.add(h)
        coords.append(digit)
    if layout.dim_map[-1] == -1:
        coords[-1] = sympy.S.Zero
    return tuple(coords)


def stick_coordinates(
    layout: StickLayout, index: sympy.Expr, ranges: Mapping[sympy.Symbol, int]
) -> tuple[sympy.Expr, ...]:
    """The stick rule: one coordinate expression per device dim for the flat host index.

    ``index`` is ``sum(coef * var) + const`` with integer ``coef``; ``ranges[var]`` is the
    number of values ``var`` takes (from 0). Per var, with ``step = coef`` and
    ``limit = coef * range`` (torch-spyre ``compute_coordinates``), among device dims of size > 1
    and stride > 0:

    - the *primary* dim, the one with the largest stride <= step, and every dim whose stride
      lies strictly between step and limit receive a term ``floor(var * step / stride)``;
    - that term becomes ``floor(Mod(var * step, next) / stride)`` when ``next``, the next larger
      stride, is < limit, i.e. the var overflows the dim.

    A var of range 1 contributes nothing. The constant is peeled positionally, largest stride
    first, so a padded stick dim never receives a modular remainder of it. The stick coordinate
    must end up ``Mod(v, eps)``, ``v`` or ``0``, optionally plus a constant.
    """
    index = as_expr(index, "stick_coordinates")
    coeffs, constant = _linear_terms(layout, index)
    sizes, strides = layout.device_size, layout.stride_map
    n = len(sizes)
    live = [d for d in range(n) if sizes[d] > 1 and strides[d] > 0]
    next_stride = {d: min((strides[e] for e in live if strides[e] > strides[d]), default=None) for d in live}
    coords: list[sympy.Expr] = [sympy.S.Zero] * n

    for var, coef in coeffs.items():
        if var not in ranges:
            raise LoweringError(
                f"device_coordinates: index {index} uses {var}, which has no range in "
                f"{dict(ranges)}; layout {_describe(layout)}"
            )
        extent = int(ranges[var])
        if extent <= 1:
            continue
        step, limit = coef, coef * extent
        if limit < step:
            raise LoweringError(
                f"device_coordinates: index {index} walks {var} backwards (coefficient {coef}, "
                f"range {extent}) on layout {_describe(layout)}; a device coordinate can only "
                f"ascend: reverse the tensor on the host or copy it reversed first"
            )
        primary = None
        for d in live:
            st = strides[d]
            if st <= step:
                if primary is None or st > strides[primary]:
                    primary = d
            elif st < limit:
                coords[d] += _term(var, step, st, next_stride[d], limit)
        if primary is None:
            raise LoweringError(
                f"device_coordinates: index {index} steps {var} by {step} host elements, finer "
                f"than every device dim of layout {_describe(layout)}"
            )
        if step % strides[primary]:
            # The part of each step below the primary stride would have to carry into finer
            # dims, which a sum of single-var terms cannot express: refuse, never mis-address.
            raise LoweringError(
                f"device_coordinates: index {index} steps {var} by {step} host elements, not a "
                f"multiple of the device dim stride {strides[primary]} of layout {_describe(layout)}; "
                f"the view regroups elements across device dims: copy the tensor first"
            )
        coords[primary] += _term(var, step, strides[primary], next_stride[primary], limit)

    if constant:
        remaining = constant
        for d in sorted(live, key=lambda d: strides[d], reverse=True):
            digit, remaining = divmod(remaining, strides[d])
            coords[d] += digit
        if remaining:
            raise LoweringError(
                f"device_coordinates: constant offset {constant} of index {index} is not a "
                f"position of layout {_describe(layout)} (remainder {remaining})"
            )

    _check_stick_expr(layout, index, coords[-1])
    return tuple(coords)


def element_offset(layout: StickLayout, coords: Sequence[int]) -> int:
    """Row-major element offset of a device coordinate (padded sticks counted)."""
    if len(coords) != len(layout.device_size):
        raise ExecutionError(
            f"element_offset: {len(coords)} coordinates {tuple(coords)} for the "
            f"{len(layout.device_size)} device dims of {_describe(layout)}"
        )
    offset = 0
    for d, (c, size) in enumerate(zip(coords, layout.device_size)):
        c = int(c)
        if not 0 <= c < size:
            raise ExecutionError(
                f"element_offset: coordinate {c} of device dim {d} is outside [0, {size}) in {_describe(layout)}"
            )
        offset = offset * size + c
    return offset


def byte_offset(layout: StickLayout, coords: Sequence[int]) -> int:
    """Byte offset of a device coordinate from the tensor's base address."""
    return element_offset(layout, coords) * layout.elem_bytes


# --- helpers ---------------------------------------------------------------------------------


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_dim_order(host: tuple[int, ...], order: tuple[int, ...]) -> None:
    rank = len(host)
    if rank > MAX_HOST_RANK:
        raise GraphError(f"stick layout: host rank {rank} of {host} exceeds {MAX_HOST_RANK}")
    dense = order[:-1] if order and order[-1] == -1 else order
    if sorted(dense) != list(range(rank)):
        raise GraphError(
            f"stick layout: dim_order {order} must be a permutation of the {rank} host dims of "
            f"{host}, optionally followed by -1 (sparse)"
        )


def _dim_map(order: tuple[int, ...]) -> tuple[int, ...]:
    if not order:
        return (-1, -1)
    if len(order) == 1:
        return (order[0], order[0])
    return order[1:] + (order[0], order[-1])


def _describe(layout: StickLayout) -> str:
    return (
        f"StickLayout(host {list(layout.host_size)}, device {list(layout.device_size)}, "
        f"stride_map {list(layout.stride_map)}, dim_order {list(layout.dim_order)}, "
        f"eps {layout.elems_per_stick})"
    )


def _linear_terms(layout: StickLayout, index: sympy.Expr) -> tuple[dict[sympy.Symbol, int], int]:
    coeffs: dict[sympy.Symbol, int] = {}
    constant = 0
    for term in sympy.Add.make_args(index):
        coef, rest = term.as_coeff_Mul()
        if not coef.is_Integer or not (rest is sympy.S.One or rest.is_Symbol):
            raise LoweringError(
                f"device_coordinates: index {index} is not a sum of integer * var terms plus a "
                f"constant (term {term}); layout {_describe(layout)}"
            )
        if rest is sympy.S.One:
            constant += int(coef)
        else:
            coeffs[rest] = coeffs.get(rest, 0) + int(coef)
    if constant < 0:
        raise LoweringError(
            f"device_coordinates: index {index} has a negative constant offset {constant}; layout {_describe(layout)}"
        )
    return {v: c for v, c in coeffs.items() if c != 0}, constant


def _term(var: sympy.Symbol, step: int, stride: int, nxt: int | None, limit: int) -> sympy.Expr:
    """``floor(var*step / stride)``, or ``floor(Mod(var*step, nxt) / stride)`` if nxt < limit.

    Built already reduced (common factors cancelled, no floor around an exact quotient), so the
    result does not depend on the symbol's assumptions: ``floor(Mod(256*c, 16384)/256)`` comes
    out as ``Mod(c, 64)``, which sympy itself reaches only for integer symbols.
    """
    if nxt is None or nxt >= limit:
        return _floor_div(step, var, stride)
    g = math.gcd(step, nxt)
    modulus = nxt // g
    if modulus == 1:
        return sympy.S.Zero
    inner = sympy.Mod((step // g) * var, modulus)
    return _floor_div(g, inner, stride)


def _floor_div(coef: int, x: sympy.Expr, divisor: int) -> sympy.Expr:
    """``floor(coef * x / divisor)`` for integer-valued ``x``, reduced."""
    g = math.gcd(coef, divisor)
    coef, divisor = coef // g, divisor // g
    if divisor == 1:
        return coef * x
    return sympy.floor(sympy.Rational(coef, divisor) * x)


def _check_stick_expr(layout: StickLayout, index: sympy.Expr, expr: sympy.Expr) -> None:
    const, rest = expr.as_coeff_Add()
    eps = layout.elems_per_stick
    ok = const.is_Integer and (
        rest is sympy.S.Zero
        or rest.is_Symbol
        or (isinstance(rest, sympy.Mod) and rest.args[0].is_Symbol and rest.args[1] == eps)
    )
    if not ok:
        names = sorted(str(s) for s in expr.free_symbols) or ["none"]
        raise LoweringError(
            f"device_coordinates: index {index} gives stick coordinate {expr} (var "
            f"{', '.join(names)}) on layout {_describe(layout)}; a stick coordinate must be "
            f"Mod(v, {eps}), v or 0, optionally plus a constant: access the stick dim with unit "
            f"stride or restickify the tensor"
        )
