"""JSON Schemas of the stage artifacts' documents, derived from the IR declarations.

``fspyre.ir.serialize`` writes an artifact field by field from its frozen dataclass; this
module walks the same declarations (the same type hints the loader checks against) and says
what such a document looks like as a JSON Schema (draft 2020-12): an object per class with
``"_type"``, its fields (required unless they have a default, no others), tuples as arrays,
``FrozenMap`` as ``{"_map": [[key, value], ...]}``, sympy expressions as ``{"_expr": tree}``.
The loader stays the authority (it also bounds sizes and checks each class's invariants);
the schema lets tools outside fspyre validate and read the documents.

The files ship in ``fspyre/schemas/`` (``<stage>.schema.json``), written by
``python -m fspyre.ir.schema``; a test checks they are current. The per-op SDSC documents'
schema (``sdsc.schema.json``) is written by hand from docs/sdsc-schema.md: it is the device
contract, not derived from a Python declaration.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import types
import typing
from pathlib import Path
from typing import Any

import sympy

from fspyre.ir import serialize
from fspyre.ir.frozen import FrozenMap
from fspyre.ir.graph import Graph
from fspyre.ir.looptree import LoopTree
from fspyre.ir.plans import Allocation, SplitPlan, TilingPlan, TilingSearch
from fspyre.ir.program import Program
from fspyre.ir.report import TrafficReport
from fspyre.ir.symbolic import SymbolicSizes

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "schemas"
DRAFT = "https://json-schema.org/draft/2020-12/schema"

# One schema per document the CLI writes: the stage artifacts (``NN_<stage>.json``; the
# resident tree is a LoopTree) and the traffic report (``report.json``).
ARTIFACTS: dict[str, type] = {
    "graph": Graph, "tiling_search": TilingSearch, "tiling_plan": TilingPlan, "loop_tree": LoopTree,
    "split_plan": SplitPlan, "allocation": Allocation, "program": Program, "symbolic": SymbolicSizes,
    "traffic_report": TrafficReport,
}

_EXPR_NODE: dict[str, Any] = {"anyOf": [
    {"type": "integer"},
    {"type": "object", "properties": {"sym": {"type": "string"}}, "required": ["sym"], "additionalProperties": False},
    {"type": "object", "properties": {"size": {"type": "string"}}, "required": ["size"],
     "additionalProperties": False},
    {"type": "object", "properties": {"rat": {"type": "array", "items": {"type": "integer"}, "minItems": 2,
                                               "maxItems": 2}},
     "required": ["rat"], "additionalProperties": False},
    {"type": "object", "properties": {"op": {"enum": ["Add", "Mul", "Pow", "floor", "ceiling", "Mod"]},
                                      "args": {"type": "array", "items": {"$ref": "#/$defs/expr_node"}}},
     "required": ["op", "args"], "additionalProperties": False},
]}
_BASE_DEFS: dict[str, Any] = {
    "expr_node": _EXPR_NODE,
    "expr": {"type": "object", "properties": {"_expr": {"$ref": "#/$defs/expr_node"}}, "required": ["_expr"],
             "additionalProperties": False},
    "float": {"anyOf": [{"type": "number"},
                        {"type": "object", "properties": {"_float": {"enum": ["inf", "-inf", "nan"]}},
                         "required": ["_float"], "additionalProperties": False}]},
    # a value whose field declares no type: any document value
    "any": {},
}


class _Builder:
    def __init__(self) -> None:
        self.defs: dict[str, Any] = dict(_BASE_DEFS)

    def of(self, tp: Any) -> dict[str, Any]:
        """The schema of a value of the declared type ``tp``."""
        if tp is Any or tp is object:
            return {"$ref": "#/$defs/any"}
        origin = typing.get_origin(tp)
        if origin is typing.Union or origin is types.UnionType:
            return {"anyOf": [self.of(t) for t in typing.get_args(tp)]}
        if origin is typing.Literal:
            return {"enum": list(typing.get_args(tp))}
        if origin is tuple:
            args = typing.get_args(tp)
            if len(args) == 2 and args[1] is Ellipsis:
                return {"type": "array", "items": self.of(args[0])}
            if not args:
                return {"type": "array"}
            return {"type": "array", "prefixItems": [self.of(a) for a in args], "items": False}
        if origin is FrozenMap or tp is FrozenMap:
            key, value = typing.get_args(tp) or (Any, Any)
            pair = {"type": "array", "prefixItems": [self.of(key), self.of(value)], "items": False, "minItems": 2}
            return {"type": "object", "properties": {"_map": {"type": "array", "items": pair}}, "required": ["_map"],
                    "additionalProperties": False}
        if tp is type(None):
            return {"type": "null"}
        if tp is bool:
            return {"type": "boolean"}
        if tp is int:
            return {"type": "integer"}
        if tp is str:
            return {"type": "string"}
        if tp is float:
            return {"$ref": "#/$defs/float"}
        if isinstance(tp, type) and issubclass(tp, sympy.Basic):
            # an index the IR holds as a plain int is written as a number
            return {"$ref": "#/$defs/expr"} if tp is sympy.Symbol else {"anyOf": [{"type": "integer"},
                                                                                   {"$ref": "#/$defs/expr"}]}
        if isinstance(tp, type) and serialize._CLASSES.get(tp.__name__) is tp:
            self.cls(tp)
            return {"$ref": f"#/$defs/{tp.__name__}"}
        raise TypeError(f"schema: no rule for the declared type {tp!r}")

    def cls(self, cls: type) -> None:
        if cls.__name__ in self.defs:
            return
        self.defs[cls.__name__] = {}  # recursive classes (a Loop's body holds Loops) refer to themselves
        hints = typing.get_type_hints(cls)
        fields = [f for f in dataclasses.fields(cls) if not f.metadata.get("derived")]
        properties: dict[str, Any] = {"_type": {"const": cls.__name__}}
        properties.update({f.name: self.of(hints[f.name]) for f in fields})
        required = ["_type"] + [f.name for f in fields
                                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        self.defs[cls.__name__] = {"type": "object", "properties": properties, "required": required,
                                   "additionalProperties": False}


def artifact_schema(name: str) -> dict[str, Any]:
    """The JSON Schema of the document ``serialize.dumps`` writes for the artifact ``name``."""
    cls = ARTIFACTS[name]
    builder = _Builder()
    builder.cls(cls)
    top = dict(builder.defs[cls.__name__])
    top["properties"] = {"_format": {"const": serialize.FORMAT}, **top["properties"]}
    top["required"] = ["_format", *top["required"]]
    return {"$schema": DRAFT, "$id": f"https://fspyre.invalid/schemas/{name}.schema.json",
            "title": f"fspyre {cls.__name__} artifact, format {serialize.FORMAT}", **top,
            "$defs": dict(sorted(builder.defs.items()))}


def schema_text(name: str) -> str:
    return json.dumps(artifact_schema(name), indent=1) + "\n"


def load_schema(name: str) -> dict[str, Any]:
    """A shipped schema: an artifact's name, or ``sdsc``."""
    return json.loads((SCHEMA_DIR / f"{name}.schema.json").read_text())


def main(argv: list[str] | None = None) -> int:
    """Write every artifact schema into fspyre/schemas/ (run after changing an IR class)."""
    SCHEMA_DIR.mkdir(exist_ok=True)
    for name in ARTIFACTS:
        (SCHEMA_DIR / f"{name}.schema.json").write_text(schema_text(name))
        print(f"wrote {SCHEMA_DIR / name}.schema.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
