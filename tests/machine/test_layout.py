"""The stick layout's coordinate forms: the rule that skips the check against the host digits
(``_walks_whole``) holds wherever it skips it."""

from __future__ import annotations

import sympy
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fspyre.machine import layout as L
from fspyre.machine.rules import row_major_strides
from fspyre.testing import examples

SHAPES = st.lists(st.one_of(st.integers(1, 5), st.integers(1, 300)), min_size=1, max_size=4)
EPS = st.sampled_from([32, 64, 128])


def walk(shape: list[int]) -> tuple[sympy.Expr, dict[sympy.Symbol, int]]:
    """The row-major offset of ``shape`` with one var per dim, and the vars' ranges."""
    syms = [sympy.Symbol(f"v{k}", integer=True, nonnegative=True) for k in range(len(shape))]
    index = sum((st * v for v, st, n in zip(syms, row_major_strides(tuple(shape)), shape) if n > 1), sympy.S.Zero)
    return index, {v: n for v, n in zip(syms, shape)}


@settings(max_examples=examples(200), deadline=None)
@given(shape=SHAPES, eps=EPS)
def test_a_whole_row_major_walk_of_the_default_layout_is_the_stick_rule_unchecked(shape, eps):
    layout = L.stick_layout(shape, eps)
    index, ranges = walk(shape)
    if index == 0:
        return  # a one-element tensor: no var, the check runs (and is trivial)
    assert L._walks_whole(layout, index, ranges)
    rule = L.stick_coordinates(layout, index, ranges)
    # what the skipped check would have said, on its sweeps and sample points
    assert L._matches_digits(rule, layout, index, ranges)
    key = tuple(sorted(ranges.items(), key=lambda p: p[0].name))
    assert L.device_coordinates(layout, index, ranges) == rule == L._device_coordinates.__wrapped__(layout, index, key)


@settings(max_examples=examples(100), deadline=None)
@given(shape=SHAPES.filter(lambda s: sum(n > 1 for n in s) >= 2), eps=EPS, data=st.data())
def test_any_other_walk_is_checked(shape, eps, data):
    layout = L.stick_layout(shape, eps)
    index, ranges = walk(shape)
    live = [v for v, n in ranges.items() if n > 1]
    kind = data.draw(st.sampled_from(["swapped", "part", "offset", "layout"]))
    if kind == "swapped":  # a transposed read: two dims' strides exchanged
        a, b = live[:2]
        assume(ranges[a] != ranges[b])  # of equal sizes, it is the same walk with its vars renamed
        index = index.xreplace({a: b, b: a})
    elif kind == "part":  # a var over part of its dim
        ranges = {**ranges, live[0]: ranges[live[0]] - 1}
    elif kind == "offset":
        index = index + 1
    else:  # another dim sticked
        layout = L.stick_layout(shape, eps, dim_order=list(range(len(shape)))[::-1])
    assert not L._walks_whole(layout, index, ranges)
