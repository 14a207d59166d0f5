"""``check``: compile, run on the machine model, and compare with the untiled reference."""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from fspyre.errors import ExecutionError
from fspyre.ir.graph import Dim, Graph, Reduction, TensorType
from fspyre.ir.kinds import Tiling
from fspyre.ir.program import Program
from fspyre.machine.hostio import random_inputs, wide_inputs
from fspyre.machine.interpreter import run_program
from fspyre.machine.memcheck import MemoryReport, check_memory, execution_issue
from fspyre.machine.reference import evaluate_with_bounds
from fspyre.machine.report import TrafficReport, traffic_report
from fspyre.machine.spyre import Machine
from fspyre.pipeline import Compilation, compile, require_graph, require_machine, run
from fspyre.stages.symbolic import bind_sizes, concrete_graph, instantiate, specialize

# A coarse norm-wise figure, max|run − ref| ≤ rtol·max(1, max|ref|), that the tiling tests
# still use as a sanity net; ``check`` itself compares per element against the propagated
# bound of ``evaluate_with_bounds`` (docs/semantics.md, "What check promises").
REDUCTION_RTOL = {"float16": 2.0**-8, "bfloat16": 2.0**-6, "float32": 2.0**-18, "int32": 0.0, "bool": 0.0}


@dataclass(frozen=True, slots=True, kw_only=True)
class OutputCheck:
    name: str
    equal: bool
    max_abs_diff: float
    tolerance: float  # the largest per-element bound (0: bit-exact)
    worst: float = 0.0  # max over elements of |diff| / bound; ≤ 1 when equal
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckReport:
    graph: str
    outputs: tuple[OutputCheck, ...]
    exact: bool  # True when the graph has no reduction: equality is bit-exact
    memory: MemoryReport | None = None  # static memory-safety check of the compiled program
    traffic: TrafficReport | None = None  # HBM/LX traffic and the analytic time estimate
    warnings: tuple[str, ...] = ()  # hints the compilation dropped (Compilation.warnings)

    @property
    def safe(self) -> bool:
        return self.memory is None or self.memory.clean

    @property
    def equal(self) -> bool:
        # A program the memory check rejects is never reported equal: on hardware it touches
        # memory outside its allocations, whatever the interpreter computed.
        return self.safe and all(o.equal for o in self.outputs)

    @property
    def max_abs_diff(self) -> float:
        return max((o.max_abs_diff for o in self.outputs), default=0.0)

    def __str__(self) -> str:
        rule = "bit-exact" if self.exact else "within tolerance"
        lines = [f"check {self.graph}: {'EQUAL' if self.equal else 'NOT EQUAL'} ({rule})"]
        for o in self.outputs:
            lines.append(
                f"  {o.name}: {o.dtype}{list(o.shape)} max|diff|={o.max_abs_diff:.3g} "
                f"max bound={o.tolerance:.3g} worst diff/bound={o.worst:.3g} {'ok' if o.equal else 'MISMATCH'}"
            )
        lines += [f"  warning: {w}" for w in self.warnings]
        for extra in (self.memory, self.traffic):
            if extra is not None:
                lines.append(str(extra))
        return "\n".join(lines)


def compare(graph: Graph, got: Mapping[str, np.ndarray], ref: Mapping[str, np.ndarray],
            bounds: Mapping[str, np.ndarray | None]) -> CheckReport:
    """Per element, ``|got − ref| ≤ bound`` (``bounds`` from ``evaluate_with_bounds``; None is
    a zero bound: bit-exact). NaN must sit where the reference has NaN, except where the bound
    is infinite (an error that may have left a function's domain). An output of another shape
    than the reference's is refused, not broadcast: it comes from a program of another graph
    (a loaded artifact may declare an output's kept axis elsewhere, which no index records)."""
    buffers = graph.buffer_table()
    exact = not any(isinstance(op, Reduction) for op in graph.ops)
    outs = []
    for o in graph.outputs:
        dtype = buffers[o.buffer].type.dtype
        a = np.asarray(got[o.name]).astype(np.float64)
        b = np.asarray(ref[o.name]).astype(np.float64)
        if a.shape != b.shape:
            raise ExecutionError(f"compare {graph.name}: output {o.name} has shape {list(a.shape)} where the graph's "
                                 f"has {list(b.shape)}; compare a program's outputs with the graph it was compiled "
                                 f"from")
        bound = bounds.get(o.name)
        bound = np.zeros(b.shape) if bound is None else np.broadcast_to(np.asarray(bound, np.float64), b.shape)
        with np.errstate(invalid="ignore"):
            diff = np.where(a == b, 0.0, np.abs(a - b))  # equal infinities differ by 0
        nan_a, nan_b = np.isnan(a), np.isnan(b)
        diff = np.where(nan_a & nan_b, 0.0, np.where(nan_a | nan_b, np.inf, diff))
        ok_elem = (diff <= bound) | np.isinf(bound)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(diff == 0, 0.0, np.where(np.isinf(bound), 0.0, diff / bound))
        finite = np.where(np.isinf(bound), 0.0, bound)
        outs.append(OutputCheck(
            name=o.name, equal=bool(np.all(ok_elem)), max_abs_diff=float(diff.max(initial=0.0)),
            tolerance=float(finite.max(initial=0.0)), worst=float(ratio.max(initial=0.0)),
            shape=buffers[o.buffer].type.shape, dtype=dtype))
    return CheckReport(graph=graph.name, outputs=tuple(outs), exact=exact)


