"""The one pipeline runner: composes the stages and calls a callback after each.

Printing, timing, verification and ``NN_<stage>.txt`` dumps all hang off that callback."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from fspyre.errors import ExecutionError, FspyreWarning, GraphError, MachineError
from fspyre.ir.frozen import FrozenMap
from fspyre.ir.graph import Graph
from fspyre.ir.kinds import CHECKS, Checks, FuseMode, Tiling
from fspyre.ir.plans import TilingPlan
from fspyre.ir.program import Program
from fspyre.machine.spyre import Machine, spyre
from fspyre.stages.allocation import AllocationOptions
from fspyre.stages.loop_tree import tile, verify_loop_tree
from fspyre.stages.online_softmax import OnlineOptions
from fspyre.stages.program import verify_program
from fspyre.stages.residency import ResidencyOptions, place_copies
from fspyre.stages.split_plan import SplitOptions
from fspyre.stages.tiling_plan import TilingOptions, plan_tiling
from fspyre.stages.tiling_search import SearchOptions, search_tiling

StageCallback = Callable[[str, Any], None]


def require_graph(graph: object, where: str) -> Graph:
    """``graph`` if it is a Graph; otherwise an error saying what was passed and how to get one."""
    if isinstance(graph, Graph):
        return graph
    from fspyre.ir.builder import GraphBuilder

    if isinstance(graph, GraphBuilder):
        raise GraphError(f"{where}: got the GraphBuilder {graph.name!r}, not a Graph; call .build() on it first")
    raise GraphError(f"{where}: expected an fspyre Graph, got {type(graph).__name__}")


def require_machine(machine: object, where: str) -> Machine:
    if machine is None:
        return spyre()
    if not isinstance(machine, Machine):
        raise MachineError(
            f"{where}: machine={machine!r:.60} is a {type(machine).__name__}; pass fspyre.machine.spyre(cores=...)"
        )
    return machine


@dataclass(frozen=True, slots=True, kw_only=True)
class Compilation:
    graph: Graph
    machine: Machine
    stages: FrozenMap[str, Any]  # stage name -> frozen artifact, in pipeline order
    program: Program
    warnings: tuple[str, ...] = ()  # every stage's hint warnings, in stage order (emitted once by compile)

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
    tiling: Tiling | TilingPlan = "auto",
    *,
    fuse: FuseMode = "max-producers",
    residency: bool = True,
    online: bool = True,
    split_options: SplitOptions = SplitOptions(),
    allocation_options: AllocationOptions = AllocationOptions(),
    callback: StageCallback | None = None,
) -> Compilation:
    graph = require_graph(graph, "compile")
    machine = require_machine(machine, "compile")
    if graph.symbolic:
        return _compile_symbolic(graph, machine, tiling, fuse=fuse, residency=residency, online=online,
                                 split_options=split_options, allocation_options=allocation_options,
                                 callback=callback)
    stages: list[tuple[str, Any]] = []

    def done(name: str, artifact: Any) -> Any:
        stages.append((name, artifact))
        if callback is not None:
            callback(name, artifact)
        return artifact

    done("graph", graph)
    # An embedder may bring its own plan (e.g. fspyre.stages.tiling_plan.plan_groups).
    if isinstance(tiling, TilingPlan):
        plan = tiling
    elif tiling == "auto":
        options = SearchOptions(fuse=fuse, residency=residency, online=OnlineOptions(enabled=online),
                                split=split_options, allocation=allocation_options)
        plan = done("tiling_search", search_tiling(graph, machine, options)).plan
    else:
        plan = plan_tiling(graph, TilingOptions(mode=tiling, online=OnlineOptions(enabled=online)))
    done("tiling_plan", plan)
    tree = tiled = done("loop_tree", tile(graph, plan, OnlineOptions(enabled=online)))
    # keep_resident judges its copies by dividing and allocating; its result carries both
    placed = place_copies(
        tree, machine, ResidencyOptions(enabled=residency, split=split_options, allocation=allocation_options))
    tree = done("resident_tree", placed.tree)
    split = done("split_plan", placed.split)
    done("allocation", placed.allocation)
    verify_loop_tree(tree)
    # keep_resident emitted the program to judge its copies (emit_program verifies the split
    # plan and allocation against the tree it is given)
    program = done("program", verify_program(placed.program))
    # Stages return their warnings as data (a stage called alone still reports them); the
    # runner raises each as a Python warning once, naming the caller of compile.
    found = tuple(dict.fromkeys(plan.warnings + tiled.warnings + split.warnings))
    for text in found:
        warnings.warn(f"{graph.name}: {text}", FspyreWarning, stacklevel=2)
    return Compilation(graph=graph, machine=machine, stages=FrozenMap(stages), program=program, warnings=found)


def _compile_symbolic(graph: Graph, machine: Machine, tiling: Tiling | TilingPlan, *, callback: StageCallback | None,
                      **options: Any) -> Compilation:
    """A graph with a symbolic dim: the concrete stages run at witness sizes and the program
    is their generalization (fspyre/stages/symbolic.py). ``stages`` holds the symbolic graph,
    the first witness's stages (named ``<stage>@<dim>=<size>``) and the symbolic program."""
    from fspyre.stages.symbolic import compile_symbolic

    if isinstance(tiling, TilingPlan):
        raise GraphError(f"compile: graph {graph.name} has a symbolic dim; an explicit TilingPlan names fixed "
                         f"counts, so pass tiling='auto', 'hints' or 'none'")
    def concrete(g: Graph, whole: frozenset[str]) -> Compilation:
        if not whole:
            return compile(g, machine, tiling, **options)
        # The whole form: work division keeps the dims of the symbolic size whole, and every
        # HBM intermediate keeps its own region (a freed slot fits a buffer of another size
        # only at some sizes, so reusing it is not one program for every size).
        split = dataclasses.replace(options["split_options"], whole=whole)
        allocation = dataclasses.replace(options["allocation_options"], hbm_reuse=False)
        return compile(g, machine, tiling, **(options | {"split_options": split, "allocation_options": allocation}))

    first, program, found = compile_symbolic(graph, machine, concrete, hinted=tiling != "none")
    assert program.symbolic is not None
    (dim,), (size,) = program.symbolic.dims, program.symbolic.witnesses[0]
    stages: list[tuple[str, Any]] = [("graph", graph)]
    stages += [(f"{name}@{dim.name}={size}", art) for name, art in first.stages.items() if name != "graph"]
    stages += [("symbolic", program.symbolic), ("program", program)]
    if callback is not None:
        for name, art in stages:
            callback(name, art)
    found = tuple(dict.fromkeys(found))
    for text in found:
        warnings.warn(f"{graph.name}: {text}", FspyreWarning, stacklevel=3)
    return Compilation(graph=graph, machine=machine, stages=FrozenMap(stages), program=program, warnings=found)


