"""How much of the test suite's time the interpreter takes, per test: a pytest plugin and a
comparison of two of its records (issue 12's "the suite is faster where the interpreter
dominates").

Record a run (any checkout, old or new: the plugin wraps the interpreter's entry points by name):

    SUITE_TIME_OUT=after.json PYTHONPATH=benchmarks .venv/bin/python -m pytest tests -p suite_time

Compare two records:

    .venv/bin/python benchmarks/suite_time.py before.json after.json

Times are this process's CPU seconds (``time.process_time``), steadier than wall clock on a
shared machine: per test the whole run protocol (set-up, call, tear-down) and the part of it
inside ``run_program`` / ``run_outputs`` (outermost call only). Tests that run subprocesses
(the CLI's) count only their own process.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest

_interp: Counter[str] = Counter()
_runs: Counter[str] = Counter()
_total: Counter[str] = Counter()
_current = [""]
_depth = [0]


def _timed(fn: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        if _depth[0]:  # run_outputs calls run_program: count the outermost call once
            return fn(*args, **kwargs)
        _depth[0] += 1
        start = time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            _interp[_current[0]] += time.process_time() - start
            _runs[_current[0]] += 1
            _depth[0] -= 1
    return run


def pytest_configure(config: pytest.Config) -> None:
    # before the test modules import the entry points by name
    import fspyre.machine.interpreter as interpreter

    for name in ("run_program", "run_outputs"):
        if hasattr(interpreter, name):
            setattr(interpreter, name, _timed(getattr(interpreter, name)))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    _current[0] = item.nodeid
    start = time.process_time()
    yield
    _total[item.nodeid] += time.process_time() - start


def pytest_sessionfinish(session: pytest.Session) -> None:
    out = os.environ.get("SUITE_TIME_OUT")
    if out:
        with open(out, "w") as f:
            json.dump({k: [_total[k], _interp[k], _runs[k]] for k in _total}, f, indent=0)


def compare(before: dict[str, list[float]], after: dict[str, list[float]]) -> list[str]:
    common = sorted(set(before) & set(after))
    # dominated: at least half of the test's CPU went to the interpreter before
    dominated = [k for k in common if before[k][0] > 0.05 and before[k][1] >= 0.5 * before[k][0]]
    same_runs = [k for k in common if before[k][2] == after[k][2] > 0]

    def row(label: str, keys: list[str], d: dict[str, list[float]]) -> str:
        return (f"{label:<44} {len(keys):>5} tests  test CPU {sum(d[k][0] for k in keys):7.1f} s  "
                f"interpreter {sum(d[k][1] for k in keys):6.1f} s in {int(sum(d[k][2] for k in keys)):>5} runs")

    return [
        row("before, whole suite", list(before), before),
        row("after, whole suite", list(after), after),
        row("before, tests in both", common, before),
        row("after, tests in both", common, after),
        row("before, interpreter >= 50 % of the test", dominated, before),
        row("after, the same tests", dominated, after),
        row("before, tests in both with as many runs", same_runs, before),
        row("after, the same tests", same_runs, after),
    ]


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: suite_time.py BEFORE.json AFTER.json")
    with open(sys.argv[1]) as b, open(sys.argv[2]) as a:
        print("\n".join(compare(json.load(b), json.load(a))))
