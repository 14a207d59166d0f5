"""The stick layout's coordinate forms: the rule that skips the check against the host digits
(``_walks_box``) holds wherever it skips it."""

from __future__ import annotations

import sympy
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fspyre.machine import layout as L
from fspyre.machine.rules import row_major_strides
from fspyre.testing import examples

SHAPES = st.lists(st.one_of(st.integers(1, 5), st.integers(1, 300)), min_size=1, max_size=4)
EPS = st.sampled_from([32, 64, 128])


def walk(shape: list[int], corner: list[int] | None = None,
         extents: list[int] | None = None) -> tuple[sympy.Expr, dict[sympy.Symbol, int]]:
    """The row-major offset of a box of ``shape`` (whole by default) with one var per dim, and
    the vars' ranges."""
    corner = corner or [0] * len(shape)
    extents = extents or list(shape)
    strides = row_major_strides(tuple(shape))
    syms = [sympy.Symbol(f"v{k}", integer=True, nonnegative=True) for k in range(len(shape))]
    index = sum((st * v for v, st, n in zip(syms, strides, shape) if n > 1), sympy.S.Zero)
    index += sum(o * st for o, st in zip(corner, strides))
    return index, {v: e for v, e in zip(syms, extents)}


@st.composite
def boxes(draw, eps: int) -> tuple[list[int], list[int], list[int]]:
    """A shape and a box of it whose corner starts at a whole stick of the last dim."""
    shape = draw(SHAPES)
    corner, extents = [], []
    for k, n in enumerate(shape):
        if k == len(shape) - 1:
            o = eps * draw(st.integers(0, (n - 1) // eps))
        else:
            o = draw(st.integers(0, n - 1))
        corner.append(o)
        extents.append(draw(st.integers(1, n - o)))
    return shape, corner, extents


@settings(max_examples=examples(300), deadline=None)
@given(eps=EPS, data=st.data())
def test_a_row_major_walk_of_a_box_of_the_default_layout_is_the_stick_rule_unchecked(eps, data):
    shape, corner, extents = data.draw(boxes(eps)) if data.draw(st.booleans()) else (data.draw(SHAPES), None, None)
    layout = L.stick_layout(shape, eps)
    index, ranges = walk(shape, corner, extents)
    assume(index.free_symbols)  # a fixed element: no var to check
    assert L._walks_box(layout, index, ranges)
    rule = L.stick_coordinates(layout, index, ranges)
    # what the skipped check would have said, on its sweeps and sample points
    assert L._matches_digits(rule, layout, index, ranges)
    key = tuple(sorted(((s, n) for s, n in ranges.items() if s in index.free_symbols), key=lambda p: p[0].name))
    assert L.device_coordinates(layout, index, ranges) == rule == L._device_coordinates.__wrapped__(layout, index, key)


@settings(max_examples=examples(100), deadline=None)
@given(shape=SHAPES.filter(lambda s: sum(n > 1 for n in s) >= 2), eps=EPS, data=st.data())
def test_any_other_walk_is_checked(shape, eps, data):
    layout = L.stick_layout(shape, eps)
    index, ranges = walk(shape)
    live = [v for v, n in ranges.items() if n > 1]
    kind = data.draw(st.sampled_from(["swapped", "overflow", "mid-stick", "layout"]))
    if kind == "swapped":  # a transposed read: two dims' strides exchanged
        a, b = live[:2]
        assume(ranges[a] != ranges[b])  # of equal sizes, it is the same walk with its vars renamed
        index = index.xreplace({a: b, b: a})
    elif kind == "overflow":  # the whole range of a dim from a corner past its start
        k = data.draw(st.sampled_from(range(len(live))))
        index = index + row_major_strides(tuple(shape))[int(live[k].name[1:])]
    elif kind == "mid-stick":  # a corner inside a stick of the last dim
        assume(shape[-1] > 1)
        o = data.draw(st.integers(1, shape[-1] - 1).filter(lambda o: o % eps))
        index = index + o
        ranges = {**ranges, live[-1]: shape[-1] - o}
    else:  # another dim sticked
        layout = L.stick_layout(shape, eps, dim_order=list(range(len(shape)))[::-1])
    assert not L._walks_box(layout, index, ranges)
