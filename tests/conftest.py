"""Shared test machinery: golden journals and the ``needs_dot`` marker.

Golden journals: one file per test module, ``tests/golden/<module>.txt``, holding entries

    === <key> ===
    <text>

sorted by key. ``golden.check(key, text)`` compares against the entry and fails with a
unified diff; entries are written only under ``pytest --update-golden``, and the journal is
then reviewed in the diff like code.

Checked mode: every program any test compiles through ``fspyre.compile`` is run through the
static memory check (``fspyre.machine.memcheck.check_memory``) as it leaves the pipeline, so the
program emitter and the memory check can never disagree silently. A test that compiles an
unsafe program on purpose opts out with ``@pytest.mark.unchecked_memory``.

Hypothesis profiles (``HYPOTHESIS_PROFILE``), loaded here so every test module, wherever it
sits, is decorated under the same one:

- ``ci`` (the default, what ``make test`` runs): each property runs the example count written
  at the test, drawn *derandomized* -- the same examples on every run of the same code -- so a
  run that passes on a fresh clone passes again, and a failure is reproduced by running the
  test again;
- ``explore`` (``make explore``): the same counts, drawn afresh each run (``SEED=n`` fixes the
  draw), the mode that hunts for new counterexamples;
- ``deep``: 25 times as many examples, drawn afresh (``fspyre.testing.examples`` scales a
  test's count by the profile).

Failures print a ``@reproduce_failure`` blob and the drawn graph's builder source.
"""

from __future__ import annotations

import difflib
import fcntl
import os
import re
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

import fspyre.pipeline
from fspyre.machine.memcheck import check_memory

_HYPOTHESIS = dict(
    deadline=None,  # compile + interpret time varies with the drawn sizes; speed lives in benchmarks/
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("ci", max_examples=100, derandomize=True, **_HYPOTHESIS)
settings.register_profile("explore", max_examples=100, **_HYPOTHESIS)
settings.register_profile("deep", max_examples=2500, **_HYPOTHESIS)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

pytest_plugins = ["pytester"]  # tests/pretty/test_golden_journal.py runs scratch sessions

GOLDEN_DIR = Path(__file__).parent / "golden"
_HEADER = re.compile(r"^=== (.+) ===$")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden", action="store_true", default=False,
        help="write changed or missing golden journal entries (tests/golden/<module>.txt) instead of failing",
    )
    parser.addoption(
        "--heavy", action="store_true", default=False,
        help="also run the tests marked heavy (whole models of the zoo: minutes of CPU each)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "needs_dot: needs graphviz's `dot` binary; skipped when it is not installed")
    config.addinivalue_line("markers", "heavy: a whole model of the zoo; skipped unless pytest is given --heavy")
    config.addinivalue_line(
        "markers", "unchecked_memory: programs this test compiles are not memory-checked (it plants faults)"
    )


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("heavy") is not None and not item.config.getoption("--heavy"):
        pytest.skip("heavy: run with --heavy")
    if item.get_closest_marker("needs_dot") is not None and shutil.which("dot") is None:
        pytest.skip("graphviz `dot` is not installed (Debian package graphviz)")


def _memory_checked(verify):
    """``verify_program`` followed by ``check_memory``: an unsafe program fails the test where it
    is compiled, with the memory report, instead of being run or returned."""

    def verify_program(program):
        program = verify(program)
        report = check_memory(program)
        if not report.clean:
            pytest.fail(f"fspyre.compile emitted a program the memory check rejects:\n{report}", pytrace=False)
        return program

    return verify_program


@pytest.fixture(autouse=True)
def _checked_compile(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    # The pipeline looks its stages up as module globals at call time, so swapping the check
    # of its last artifact here covers every compile, however the test imported ``compile``.
    # (The stage callback cannot: it is an argument each caller would have to pass.)
    if request.node.get_closest_marker("unchecked_memory") is None:
        monkeypatch.setattr(fspyre.pipeline, "verify_program", _memory_checked(fspyre.pipeline.verify_program))


def parse_journal(text: str) -> dict[str, str]:
    entries: dict[str, str] = {}
    key: str | None = None
    body: list[str] = []
    for line in text.splitlines():
        m = _HEADER.match(line)
        if m:
            if key is not None:
                entries[key] = "\n".join(body).rstrip("\n")
            key, body = m.group(1), []
        elif key is not None:
            body.append(line)
    if key is not None:
        entries[key] = "\n".join(body).rstrip("\n")
    return entries


def format_journal(entries: dict[str, str]) -> str:
    return "\n".join(f"=== {k} ===\n{entries[k]}\n" for k in sorted(entries))


class Golden:
    def __init__(self, path: Path, update: bool, root: Path) -> None:
        self.path = path
        self.update = update
        self.root = root

    def check(self, key: str, text: str) -> None:
        if not key or "\n" in key or key != key.strip():
            raise ValueError(f"golden key {key!r} must be one line without surrounding spaces")
        actual = text.rstrip("\n")
        if any(_HEADER.match(line) for line in actual.splitlines()):
            raise ValueError(f"golden entry {key!r} holds a line shaped like a journal header (=== ... ===)")
        expected = self._read().get(key)
        if expected == actual:
            return
        if self.update:
            self._write(key, actual)
            return
        rel = os.path.relpath(self.path, self.root)
        if expected is None:
            pytest.fail(
                f"no golden entry {key!r} in {rel}; run pytest with --update-golden to record it, "
                f"then read the diff of {rel} before committing. Actual text:\n{actual}",
                pytrace=False,
            )
        diff = "\n".join(difflib.unified_diff(
            expected.splitlines(), actual.splitlines(), f"{rel} [{key}]", "actual", lineterm="",
        ))
        pytest.fail(
            f"golden entry {key!r} in {rel} differs; run with --update-golden to accept, then review the diff:\n"
            f"{diff}",
            pytrace=False,
        )

    def _read(self) -> dict[str, str]:
        return parse_journal(self.path.read_text()) if self.path.exists() else {}

    def _write(self, key: str, text: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Read-modify-write under a lock on the directory, so parallel workers updating one
        # journal keep each other's entries (and no lock file is left behind).
        fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            entries = self._read()
            entries[key] = text
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(format_journal(entries))
            os.replace(tmp, self.path)
        finally:
            os.close(fd)


@pytest.fixture
def golden(request: pytest.FixtureRequest) -> Golden:
    """``golden.check(key, text)`` against ``tests/golden/<this test module>.txt``."""
    module = Path(str(request.node.fspath)).stem
    return Golden(GOLDEN_DIR / f"{module}.txt", request.config.getoption("--update-golden"), request.config.rootpath)
