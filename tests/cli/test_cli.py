"""The ``fspyre`` command as a user meets it: its exit code, stdout, stderr and the files it
writes. The cases that prove the real process boundary (``python -m fspyre``, the console
script, no traceback on the real stderr, the demo's files) run a subprocess; the rest call
``main`` in-process, which is the same code without a second of interpreter start-up each."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

import fspyre
from fspyre import cli
from fspyre.ir.serialize import loads
from fspyre.pretty import pretty

FIXTURES = Path(__file__).parent / "fixtures"
ADD_MUL = str(FIXTURES / "add_mul.py")
ROW_SUM = str(FIXTURES / "row_sum.py")
TORCH_FILE = str(FIXTURES / "torch_scale_shift.py")


def fspyre_cmd(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fspyre", *args], capture_output=True, text=True, cwd=cwd, timeout=300,
    )


@dataclass(frozen=True)
class Done:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def fspyre_main(capsys: pytest.CaptureFixture[str]) -> Callable[..., Done]:
    def call(*args: str) -> Done:
        rc = cli.main(list(args))
        out, err = capsys.readouterr()
        return Done(rc, out, err)

    return call


def one_line_error(done: subprocess.CompletedProcess[str] | Done) -> str:
    """The error contract: exit 2, exactly one line on stderr, no traceback."""
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("fspyre: ")
    return lines[0]


# -- help ----------------------------------------------------------------------------------


def test_python_m_fspyre_help() -> None:
    done = fspyre_cmd("--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: fspyre")
    for command in ("demo", "compile", "check", "coverage"):
        assert f"    {command}" in done.stdout


@pytest.mark.parametrize("args", [("demo",), ("compile",), ("check",)])
def test_help_everywhere(fspyre_main, args: tuple[str, ...]) -> None:
    done = fspyre_main(*args, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: fspyre {' '.join(args)}")
    assert done.stderr == ""


def test_compile_help_lists_every_emit_kind(fspyre_main) -> None:
    out = " ".join(fspyre_main("compile", "--help").stdout.split())
    for kind in cli.EMITS:
        assert kind in out


def test_console_script_is_installed() -> None:
    script = Path(sys.executable).parent / "fspyre"
    if not script.exists():
        pytest.skip("fspyre is not pip-installed into this interpreter's environment")
    done = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("usage: fspyre")


def test_coverage_forwards_its_arguments(fspyre_main) -> None:
    pytest.importorskip("fspyre.frontend.coverage")
    done = fspyre_main("coverage", "--help")
    assert done.returncode == 0, done.stderr
    assert "usage" in done.stdout.lower()


# -- compile -------------------------------------------------------------------------------


def test_compile_prints_every_stage() -> None:
    done = fspyre_cmd("compile", ADD_MUL, "--tiling", "none", "--cores", "4")
    assert done.returncode == 0, done.stderr
    headers = [ln for ln in done.stdout.splitlines() if ln.startswith("== ")]
    comp = fspyre.compile(cli.load_workload(ADD_MUL).graph, fspyre.machine.spyre(cores=4), tiling="none")
    assert headers == [f"== {i:02d}_{name} ==" for i, name in enumerate(comp.stages)]
    assert pretty(comp.program) in done.stdout


def test_compile_emits_mlir_to_stdout(fspyre_main) -> None:
    done = fspyre_main("compile", ADD_MUL, "--tiling", "none", "--emit", "mlir")
    assert done.returncode == 0, done.stderr
    graph = cli.load_workload(ADD_MUL).graph
    assert done.stdout.rstrip("\n") == fspyre.compile(graph, tiling="none").bundle_mlir.rstrip("\n")


def test_compile_json_round_trips_every_stage(fspyre_main, tmp_path: Path) -> None:
    done = fspyre_main("compile", ADD_MUL, "--tiling", "none", "--emit", "json")
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    comp = fspyre.compile(cli.load_workload(ADD_MUL).graph, tiling="none")
    assert list(printed) == list(comp.stages)
    for name, artifact in comp.stages.items():
        assert loads(json.dumps(printed[name])) == artifact

    done = fspyre_main("compile", ADD_MUL, "--tiling", "none", "--emit", "json", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == [f"{i:02d}_{name}.json" for i, name in enumerate(comp.stages)]
    assert loads((tmp_path / files[-1]).read_text()) == comp.program


def test_compile_writes_several_kinds_under_out(fspyre_main, tmp_path: Path) -> None:
    done = fspyre_main("compile", ADD_MUL, "--tiling", "none", "--emit", "stages,program",
                      "--emit", "mlir-generic,dot", "--out", str(tmp_path / "o"))
    assert done.returncode == 0, done.stderr
    names = {p.name for p in (tmp_path / "o").iterdir()}
    assert {"00_graph.txt", "program.txt", "bundle.generic.mlir", "loop_tree.dot"} <= names
    assert all(ln.startswith("wrote ") for ln in done.stdout.strip().splitlines())
    assert (tmp_path / "o" / "loop_tree.dot").read_text().lstrip().startswith("digraph")


def test_compile_every_kind_at_once(fspyre_main, tmp_path: Path) -> None:
    kinds = [k for k in cli.EMITS if k != "svg" or shutil.which("dot")]
    done = fspyre_main("compile", ADD_MUL, "--emit", ",".join(kinds), "--out", str(tmp_path), "--cores", "4")
    assert done.returncode == 0, done.stderr
    expected = {"tree": "loop_tree.txt", "dot": "loop_tree.dot", "svg": "loop_tree.svg", "program": "program.txt",
                "mlir": "bundle.mlir", "mlir-generic": "bundle.generic.mlir", "unrolled": "unrolled.txt",
                "report": "report.txt", "memmap": "lx_memmap.svg"}
    names = {p.name for p in tmp_path.iterdir()}
    assert {expected[k] for k in kinds if k in expected} <= names
    assert {"00_graph.txt", "00_graph.json", "07_program.txt", "07_program.json"} <= names
    assert (tmp_path / "loop_tree.txt").read_text().startswith("for A in 0..2:")
    assert "for " not in (tmp_path / "unrolled.txt").read_text()


def test_compile_detailed_view(fspyre_main) -> None:
    compact = fspyre_main("compile", ADD_MUL, "--emit", "tree").stdout
    detailed = fspyre_main("compile", ADD_MUL, "--emit", "tree", "--detailed").stdout
    comp = fspyre.compile(cli.load_workload(ADD_MUL).graph)
    assert compact.rstrip("\n") == pretty(comp.stages["loop_tree"]).rstrip("\n")
    assert detailed.rstrip("\n") == pretty(comp.stages["loop_tree"], detailed=True).rstrip("\n")
    assert compact != detailed


def test_no_lx_and_solver_reach_the_allocation(fspyre_main) -> None:
    with_lx = fspyre_main("compile", ADD_MUL, "--emit", "report", "--lx-solver", "bestfit").stdout
    without = fspyre_main("compile", ADD_MUL, "--emit", "report", "--no-lx").stdout
    assert "traffic ratio 1.000" in with_lx
    assert "traffic ratio 1.000" not in without


@pytest.mark.needs_dot
def test_compile_svg_is_a_file(fspyre_main, tmp_path: Path) -> None:
    done = fspyre_main("compile", ADD_MUL, "--tiling", "none", "--emit", "svg", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "<svg" in (tmp_path / "loop_tree.svg").read_text()


def test_unknown_emit_kind_is_a_usage_error(fspyre_main) -> None:
    done = fspyre_main("compile", ADD_MUL, "--emit", "stages,pictures")
    assert done.returncode == 2
    assert "unknown --emit pictures" in done.stderr


# -- check and exit codes ------------------------------------------------------------------


def test_check_equal_exits_0() -> None:
    done = fspyre_cmd("check", ADD_MUL, "--cores", "8")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("check add_mul_small: EQUAL (bit-exact)")


@pytest.mark.parametrize("tiling", ["none", "hints"])
def test_check_tiled_and_untiled(fspyre_main, tiling: str) -> None:
    done = fspyre_main("check", ADD_MUL, "--tiling", tiling, "--cores", "3")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("check add_mul_small: EQUAL (bit-exact)")


def test_check_reduction_within_tolerance_exits_0(fspyre_main) -> None:
    done = fspyre_main("check", ROW_SUM, "--tiling", "none", "--seed", "3")
    assert done.returncode == 0, done.stderr
    assert "EQUAL (within tolerance)" in done.stdout


def test_check_not_equal_exits_1(fspyre_main, monkeypatch: pytest.MonkeyPatch) -> None:
    """An interpreter that answers wrongly (here: one element off) must turn into exit 1."""
    check_module = sys.modules["fspyre.check"]
    honest = check_module.run

    def off_by_one(comp, inputs):
        outs = honest(comp, inputs)
        z = outs["z"].copy()
        z.flat[7] += 1
        return {**outs, "z": z}

    monkeypatch.setattr(check_module, "run", off_by_one)
    done = fspyre_main("check", ADD_MUL, "--tiling", "none")
    assert done.returncode == 1
    assert "check add_mul_small: NOT EQUAL" in done.stdout


# -- torch files ---------------------------------------------------------------------------


def test_torch_file_compiles_and_checks_against_eager(fspyre_main) -> None:
    pytest.importorskip("fspyre.frontend.files")
    done = fspyre_main("compile", TORCH_FILE, "--tiling", "none", "--emit", "tree")
    assert done.returncode == 0, done.stderr
    assert "relu(" in done.stdout
    done = fspyre_main("check", TORCH_FILE, "--tiling", "none", "--cores", "4")
    assert done.returncode == 0, done.stderr
    assert "check torch_scale_shift: EQUAL" in done.stdout
    assert "eager torch_scale_shift.py: EQUAL (atol=" in done.stdout


def test_eager_comparison_reports_mismatches() -> None:
    """The eager comparison has teeth: results off by one everywhere are reported, element count and all."""
    files = pytest.importorskip("fspyre.frontend.files")
    loaded = files.load_torch_file(TORCH_FILE)
    got = fspyre.run(fspyre.compile(loaded.graph, tiling="none"), loaded.inputs)
    ok, lines = cli._eager_lines(loaded, got)
    assert ok and lines[0].startswith("eager torch_scale_shift.py: EQUAL")
    wrong = {k: v + 1.0 for k, v in got.items()}
    ok, lines = cli._eager_lines(loaded, wrong)
    assert not ok and lines[0].startswith("eager torch_scale_shift.py: NOT EQUAL")
    assert "MISMATCH at 4096 of 4096" in lines[1]


# -- errors: one line, no traceback, exit 2 ------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    line = one_line_error(fspyre_cmd("check", str(tmp_path / "nope.py")))
    assert "nope.py: no such file" in line


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("def build(:\n    pass\n", "syntax error"),
        ("x = 1\n", "defines neither build()"),
        ("def build():\n    return 42\n", "returned int, not a Graph"),
        ("raise ValueError('boom at import')\n\ndef build():\n    pass\n", "ValueError: boom at import"),
        ("def build():\n    return {}['missing']\n", "build() raised KeyError"),
        ("import fspyre\n\ndef build():\n    fspyre.GraphBuilder('g').dim('A', 0)\n", "dim 'A'"),
    ],
    ids=["syntax", "no-build", "not-a-graph", "raises-at-import", "build-raises", "fspyre-error"],
)
def test_bad_files(fspyre_main, tmp_path: Path, source: str, expected: str) -> None:
    path = tmp_path / "user_graph.py"
    path.write_text(source)
    for command in ("compile", "check"):
        line = one_line_error(fspyre_main(command, str(path)))
        assert expected in line


def test_bad_file_in_a_real_process(tmp_path: Path) -> None:
    path = tmp_path / "broken.py"
    path.write_text("def build(:\n")
    assert one_line_error(fspyre_cmd("compile", str(path))) == f"fspyre: error: {path}:1: syntax error: invalid syntax"


def test_fixture_raising_fspyre_error(fspyre_main) -> None:
    line = one_line_error(fspyre_main("check", str(FIXTURES / "bad_dim.py")))
    assert line.startswith("fspyre: error: ")


def test_bad_cores(fspyre_main) -> None:
    line = one_line_error(fspyre_main("compile", ADD_MUL, "--tiling", "none", "--cores", "33"))
    assert "cores=33" in line


def test_unwritable_out_dir(fspyre_main, tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    line = one_line_error(fspyre_main("compile", ADD_MUL, "--emit", "mlir", "--out", str(blocker)))
    assert str(blocker) in line


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    done = fspyre_cmd("check", str(FIXTURES / "bad_dim.py"), "--debug")
    assert done.returncode == 2
    assert "Traceback" in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("fspyre: error: ")


def test_internal_error(fspyre_main, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug in fspyre (not the user's input) is one 'internal error' line; --debug adds the traceback."""

    def crash(*args, **kwargs):
        raise RuntimeError("stage exploded")

    monkeypatch.setattr(fspyre, "compile", crash)
    done = fspyre_main("compile", ADD_MUL)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "fspyre: internal error: RuntimeError: stage exploded (rerun with --debug for the traceback, "
        "and please report it)"
    ]
    done = fspyre_main("compile", ADD_MUL, "--debug")
    assert done.returncode == 2
    assert "Traceback" in done.stderr


