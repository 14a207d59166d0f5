"""JSON round trip for every stage artifact.

One generic codec walks frozen dataclasses field by field; a class is named by ``"_type"``.
Tuples become JSON lists (and lists come back as tuples: the IR has no lists), FrozenMaps
become ``{"_map": [[key, value], ...]}`` so order and non-string keys survive, and sympy
expressions are written as small trees (``{"op": "Add", "args": [...]}``, ``{"sym": "A"}``,
integers as numbers), so a dim called ``N``, ``E`` or ``floor`` stays a symbol.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import sympy

from fspyre.errors import SerializationError
from fspyre.ir import graph, looptree, plans, program
from fspyre.ir.frozen import FrozenMap

_CLASSES: dict[str, type] = {}
for _module in (graph, looptree, plans, program):
    for _name in dir(_module):
        _obj = getattr(_module, _name)
        if isinstance(_obj, type) and dataclasses.is_dataclass(_obj) and _obj.__module__ == _module.__name__:
            _CLASSES[_name] = _obj

# Expressions are written as trees, not text: a dim may be called ``floor``, ``Integer`` or
# ``lambda``, and no text parser keeps such names apart from sympy's own.
_HEADS: dict[str, Any] = {
    "Add": sympy.Add, "Mul": sympy.Mul, "Pow": sympy.Pow,
    "floor": sympy.floor, "ceiling": sympy.ceiling, "Mod": sympy.Mod,
}


def _expr_to(e: sympy.Basic) -> Any:
    if e.is_Integer:
        return int(e)
    if e.is_Symbol:
        return {"sym": e.name}
    if e.is_Rational:
        return {"rat": [int(e.p), int(e.q)]}
    head = type(e).__name__
    if head not in _HEADS:
        raise SerializationError(f"cannot serialize expression {e} (no rule for {head})")
    return {"op": head, "args": [_expr_to(a) for a in e.args]}


def _expr_from(data: Any) -> sympy.Expr:
    if isinstance(data, int):
        return sympy.Integer(data)
    if "sym" in data:
        return graph.sym(data["sym"])
    if "rat" in data:
        return sympy.Rational(*data["rat"])
    head = _HEADS.get(data.get("op"))
    if head is None:
        raise SerializationError(f"unknown expression node {data!r}")
    return head(*(_expr_from(a) for a in data["args"]))


def to_json(obj: Any) -> Any:
    """The JSON-ready form of an artifact (dicts, lists, numbers, strings)."""
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else {"_float": repr(obj)}
    if isinstance(obj, sympy.Basic):
        return {"_expr": _expr_to(obj)}
    if isinstance(obj, FrozenMap):
        return {"_map": [[to_json(k), to_json(v)] for k, v in obj.items()]}
    if isinstance(obj, tuple):
        return [to_json(x) for x in obj]
    if dataclasses.is_dataclass(obj):
        name = type(obj).__name__
        if _CLASSES.get(name) is not type(obj):
            raise SerializationError(f"{name} is not an fspyre IR class")
        out = {"_type": name}
        for f in dataclasses.fields(obj):
            out[f.name] = to_json(getattr(obj, f.name))
        return out
    raise SerializationError(f"cannot serialize a {type(obj).__name__}: {obj!r}")


def from_json(data: Any) -> Any:
    if data is None or isinstance(data, (bool, int, str, float)):
        return data
    if isinstance(data, list):
        return tuple(from_json(x) for x in data)
    if isinstance(data, dict):
        if "_expr" in data:
            return _expr_from(data["_expr"])
        if "_float" in data:
            return float(data["_float"])
        if "_map" in data:
            return FrozenMap((from_json(k), from_json(v)) for k, v in data["_map"])
        name = data.get("_type")
        cls = _CLASSES.get(name)
        if cls is None:
            raise SerializationError(f"unknown artifact type {name!r}; known: {sorted(_CLASSES)}")
        kwargs = {k: from_json(v) for k, v in data.items() if k != "_type"}
        try:
            return cls(**kwargs)
        except TypeError as err:
            raise SerializationError(f"{name}: {err}") from None
    raise SerializationError(f"unexpected JSON value {data!r}")


def dumps(obj: Any, indent: int | None = 1) -> str:
    return json.dumps(to_json(obj), indent=indent, sort_keys=False)


def loads(text: str) -> Any:
    try:
        return from_json(json.loads(text))
    except json.JSONDecodeError as err:
        raise SerializationError(f"not JSON: {err}") from None
