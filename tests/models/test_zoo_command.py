"""``fspyre zoo``: a family verified in its own process, its row, its JSON verdict and a
progress bar on a terminal."""

from __future__ import annotations

import io
import json
import sys

from fspyre.cli import main
from fspyre.testing.zoo.report import FamilyVerdict


class Terminal(io.StringIO):
    """stderr as a terminal: tqdm draws its bar only there."""

    def isatty(self) -> bool:
        return True


def test_zoo_verifies_a_family_with_a_progress_bar(tmp_path, monkeypatch, capsys):
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    out = tmp_path / "zoo.jsonl"
    assert main(["zoo", "bloom", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| bloom | ok | all " in text and "1 of 1 families pass" in text, text
    assert "zoo: 100%" in terminal.getvalue() and "1/1" in terminal.getvalue(), terminal.getvalue()
    verdict = FamilyVerdict.from_json(json.loads(out.read_text()))
    assert verdict.ok and verdict.capture == verdict.compiled == "ok" and verdict.in_eager == 0
    assert verdict.error is not None and 0 < verdict.tolerance and verdict.error <= verdict.tolerance


def test_a_family_off_tolerance_or_in_eager_fails():
    good = FamilyVerdict(name="x", tolerance=1e-6, error=5e-7, capture="ok", compiled="ok", on_fspyre=9)
    assert good.ok
    assert not FamilyVerdict(name="x", tolerance=1e-6, error=2e-6, capture="ok", compiled="ok").ok
    assert not FamilyVerdict(name="x", tolerance=1e-6, error=5e-7, capture="ok", compiled="ok", in_eager=1).ok
    assert not FamilyVerdict(name="x", tolerance=1e-6, error=5e-7, capture="crash: E", compiled="ok").ok
    assert FamilyVerdict(name="x", tolerance=1e-6, error=5e-7, capture="refused: data-dependent", compiled="ok").ok


def test_unknown_family_is_refused_by_name(capsys):
    assert main(["zoo", "nonesuch"]) == 2
    assert "unknown zoo families nonesuch; choose from gpt2" in capsys.readouterr().err