# -- demo ----------------------------------------------------------------------------------


def test_demo_writes_its_artifacts(tmp_path: Path) -> None:
    done = fspyre_cmd("demo", "--out", "artifacts", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = tmp_path / "artifacts"
    assert not (tmp_path / cli.DEMO_OUT).exists()
    names = {p.name for p in out.iterdir()}

    comp = fspyre.compile(cli.canonical_example())
    stages = [f"{i:02d}_{name}.txt" for i, name in enumerate(comp.stages)]
    assert set(stages) <= names
    for (name, artifact), file in zip(comp.stages.items(), stages):
        assert f"== {file[:-4]} ==\n{pretty(artifact)}" in done.stdout
        assert (out / file).read_text() == pretty(artifact).rstrip("\n") + "\n"
    assert (out / "bundle.mlir").read_text() == comp.bundle_mlir.rstrip("\n") + "\n"
    assert {"bundle.mlir", "bundle.generic.mlir", "loop_tree.dot", "report.txt"} <= names
    assert "<svg" in (out / "lx_memmap.svg").read_text()
    assert "traffic ratio 1.000" in done.stdout  # y stays in LX: inputs read once, z written once
    assert any(n.startswith("sdsc_") and n.endswith(".json") for n in names)
    if shutil.which("dot"):
        assert "<svg" in (out / "loop_tree.svg").read_text()
    assert "check add_mul: EQUAL" in done.stdout


# -- misuse: flags checked first, files that exit, warnings ------------------------------------

TORCH_EXIT = "import sys\nimport torch\n\n\ndef model(x):\n    return x + 1\n\n\ndef example_inputs():\n" \
             "    return (torch.ones(4, 64),)\n\n\nsys.exit(0)\n"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import sys\nsys.exit(0)\n\ndef build():\n    pass\n", "running the file called sys.exit(0)"),
        ("import sys\n\ndef build():\n    sys.exit(3)\n", "build() called sys.exit(3)"),
        (TORCH_EXIT, "running the file called sys.exit(0)"),
        ("import torch\n\ndef model(x):\n    return x\n\ndef example_inputs():\n    raise SystemExit('bye')\n",
         "example_inputs() called sys.exit('bye')"),
    ],
    ids=["build-file-at-import", "in-build", "torch-file-at-import", "in-example-inputs"],
)
def test_a_file_calling_sys_exit_is_an_error_not_a_pass(fspyre_main, tmp_path: Path, source: str,
                                                        expected: str) -> None:
    path = tmp_path / "exits.py"
    path.write_text(source)
    line = one_line_error(fspyre_main("check", str(path)))
    assert expected in line and str(path) in line and "__main__" in line


