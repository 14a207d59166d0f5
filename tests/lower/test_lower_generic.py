"""Generic MLIR (fspyre.lower.generic): parsed back by xdsl, and by mlir-opt when installed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from looped_programs import all_programs, hand_tiled_programs

from fspyre.ir.program import LoopSpec, op_specs, walk_specs
from fspyre.lower.bundle import plan_bundle
from fspyre.lower.generic import mlir_generic

xdsl = pytest.importorskip("xdsl")

from xdsl.context import Context  # noqa: E402
from xdsl.dialects.affine import Affine  # noqa: E402
from xdsl.dialects.arith import Arith  # noqa: E402
from xdsl.dialects.builtin import Builtin, ModuleOp, UnregisteredOp  # noqa: E402
from xdsl.dialects.func import Func  # noqa: E402
from xdsl.dialects.scf import Scf  # noqa: E402
from xdsl.parser import Parser  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def parse(text: str) -> ModuleOp:
    ctx = Context(allow_unregistered=True)
    for dialect in (Builtin, Func, Arith, Scf, Affine):
        ctx.load_dialect(dialect)
    module = Parser(ctx, text).parse_module()
    module.verify()
    return module


def op_name(op) -> str:
    """The op's MLIR name; xdsl files every unregistered op under builtin.unregistered."""
    return op.op_name.data if isinstance(op, UnregisteredOp) else op.name


PROGRAMS = all_programs()


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_xdsl_parses_and_the_structure_matches(name):
    program = PROGRAMS[name]
    module = parse(mlir_generic(program))
    ops = list(module.walk())
    names = [op_name(op) for op in ops]
    loops = [s for s, _ in walk_specs(program.body) if isinstance(s, LoopSpec)]
    assert names.count("func.func") == 1
    assert names.count("scf.for") == len(loops)
    execs = [op for op in ops if op_name(op) == "sdscbundle.sdsc_execute"]
    specs = op_specs(program)
    assert len(execs) == len(specs)
    for i, (op, spec) in enumerate(zip(execs, specs)):
        assert op.attributes["sdsc_filename"].data == f"sdsc_{i}.json"
        ids = [a.value.data for a in op.attributes["symbol_ids"].data]
        assert len(ids) == len(op.operands) == len(spec.args)
    plan = plan_bundle(program)
    applies = [op for op in ops if op.name == "affine.apply"]
    assert len(applies) == sum(1 for _ in _applies(plan.body))
    n_args = len({k.arg_index for k in program.kernel_args})
    func = next(op for op in ops if op.name == "func.func")
    assert len(func.body.blocks[0].args) == n_args
    assert names.count("sdscbundle.input_arg_extract") == n_args
    assert names.count("sdscbundle.device_mem_allocate") == (1 if plan.regions.pool_bytes else 0)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=hand_tiled_programs())
def test_property_xdsl_parses(case):
    program, _ = case
    module = parse(mlir_generic(program))
    execs = [op for op in module.walk() if op_name(op) == "sdscbundle.sdsc_execute"]
    assert len(execs) == len(op_specs(program))


def _applies(stmts):
    from fspyre.lower.bundle import ApplyMap, ForLoop, IfIteration

    for s in stmts:
        if isinstance(s, ApplyMap):
            yield s
        elif isinstance(s, (ForLoop, IfIteration)):
            yield from _applies(s.body)


def test_affine_maps_round_trip_through_xdsl():
    """The strides xdsl reads from each affine.apply are the plan's, bound to the right loops."""
    program = PROGRAMS["matmul_m_n"]
    plan = plan_bundle(program)
    module = parse(mlir_generic(program))
    parsed = [op for op in module.walk() if op.name == "affine.apply"]
    for op, stmt in zip(parsed, _applies(plan.body), strict=True):
        amap = op.properties["map"].data
        strides = plan.maps[stmt.map_index]
        assert amap.num_dims == len(strides) and amap.num_symbols == 1
        point = list(range(2, 2 + len(strides)))
        assert amap.eval(point, [1000]) == (1000 + sum(s * p for s, p in zip(strides, point)),)