def run(comp: Compilation | Program, inputs: Mapping[str, object], *, checks: Checks = "full") -> dict[str, np.ndarray]:
    """Run on the machine model. ``checks="full"`` (the default) keeps a written bit per byte
    and reports any read of a byte nobody wrote; ``checks="fast"`` skips that bookkeeping:
    identical results on every program that passes with ``"full"``, and no report for one that
    reads unwritten bytes (they read as zero). Bounds and alignment are checked either way."""
    from fspyre.machine.interpreter import RunOptions, run_outputs

    if checks not in CHECKS:
        raise ExecutionError(f"run: checks={checks!r}: use one of {list(CHECKS)}")
    if isinstance(comp, Compilation):
        program = comp.program
    elif isinstance(comp, Program):
        program = comp
    elif isinstance(comp, Graph):
        raise ExecutionError("run: got a Graph; compile it first (fspyre.run(fspyre.compile(graph), inputs)), "
                             "or use fspyre.evaluate(graph, inputs) for the untiled reference")
    else:
        raise ExecutionError(f"run: expected the Compilation fspyre.compile returns, got {type(comp).__name__}"
                             f"{'; call .build() and compile the graph first' if hasattr(comp, 'build') else ''}")
    if program.symbolic is not None:  # bind the symbolic sizes from the inputs and check the assumptions
        from fspyre.stages.symbolic import bind_sizes, instantiate

        program = instantiate(program, bind_sizes(program, inputs))
    return run_outputs(program, inputs, RunOptions(check_written=checks == "full"))