def check(graph: Graph, inputs: Mapping[str, object] | None = None, seed: int = 0, *,
          machine: Machine | None = None, tiling: Tiling = "auto", comp: Compilation | None = None) -> CheckReport:
    machine = require_machine(machine, "check")
    graph = require_graph(graph, "check", machine)
    if comp is not None and not isinstance(comp, Compilation):
        raise ExecutionError(f"check: comp= takes the Compilation of this graph, got {type(comp).__name__}")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ExecutionError(f"check: seed={seed!r} must be a non-negative integer")
    comp = comp or compile(graph, machine, tiling=tiling)
    program = comp.program
    runs = [inputs]
    if inputs is None:
        sized = graph
        if program.symbolic is not None:  # random inputs at the first size the compile was derived at
            sized = specialize(graph, {d.name: w for d, w in zip(program.symbolic.dims, program.symbolic.witnesses[0])})
        buffers = sized.buffer_table()
        types = {n: buffers[n].type for n in sized.inputs}
        # and a second run whose inputs defeat shift and scale invariances (a softmax hides a
        # wrong running max on inputs of one magnitude around 0)
        runs = [random_inputs(types, seed), wide_inputs(types, seed)]
    reports = []
    for given in runs:
        assert given is not None
        concrete, run_graph = program, graph
        if program.symbolic is not None:
            concrete = instantiate(program, bind_sizes(program, given))
            run_graph = concrete_graph(graph, given)
        ref, bounds = evaluate_with_bounds(run_graph, given, machine)
        reports.append(compare(run_graph, run(concrete, given), ref, bounds))
    report = _worst(reports)
    return replace(report, memory=check_memory(concrete), traffic=traffic_report(concrete),
                   warnings=comp.warnings)


def _worst(reports: list[CheckReport]) -> CheckReport:
    """One report of several runs of a program: each output equal in every run, with the
    largest difference, bound and ratio any run saw."""
    first, *rest = reports
    outs = []
    for i, o in enumerate(first.outputs):
        others = [r.outputs[i] for r in rest]
        outs.append(replace(o, equal=all(x.equal for x in [o, *others]),
                            max_abs_diff=max(x.max_abs_diff for x in [o, *others]),
                            tolerance=max(x.tolerance for x in [o, *others]),
                            worst=max(x.worst for x in [o, *others])))
    return replace(first, outputs=tuple(outs))


def check_memory_and_run(program: Program, inputs: Mapping[str, object] | None = None, seed: int = 0) -> MemoryReport:
    """``check_memory`` plus a run on the interpreter (random inputs unless given) whose first
    ExecutionError becomes an issue: it catches reads of never-written bytes the static rules
    cannot see. It lives here, not in memcheck, so the checker and the interpreter stay
    independent of each other."""
    report = check_memory(program)
    if inputs is None:
        types = {a.name: TensorType(dims=tuple(Dim(f"h{i}", s) for i, s in enumerate(a.host_shape)), dtype=a.dtype)
                 for a in program.kernel_args if a.is_input}
        inputs = random_inputs(types, seed)
    try:
        run_program(program, inputs)
    except ExecutionError as err:
        return replace(report, issues=report.issues + (execution_issue(err),))
    return report