def test_sys_exit_zero_in_a_real_process_is_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "exits.py"
    path.write_text("import sys\nsys.exit(0)\n\ndef build():\n    pass\n")
    assert "sys.exit(0)" in one_line_error(fspyre_cmd("check", str(path)))


@pytest.mark.parametrize("value", ["('tight', 1e-3)", "'loose'", "(1e-3,)", "(float('nan'), 0.1)", "(-1, 0.1)",
                                   "(1, 2, 3)"])
def test_a_bad_tolerance_in_a_torch_file(fspyre_main, tmp_path: Path, value: str) -> None:
    path = tmp_path / "tol.py"
    path.write_text(Path(TORCH_FILE).read_text() + f"\ntolerance = {value}\n")
    line = one_line_error(fspyre_main("check", str(path)))
    assert "tolerance" in line and "(atol, rtol)" in line


def test_a_numeric_tolerance_is_used(fspyre_main, tmp_path: Path) -> None:
    path = tmp_path / "tol.py"
    path.write_text(Path(TORCH_FILE).read_text() + "\ntolerance = (0.25, 0)\n")
    done = fspyre_main("check", str(path))
    assert done.returncode == 0, done.stderr
    assert "atol=0.25, rtol=0" in done.stdout


def test_a_torch_file_imports_modules_beside_it(fspyre_main) -> None:
    before = list(sys.path)
    done = fspyre_main("check", str(FIXTURES / "torch_sibling_import.py"))
    assert done.returncode == 0, done.stderr
    assert sys.path == before
    sys.modules.pop("sibling_helper", None)


