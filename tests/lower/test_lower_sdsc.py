"""Per-op SDSC JSON (fspyre.lower.sdsc): schema, agreement with the bundle and the OpSpecs."""

from __future__ import annotations

import itertools
import json
import math
import re
from pathlib import Path

import pytest
import sympy
from looped_programs import all_programs, hinted_cases

from fspyre.ir.program import op_specs
from fspyre.lower.bundle import plan_bundle
from fspyre.lower.sdsc import SCHEMA, jsonable, sdsc_json
from fspyre.machine import formats

REPO = Path(__file__).resolve().parents[2]

PROGRAMS = all_programs()

OP_KEYS = {"schema", "file", "index", "op", "name", "is_reduction", "runs", "loops", "iteration_space", "cores",
           "core_to_slice", "core_spaces", "tensors", "op_info"}
TENSOR_KEYS = {"name", "role", "operand", "arg_index", "device_dtype", "device_size", "device_coordinates",
               "allocation", "address", "core_offsets", "tile_advance", "bytes"}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_schema_keys_and_strict_json(name):
    program = PROGRAMS[name]
    files = sdsc_json(program)
    assert list(files) == [f"sdsc_{i}.json" for i in range(len(op_specs(program)))]
    for filename, doc in files.items():
        assert json.loads(json.dumps(doc, allow_nan=False)) == doc
        assert set(doc) == OP_KEYS and doc["schema"] == SCHEMA and doc["file"] == filename
        for space in doc["iteration_space"].values():
            assert set(space) == {"size", "split", "per_core", "slices"}
            assert len(space["slices"]) == space["split"] and sum(space["slices"]) == space["size"]
            assert space["per_core"] == max(space["slices"])
        for t in doc["tensors"]:
            assert set(t) == TENSOR_KEYS
            assert set(t["address"]) == {"symbol_id", "value", "base", "offset"}
            assert len(t["core_offsets"]) == doc["cores"]
            assert len(t["tile_advance"]) == len(doc["loops"])
        assert {"fn", "operands", "compute"} <= set(doc["op_info"])


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_agrees_with_the_opspecs_and_the_bundle(name):
    program = PROGRAMS[name]
    plan = plan_bundle(program)
    for spec, ex, doc in zip(op_specs(program), plan.executes(), sdsc_json(program).values(), strict=True):
        assert doc["file"] == ex.filename and doc["index"] == ex.index
        assert (doc["op"], doc["name"], doc["is_reduction"]) == (spec.op, spec.name, spec.is_reduction)
        assert [lp["loop"] for lp in doc["loops"]] == list(ex.loops)
        assert [lp["induction_var"] for lp in doc["loops"]] == [f"%i_{k}" for k in ex.loops]
        if spec.tiled_symbols:
            assert [lp["tiled_symbols"] for lp in doc["loops"]] == [[str(s) for s in lvl] for lvl in spec.tiled_symbols]
        assert doc["cores"] == spec.cores
        assert [t["address"]["symbol_id"] for t in doc["tensors"]] == list(ex.symbol_ids)
        for n, (t, arg) in enumerate(zip(doc["tensors"], spec.args, strict=True)):
            assert t["operand"] == n and t["name"] == arg.name
            assert t["role"] == ("input" if arg.is_input else "output")
            assert t["allocation"] == {arg.memory: arg.address}
            assert t["tile_advance"] == (list(arg.tile_advance) or [0] * len(ex.loops))
            assert t["device_coordinates"] == [str(c) for c in arg.device_coordinates]
            assert sympy.sympify(t["device_coordinates"][-1], locals={str(s): s for s in spec.iteration_space}) \
                == arg.device_coordinates[-1]
            base = plan.symbols[-t["address"]["symbol_id"] - 1]
            assert t["address"]["value"] == f"%{base.name}" and t["address"]["base"] == base.kind


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_core_mapping_and_offsets(name):
    """Cores enumerate the slices with the first iteration-space symbol fastest (the anchor's
    core_to_slice); each HBM tensor's core offset is the byte offset of its slice's first element."""
    program = PROGRAMS[name]
    for spec, doc in zip(op_specs(program), sdsc_json(program).values()):
        splits = [split for _, split in spec.iteration_space.values()]
        # itertools.product varies the last factor fastest, so enumerate reversed and flip back.
        expected = [list(reversed(p)) for p in itertools.product(*(range(s) for s in reversed(splits)))]
        assert doc["core_to_slice"] == expected
        syms = list(spec.iteration_space)
        slices_of = [doc["iteration_space"][str(s)]["slices"] for s in syms]
        starts = [[sum(ext[:k]) for k in range(len(ext))] for ext in slices_of]
        assert doc["core_spaces"] == [
            {str(s): [starts[i][k], slices_of[i][k]] for i, (s, k) in enumerate(zip(syms, sl))} for sl in expected]
        for t, arg in zip(doc["tensors"], spec.args):
            if arg.memory == "lx":
                assert t["core_offsets"] == [0] * spec.cores
                continue
            strides = [math.prod(arg.device_size[i + 1:]) for i in range(len(arg.device_size))]
            nbytes = formats.FORMATS[arg.device_dtype].nbytes
            for core, slices in enumerate(expected):
                point = {s: starts[i][k] for i, (s, k) in enumerate(zip(syms, slices))}
                coords = [int(sympy.sympify(c).subs(point)) for c in arg.device_coordinates]
                assert t["core_offsets"][core] == sum(c * st for c, st in zip(coords, strides)) * nbytes


def test_op_info_values():
    docs = list(sdsc_json(PROGRAMS["row_sum"]).values())
    mul, total = docs
    assert mul["op_info"]["operands"] == [["arg", 0], ["scalar", 0.5]]
    assert total["op_info"]["reduced"] == ["B"] and total["op_info"]["count"] == 128
    assert total["is_reduction"] and not mul["is_reduction"]
    mm = list(sdsc_json(PROGRAMS["matmul"]).values())[0]
    assert mm["op"] == "batchmatmul" and mm["op_info"]["fn"] == "matmul"


def test_jsonable_is_strict():
    x = sympy.Symbol("x", integer=True)
    value = {"a": (1, 2.5, float("-inf"), float("nan")), "b": sympy.floor(x / 64), "c": [True, None, x]}
    assert jsonable(value) == {"a": [1, 2.5, "-inf", "nan"], "b": "floor(x/64)", "c": [True, None, "x"]}
    json.dumps(jsonable(value), allow_nan=False)


def _shape(value):
    """The key structure and value types of a JSON document, without the values."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shape(value[0])] if value else []
    return type(value).__name__


def test_schema_doc_example_is_current():
    """docs/sdsc-schema.md shows sdsc_1.json of the small canonical example; its keys and
    value types must be today's (the values follow the split policy, which may change)."""
    text = (REPO / "docs" / "sdsc-schema.md").read_text()
    block = re.search(r"```json\n(.*?)\n```", text, re.S)
    assert block, "docs/sdsc-schema.md has no ```json example"
    example = json.loads(block.group(1))
    program, _ = hinted_cases()["canonical_2x2"]
    current = sdsc_json(program)["sdsc_1.json"]
    assert _shape(example) == _shape(current)
    assert [t["name"] for t in example["tensors"]] == [t["name"] for t in current["tensors"]]
    assert [t["tile_advance"] for t in example["tensors"]] == [t["tile_advance"] for t in current["tensors"]]
    for key in OP_KEYS:
        assert f"`{key}`" in text
    for key in TENSOR_KEYS:
        assert f"`{key}`" in text
