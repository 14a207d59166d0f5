"""JSON round trip (fspyre.ir.serialize): every artifact comes back equal, whatever its dims
are called; malformed documents give SerializationError."""

from __future__ import annotations

import json
import math

import pytest
import sympy

import fspyre
from fspyre.errors import GraphError, SerializationError
from fspyre.ir.frozen import FrozenMap
from fspyre.ir.graph import Dim, HintScope, Scalar, sym
from fspyre.ir.serialize import FORMAT, dumps, from_json, loads, to_json
from fspyre.machine.spyre import spyre


def round_trip(x):
    back = loads(dumps(x))
    assert back == x
    assert hash(back) == hash(x)
    assert dumps(back) == dumps(x)
    return back


def graph_over(name: str) -> fspyre.Graph:
    """Every kind of index a dim can appear in: contiguous, permuted, broadcast, reduced, reshaped."""
    g = fspyre.GraphBuilder("names")
    d, k = g.dim(name, 3), g.dim("K", 64)
    x = g.input("x", (d, k), "float16")
    v = g.input("v", (Dim(name, 1), k), "float32")
    y = g.add(g.permute(x, (1, 0)), g.permute(v, (1, 0)))
    g.output("y", y)
    g.output("s", g.sum(x, [name], keepdim=True))
    g.output("r", g.neg(g.reshape(x, (g.dim("F", 192),))))
    g.output("m", g.matmul(x, g.input("w", (d, g.dim("N2", 5)), "float32"), contract=name))
    with g.hint(slices={name: 3}):
        g.output("h", g.abs(x))
    return g.build()


# Names that are sympy constants, functions or parser internals, and Python keywords or constants.
CLASHING = [
    "N", "E", "S", "I", "Q", "O", "beta", "gamma", "pi", "oo", "zoo", "nan", "exp", "sqrt", "Float",
    "Rational", "Symbol", "Integer", "floor", "Mod", "ceiling", "lambda_", "lambda", "None", "True",
    "False", "and", "print",
]


@pytest.mark.parametrize("name", CLASHING)
def test_dims_named_like_sympy_or_python_builtins_round_trip(name):
    """A name Dim accepts must survive JSON as a plain symbol; a name that cannot must be refused
    when the dim is declared, not when a compiled artifact is loaded back."""
    try:
        graph = graph_over(name)
    except GraphError as err:
        assert repr(name) in str(err)
        return
    back = round_trip(graph)
    assert sym(name) in back.ops[0].operands[0].index.free_symbols | back.ops[0].operands[1].index.free_symbols
    comp = fspyre.compile(graph, machine=spyre(cores=3), tiling="none")
    for art in comp.stages.values():
        round_trip(art)


def test_json_forms():
    a = sym("A")
    doc = to_json(FrozenMap({a: (3, 1), "k": (1, 2)}))
    assert doc == {"_map": [[{"_expr": {"sym": "A"}}, [3, 1]], ["k", [1, 2]]]}
    assert to_json(4096 * a + 7) == {"_expr": {"op": "Add", "args": [7, {"op": "Mul", "args": [4096, {"sym": "A"}]}]}}
    assert to_json(Scalar(value=math.inf)) == {"_type": "Scalar", "value": {"_float": "inf"}}
    assert loads(dumps(Scalar(value=-math.inf))) == Scalar(value=-math.inf)
    assert math.isnan(loads(dumps(Scalar(value=math.nan))).value)
    assert from_json([1, [2, 3]]) == (1, (2, 3))  # the IR has no lists
    for value in (True, 0, -7, 0.1, 1e-300, 2.0):
        back = loads(dumps(Scalar(value=value))).value
        assert back == value and type(back) is type(value)


def test_frozen_map_keeps_order_and_non_string_keys():
    m = FrozenMap([(sym("B"), 1), (sym("A"), 2), (3, "x")])
    back = round_trip(m)
    assert list(back) == [sym("B"), sym("A"), 3]


def test_expressions_keep_floor_mod_and_assumptions():
    n, e = sym("N"), sym("E")
    for expr in (sympy.floor(n / 64), sympy.Mod(n, 64), 3 * n + e + 7, sympy.floor(sympy.Mod(e, 128) / 64), sympy.S(0)):
        back = from_json(to_json(expr))
        assert back == expr
        assert all(s.is_integer and s.is_nonnegative for s in back.free_symbols)


def test_hint_scopes_round_trip():
    round_trip(HintScope(id=2, slices=FrozenMap({"M": 4, "N": 2}), work_div=FrozenMap({"M": 2})))


@pytest.mark.parametrize(
    "text, match",
    [
        ("{", "not JSON"),
        ('{"_type": "Nope"}', "unknown artifact type 'Nope'"),
        ('{"_type": "Dim"}', "Dim:"),
        ('{"_type": "Dim", "name": "A", "size": 2, "extra": 1}', "Dim:"),
        ('{"_expr": {"op": "Sin", "args": [1]}}', "unknown expression node"),
    ],
)
def test_malformed_documents(text, match):
    text = '{"_format": %d, ' % FORMAT + text[1:]  # in the current format: refused for its contents
    with pytest.raises(SerializationError, match=match):
        loads(text)


def test_invalid_values_in_a_document_are_reported_by_the_ir():
    with pytest.raises(GraphError, match="size 0"):
        loads(json.dumps({"_format": FORMAT, "_type": "Dim", "name": "A", "size": 0}))


def test_only_ir_classes_serialize():
    with pytest.raises(SerializationError, match="Machine is not an fspyre IR class"):
        dumps(spyre())
    with pytest.raises(SerializationError, match="cannot serialize a set"):
        dumps({1, 2})