@pytest.mark.parametrize("args", [
    ("--cores", "40"), ("--cores", "0"), ("--tiling", "magic"), ("--lx-solver", "best"), ("--emit", "pdf"),
])
def test_flags_are_checked_before_the_file_is_loaded(fspyre_main, tmp_path: Path, args) -> None:
    marker = tmp_path / "loaded"
    path = tmp_path / "side_effect.py"
    path.write_text(f"open({str(marker)!r}, 'w').close()\n\ndef build():\n    pass\n")
    done = fspyre_main("compile", str(path), *args)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert not marker.exists(), f"{args}: the file ran before the flags were checked"


def test_out_onto_an_existing_file_is_refused_before_loading(fspyre_main, tmp_path: Path) -> None:
    blocker = tmp_path / "taken.txt"
    blocker.write_text("keep me")
    marker = tmp_path / "loaded"
    path = tmp_path / "side_effect.py"
    path.write_text(f"open({str(marker)!r}, 'w').close()\n\ndef build():\n    pass\n")
    for command in (("compile", str(path), "--emit", "mlir"), ("demo",)):
        line = one_line_error(fspyre_main(*command, "--out", str(blocker)))
        assert f"--out {blocker}" in line and "not a directory" in line
    assert not marker.exists()
    assert blocker.read_text() == "keep me"


