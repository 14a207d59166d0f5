"""The golden journal fixture itself, run in a scratch pytest session with tests/conftest.py."""

from __future__ import annotations

from pathlib import Path

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"

CASE = '''
TEXT = {text!r}

def test_one(golden):
    golden.check("zeta", TEXT)
    golden.check("alpha", "first line\\nsecond line")
'''


def _session(pytester, text: str, *args: str):
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(test_case=CASE.format(text=text))
    return pytester.runpytest_subprocess(*args)


def test_missing_entry_fails_until_recorded_then_diffs(pytester):
    first = _session(pytester, "old text")
    first.assert_outcomes(failed=1)
    first.stdout.fnmatch_lines(["*no golden entry 'zeta' in golden/test_case.txt; run pytest with --update-golden*"])
    journal = pytester.path / "golden" / "test_case.txt"
    assert not journal.exists()

    _session(pytester, "old text", "--update-golden").assert_outcomes(passed=1)
    assert journal.read_text() == "=== alpha ===\nfirst line\nsecond line\n\n=== zeta ===\nold text\n"
    _session(pytester, "old text").assert_outcomes(passed=1)

    changed = _session(pytester, "new text")
    changed.assert_outcomes(failed=1)
    changed.stdout.fnmatch_lines(["*golden entry 'zeta' in golden/test_case.txt differs*", "*-old text", "*+new text"])
    assert "old text" in journal.read_text()

    _session(pytester, "new text", "--update-golden").assert_outcomes(passed=1)
    assert journal.read_text().endswith("=== zeta ===\nnew text\n")


def test_needs_dot_marker_skips_without_dot(pytester):
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(test_case="import pytest\n\n@pytest.mark.needs_dot\ndef test_x():\n    pass\n")
    result = pytester.runpytest_subprocess("--strict-markers", "-rs")
    result.assert_outcomes(**({"passed": 1} if __import__("shutil").which("dot") else {"skipped": 1}))
