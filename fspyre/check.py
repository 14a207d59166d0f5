"""``check``: compile, run on the machine model, and compare with the untiled reference."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from fspyre.ir.graph import Graph, Reduction
from fspyre.machine.hostio import random_inputs
from fspyre.machine.memcheck import MemoryReport, check_memory
from fspyre.machine.reference import evaluate
from fspyre.machine.report import TrafficReport, traffic_report
from fspyre.machine.spyre import Machine, spyre
from fspyre.pipeline import Compilation, compile, run

# Relative tolerance (to the output's largest magnitude) when a graph reduces: summation
# order differs between per-core partials and the reference (docs/semantics.md).
REDUCTION_RTOL = {"float16": 2.0**-8, "bfloat16": 2.0**-6, "float32": 2.0**-18, "int32": 0.0, "bool": 0.0}


@dataclass(frozen=True, slots=True, kw_only=True)
class OutputCheck:
    name: str
    equal: bool
    max_abs_diff: float
    tolerance: float
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckReport:
    graph: str
    outputs: tuple[OutputCheck, ...]
    exact: bool  # True when the graph has no reduction: equality is bit-exact
    memory: MemoryReport | None = None  # static memory-safety check of the compiled program
    traffic: TrafficReport | None = None  # HBM/LX traffic and the analytic time estimate

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
                f"tol={o.tolerance:.3g} {'ok' if o.equal else 'MISMATCH'}"
            )
        for extra in (self.memory, self.traffic):
            if extra is not None:
                lines.append(str(extra))
        return "\n".join(lines)


def reduction_rtol(graph: Graph, dtype: str) -> float:
    """The relative tolerance for a graph's float outputs: the format's few-ulp bound, grown
    to 2·n·2⁻²⁴ (the float32 error bound of an n-term sum or product in any order) for the
    longest reduction n in the graph."""
    base = REDUCTION_RTOL[dtype]
    if base == 0.0:
        return 0.0
    n = max((int(np.prod([d.size for d in op.reduction_ranges])) for op in graph.ops
             if isinstance(op, Reduction)), default=1)
    return max(base, 2.0 * n * 2.0**-24)


def compare(graph: Graph, got: Mapping[str, np.ndarray], ref: Mapping[str, np.ndarray]) -> CheckReport:
    buffers = graph.buffer_table()
    exact = not any(isinstance(op, Reduction) for op in graph.ops)
    outs = []
    for o in graph.outputs:
        dtype = buffers[o.buffer].type.dtype
        a = np.asarray(got[o.name]).astype(np.float64)
        b = np.asarray(ref[o.name]).astype(np.float64)
        same_nan = np.isnan(a) == np.isnan(b)
        both = ~np.isnan(a) & ~np.isnan(b)
        diff = np.where(both & (a != b), np.abs(a - b), 0.0)
        diff = np.nan_to_num(diff, nan=np.inf, posinf=np.inf)
        mad = float(diff.max()) if diff.size else 0.0
        scale = float(np.nanmax(np.abs(np.where(np.isfinite(b), b, 0)))) if b.size else 0.0
        tol = 0.0 if exact else reduction_rtol(graph, dtype) * max(1.0, scale)
        ok = bool(np.all(same_nan)) and mad <= tol
        outs.append(OutputCheck(name=o.name, equal=ok, max_abs_diff=mad, tolerance=tol,
                                shape=buffers[o.buffer].type.shape, dtype=dtype))
    return CheckReport(graph=graph.name, outputs=tuple(outs), exact=exact)


def check(graph: Graph, inputs: Mapping[str, object] | None = None, seed: int = 0, *,
          machine: Machine | None = None, tiling: str = "hints", comp: Compilation | None = None) -> CheckReport:
    machine = machine or spyre()
    buffers = graph.buffer_table()
    if inputs is None:
        inputs = random_inputs({n: buffers[n].type for n in graph.inputs}, seed)
    comp = comp or compile(graph, machine, tiling=tiling)
    report = compare(graph, run(comp, inputs), evaluate(graph, inputs, machine))
    return replace(report, memory=check_memory(comp.program), traffic=traffic_report(comp.program, machine))
