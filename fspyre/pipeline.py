"""The one pipeline runner: composes the stages and calls a callback after each.

Printing, timing, verification and ``NN_<stage>.txt`` dumps all hang off that callback."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from fspyre.ir.frozen import FrozenMap
from fspyre.ir.graph import Graph
from fspyre.ir.plans import TilingPlan
from fspyre.ir.program import Program
from fspyre.machine.spyre import Machine, spyre
from fspyre.stages.allocation import AllocationOptions, allocate
from fspyre.stages.loop_tree import tile
from fspyre.stages.program import emit_program
from fspyre.stages.split_plan import SplitOptions, divide_work
from fspyre.stages.tiling_plan import TilingOptions, plan_tiling

StageCallback = Callable[[str, Any], None]


@dataclass(frozen=True, slots=True, kw_only=True)
class Compilation:
    graph: Graph
    machine: Machine
    stages: FrozenMap[str, Any]  # stage name -> frozen artifact, in pipeline order
    program: Program

    @property
    def bundle_mlir(self) -> str:
        from fspyre.lower.bundle import bundle_mlir

        return bundle_mlir(self.program)

    @property
    def mlir_generic(self) -> str:
        from fspyre.lower.generic import mlir_generic

        return mlir_generic(self.program)

    @property
    def sdsc(self) -> dict[str, dict]:
        from fspyre.lower.sdsc import sdsc_json

        return sdsc_json(self.program)


def compile(
    graph: Graph,
    machine: Machine | None = None,
    tiling: str | TilingPlan = "hints",
    *,
    split_options: SplitOptions = SplitOptions(),
    allocation_options: AllocationOptions = AllocationOptions(),
    callback: StageCallback | None = None,
) -> Compilation:
    machine = machine or spyre()
    stages: list[tuple[str, Any]] = []

    def done(name: str, artifact: Any) -> Any:
        stages.append((name, artifact))
        if callback is not None:
            callback(name, artifact)
        return artifact

    done("graph", graph)
    # An embedder may bring its own plan (e.g. fspyre.stages.tiling_plan.plan_groups).
    plan = tiling if isinstance(tiling, TilingPlan) else plan_tiling(graph, TilingOptions(mode=tiling))
    done("tiling_plan", plan)
    tree = done("loop_tree", tile(graph, plan))
    split = done("split_plan", divide_work(tree, machine, split_options))
    alloc = done("allocation", allocate(tree, split, machine, allocation_options))
    program = done("program", emit_program(tree, split, alloc, machine))
    return Compilation(graph=graph, machine=machine, stages=FrozenMap(stages), program=program)


def run(comp: Compilation | Program, inputs: Mapping[str, object], *, checks: str = "full") -> dict[str, np.ndarray]:
    """Run on the machine model. ``checks="full"`` (the default) keeps a written bit per byte
    and reports any read of a byte nobody wrote; ``checks="fast"`` skips that bookkeeping:
    identical results on every program that passes with ``"full"``, and no report for one that
    reads unwritten bytes (they read as zero). Bounds and alignment are checked either way."""
    from fspyre.machine.interpreter import RunOptions, run_program

    if checks not in ("full", "fast"):
        raise ValueError(f"checks={checks!r}: use 'full' or 'fast'")
    program = comp.program if isinstance(comp, Compilation) else comp
    outs, _ = run_program(program, inputs, RunOptions(check_written=checks == "full"))
    return outs
