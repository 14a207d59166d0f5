"""The mutation check (``make mutate``): do a module's own tests pin its rules?

For each target module, one small change at a time is made to the rules it holds -- a
comparison turned (``<`` to ``<=``, ``==`` to ``!=``, ``in`` to ``not in``), ``and`` to ``or``,
a ``not`` dropped, an integer constant moved by one, a boolean flipped, ``+`` to ``-``, a
``raise`` (a refusal) deleted -- and only that module's tests run on the mutant, in a copy of
the tree. A mutant the tests pass is a *survivor*: a rule no test of its module pins, unless it
is listed in ``EQUIVALENT`` with the reason it computes the same thing.

The budget fits a 2-core machine: ``--per-module N`` mutants per module, drawn evenly (with
``--seed``) from all of its mutants, each test run stopping at the first failure, with a
timeout of a few times the unmutated run; ``--budget-minutes B`` gives every module an equal
share of B minutes (its unmutated run included) and runs its drawn mutants in order while the
share lasts: the mutants drawn are the same whatever the load, only how many of them run
depends on the machine (those left are reported as not run). A maintained tool (mutmut) would mutate the same way;
this script is small, needs nothing installed, and runs each module against its own tests only,
which is the question asked.

    python -m fspyre.testing.mutation --per-module 8
"""

from __future__ import annotations

import argparse
import ast
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """A module, the functions of it that hold its rules (empty: all), and its own tests."""

    module: str
    tests: tuple[str, ...]
    functions: tuple[str, ...] = ()


TARGETS = (
    Target(module="fspyre/stages/program.py", tests=("tests/stages/test_program.py",),
           functions=("verify_program", "_verify_op_spec", "_verify_tiled_symbols",
                      "_compute_dtype_refusal", "_verify_matmul_operands", "_op_spec")),
    Target(module="fspyre/machine/rules.py", tests=("tests/stages/test_uneven_split.py",),
           functions=("slice_extents", "core_slices", "_core_slices", "writing_cores", "common_loops", "live_chain",
                      "live_intervals")),
    Target(module="fspyre/stages/split_plan.py", tests=("tests/stages/test_split_plan.py",)),
    Target(module="fspyre/stages/allocation.py", tests=("tests/stages/test_allocation.py",)),
    Target(module="fspyre/stages/residency.py", tests=("tests/tiling/test_residency.py",)),
    Target(module="fspyre/ir/plans.py", tests=("tests/tiling/test_tiling_plan.py", "tests/ir/test_nodes.py")),
)

# (module, line, mutation) -> why the mutant computes the same thing as the module
EQUIVALENT: dict[tuple[str, int, str], str] = {
    ("fspyre/stages/allocation.py", 413, "+ -> -"):
        "_Free.take carves [addr + covered, addr + size) only when a buffer larger than every live owner of its "
        "address is placed there; a buffer takes an owned address only in place of a parent at least its size, "
        "and a gap's address has no live owner, so covered is 0 whenever the carve runs: addr - 0 == addr + 0",
}

_SWAP_COMPARE = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
                 ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}


@dataclass(frozen=True, slots=True)
class Mutant:
    line: int
    what: str
    index: int  # the mutation's position in the module's walk


def _in_functions(tree: ast.Module, names: tuple[str, ...]) -> list[ast.AST]:
    roots: list[ast.AST] = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                            and (not names or n.name in names)]
    return roots or [tree]


def _candidates(tree: ast.Module, names: tuple[str, ...]) -> Iterator[tuple[ast.AST, str]]:
    seen: set[int] = set()
    for root in _in_functions(tree, names):
        for node in ast.walk(root):
            if id(node) in seen:
                continue
            seen.add(id(node))
            if isinstance(node, ast.Compare) and type(node.ops[0]) in _SWAP_COMPARE:
                yield node, f"{type(node.ops[0]).__name__} -> {_SWAP_COMPARE[type(node.ops[0])].__name__}"
            elif isinstance(node, ast.BoolOp):
                yield node, "and -> or" if isinstance(node.op, ast.And) else "or -> and"
            elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
                yield node, "not dropped"
            elif isinstance(node, ast.Constant) and type(node.value) is bool:
                yield node, f"{node.value} -> {not node.value}"
            elif isinstance(node, ast.Constant) and type(node.value) is int:
                yield node, f"{node.value} -> {node.value + 1}"
            elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
                yield node, "+ -> -" if isinstance(node.op, ast.Add) else "- -> +"
            elif isinstance(node, ast.Raise):
                yield node, "raise deleted"


class _Apply(ast.NodeTransformer):
    def __init__(self, target: ast.AST) -> None:
        self.target = target

    def visit(self, node: ast.AST) -> ast.AST:
        if node is not self.target:
            return self.generic_visit(node)
        if isinstance(node, ast.Compare):
            node.ops = [_SWAP_COMPARE[type(node.ops[0])](), *node.ops[1:]]
        elif isinstance(node, ast.BoolOp):
            node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        elif isinstance(node, ast.UnaryOp):
            return node.operand
        elif isinstance(node, ast.Constant) and isinstance(node.value, int):  # bool or int: _candidates
            node.value = (not node.value) if type(node.value) is bool else node.value + 1
        elif isinstance(node, ast.BinOp):
            node.op = ast.Sub() if isinstance(node.op, ast.Add) else ast.Add()
        elif isinstance(node, ast.Raise):
            return ast.copy_location(ast.Pass(), node)
        return node