@pytest.mark.parametrize("where", ["first", "after-command", "last"])
def test_debug_works_wherever_it_is_placed(fspyre_main, where: str) -> None:
    args = ["check", str(FIXTURES / "bad_dim.py")]
    args.insert({"first": 0, "after-command": 1, "last": 2}[where], "--debug")
    done = fspyre_main(*args)
    assert done.returncode == 2
    assert "Traceback" in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("fspyre: error: ")


def test_coverage_takes_debug_anywhere(fspyre_main) -> None:
    done = fspyre_main("coverage", "--debug", "--help")
    assert done.returncode == 0
    assert "usage: fspyre coverage" in done.stdout


@pytest.mark.parametrize("flag", ["--samples", "--run"])
def test_coverage_refuses_negative_counts(fspyre_main, flag: str) -> None:
    done = fspyre_main("coverage", flag, "-1")
    assert done.returncode == 2
    assert f"argument {flag}: '-1': give a whole number" in done.stderr


def test_check_refuses_a_negative_seed(fspyre_main) -> None:
    done = fspyre_main("check", ADD_MUL, "--seed", "-1")
    assert done.returncode == 2
    assert "--seed '-1'" in done.stderr


@pytest.mark.parametrize("command", [("compile",), ("compile", "--emit", "mlir"), ("check",)])
def test_every_command_prints_hint_warnings(fspyre_main, command) -> None:
    done = fspyre_main(command[0], str(FIXTURES / "ignored_hint.py"), *command[1:])
    assert done.returncode == 0, done.stderr
    warned = [line for line in done.stderr.splitlines() if line.startswith("warning: ")]
    assert warned and all("\n" not in w for w in warned)
    assert any("slices={'C': 2}: no op of [buf0] iterates dim C" in w for w in warned), done.stderr
    assert "Traceback" not in done.stderr