@pytest.mark.skipif(shutil.which("mlir-opt") is None, reason="mlir-opt is not installed")
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_mlir_opt_parses(name, tmp_path):
    path = tmp_path / f"{name}.mlir"
    path.write_text(mlir_generic(PROGRAMS[name]))
    result = subprocess.run(["mlir-opt", "--allow-unregistered-dialect", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


_DUMP = """
import json, sys
sys.path.insert(0, {tests!r})
from looped_programs import all_programs
from fspyre.lower import bundle_mlir, mlir_generic, sdsc_json, unroll
from fspyre.ir.serialize import dumps
for name, p in sorted(all_programs().items()):
    print(name, bundle_mlir(p), mlir_generic(p), json.dumps(sdsc_json(p), sort_keys=False), dumps(unroll(p)))
"""


def test_output_is_stable_across_hash_seeds():
    code = _DUMP.format(tests=str(Path(__file__).parent))
    outs = []
    for seed in ("0", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO)}
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO)
        assert run.returncode == 0, run.stderr
        outs.append(run.stdout)
    assert outs[0] == outs[1] and len(outs[0]) > 1000


HOSTILE_NAMES = [
    'x\n"sdscbundle.sdsc_execute"() : () -> ()', "x*/ }", '"q"', "a\r\nb", "x\u2028y", "x // y", "x\x00y", "é",
]


def _renamed(program, old: str, new: str):
    """``program`` with every mention of tensor ``old`` renamed ``new``: built from the JSON
    form, as a hand-edited document would be (programs do not check names; the loop tree and
    graph they come from do)."""
    import json

    from fspyre.ir.serialize import dumps, from_json

    def walk(doc):
        if isinstance(doc, dict):
            return {k: (new if k in ("name", "buffer") and v == old else walk(v)) for k, v in doc.items()}
        if isinstance(doc, list):
            return [walk(v) for v in doc]
        return doc

    doc = json.loads(dumps(program))
    doc.pop("_format")
    return from_json(walk(doc))


@pytest.mark.parametrize("hostile", HOSTILE_NAMES)
def test_a_name_never_adds_a_line_or_an_op_to_mlir(hostile):
    from fspyre.lower.bundle import bundle_mlir

    program = PROGRAMS[sorted(PROGRAMS)[0]]
    name = program.kernel_args[0].name
    edited = _renamed(program, name, hostile)
    assert any(t.name == hostile for spec in op_specs(edited) for t in spec.args)
    for emit in (mlir_generic, bundle_mlir):
        before, after = emit(program), emit(edited)
        assert after.count("\n") == before.count("\n")
        assert len(after.splitlines()) == len(before.splitlines())  # no \r, \u2028 line breaks either
        assert all(c == "\t" or " " <= c <= "~" for c in after if c != "\n")
    ops = [op_name(op) for op in parse(mlir_generic(edited)).walk()]
    assert ops == [op_name(op) for op in parse(mlir_generic(program)).walk()]


@pytest.mark.parametrize("hostile", HOSTILE_NAMES)
def test_a_name_that_is_not_an_identifier_is_refused_where_it_enters(hostile):
    import fspyre
    from fspyre.errors import GraphError

    g = fspyre.GraphBuilder("names")
    with pytest.raises(GraphError, match="ASCII identifier"):
        g.input(hostile, [g.dim("A", 64)], "float32")
    with pytest.raises(GraphError, match="ASCII identifier"):
        g.dim(hostile, 64)
    x = g.input("x", [g.dim("B", 64)], "float32")
    with pytest.raises(GraphError, match="ASCII identifier"):
        g.output(hostile, g.exp(x))
    with pytest.raises(GraphError, match="ASCII identifier"):
        fspyre.GraphBuilder(hostile)