def mutants(source: str, functions: tuple[str, ...]) -> list[Mutant]:
    tree = ast.parse(source)
    return [Mutant(line=getattr(n, "lineno", 0), what=what, index=i)
            for i, (n, what) in enumerate(_candidates(tree, functions))]


def mutated(source: str, functions: tuple[str, ...], m: Mutant) -> str:
    tree = ast.parse(source)
    node = [n for n, _ in _candidates(tree, functions)][m.index]
    return ast.unparse(ast.fix_missing_locations(_Apply(node).visit(tree)))


def _run_tests(root: Path, tests: tuple[str, ...], timeout: float) -> str:
    env = {**os.environ, "PYTHONPATH": str(root)}
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-W", "ignore", *tests]
    try:
        done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout"
    return "passed" if done.returncode == 0 else "failed"


def _copy_tree(repo: Path, into: Path) -> None:
    for part in ("fspyre", "tests", "examples"):  # tests read the examples (examples/mlp.py)
        shutil.copytree(repo / part, into / part, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for f in ("pyproject.toml",):
        shutil.copy(repo / f, into / f)


def check_module(repo: Path, target: Target, per_module: int, seed: int, budget: float = 0.0) -> dict[str, list]:
    """Run ``target``'s drawn mutants against its tests; ``budget`` seconds (0: none) for the
    module, its unmutated run included."""
    source = (repo / target.module).read_text()
    every = mutants(source, target.functions)
    chosen = sorted(random.Random(f"{seed}:{target.module}").sample(every, min(per_module, len(every))),
                    key=lambda m: m.index)
    out: dict[str, list] = {"killed": [], "survived": [], "equivalent": [], "timeout": [], "not run": [],
                            "total": [len(every)]}
    with tempfile.TemporaryDirectory(prefix="fspyre-mutate-") as tmp:
        root = Path(tmp)
        _copy_tree(repo, root)
        t0 = time.monotonic()
        if _run_tests(root, target.tests, 3600) != "passed":  # nothing to compare mutants with
            print(f"  {target.module}: its tests {list(target.tests)} FAIL unmutated", flush=True)
            out["not run"] = [(m, "tests fail unmutated") for m in chosen]
            out["survived"] = [(Mutant(line=0, what="its tests fail unmutated", index=-1), "")]
            return out
        clean = time.monotonic() - t0
        timeout = 3 * clean + 30
        original = ast.unparse(ast.parse(source))
        for m in chosen:
            if budget and time.monotonic() - t0 + clean > budget:  # a surviving mutant takes a whole run
                out["not run"].append((m, "budget"))
                continue
            text = mutated(source, target.functions, m)
            if text == original:
                out["equivalent"].append((m, "the same code"))
                continue
            (root / target.module).write_text(text)
            result = _run_tests(root, target.tests, timeout)
            why = EQUIVALENT.get((target.module, m.line, m.what))
            if result == "passed":
                out["equivalent" if why else "survived"].append((m, why or ""))
            else:
                out["killed" if result == "failed" else "timeout"].append((m, ""))
            print(f"  {target.module}:{m.line} {m.what}: {result}", flush=True)
        (root / target.module).write_text(source)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fspyre.testing.mutation", description=__doc__.split("\n")[0])
    parser.add_argument("--per-module", type=int, default=8, help="mutants run per module (default 8)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--module", action="append", help="only these target modules (path as in TARGETS)")
    parser.add_argument("--budget-minutes", type=float, default=0.0,
                        help="minutes for the whole check, shared equally by the modules (default: no limit)")
    args = parser.parse_args(argv)
    targets = [t for t in TARGETS if not args.module or t.module in args.module]
    share = 60 * args.budget_minutes / max(len(targets), 1)
    repo = Path(__file__).resolve().parents[2]
    totals = {"run": 0, "killed": 0, "survived": 0, "equivalent": 0, "timeout": 0, "not run": 0}
    for target in targets:
        print(f"{target.module} (tests: {', '.join(target.tests)})", flush=True)
        r = check_module(repo, target, args.per_module, args.seed, share)
        run = sum(len(r[k]) for k in ("killed", "survived", "equivalent", "timeout"))
        totals["run"] += run
        for k in ("killed", "survived", "equivalent", "timeout", "not run"):
            totals[k] += len(r[k])
        print(f"  {run} of {r['total'][0]} mutants run: {len(r['killed'])} killed, {len(r['timeout'])} timed out, "
              f"{len(r['equivalent'])} equivalent, {len(r['survived'])} survived; {len(r['not run'])} drawn "
              f"but not run in the budget", flush=True)
        for m, _ in r["survived"]:
            print(f"  SURVIVED {target.module}:{m.line} {m.what}", flush=True)
    print(f"mutants {totals['run']}: killed {totals['killed']}, timed out {totals['timeout']}, "
          f"equivalent {totals['equivalent']}, survived {totals['survived']}; not run {totals['not run']}")
    return 1 if totals["survived"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
