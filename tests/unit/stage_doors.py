"""Every stage artifact, corrupted one JSON edit at a time, fed to the next stage alone.

A corruption must be refused (a one-line FspyreError, at load or by the stage) or give a
program whose results equal the untiled reference of the graph on random inputs and on
inputs that defeat shift and scale invariances: never a raw exception, a run of more than
``TIME_LIMIT`` CPU seconds, or a silently wrong answer. One edit only the comparison with
the graph can refuse: an output buffer's axis of size 1 (a kept reduced axis) moved or
dropped, which no index records, so the tree is consistent and its program gives the output
another shape; ``compare`` refuses an output whose shape is not the graph's. A corrupted graph is compared with
its own reference (any valid graph is a graph someone may mean).

The edits (``edits``): every number +/-1, doubled, halved, 0, negated and made huge; every
bool flipped; every string replaced by other names of the document, by every other value of
its closed set (a memory, a scope, a dtype, ...), extended and emptied; every leaf nulled;
every field of an object dropped; every list's neighbours swapped and each element dropped
and duplicated. The artifact kinds and the stage each is fed to (``Pipeline.next_stage``):
graph (compile), tiling search (its plan tiled, placed, divided, allocated, emitted; the
record printed), tiling plan (tile), loop tree (place copies), resident tree (divide,
allocate, emit), split plan (allocate, emit), allocation (emit), program (run), the symbolic
record of a symbolic program (run at two sizes), traffic report (printed: nothing reads it,
so an edit it survives is "inert").

In a loop tree or a program, an op's computation (its fn, scalars, store and operands of a
tree op, a program op's fn, scalar operands and the device coordinates it addresses each
tensor at, the analogue of a tree op's indices), which ops a loop body runs in what order
(its list of nodes: an op dropped or swapped with its neighbour), and a buffer's or
argument's dtype are the only record of what it computes, and its output names are its
interface: an edit there is a different program, not an inconsistent one, so those fields
are not edited. So is the order of a program op's input args, the operand order of its fn
(two swapped: ``sub(b, a)`` for ``sub(a, b)``, as a tree op's operands swapped; each tensor
keeps its own coordinates, and nothing else in the program says which operand the graph
subtracted from which -- but for a batchmatmul, whose roles ``OpInfo.rows``/``cols`` record,
so its swap is still made and refused) (which of a
program's fields the oracle reads is also pinned by tests/machine/test_corruptions.py).

``test_hostile_artifacts.py`` runs a fixed sample of the cases; ``python
tests/unit/stage_doors.py`` runs them all and prints the tally per artifact kind."""

from __future__ import annotations

import copy
import json
import random
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

import fspyre
import fspyre.ir.kinds as kinds
from fspyre.check import compare
from fspyre.errors import FspyreError
from fspyre.ir.dtypes import DTYPES
from fspyre.ir.serialize import FORMAT, dumps, loads
from fspyre.machine.hostio import random_inputs, wide_inputs
from fspyre.machine.reference import evaluate_with_bounds
from fspyre.machine.report import traffic_report
from fspyre.machine.spyre import Machine, spyre
from fspyre.pretty import pretty
from fspyre.stages.allocation import allocate
from fspyre.stages.loop_tree import tile
from fspyre.stages.online_softmax import OnlineOptions
from fspyre.stages.program import emit_program
from fspyre.stages.residency import place_copies
from fspyre.stages.split_plan import divide_work
from fspyre.stages.symbolic import specialize

TIME_LIMIT = 5.0  # CPU seconds per case: a corrupted artifact must never make a stage work for long
STAGES = ("graph", "tiling_search", "tiling_plan", "loop_tree", "resident_tree", "split_plan", "allocation",
          "program", "symbolic", "report")
HUGE = 2**62  # a number no size, count or address of these graphs comes near


