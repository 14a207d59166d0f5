"""JSON round trip for every stage artifact.

One generic codec walks frozen dataclasses field by field; a class is named by ``"_type"``.
Tuples become JSON lists (and lists come back as tuples: the IR has no lists), FrozenMaps
become ``{"_map": [[key, value], ...]}`` so order and non-string keys survive, and sympy
expressions are written as small trees (``{"op": "Add", "args": [...]}``, ``{"sym": "A"}``,
integers as numbers, the size of a symbolic dim ``{"size": "S"}``), so a dim called ``N``, ``E``
or ``floor`` stays a symbol. A document's
top-level object states the artifact format it was written in (``"_format"``); ``loads`` reads
only the current one.

Loading treats the document as hostile. Every field is checked against the type its IR class
declares before anything is built, expressions are built node by node from the known heads
(never parsed from text), and document size, nesting depth, integer size and the size of the
numbers sympy would compute are bounded, so loading takes time linear in the text. Anything
else is a ``SerializationError`` naming the path to the bad value.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from collections.abc import Callable
from typing import Any

import sympy

from fspyre.errors import FspyreError, SerializationError
from fspyre.ir import graph, looptree, plans, program, report, symbolic
from fspyre.ir.frozen import FrozenMap
from fspyre.proof import artifact as proof_artifact

_CLASSES: dict[str, type] = {}
for _module in (graph, looptree, plans, program, report, symbolic, proof_artifact):
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

# Limits on what a document may ask of the loader. Real artifacts stay far below them: the
# largest gallery program is about 35 kB and nests 15 levels deep (a loop level adds two),
# and its expressions have tens of nodes with integers below 2**40.
MAX_DOCUMENT_CHARS = 32 << 20
MAX_DEPTH = 100  # JSON nesting levels; the decoder recurses a few Python frames per level
MAX_INT = 1 << 63  # any integer, in a field or an expression: |n| < 2**63
MAX_STRING_CHARS = 1 << 16
MAX_EXPR_NODES = 1024  # nodes of one expression tree
MAX_EXPR_BITS = 4096  # bound on the size of any number sympy computes while building one
MAX_EXPONENT = 64  # |integer exponent| of a Pow node
_FLOATS = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}

# The artifact schema's version, written into every document and required by ``loads``: a
# document of another schema is refused whole instead of failing at its first changed field.
# 1 (documents without "_format"): op_info as a map, TensorArg's allocation as a map.
# 2: op_info an OpInfo record, TensorArg's memory and address fields.
# 3: OpNode.runs and OpSpec.runs (ops that run only in their loop's first or last iteration).
# 4: LoopSpec.tiled_symbols (the dims a loop tiles) and OpInfo.rows / cols (a batchmatmul's operand roles).
FORMAT = 4


def _expr_to(e: sympy.Basic) -> Any:
    if e.is_Integer:
        return int(e)
    if symbolic.is_size_symbol(e):
        return {"size": symbolic.size_dim_name(e)}
    if e.is_Symbol:
        return {"sym": e.name}
    if e.is_Rational:
        return {"rat": [int(e.p), int(e.q)]}
    head = type(e).__name__
    if head not in _HEADS:
        raise SerializationError(f"cannot serialize expression {e} (no rule for {head})")
    return {"op": head, "args": [_expr_to(a) for a in e.args]}


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
            if not f.metadata.get("derived"):  # recomputed by the stage that needs it
                out[f.name] = to_json(getattr(obj, f.name))
        return out
    raise SerializationError(f"cannot serialize a {type(obj).__name__}: {obj!r}")


def dumps(obj: Any, indent: int | None = 1) -> str:
    data = to_json(obj)
    if isinstance(data, dict):
        data = {"_format": FORMAT, **data}
    return json.dumps(data, indent=indent, sort_keys=False)


def loads(text: str) -> Any:
    """The artifact (an IR dataclass, or a FrozenMap of values such as ``Compilation.stages``)
    a ``dumps`` document describes; ``SerializationError`` for anything else."""
    if not isinstance(text, str):
        raise SerializationError(f"loads takes the JSON text as a str, got a {type(text).__name__}")
    if len(text) > MAX_DOCUMENT_CHARS:
        raise SerializationError(
            f"document of {len(text)} characters exceeds the {MAX_DOCUMENT_CHARS}-character limit"
        )
    data = _parse(text)
    if isinstance(data, dict):
        data = _current_format(data)
    value = _decode(data, Any, "document", 0)
    if not isinstance(value, FrozenMap) and _CLASSES.get(type(value).__name__) is not type(value):
        raise SerializationError(
            f"document: expected an fspyre artifact (an object with \"_type\"), got {_kind(data)}"
        )
    return _verified(value)


def _verified(value: Any) -> Any:
    """``value`` after the whole-artifact verifier of its kind: a document is as untrusted as a
    hand-built artifact, and a stage handed it alone must not be the first to find it broken.
    A map of stages (``Compilation.stages``) has each artifact verified, and its tiling plan
    against its graph; split plans and allocations are verified by the stage they are handed
    to, against the tree and machine."""
    from fspyre.ir.graph import Graph, verify_graph
    from fspyre.ir.looptree import LoopTree
    from fspyre.ir.plans import TilingPlan
    from fspyre.ir.program import Program
    from fspyre.stages.arguments import verified
    from fspyre.stages.loop_tree import verify_loop_tree
    from fspyre.stages.program import verify_program
    from fspyre.stages.tiling_plan import verify_plan

    verifiers: dict[type, Callable[[Any], Any]] = {Graph: verify_graph, LoopTree: verify_loop_tree,
                                                   Program: verify_program}
    parts = value.values() if isinstance(value, FrozenMap) else (value,)
    for part in parts:
        verifier = verifiers.get(type(part))
        if verifier is not None:
            verified(verifier, part)
    if isinstance(value, FrozenMap):
        graph, plan = value.get("graph"), value.get("tiling_plan")
        if isinstance(graph, Graph) and isinstance(plan, TilingPlan) and not graph.symbolic:
            verified(verify_plan, graph, plan)
    return value


def _current_format(data: dict[str, Any]) -> dict[str, Any]:
    """The document without its ``"_format"`` key, which must name the current format."""
    if "_format" not in data:
        raise SerializationError(
            f"document: no \"_format\"; it predates artifact format {FORMAT} (written by an older fspyre, "
            f"format 1) and this fspyre reads only format {FORMAT}: compile the graph again to re-create it"
        )
    version = data["_format"]
    if type(version) is not int or version != FORMAT:
        raise SerializationError(
            f"document: artifact format {_short(version)}, but this fspyre reads only format {FORMAT}: "
            f"re-create the artifact with this fspyre"
        )
    return {k: v for k, v in data.items() if k != "_format"}


def from_json(data: Any) -> Any:
    """The value a ``to_json`` form describes, checked as ``loads`` checks a document."""
    return _decode(data, Any, "document", 0)


# -- parsing --------------------------------------------------------------------------------
def _refuse_constant(name: str) -> Any:
    raise SerializationError(f"document: bare {name} is not JSON; non-finite floats are written {{\"_float\": ...}}")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise SerializationError(f"document: key {_short(k)} appears twice in one object")
            seen.add(k)
    return out


def _parse(text: str) -> Any:
    try:
        return json.loads(text, parse_constant=_refuse_constant, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as err:
        raise SerializationError(f"not JSON: {err}") from None
    except RecursionError:
        raise SerializationError(f"document nests deeper than {MAX_DEPTH} levels") from None
    except ValueError as err:  # e.g. an integer literal beyond Python's digit limit
        raise SerializationError(f"not a usable JSON document: {_one_line(str(err))}") from None


# -- typed decoding -------------------------------------------------------------------------
_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _decode(data: Any, tp: Any, path: str, depth: int) -> Any:
    """``data`` as a value of the declared type ``tp``; ``path`` names it in errors."""
    if depth > MAX_DEPTH:
        raise SerializationError(f"{path}: nests deeper than {MAX_DEPTH} levels")
    if tp is Any or tp is object:
        return _decode_any(data, path, depth)
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        return _decode_union(data, typing.get_args(tp), path, depth)
    if origin is typing.Literal:
        if not any(type(data) is type(v) and data == v for v in typing.get_args(tp)):
            raise SerializationError(f"{path}: expected one of {list(typing.get_args(tp))}, got {_short(data)}")
        return data
    if origin is tuple:
        return _decode_tuple(data, typing.get_args(tp), path, depth)
    if origin is FrozenMap or tp is FrozenMap:
        key_tp, value_tp = typing.get_args(tp) or (Any, Any)
        return _decode_map(data, key_tp, value_tp, path, depth)
    if tp is type(None):
        if data is not None:
            raise SerializationError(f"{path}: expected null, got {_kind(data)}")
        return None
    if tp in _SCALARS:
        return _SCALARS[tp](data, path)
    if isinstance(tp, type) and issubclass(tp, sympy.Basic):
        return _decode_expr_field(data, tp, path, depth)
    if isinstance(tp, type) and _CLASSES.get(tp.__name__) is tp:
        return _decode_class(data, (tp,), path, depth)
    raise SerializationError(f"{path}: the loader has no rule for the declared type {tp!r}")


def _decode_union(data: Any, options: tuple[Any, ...], path: str, depth: int) -> Any:
    classes = tuple(t for t in options if isinstance(t, type) and _CLASSES.get(t.__name__) is t)
    if isinstance(data, dict) and "_type" in data and classes:
        return _decode_class(data, classes, path, depth)
    # A JSON value's own type picks the alternative: true/false is a bool, 3 an int, 3.0 a float.
    for tp in options:
        if tp in _SCALARS and _matches_scalar(data, tp):
            return _SCALARS[tp](data, path)
    if int in options and not isinstance(data, dict):  # a size: an integer, or an expression in symbolic sizes
        raise SerializationError(f"{path}: expected an integer or an expression tree, got {_kind(data)}")
    others = [t for t in options if t not in _SCALARS and t not in classes]
    for tp in others:
        if tp is type(None) and data is not None:
            continue
        return _decode(data, tp, path, depth)
    names = ", ".join(getattr(t, "__name__", repr(t)) for t in options)
    raise SerializationError(f"{path}: expected one of {names}, got {_kind(data)}")


def _matches_scalar(data: Any, tp: type) -> bool:
    if tp is float:
        return type(data) is float or (isinstance(data, dict) and set(data) == {"_float"})
    return type(data) is tp


def _decode_tuple(data: Any, args: tuple[Any, ...], path: str, depth: int) -> tuple:
    if not isinstance(data, list):
        raise SerializationError(f"{path}: expected a list, got {_kind(data)}")
    if len(args) == 2 and args[1] is Ellipsis:
        return tuple(_decode(x, args[0], f"{path}[{i}]", depth + 1) for i, x in enumerate(data))
    if not args:
        return tuple(_decode(x, Any, f"{path}[{i}]", depth + 1) for i, x in enumerate(data))
    if len(data) != len(args):
        raise SerializationError(f"{path}: expected a list of {len(args)} items, got {len(data)}")
    return tuple(_decode(x, t, f"{path}[{i}]", depth + 1) for i, (x, t) in enumerate(zip(data, args)))


def _decode_map(data: Any, key_tp: Any, value_tp: Any, path: str, depth: int) -> FrozenMap:
    if not isinstance(data, dict) or set(data) != {"_map"}:
        raise SerializationError(f"{path}: expected a map {{\"_map\": [[key, value], ...]}}, got {_kind(data)}")
    items = data["_map"]
    if not isinstance(items, list):
        raise SerializationError(f"{path}._map: expected a list of [key, value] pairs, got {_kind(items)}")
    pairs = []
    for i, item in enumerate(items):
        where = f"{path}._map[{i}]"
        if not isinstance(item, list) or len(item) != 2:
            raise SerializationError(f"{where}: expected a [key, value] pair, got {_kind(item)}")
        key = _decode(item[0], key_tp, f"{where}.key", depth + 2)
        pairs.append((key, _decode(item[1], value_tp, f"{path}[{_short(key)}]", depth + 2)))
    try:
        return FrozenMap(pairs)
    except (ValueError, TypeError) as err:
        raise SerializationError(f"{path}: {_one_line(str(err))}") from None


def _decode_class(data: Any, classes: tuple[type, ...], path: str, depth: int) -> Any:
    names = [c.__name__ for c in classes]
    if not isinstance(data, dict):
        raise SerializationError(f"{path}: expected {' or '.join(names)} (an object with \"_type\"), got {_kind(data)}")
    name = data.get("_type")
    cls = next((c for c in classes if c.__name__ == name), None)
    if cls is None:
        if isinstance(name, str) and name in _CLASSES:
            raise SerializationError(f"{path}: expected {' or '.join(names)}, got a {name}")
        raise SerializationError(f"{path}: unknown artifact type {_short(name)}; known: {sorted(_CLASSES)}")
    where = name if path == "document" else path
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("derived")}
    unknown = [k for k in data if k != "_type" and k not in fields]
    if unknown:
        raise SerializationError(f"{where}: {name} has no field {_short(unknown[0])}; its fields are {list(fields)}")
    missing = [
        f.name for f in fields.values()
        if f.name not in data and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise SerializationError(f"{where}: {name} misses the field {missing[0]!r}")
    kwargs = {k: _decode(v, hints[k], f"{where}.{k}", depth + 1) for k, v in data.items() if k != "_type"}
    try:
        return cls(**kwargs)
    except FspyreError as err:
        # The IR's own check refused a well-typed value: keep its class, add where it sits.
        raise type(err)(f"{where}: {_one_line(str(err))}") from None
    except (TypeError, ValueError, KeyError, AttributeError, ArithmeticError, RecursionError) as err:
        raise SerializationError(f"{where}: {name} refused these fields: {_one_line(str(err))}") from None


def _decode_any(data: Any, path: str, depth: int) -> Any:
    """A value whose field declares no type (``op_info`` values, a whole document)."""
    if data is None or type(data) in (bool, str):
        return _SCALARS[type(data)](data, path) if data is not None else None
    if type(data) is int:
        return _int(data, path)
    if type(data) is float:
        return data
    if isinstance(data, list):
        return _decode_tuple(data, (), path, depth)
    if isinstance(data, dict):
        if "_type" in data:
            return _decode_class(data, tuple(_CLASSES.values()), path, depth)
        if "_expr" in data:
            return _decode_expr_field(data, sympy.Basic, path, depth)
        if "_float" in data:
            return _float(data, path)
        if "_map" in data:
            return _decode_map(data, Any, Any, path, depth)
        raise SerializationError(
            f"{path}: an object must carry \"_type\", \"_expr\", \"_map\" or \"_float\", got keys {_short(list(data))}"
        )
    raise SerializationError(f"{path}: unexpected JSON value {_kind(data)}")


# -- scalars --------------------------------------------------------------------------------
def _int(data: Any, path: str) -> int:
    if type(data) is not int:
        raise SerializationError(f"{path}: expected an integer, got {_kind(data)}")
    if not -MAX_INT < data < MAX_INT:
        raise SerializationError(f"{path}: integer {_short(data)} is beyond ±2**63")
    return data


def _bool(data: Any, path: str) -> bool:
    if type(data) is not bool:
        raise SerializationError(f"{path}: expected true or false, got {_kind(data)}")
    return data


def _str(data: Any, path: str) -> str:
    if type(data) is not str:
        raise SerializationError(f"{path}: expected a string, got {_kind(data)}")
    if len(data) > MAX_STRING_CHARS:
        raise SerializationError(f"{path}: string of {len(data)} characters exceeds {MAX_STRING_CHARS}")
    return data


def _float(data: Any, path: str) -> float:
    if type(data) is float:
        return data
    if isinstance(data, dict) and set(data) == {"_float"}:
        if data["_float"] in _FLOATS:
            return _FLOATS[data["_float"]]
        raise SerializationError(f"{path}._float: expected one of {list(_FLOATS)}, got {_short(data['_float'])}")
    raise SerializationError(f"{path}: expected a float, got {_kind(data)}")


_SCALARS: dict[type, Callable[[Any, str], Any]] = {int: _int, bool: _bool, str: _str, float: _float}


# -- expressions ----------------------------------------------------------------------------
def _decode_expr_field(data: Any, tp: type, path: str, depth: int) -> Any:
    if type(data) is int and tp is not sympy.Symbol:
        return _int(data, path)  # an index the IR holds as a plain int
    if not isinstance(data, dict) or set(data) != {"_expr"}:
        raise SerializationError(f"{path}: expected an expression tree {{\"_expr\": ...}}, got {_kind(data)}")
    budget = [MAX_EXPR_NODES]
    expr, _ = _expr_from(data["_expr"], f"{path}._expr", depth + 1, budget)
    if not isinstance(expr, tp):
        raise SerializationError(f"{path}: expected a {tp.__name__}, got the expression {_short(expr)}")
    return expr


def _expr_from(data: Any, path: str, depth: int, budget: list[int]) -> tuple[sympy.Expr, int]:
    """The expression and an upper bound on the bits of any number in it, which keeps sympy's
    constant folding (``Pow(3, 10**7)``, products of huge integers) from running unbounded."""
    if depth > MAX_DEPTH:
        raise SerializationError(f"{path}: nests deeper than {MAX_DEPTH} levels")
    budget[0] -= 1
    if budget[0] < 0:
        raise SerializationError(f"{path}: expression has more than {MAX_EXPR_NODES} nodes")
    if type(data) is int:
        n = _int(data, path)
        return sympy.Integer(n), n.bit_length()
    if not isinstance(data, dict):
        raise SerializationError(f"{path}: expected an expression node (an integer or an object), got {_kind(data)}")
    if set(data) == {"sym"}:
        name = data["sym"]
        if type(name) is not str or not name.isidentifier() or len(name) > 256:
            raise SerializationError(f"{path}.sym: a symbol name must be a Python identifier, got {_short(name)}")
        return graph.sym(name), 0
    if set(data) == {"size"}:
        name = data["size"]
        if type(name) is not str or not name.isidentifier() or len(name) > 256:
            raise SerializationError(f"{path}.size: a dim name must be a Python identifier, got {_short(name)}")
        return symbolic.size_symbol(name), 0
    if set(data) == {"rat"}:
        pq = data["rat"]
        if not isinstance(pq, list) or len(pq) != 2:
            raise SerializationError(f"{path}.rat: expected [numerator, denominator], got {_kind(pq)}")
        p, q = _int(pq[0], f"{path}.rat[0]"), _int(pq[1], f"{path}.rat[1]")
        if q == 0:
            raise SerializationError(f"{path}.rat: denominator 0")
        return sympy.Rational(p, q), max(p.bit_length(), q.bit_length())
    if set(data) != {"op", "args"}:
        raise SerializationError(f"{path}: unknown expression node with keys {_short(sorted(data))}")
    head = data["op"]
    if not isinstance(head, str) or head not in _HEADS:
        raise SerializationError(f"{path}: unknown expression node {_short(head)}; known: {sorted(_HEADS)}")
    raw = data["args"]
    arity = {"Add": None, "Mul": None, "Pow": 2, "floor": 1, "ceiling": 1, "Mod": 2}[head]
    if not isinstance(raw, list) or (arity is not None and len(raw) != arity) or (arity is None and len(raw) < 2):
        want = f"{arity}" if arity is not None else "at least 2"
        raise SerializationError(f"{path}.args: {head} takes {want} arguments, got {_kind(raw)}")
    parts = [_expr_from(a, f"{path}.args[{i}]", depth + 2, budget) for i, a in enumerate(raw)]
    args, bits = [p[0] for p in parts], [p[1] for p in parts]
    if head == "Pow":
        exponent = args[1]
        if not exponent.is_Integer or abs(int(exponent)) > MAX_EXPONENT:
            raise SerializationError(
                f"{path}.args[1]: a Pow exponent must be an integer within ±{MAX_EXPONENT}, got {_short(exponent)}"
            )
        size = max(bits[0], 1) * abs(int(exponent))
    elif head in ("Add", "Mul"):
        # A sum of rationals multiplies denominators, so both grow by at most the sum.
        size = sum(bits) + len(bits)
    else:
        size = max(bits)
    if size > MAX_EXPR_BITS:
        raise SerializationError(f"{path}: {head} would compute numbers of more than {MAX_EXPR_BITS} bits")
    # floor, ceiling and Mod are rebuilt as written: a document from ``dumps`` holds them
    # already simplified, and simplifying a crafted one (``Mod`` of a sum of a hundred
    # rational terms) takes minutes. Add, Mul and Pow only fold numbers, bounded above.
    evaluate = head in ("Add", "Mul", "Pow")
    try:
        return _HEADS[head](*args, evaluate=evaluate), size
    except (TypeError, ValueError, ArithmeticError, RecursionError) as err:
        raise SerializationError(f"{path}: {head} refused its arguments: {_one_line(str(err))}") from None


# -- messages -------------------------------------------------------------------------------
def _kind(data: Any) -> str:
    if data is None:
        return "null"
    if isinstance(data, bool):
        return f"{str(data).lower()} (a boolean)"
    if isinstance(data, int):
        return f"the integer {_short(data)}"
    if isinstance(data, float):
        return f"the number {data!r}"
    if isinstance(data, str):
        return f"a string {_short(data)}"
    if isinstance(data, list):
        return f"a list of {len(data)} items"
    if isinstance(data, dict):
        return f"an object with keys {_short(list(data))}"
    return f"a {type(data).__name__}"


def _short(value: Any, limit: int = 60) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _one_line(text: str) -> str:
    return text.replace("\n", "\\n")
