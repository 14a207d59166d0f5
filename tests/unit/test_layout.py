"""Stick layouts (fspyre.machine.layout) and coordinate evaluation (fspyre.machine.indexing).

Expected values come from worked examples L1-L11 of torch-spyre's default stick layout
(``SpyreTensorLayout``: device dims, stride maps, padding of the stick dim).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import sympy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fspyre.errors import GraphError, LoweringError
from fspyre.machine.indexing import compile_index
from fspyre.machine.layout import (
    StickLayout,
    byte_offset,
    device_coordinates,
    element_offset,
    row_major_strides,
    stick_layout,
)

c0, c1, c2, c3 = C = sympy.symbols("c0 c1 c2 c3")


def flat_index(shape):
    return sum((s * v for s, v in zip(row_major_strides(shape), C)), sympy.S.Zero)


# --- worked examples ------------------------------------------------------------------------

# (name, host_size, eps, dim_order, device_size, stride_map, nbytes or None)
EXAMPLES = [
    ("L1", (1024, 4096), 64, None, (64, 1024, 64), (64, 4096, 1), 8 << 20),
    ("L2", (512, 240), 64, None, (4, 512, 64), (64, 240, 1), None),
    ("L3", (512, 8, 240), 64, None, (8, 4, 512, 64), (240, 64, 1920, 1), None),
    ("L4-1d", (120,), 64, None, (2, 64), (64, 1), None),
    ("L4-scalar", (), 64, None, (1, 64), (-1, -1), 128),
    ("L5-default", (5, 100, 150), 64, None, (100, 3, 5, 64), (150, 64, 15000, 1), None),
    ("L5-order", (5, 100, 150), 64, (1, 0, 2), (5, 3, 100, 64), (15000, 64, 150, 1), None),
    ("L6", (512, 256), 64, (1, 0), (8, 256, 64), (16384, 1, 256), None),
    ("L7", (512, 256), 64, (0, 1, -1), (256, 1, 512, 64), (1, -1, 256, -1), None),
    ("L8", (512, 8, 256), 64, (2, 1, 0), (8, 8, 256, 64), (256, 131072, 1, 2048), None),
    ("L9", (256, 1024), 32, None, (32, 256, 32), (32, 1024, 1), 1 << 20),
    ("L10", (512,), 64, (0, -1), (1, 512, 64), (-1, 1, -1), 64 << 10),
]


@pytest.mark.parametrize(
    "host, eps, order, device, strides, nbytes",
    [e[1:] for e in EXAMPLES],
    ids=[e[0] for e in EXAMPLES],
)
def test_reference_layouts(host, eps, order, device, strides, nbytes):
    layout = stick_layout(host, eps, order)
    assert layout.device_size == device
    assert layout.stride_map == strides
    assert layout.elems_per_stick == eps
    assert layout.elem_bytes == 128 // eps
    assert layout.nbytes == math.prod(device[:-1]) * 128
    if nbytes is not None:
        assert layout.nbytes == nbytes


def test_l1_coordinates_and_offsets():
    layout = stick_layout((1024, 4096), 64)
    coords = device_coordinates(layout, 4096 * c0 + c1, {c0: 1024, c1: 4096})
    assert coords == (sympy.floor(c1 / 64), c0, sympy.Mod(c1, 64))
    assert [str(c) for c in coords] == ["floor(c1/64)", "c0", "Mod(c1, 64)"]
    point = tuple(compile_index(e, (c0, c1))(3, 130) for e in coords)
    assert point == (2, 3, 2)
    assert element_offset(layout, point) == 131_266
    assert byte_offset(layout, point) == 262_532
    assert layout.nbytes == 8 * 1024 * 1024


def test_per_tile_coordinates_match_full_tensor():
    layout = stick_layout((1024, 4096), 64)
    full = device_coordinates(layout, 4096 * c0 + c1, {c0: 1024, c1: 4096})
    tile = device_coordinates(layout, 4096 * c0 + c1, {c0: 512, c1: 1024})
    assert tile == full


def test_l10_sparse_reduction_output():
    layout = stick_layout((512,), 64, (0, -1))
    assert device_coordinates(layout, c0, {c0: 512}) == (0, c0, 0)
    assert layout.nbytes == 64 * 1024
    # one value per stick: element i sits at the start of stick i
    assert [element_offset(layout, (0, i, 0)) for i in (0, 1, 511)] == [0, 64, 511 * 64]


def test_l9_fp32_coordinates():
    layout = stick_layout((256, 1024), 32)
    coords = device_coordinates(layout, 1024 * c0 + c1, {c0: 256, c1: 1024})
    assert coords == (sympy.floor(c1 / 32), c0, sympy.Mod(c1, 32))
    assert byte_offset(layout, (1, 0, 1)) == (256 * 32 + 1) * 4


@pytest.mark.parametrize(
    "host, order, expected",
    [
        # L6: stick on host dim 0 (stride 256); derived by hand from the rule.
        ((512, 256), (1, 0), lambda: (sympy.floor(c0 / 64), c1, sympy.Mod(c0, 64))),
        # L7: sparse, one element per stick.
        ((512, 256), (0, 1, -1), lambda: (c1, 0, c0, 0)),
        # L8: stick on host dim 0 of a rank-3 tensor.
        ((512, 8, 256), (2, 1, 0), lambda: (c1, sympy.floor(c0 / 64), c2, sympy.Mod(c0, 64))),
        # L5 default: rank 3, padded stick (150 -> 3 sticks).
        ((5, 100, 150), None, lambda: (c1, sympy.floor(c2 / 64), c0, sympy.Mod(c2, 64))),
    ],
    ids=["L6", "L7", "L8", "L5"],
)
def test_dim_order_coordinates(host, order, expected):
    layout = stick_layout(host, 64, order)
    ranges = dict(zip(C, host))
    assert device_coordinates(layout, flat_index(host), ranges) == expected()


def test_l11_dma_spec():
    # ((4,1024,64),(65536,64,1),(64,256,1)): device[i*65536 + j*64 + k] = host[j*256 + i*64 + k]
    layout = stick_layout((1024, 256), 64)
    assert layout.device_size == (4, 1024, 64)
    assert layout.device_strides == (65536, 64, 1)
    assert layout.stride_map == (64, 256, 1)
    coords = device_coordinates(layout, 256 * c0 + c1, {c0: 1024, c1: 256})
    j, c = np.ix_(np.arange(1024), np.arange(256))
    offset = sum(compile_index(e, (c0, c1))(j, c) * s for e, s in zip(coords, layout.device_strides))
    i, k = c // 64, c % 64
    np.testing.assert_array_equal(offset, i * 65536 + j * 64 + k)


def test_constant_offset_is_peeled_positionally():
    # [3, 100] fp16: rows are padded to 128 elements. x[1:, 64:] starts at host offset 164.
    layout = stick_layout((3, 100), 64)
    assert layout.stride_map == (64, 100, 1)
    assert device_coordinates(layout, sympy.Integer(130), {}) == (0, 1, 30)
    coords = device_coordinates(layout, 100 * c0 + c1 + 164, {c0: 2, c1: 36})
    assert coords == (1, c0 + 1, c1)


def test_range_one_vars_contribute_nothing():
    layout = stick_layout((1024, 4096), 64)
    coords = device_coordinates(layout, 4096 * c0 + c1, {c0: 1, c1: 4096})
    assert coords == (sympy.floor(c1 / 64), 0, sympy.Mod(c1, 64))


def test_scalar_and_size_one_dims():
    assert device_coordinates(stick_layout((), 64), sympy.Integer(0), {}) == (0, 0)
    layout = stick_layout((7, 1), 64)
    assert layout.device_size == (1, 7, 64) and layout.stride_map == (-1, 1, -1)
    assert device_coordinates(layout, c0 + c1, {c0: 7, c1: 1}) == (0, c0, 0)


# --- errors ---------------------------------------------------------------------------------


def test_backward_traversal_falls_back_to_exact_coordinates():
    # the stick rule refuses a reversed walk; the exact digit form addresses it correctly
    layout = stick_layout((1024, 4096), 64)
    coords = device_coordinates(layout, 4096 * (1023 - c0) + c1, {c0: 1024, c1: 4096})
    at = [int(e.subs({c0: 3, c1: 130})) for e in coords]
    assert at == [2, 1020, 2]


def test_strided_stick_access_is_exact_or_refused():
    # every other element of a row: the stick rule refuses; the exact digit form is used when
    # sympy keeps it verifiable, else a LoweringError names the index -- never a wrong address
    layout = stick_layout((1024, 4096), 64)
    try:
        coords = device_coordinates(layout, 4096 * c0 + 2 * c1, {c0: 1024, c1: 2048})
    except LoweringError as err:
        assert "2*c1" in str(err) and "[64, 1024, 64]" in str(err)
        return
    assert [int(e.subs({c0: 3, c1: 65})) for e in coords] == [2, 3, 2]  # host (3, 130)


@pytest.mark.parametrize(
    "index, ranges",
    [
        (c0 * c1, {c0: 4, c1: 4}),  # not linear
        (c0 / 2, {c0: 4}),  # rational coefficient
        (c0 + c2, {c0: 4}),  # c2 has no range
        (c0 - 5, {c0: 4}),  # negative constant
    ],
)
def test_unsupported_indices(index, ranges):
    with pytest.raises(LoweringError):
        device_coordinates(stick_layout((1024, 4096), 64), index, ranges)


@pytest.mark.parametrize(
    "fields",
    [
        dict(device_size=(64, 1024, 32)),  # last dim != eps
        dict(device_size=(64, 1024)),  # wrong device rank
        dict(stride_map=(64, 0, 1)),  # zero stride
        dict(dim_order=(1, 1)),  # not a permutation
        dict(device_size=[64, 1024, 64]),  # list field
        dict(host_size=(0, 4096)),  # empty dim
        dict(elems_per_stick=48),  # does not divide 128 bytes
    ],
)
def test_layout_validation(fields):
    base = dict(
        host_size=(1024, 4096),
        device_size=(64, 1024, 64),
        stride_map=(64, 4096, 1),
        dim_order=(0, 1),
        elems_per_stick=64,
    )
    with pytest.raises(GraphError):
        StickLayout(**(base | fields))


def test_stick_layout_rejects_bad_dim_order_and_rank():
    with pytest.raises(GraphError):
        stick_layout((4, 4), 64, (0, 2))
    with pytest.raises(GraphError):
        stick_layout((2,) * 7, 64)


def test_layout_is_frozen():
    layout = stick_layout((4, 4), 64)
    with pytest.raises(AttributeError):
        layout.host_size = (8, 8)  # type: ignore[misc]


# --- properties: layout + coordinates -------------------------------------------------------


@st.composite
def layouts(draw):
    """A host shape (rank 1-4, sizes 1-300, at most ~200k elements), eps and a dim order."""
    rank = draw(st.integers(1, 4))
    budget, shape = 200_000, []
    for _ in range(rank):
        size = draw(st.integers(1, max(1, min(300, budget))))
        shape.append(size)
        budget //= size
    eps = draw(st.sampled_from([32, 64]))
    order = tuple(draw(st.permutations(range(rank))))
    if draw(st.booleans()):
        order += (-1,)
    return tuple(shape), eps, order


def expected_offsets(layout, grid):
    """Device element offset of every host element, straight from the layout's dim_map."""
    dmap, last = layout.dim_map, len(layout.device_size) - 1
    total = 0
    for d, (h, stride) in enumerate(zip(dmap, layout.device_strides)):
        if h == -1:
            continue
        if d == last:
            coord = grid[h] % layout.elems_per_stick
        elif h == dmap[-1]:
            coord = grid[h] // layout.elems_per_stick
        else:
            coord = grid[h]
        total = total + coord * stride
    return total


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts(), st.randoms(use_true_random=False))
def test_host_to_device_map_is_exact(case, rnd):
    shape, eps, order = case
    layout = stick_layout(shape, eps, order)
    syms = C[: len(shape)]
    coords = device_coordinates(layout, flat_index(shape), dict(zip(syms, shape)))
    fns = [compile_index(e, syms) for e in coords]

    grid = np.ix_(*(np.arange(n, dtype=np.int64) for n in shape))
    per_dim = [np.broadcast_to(f(*grid), shape) for f in fns]
    offsets = sum(c * s for c, s in zip(per_dim, layout.device_strides))

    # in bounds per device dim and overall, injective, equal to the direct layout formula
    for c, size in zip(per_dim, layout.device_size):
        assert c.min() >= 0 and c.max() < size
    assert offsets.min() >= 0 and offsets.max() < math.prod(layout.device_size)
    assert np.unique(offsets).size == math.prod(shape)
    np.testing.assert_array_equal(offsets, np.broadcast_to(expected_offsets(layout, grid), shape))

    # padded stick slots are never hit: every hit slot holds a real element of the stick host dim
    stick_host = layout.dim_map[-1]
    if stick_host != -1:
        outer = layout.dim_map.index(stick_host)
        along = per_dim[outer] * eps + per_dim[-1]
        assert along.max() < shape[stick_host]
    else:
        assert not per_dim[-1].any()

    # element by element: scalar evaluation (plain ints) and sympy's own evaluation agree
    points = [tuple(rnd.randrange(n) for n in shape) for _ in range(40)]
    for k, point in enumerate(points):
        scalar = tuple(f(*point) for f in fns)
        assert element_offset(layout, scalar) == offsets[point]
        if k < 5:
            subs = dict(zip(syms, point))
            assert tuple(int(e.subs(subs)) for e in coords) == scalar