def graphs() -> dict[str, fspyre.Graph]:
    """Small graphs whose artifacts cover loops, tails, a K-accumulated matmul, a reduction,
    an online softmax, work division and a symbolic dim."""
    out = {}
    g = fspyre.GraphBuilder("mm")
    m, k, n = g.dim("M", 8), g.dim("K", 128), g.dim("N", 64)
    x, w = g.input("x", (m, k), "float32"), g.input("w", (k, n), "float32")
    with g.hint(slices={"K": 2}):
        y = g.matmul(x, w, contract="K")
    with g.hint(slices={"M": 2}):
        g.output("y", g.add(g.relu(y), 1.5))
        g.output("s", g.sum(x, ["K"], keepdim=True))
    out["mm"] = g.build()

    g = fspyre.GraphBuilder("tails")
    a, b = g.dim("A", 100), g.dim("B", 96)
    x, y = g.input("x", (a, b), "float16"), g.input("y", (a, b), "float16")
    with g.hint(slices={"A": 3}):
        g.output("z", g.mul(g.exp(x), y))
    out["tails"] = g.build()

    g = fspyre.GraphBuilder("softmax")
    r, c = g.dim("R", 16), g.dim("C", 256)
    x = g.input("x", (r, c), "float32")
    with g.hint(slices={"C": 4}):
        mx = g.amax(x, ["C"], keepdim=True)
        e = g.exp(g.sub(x, mx))
        g.output("p", g.div(e, g.sum(e, ["C"], keepdim=True)))
    out["softmax"] = g.build()

    g = fspyre.GraphBuilder("sym")
    s = g.dim("S")
    g.dim("A", 64)
    x, y = g.input("x", ["S", "A"], "float16"), g.input("y", ["S", "A"], "float16")
    with g.hint(slices={"S": s.size // 64}):
        g.output("z", g.add(g.exp(x), y))
    out["sym"] = g.build()
    return out


# The stages each graph's artifacts come from: a symbolic graph has a graph, a program and its
# symbolic record (the concrete stages run at witness sizes inside compile)
SYMBOLIC_STAGES = ("graph", "program", "symbolic")
SYMBOLIC_SIZES = (128, 320)  # the sizes a symbolic program runs at


@dataclass(frozen=True)
class Case:
    graph: str
    stage: str
    path: tuple  # of the leaf or container edited
    edit: str  # "set" | "drop" | "swap" | "dup" | "del"
    value: Any = None  # "set": the new value; "swap", "dup", "del": the list index

    def describe(self) -> str:
        what = f"= {self.value!r}"[:80] if self.edit == "set" else f"{self.edit} {self.value!r}"
        return f"{self.graph} {self.stage} {self.path} {what}"


@dataclass(frozen=True)
class Outcome:
    kind: str  # "refused" | "equal" | "inert" | "wrong" | "raw" | "slow"
    detail: str = ""
    seconds: float = 0.0


def positions(doc: Any, path: tuple = ()) -> Iterator[tuple[tuple, Any]]:
    """Every (path, value) of a JSON document, containers before their contents."""
    yield path, doc
    if isinstance(doc, dict):
        for key, value in doc.items():
            if key not in ("_type", "_format"):
                yield from positions(value, path + (key,))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            yield from positions(value, path + (i,))


# every closed set of names an artifact field takes (a value of one is replaced by each other)
ENUMS: tuple[tuple[str, ...], ...] = tuple(
    v for v in vars(kinds).values() if isinstance(v, tuple) and v and all(isinstance(x, str) for x in v)
) + (tuple(DTYPES),)


def leaf_edits(value: Any, others: list[str]) -> list[Any]:
    """Plausible edits of one leaf: what a hand edit or a bit of rot would make."""
    if isinstance(value, bool):
        return [not value, None]
    if isinstance(value, int):
        return sorted({value + 1, value - 1, value * 2, value // 2, 0, -value, -1, HUGE} - {value}) + [None]
    if isinstance(value, float):
        return [value * 2, -value, 0.0, value + 1.0, None]
    if isinstance(value, str):
        closed = [x for enum in ENUMS if value in enum for x in enum if x != value]
        return list(dict.fromkeys([*closed, *others, value + "_x", "", None]))
    return [0]


def edits(doc: Any, path_filter: Callable[[tuple], bool], seed: str) -> Iterator[tuple[tuple, str, Any]]:
    """(path, edit, value) of every edit of ``doc`` at a path ``path_filter`` keeps."""
    leaves = [(p, v) for p, v in positions(doc) if not isinstance(v, (dict, list))]
    names = sorted({v for _, v in leaves if isinstance(v, str)})
    rng = random.Random(seed)
    for path, value in positions(doc):
        if not path_filter(path):
            continue
        if isinstance(value, dict):
            for key in value:
                if key not in ("_type", "_format"):
                    yield path, "drop", key
        elif isinstance(value, list):
            for i in range(len(value)):
                yield path, "del", i
                yield path, "dup", i
                if i + 1 < len(value) and value[i] != value[i + 1]:
                    yield path, "swap", i
        elif path:
            pool = [n for n in names if n != value]
            others = rng.sample(pool, min(3, len(pool))) if isinstance(value, str) else []
            for new in leaf_edits(value, others):
                yield path, "set", new


def edited(doc: Any, case: Case) -> Any:
    out = copy.deepcopy(doc)
    node = out
    for step in case.path[:-1] if case.edit == "set" else case.path:
        node = node[step]
    if case.edit == "set":
        node[case.path[-1]] = case.value
    elif case.edit == "drop":
        del node[case.value]
    elif case.edit == "del":
        del node[case.value]
    elif case.edit == "dup":
        node.insert(case.value, copy.deepcopy(node[case.value]))
    else:  # swap
        i = case.value
        node[i], node[i + 1] = node[i + 1], node[i]
    return out


def _meaning(stage: str, path: tuple) -> bool:
    """The fields of a loop tree or program that say what it computes, or are its interface."""
    keys = {p for p in path if isinstance(p, str)}
    if stage in ("loop_tree", "resident_tree", "program") and path[-1:] == ("body",):
        return True  # which ops run, in what order: the list itself (its elements are edited)
    if stage in ("loop_tree", "resident_tree"):
        return bool({"fn", "operands", "store", "correction", "value", "dtype", "outputs"} & keys)
    if stage == "program":
        interface = path[-1:] == ("name",) and "kernel_args" in keys  # an output's name
        return path[-1:] == ("op",) or bool({"value", "dtype", "device_coordinates"} & keys) or interface
    return False


def _swaps_operands(stage: str, doc: Any, path: tuple, edit: str, value: Any) -> bool:
    """The edit swaps two input args of a program op other than a batchmatmul (its operand order)."""
    if stage != "program" or edit != "swap" or path[-1:] != ("args",):
        return False
    op = doc
    for step in path[:-1]:
        op = op[step]
    args = op["args"]
    pair = args[value:value + 2]
    return ("op" in op and op["op"] != "batchmatmul"
            and all(isinstance(a, dict) and a.get("is_input") is True for a in pair))


def kept(stage: str, path: tuple) -> bool:
    """Whether ``stage``'s artifact is edited at ``path``: the program's symbolic record is the
    kind "symbolic", edited apart from the rest of the program."""
    if _meaning(stage, path):
        return False
    if stage == "program":
        return "symbolic" not in path[:1]
    if stage == "symbolic":
        return path[:1] == ("symbolic",) and len(path) > 1
    return True


class Pipeline:
    """One graph's stage artifacts, inputs and reference, and how each stage runs alone."""

    def __init__(self, graph: fspyre.Graph, machine: Machine) -> None:
        self.graph, self.machine = graph, machine
        comp = fspyre.compile(graph, machine, tiling="hints")
        self.program = comp.program
        if graph.symbolic:
            self.artifacts = {"graph": graph, "program": comp.program, "symbolic": comp.program}
        else:
            self.tree = comp.stages["loop_tree"]
            self.resident = comp.stages["resident_tree"]
            self.split = divide_work(self.tree, machine)
            self.alloc = allocate(self.tree, self.split, machine)
            search = fspyre.compile(graph, machine, tiling="auto").stages["tiling_search"]
            self.artifacts = {"graph": graph, "tiling_search": search, "tiling_plan": comp.stages["tiling_plan"],
                              "loop_tree": self.tree, "resident_tree": self.resident, "split_plan": self.split,
                              "allocation": self.alloc, "program": comp.program,
                              "report": traffic_report(comp.program)}
        self.docs = {stage: json.loads(dumps(art)) for stage, art in self.artifacts.items()}
        self.references: dict[tuple[str, int | None], tuple] = {}

    @property
    def stages(self) -> tuple[str, ...]:
        return tuple(s for s in STAGES if s in self.artifacts)

    def next_stage(self, stage: str, artifact: Any) -> tuple[fspyre.Graph, Any]:
        """(the graph to compare against, the program) with ``artifact`` in place of ``stage``'s."""
        m = self.machine
        if stage == "graph":
            return artifact, fspyre.compile(artifact, m, tiling="hints").program
        if stage == "tiling_search":
            pretty(artifact), str(artifact)
            return self.graph, place_copies(tile(self.graph, artifact.plan, OnlineOptions()), m).program
        if stage == "tiling_plan":
            return self.graph, place_copies(tile(self.graph, artifact, OnlineOptions()), m).program
        if stage == "loop_tree":
            return self.graph, place_copies(artifact, m).program
        if stage == "resident_tree":
            split = divide_work(artifact, m)
            return self.graph, emit_program(artifact, split, allocate(artifact, split, m), m)
        if stage == "split_plan":
            return self.graph, emit_program(self.tree, artifact, allocate(self.tree, artifact, m), m)
        if stage == "allocation":
            return self.graph, emit_program(self.tree, self.split, artifact, m)
        if stage in ("program", "symbolic"):
            return self.graph, artifact
        raise AssertionError(stage)

    def runs(self, graph: fspyre.Graph) -> Iterator[tuple[fspyre.Graph, dict[str, np.ndarray], tuple]]:
        """(the graph at a concrete size, inputs, reference with bounds) to compare a program on."""
        sizes: tuple[int | None, ...] = SYMBOLIC_SIZES if graph.symbolic else (None,)
        for size in sizes:
            sized = specialize(graph, {"S": size}) if size is not None else graph
            buffers = sized.buffer_table()
            types = {n: buffers[n].type for n in sized.inputs}
            for make in (random_inputs, wide_inputs):
                key = (make.__name__, size)
                if graph is self.graph and key in self.references:
                    yield (sized, *self.references[key])
                    continue
                inputs = make(types, 0)
                ref = evaluate_with_bounds(sized, inputs, self.machine)
                if graph is self.graph:
                    self.references[key] = (inputs, ref)
                yield sized, inputs, ref

    def outcome(self, stage: str, text: str) -> Outcome:
        start = time.process_time()
        signal.signal(signal.SIGVTALRM, _stop)
        signal.setitimer(signal.ITIMER_VIRTUAL, 2 * TIME_LIMIT)  # a case that never returns is stopped
        try:
            artifact = loads(text)
            if stage == "report":
                str(artifact), repr(artifact), pretty(artifact)
                kind, detail = "inert", ""
            else:
                graph, program = self.next_stage(stage, artifact)
                kind, detail = "equal", ""
                for sized, inputs, ref in self.runs(graph):
                    report = compare(sized, fspyre.run(program, inputs), *ref)
                    if not report.equal:
                        kind, detail = "wrong", str(report).splitlines()[0]
                        break
        except FspyreError as err:
            message = str(err)
            one_line = message and "\n" not in message
            kind, detail = ("refused", message) if one_line else ("raw", f"bad message {message!r}")
        except _Stopped:
            kind, detail = "slow", "stopped"
        except Exception as err:  # noqa: BLE001 - the point: any other exception is a finding
            kind, detail = "raw", f"{type(err).__name__}: {err}"
        finally:
            signal.setitimer(signal.ITIMER_VIRTUAL, 0)
        took = time.process_time() - start
        if took > TIME_LIMIT:
            kind, detail = "slow", f"{took:.1f} s"
        return Outcome(kind, detail[:300], took)


class _Stopped(BaseException):
    """A case ran past twice the time limit (a BaseException: no stage's handler swallows it)."""


def _stop(signum: int, frame: Any) -> None:
    raise _Stopped


def all_cases(pipes: dict[str, Pipeline]) -> list[Case]:
    out = []
    for gname, pipe in pipes.items():
        for stage in pipe.stages:
            doc = pipe.docs[stage]
            for path, edit, value in edits(doc, lambda p, s=stage: kept(s, p), f"{gname} {stage}"):
                if not _swaps_operands(stage, doc, path, edit, value):
                    out.append(Case(gname, stage, path, edit, value))
    return out


def run_cases(pipes: dict[str, Pipeline], cases: list[Case],
              report: Callable[[Case, Outcome], None] | None = None) -> dict[str, dict[str, int]]:
    """The tally of outcomes per artifact kind."""
    tally: dict[str, dict[str, int]] = {}
    for case in cases:
        pipe = pipes[case.graph]
        text = json.dumps({"_format": FORMAT, **edited(pipe.docs[case.stage], case)})
        got = pipe.outcome(case.stage, text)
        per = tally.setdefault(case.stage, {})
        per[got.kind] = per.get(got.kind, 0) + 1
        if report is not None:
            report(case, got)
    return tally


def pipelines() -> dict[str, Pipeline]:
    machine = spyre(cores=4)
    return {name: Pipeline(g, machine) for name, g in graphs().items()}


def sample(cases: list[Case], n: int, seed: int = 22) -> list[Case]:
    """``n`` cases spread over every (graph, stage)."""
    rng = random.Random(seed)
    groups: dict[tuple[str, str], list[Case]] = {}
    for c in cases:
        groups.setdefault((c.graph, c.stage), []).append(c)
    per = max(1, n // len(groups))
    return [c for group in groups.values() for c in rng.sample(group, min(per, len(group)))]


def main() -> None:
    import warnings

    warnings.simplefilter("ignore")
    np.seterr(all="ignore")
    pipes = pipelines()
    cases = all_cases(pipes)
    print(f"{len(cases)} corruptions over {len(pipes)} graphs, {len(STAGES)} artifact kinds")
    bad: list[str] = []

    def note(case: Case, got: Outcome) -> None:
        if got.kind not in ("refused", "equal", "inert"):
            bad.append(f"{got.kind}: {case.describe()}: {got.detail}")

    start = time.process_time()
    tally = run_cases(pipes, cases, note)
    total: dict[str, int] = {}
    for stage in STAGES:
        per = tally.get(stage, {})
        for k, v in per.items():
            total[k] = total.get(k, 0) + v
        print(f"  {stage:14} {sum(per.values()):6}  " + "  ".join(f"{k} {v}" for k, v in sorted(per.items())))
    print(f"  {'total':14} {sum(total.values()):6}  " + "  ".join(f"{k} {v}" for k, v in sorted(total.items())))
    print(f"in {time.process_time() - start:.0f} s CPU")
    for line in bad:
        print(line)


if __name__ == "__main__":
    main()
