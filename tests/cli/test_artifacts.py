"""Artifacts on disk: ``--emit all`` writes every file bundle.mlir names, each valid against
its shipped JSON Schema; ``fspyre run`` runs the interpreter on the user's ``.npz`` arrays;
``compile --from DIR`` continues from saved stage artifacts; the traffic report is an artifact
(prints, round-trips JSON)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import fspyre
from fspyre import cli
from fspyre.frontend.files import load_torch_file
from fspyre.ir.schema import ARTIFACTS, SCHEMA_DIR, load_schema, schema_text
from fspyre.ir.serialize import dumps, loads
from fspyre.machine.report import traffic_report
from fspyre.pipeline import STAGES, resume
from fspyre.pretty import pretty
from fspyre.testing import graphs

FIXTURES = Path(__file__).parent / "fixtures"
ADD_MUL = str(FIXTURES / "add_mul.py")
ROW_SUM = str(FIXTURES / "row_sum.py")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
Validator = jsonschema.Draft202012Validator


def _schema_of(file: Path) -> dict:
    """The schema of a ``NN_<stage>.json`` file (a resident tree is a loop tree)."""
    stage = re.sub(r"^\d\d_", "", file.stem)
    return load_schema("loop_tree" if stage == "resident_tree" else stage)


def _valid(doc: object, schema: dict) -> None:
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message[:200]}" for e in Validator(schema).iter_errors(doc)]
    assert not errors, errors[:5]


def test_shipped_schemas_are_current_and_well_formed() -> None:
    # run `python -m fspyre.ir.schema` after changing an IR class
    for name in ARTIFACTS:
        assert (SCHEMA_DIR / f"{name}.schema.json").read_text() == schema_text(name), name
    for path in SCHEMA_DIR.glob("*.schema.json"):
        Validator.check_schema(json.loads(path.read_text()))


@pytest.mark.parametrize("file", [ADD_MUL, ROW_SUM])
def test_emit_all_writes_every_file_bundle_names_each_valid(file: str, tmp_path: Path) -> None:
    assert cli.main(["compile", file, "--emit", "all", "--out", str(tmp_path)]) == 0
    names = set(re.findall(r'sdsc_filename="([^"]+)"', (tmp_path / "bundle.mlir").read_text()))
    assert names and all((tmp_path / n).is_file() for n in names)
    assert {p.name for p in tmp_path.glob("sdsc_*.json")} == names
    sdsc = load_schema("sdsc")
    for n in names:
        _valid(json.loads((tmp_path / n).read_text()), sdsc)
    stage_files = sorted(tmp_path.glob("[0-9][0-9]_*.json"))
    assert [re.sub(r"^\d\d_", "", p.stem) for p in stage_files] == [s for s in STAGES]
    for p in stage_files:
        _valid(json.loads(p.read_text()), _schema_of(p))
    report = json.loads((tmp_path / "report.json").read_text())
    _valid(report, load_schema("traffic_report"))
    for kind in ("loop_tree.txt", "loop_tree.dot", "program.txt", "bundle.generic.mlir", "unrolled.txt",
                 "report.txt", "lx_memmap.svg", "hbm_memmap.svg", "00_graph.txt"):
        assert (tmp_path / kind).is_file(), kind


def test_schemas_reject_what_the_loader_rejects(tmp_path: Path) -> None:
    """The schemas can fail: a document with a renamed field, a wrong type or a stray key is
    invalid, as ``loads`` refuses it."""
    comp = fspyre.compile(cli.canonical_example(64, 256), fspyre.machine.spyre(cores=4), tiling="hints")
    program = json.loads(dumps(comp.program))
    schema = load_schema("program")
    _valid(program, schema)
    bad = json.loads(json.dumps(program))
    bad["cores"] = "4"
    assert not Validator(schema).is_valid(bad)
    bad = json.loads(json.dumps(program))
    bad["body"][0]["body"][0]["body"][0]["args"][0]["allocation"] = {"hbm": 0}
    assert not Validator(schema).is_valid(bad)
    bad = dict(program, _format=2)
    assert not Validator(schema).is_valid(bad)
    doc = next(iter(comp.sdsc.values()))
    sdsc = load_schema("sdsc")
    _valid(doc, sdsc)
    for key, value in (("runs", "sometimes"), ("cores", 0), ("schema", "fspyre.sdsc/1")):
        assert not Validator(sdsc).is_valid(dict(doc, **{key: value})), key
    lx = json.loads(json.dumps(doc))
    lx["tensors"][0]["allocation"] = {"lx": 0}
    lx["tensors"][0]["core_offsets"] = [0, 128, 0, 0]
    assert not Validator(sdsc).is_valid(lx)  # each core's LX holds its own slice at the tensor's address


@pytest.mark.parametrize("name", sorted(p.stem for p in EXAMPLES.glob("*.py")))
def test_gallery_sdsc_documents_valid(name: str) -> None:
    """Every SDSC document of every gallery example, LX slots that advance included."""
    with pytest.warns() if name == "llama_decoder_layer" else _nothing():
        comp = fspyre.compile(load_torch_file(EXAMPLES / f"{name}.py").graph)
    sdsc = load_schema("sdsc")
    for doc in comp.sdsc.values():
        _valid(doc, sdsc)


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def test_report_is_an_artifact() -> None:
    comp = fspyre.compile(cli.canonical_example(64, 256), fspyre.machine.spyre(cores=4), tiling="hints")
    report = traffic_report(comp.program)
    assert loads(dumps(report)) == report
    assert pretty(report) == str(report)
    _valid(json.loads(dumps(report)), load_schema("traffic_report"))


def test_program_prints_its_own_fields() -> None:
    """The printer shows the artifact's layout (OpInfo, memory and address), not the anchor's dicts."""
    comp = fspyre.compile(cli.canonical_example(64, 256), fspyre.machine.spyre(cores=4), tiling="hints")
    text = pretty(comp.program)
    assert "allocation=" not in text and "op_info={" not in text
    assert "op_info=OpInfo(operands=[arg 0, arg 1], compute=float32)" in text
    assert "memory='lx'" in text and "memory='hbm'" in text


def test_run_round_trips_user_arrays(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    inputs = {n: rng.standard_normal((64, 256)).astype(np.float16) for n in "abc"}
    np.savez(tmp_path / "in.npz", **inputs)
    out = tmp_path / "sub" / "out.npz"
    assert cli.main(["run", ADD_MUL, "--inputs", str(tmp_path / "in.npz"), "--out", str(out)]) == 0
    graph = cli.load_workload(ADD_MUL).graph
    with np.load(out) as got:
        assert sorted(got.files) == ["z"]
        expected = fspyre.evaluate(graph, inputs)["z"]
        assert got["z"].dtype == expected.dtype and got["z"].shape == expected.shape
        np.testing.assert_array_equal(got["z"], expected)  # pointwise: bit-exact against the reference


def test_run_refuses_inputs_that_do_not_match(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    np.savez(tmp_path / "in.npz", a=np.ones((64, 256), np.float16), b=np.ones((64, 256), np.float16))
    assert cli.main(["run", ADD_MUL, "--inputs", str(tmp_path / "in.npz")]) == 2
    assert "missing c" in capsys.readouterr().err
    (tmp_path / "junk.npz").write_text("not an archive")
    assert cli.main(["run", ADD_MUL, "--inputs", str(tmp_path / "junk.npz")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a numpy .npz archive" in err[0]


def test_compile_from_saved_artifacts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["compile", ROW_SUM, "--emit", "json,mlir", "--out", str(tmp_path / "all")]) == 0
    full = (tmp_path / "all" / "bundle.mlir").read_text()
    files = sorted((tmp_path / "all").glob("[0-9][0-9]_*.json"))
    for k in range(1, len(files) + 1):  # continue from each stage in turn
        d = tmp_path / f"from{k}"
        d.mkdir()
        for f in files[:k]:
            (d / f.name).write_text(f.read_text())
        assert cli.main(["compile", "--from", str(d), "--emit", "mlir", "--out", str(d / "out")]) == 0
        assert (d / "out" / "bundle.mlir").read_text() == full, files[k - 1].name
    capsys.readouterr()
    assert cli.main(["compile", ROW_SUM, "--from", str(tmp_path / "all")]) == 2
    assert "not both" in capsys.readouterr().err


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs(max_ops=4))
def test_resume_from_any_stage_gives_the_compiled_program(graph) -> None:
    """Continuing from every prefix of a compilation's stages (through JSON) gives its program."""
    machine = fspyre.machine.spyre(cores=4)
    comp = fspyre.compile(graph, machine)
    saved = {name: loads(dumps(artifact)) for name, artifact in comp.stages.items()}
    names = list(saved)
    for k in range(1, len(names) + 1):
        again = resume({n: saved[n] for n in names[:k]}, machine)
        assert again.program == comp.program, names[k - 1]
        assert list(again.stages) == names