# --- compile_index --------------------------------------------------------------------------

x, y, z = XYZ = sympy.symbols("x y z")


def index_exprs():
    leaves = st.sampled_from(XYZ) | st.integers(-7, 20).map(sympy.Integer)

    def extend(children):
        return st.one_of(
            st.tuples(children, children).map(lambda t: t[0] + t[1]),
            st.tuples(st.integers(-4, 4), children).map(lambda t: t[0] * t[1]),
            st.tuples(children, st.integers(1, 70)).map(lambda t: sympy.floor(t[0] / t[1])),
            st.tuples(children, children, st.integers(1, 9), st.integers(2, 9)).map(
                lambda t: sympy.floor(t[0] / t[2] + t[1] / t[3])
            ),
            st.tuples(children, st.integers(1, 70)).map(lambda t: sympy.Mod(t[0], t[1])),
        )

    return st.recursive(leaves, extend, max_leaves=8)


@settings(max_examples=300, deadline=None)
@given(index_exprs(), st.lists(st.tuples(*[st.integers(-100, 300)] * 3), min_size=1, max_size=8))
def test_compile_index_agrees_with_sympy(expr, points):
    f = compile_index(expr, XYZ)
    for p in points:
        assert f(*p) == int(expr.subs(dict(zip(XYZ, p))))
    # vectorized on an open grid, element by element against the scalar path
    axes = [np.array(sorted({p[i] for p in points}), dtype=np.int64) for i in range(3)]
    values = np.broadcast_to(f(*np.ix_(*axes)), tuple(len(a) for a in axes))
    for idx in np.ndindex(values.shape):
        assert values[idx] == f(*(int(a[i]) for a, i in zip(axes, idx)))


