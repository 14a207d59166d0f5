"""What a user sees besides artifacts: --version, -v logging per stage, a fast --help that
imports no sympy, numpy or torch, short reprs and notebook views of the artifacts, the
``fspyre.stages`` face, and docs/options.md kept current."""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import fspyre
from fspyre import cli
from fspyre.machine.report import traffic_report
from fspyre.pipeline import STAGES, log_stages
from fspyre.pretty.options import PAGE, options_page

ROOT = Path(__file__).resolve().parents[2]
ROW_SUM = str(Path(__file__).parent / "fixtures" / "row_sum.py")


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--version"]) == 0
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert capsys.readouterr().out.strip() == f"fspyre {version}" == f"fspyre {fspyre.__version__}"


def test_help_imports_no_heavy_library() -> None:
    done = _python("import sys, fspyre.cli\n"
                   "fspyre.cli.main(['compile', '--help'])\n"
                   "print(sorted(m for m in ('sympy', 'numpy', 'torch') if m in sys.modules))")
    assert done.returncode == 0, done.stderr
    assert "FILE.py" in done.stdout and done.stdout.strip().endswith("[]")


def test_names_load_on_first_use() -> None:
    done = _python("import fspyre\n"
                   "from fspyre.check import CheckReport\n"  # loading the module must not hide the function
                   "print(callable(fspyre.check), fspyre.lower.bundle_mlir.__name__, fspyre.stages.tile.__name__,"
                   " fspyre.pretty.pretty.__name__, fspyre.GraphBuilder.__name__)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "bundle_mlir", "tile", "pretty", "GraphBuilder"]
    with pytest.raises(AttributeError, match="no attribute 'nonesuch'"):
        fspyre.nonesuch  # noqa: B018


def test_stages_face_exports_every_stage_and_options() -> None:
    import fspyre.stages as stages

    for name in ("plan_tiling", "search_tiling", "tile", "keep_resident", "place_copies", "divide_work", "allocate",
                 "emit_program", "verify_loop_tree", "verify_split_plan", "verify_allocation", "verify_program"):
        assert callable(getattr(stages, name)), name
    assert {c.__name__ for c in stages.OPTIONS} == {n for n in stages.__all__ if n.endswith("Options")}


def test_verbose_logs_each_stage(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["compile", ROW_SUM, "-v", "--emit", "mlir"]) == 0
    err = capsys.readouterr().err.splitlines()
    logged = [line.split()[1] for line in err if line.startswith("fspyre: ") and line.split()[1] in STAGES]
    assert logged == list(STAGES)
    assert any("group buf0:" in line and "candidates" in line for line in err)  # the search's decision
    assert logging.getLogger("fspyre").handlers == []  # the command's handler is gone after it


def test_log_stages_calls_through(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[str] = []
    with caplog.at_level(logging.DEBUG, logger="fspyre"):
        fspyre.compile(cli.canonical_example(64, 256), tiling="hints",
                       callback=log_stages(lambda name, artifact: seen.append(name)))
    assert seen == [n for n in STAGES if n != "tiling_search"]
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert [m.split()[0] for m in infos] == seen
    assert any("# program add_mul" in r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG)


def test_reprs_are_short_and_notebooks_render() -> None:
    comp = fspyre.compile(cli.canonical_example(), tiling="hints")
    report = traffic_report(comp.program)
    for value in (*comp.stages.values(), comp, report):
        text = repr(value)
        assert len(text) < 240 and "\n" not in text, text
    assert "2 loops" in repr(comp.stages["loop_tree"]) and "traffic ratio 1.000" in repr(report)
    html = comp.program._repr_html_()
    assert html.startswith("<pre>") and "OpSpec(" in html and "&#x27;add&#x27;" in html
    assert "HBM 33554432 B" in report._repr_html_()


@pytest.mark.needs_dot
def test_loop_tree_draws_in_a_notebook() -> None:
    comp = fspyre.compile(cli.canonical_example(), tiling="hints")
    svg = comp.stages["loop_tree"]._repr_svg_()
    assert svg is not None and "<svg" in svg and "buf1" in svg


def test_loop_tree_without_dot_has_no_svg(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    comp = fspyre.compile(cli.canonical_example(64, 256), tiling="hints")
    assert comp.stages["loop_tree"]._repr_svg_() is None


def test_options_page_is_current() -> None:
    # run `python -m fspyre.pretty.options` after changing an options record or a flag
    assert PAGE.read_text() == options_page()
    for name in ("TilingOptions", "SearchOptions", "AllocationOptions", "lx_solver", "`fspyre run`", "--from"):
        assert name in PAGE.read_text(), name