def test_check_report_lists_hint_warnings(fspyre_main) -> None:
    done = fspyre_main("check", str(FIXTURES / "ignored_hint.py"))
    assert "  warning: hint scope 0 slices={'C': 2}" in done.stdout


def test_demo_and_checks_print_no_numpy_runtime_warnings(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-W", "error::RuntimeWarning", "-m", "fspyre", "check", str(FIXTURES / "row_sum.py")],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "RuntimeWarning" not in done.stderr


def test_compile_with_the_tiling_search(fspyre_main) -> None:
    done = fspyre_main("compile", ADD_MUL, "--tiling", "auto", "--fuse", "no-fuse", "--cores", "4")
    assert done.returncode == 0, done.stderr
    assert "tiling search (no-fuse)" in done.stdout
    off = fspyre_main("compile", ADD_MUL, "--no-residency", "--cores", "4", "--emit", "tree")
    assert off.returncode == 0, off.stderr
    bad = fspyre_main("compile", ADD_MUL, "--tiling", "auto", "--fuse", "greedy")
    assert bad.returncode == 2 and "--fuse" in bad.stderr


def test_no_online_turns_the_online_softmax_off(fspyre_main, tmp_path: Path) -> None:
    src = tmp_path / "softmax_c.py"
    src.write_text(
        "import fspyre\n"
        "def build():\n"
        "    g = fspyre.GraphBuilder('softmax_c')\n"
        "    B, C = g.dim('B', 8), g.dim('C', 512)\n"
        "    x = g.input('x', (B, C), 'float32')\n"
        "    with g.hint(slices={'C': 4}):\n"
        "        e = g.exp(g.sub(x, g.amax(x, ['C'], keepdim=True)))\n"
        "        y = g.div(e, g.sum(e, ['C'], keepdim=True))\n"
        "    g.output('y', y)\n"
        "    return g.build()\n"
    )
    online = fspyre_main("compile", str(src), "--tiling", "hints", "--cores", "4", "--emit", "tree")
    assert online.returncode == 0, online.stderr
    assert "carries buf0_acc, buf3_acc" in online.stdout and "buf0_alpha = exp(buf0_alpha)" in online.stdout
    fission = fspyre_main("compile", str(src), "--tiling", "hints", "--cores", "4", "--emit", "tree", "--no-online")
    assert fission.returncode == 0, fission.stderr
    assert "_alpha" not in fission.stdout and fission.stdout.count("for C in 0..4") == 3
    assert fspyre_main("check", str(src), "--tiling", "hints", "--cores", "4").returncode == 0


# -- doors: exits, odd files, usage errors (issue #22) -----------------------------------------
GOOD_BUILD = ("import fspyre\n\ndef build():\n    g = fspyre.GraphBuilder('t')\n    a = g.dim('A', 64)\n"
              "    x = g.input('x', (a,), 'float32')\n    g.output('y', g.exp(x))\n    {tail}\n")


@pytest.mark.parametrize(
    "source",
    [
        GOOD_BUILD.format(tail="import os; os._exit(0)"),
        "import os\nos._exit(0)\n\ndef build():\n    pass\n",
        "import torch, os\nos._exit(0)\n\ndef model(x):\n    return x\n\ndef example_inputs():\n"
        "    return (torch.ones(64),)\n",
        "import torch, os\n\ndef model(x):\n    os._exit(0)\n\ndef example_inputs():\n    return (torch.ones(64),)\n",
    ],
    ids=["in-build", "at-import", "torch-at-import", "torch-in-model"],
)
def test_a_file_calling_os_exit_is_exit_2_never_a_silent_pass(tmp_path: Path, source: str) -> None:
    """os._exit skips every handler: it must not end `fspyre check` with status 0 and no verdict."""
    path = tmp_path / "exits.py"
    path.write_text(source)
    line = one_line_error(fspyre_cmd("check", str(path)))
    assert "os._exit(0)" in line and str(path) in line


def test_os_exit_is_restored_after_the_command(fspyre_main, tmp_path: Path) -> None:
    import os

    real = os._exit
    path = tmp_path / "exits.py"
    path.write_text(GOOD_BUILD.format(tail="import os; os._exit(0)"))
    one_line_error(fspyre_main("check", str(path)))
    assert os._exit is real


def test_a_utf8_bom_file_loads(fspyre_main, tmp_path: Path) -> None:
    path = tmp_path / "bom.py"
    path.write_bytes(b"\xef\xbb\xbf" + GOOD_BUILD.format(tail="return g.build()").encode())
    done = fspyre_main("check", str(path), "--tiling", "none")
    assert done.returncode == 0, done.stderr


def test_a_file_with_another_suffix_is_python(fspyre_main, tmp_path: Path) -> None:
    path = tmp_path / "good.txt"
    path.write_text(GOOD_BUILD.format(tail="return g.build()"))
    done = fspyre_main("compile", str(path), "--emit", "mlir", "--tiling", "none")
    assert done.returncode == 0, done.stderr
    assert "sdsc_execute" in done.stdout


def test_an_internal_error_without_text_says_where(fspyre_main, monkeypatch: pytest.MonkeyPatch) -> None:
    def crash(*args, **kwargs):
        raise AssertionError

    monkeypatch.setattr(fspyre, "compile", crash)
    line = fspyre_main("compile", ADD_MUL).stderr.strip()
    assert line.startswith("fspyre: internal error: AssertionError: raised at test_cli.py:")
    assert "raise AssertionError" in line


USAGE_ERRORS = [
    (), ("frob",), ("compile",), ("check",), ("compile", ADD_MUL, "--bogus"), ("check", ADD_MUL, "--tiling", "fast"),
    ("check", ADD_MUL, "--fuse", "x"), ("compile", ADD_MUL, "--emit", "pdf"), ("check", ADD_MUL, "--cores", "x"),
    ("check", ADD_MUL, "--cores", "0"), ("check", ADD_MUL, "--cores", "-1"), ("check", ADD_MUL, "--seed", "-3"),
    ("check", ADD_MUL, "--seed"), ("compile", ADD_MUL, "--out"), ("check", ADD_MUL, ADD_MUL),
    ("compile", ADD_MUL, "--lx-solver", "best"), ("demo", "--cores", "99"), ("demo", "extra"),
    ("check", "--tiling"), ("compile", "--emit", ""), ("--cores", "4"), ("check", ADD_MUL, "--no-lx=1"),
    ("compile", ADD_MUL, "--detailed=yes"), ("check", ADD_MUL, "--seed", "1e3"), ("check", ADD_MUL, "--cores", "2.5"),
]


@pytest.mark.parametrize("args", USAGE_ERRORS, ids=[" ".join(a) or "nothing" for a in USAGE_ERRORS])
def test_a_usage_error_is_one_line_pointing_at_help(fspyre_main, args: tuple[str, ...]) -> None:
    line = one_line_error(fspyre_main(*args))
    assert "--help" in line or "cores" in line or "seed" in line or "emit" in line, line