def test_compile_index_floor_mod_on_arrays():
    f = compile_index(sympy.floor(x / 64) * 1024 + sympy.Mod(x, 64) + 64 * y, (x, y))
    xs, ys = np.ix_(np.arange(200, dtype=np.int64), np.arange(3, dtype=np.int64))
    out = f(xs, ys)
    assert out.dtype == np.int64 and out.shape == (200, 3)
    np.testing.assert_array_equal(out, (xs // 64) * 1024 + xs % 64 + 64 * ys)
    assert f(130, 2) == 2 * 1024 + 2 + 128
    assert compile_index(sympy.Integer(7), ())() == 7


def test_compile_index_is_cached():
    assert compile_index(sympy.Mod(x, 64), (x,)) is compile_index(sympy.Mod(x, 64), [x])


@pytest.mark.parametrize(
    "expr",
    [x / 2, x**2, sympy.Mod(x, y), sympy.ceiling(x / 3), sympy.Float(1.5) * x, x + z],
    ids=["rational", "pow", "symbolic-mod", "ceiling", "float", "unknown-symbol"],
)
def test_compile_index_rejects(expr):
    with pytest.raises(LoweringError) as err:
        compile_index(expr, (x, y))
    assert str(expr) in str(err.value) or "z" in str(err.value)
