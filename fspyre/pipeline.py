"""The one pipeline runner: composes the stages and calls a callback after each.

Printing, timing, verification and ``NN_<stage>.txt`` dumps all hang off that callback."""

from __future__ import annotations

import dataclasses
import inspect
import logging
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from fspyre.errors import (
    AllocationError,
    ExecutionError,
    FspyreWarning,
    GraphError,
    MachineError,
    TilingError,
    WorkDivisionError,
)
from fspyre.ir.frozen import FrozenMap
from fspyre.ir.graph import Graph
from fspyre.ir.kinds import CHECKS, FUSE_MODES, TILINGS, Checks, FuseMode, Tiling
from fspyre.ir.looptree import LoopTree
from fspyre.ir.plans import Allocation, SplitPlan, TilingPlan, TilingSearch
from fspyre.ir.program import Program
from fspyre.machine.spyre import Machine
from fspyre.stages.allocation import AllocationOptions
from fspyre.stages.arguments import require, require_callable, require_graph, require_machine, short, verified
from fspyre.stages.loop_tree import tile, verify_loop_tree
from fspyre.stages.online_softmax import OnlineOptions
from fspyre.stages.program import emit_program, verify_program
from fspyre.stages.residency import Residency, ResidencyOptions, place_copies
from fspyre.stages.split_plan import SplitOptions
from fspyre.stages.tiling_plan import TilingOptions, plan_tiling
from fspyre.stages.tiling_search import Placed, SearchOptions, search_placed

StageCallback = Callable[[str, Any], None]
logger = logging.getLogger("fspyre")


def log_stages(callback: StageCallback | None = None) -> StageCallback:
    """A stage callback logging each stage on the ``fspyre`` logger -- INFO: its name, the seconds
    since the previous stage and its one-line summary, and the tiling search's choice per group;
    DEBUG: the stage's compact printed text -- then calling ``callback``. ``fspyre -v`` (``-vv``)."""
    last = [time.perf_counter()]

    def log(name: str, artifact: Any) -> None:
        logger.info("%s %.3f s: %r", name, time.perf_counter() - last[0], artifact)
        if isinstance(artifact, TilingSearch):
            for g in artifact.groups:
                chosen = g.candidates[g.chosen]
                levels = " ".join(f"{'/'.join(lv.dims)}:{lv.count}" for lv in chosen.levels) or "untiled"
                logger.info("  group %s: %s (%.2f us, %d B HBM) of %d candidates", ", ".join(g.ops), levels,
                            chosen.time_ns / 1000, chosen.hbm_bytes, len(g.candidates))
            if artifact.note:
                logger.info("  %s", artifact.note)
        if logger.isEnabledFor(logging.DEBUG):
            from fspyre.pretty import pretty

            logger.debug("%s", pretty(artifact))
        if callback is not None:
            callback(name, artifact)
        last[0] = time.perf_counter()

    return log


@dataclass(frozen=True, slots=True, kw_only=True)
class Compilation:
    graph: Graph
    machine: Machine
    stages: FrozenMap[str, Any]  # stage name -> frozen artifact, in pipeline order
    program: Program
    warnings: tuple[str, ...] = ()  # every stage's hint warnings, in stage order (emitted once by compile)
    proof: Any = None  # with compile(..., prove=True): the fspyre.proof.Proof of the program

    def __repr__(self) -> str:  # short: each stage has its own repr and printer
        return f"Compilation({self.graph.name!r}: stages {', '.join(self.stages)}; {self.program!r})"

    def _repr_html_(self) -> str:
        return self.program._repr_html_()

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
    prove: bool = False,
) -> Compilation:
    """``prove=True`` also proves the program statically (``fspyre.prove``, docs/proof.md): the
    Compilation carries the Proof, and a property not proved is a FspyreWarning."""
    machine = require_machine(machine, "compile")
    graph = require_graph(graph, "compile", machine)
    _check_options("compile", tiling, fuse=fuse, residency=residency, online=online, split_options=split_options,
                   allocation_options=allocation_options, callback=callback, prove=prove)
    if prove:
        comp = compile(graph, machine, tiling, fuse=fuse, residency=residency, online=online,
                       split_options=split_options, allocation_options=allocation_options, callback=callback)
        from fspyre.proof import prove as prove_program

        proof = prove_program(comp)
        if not proof.proved:
            warnings.warn(f"{comp.graph.name}: {' '.join(str(proof).split())}", FspyreWarning, stacklevel=2)
        return replace(comp, proof=proof)
    if graph.symbolic:
        return _compile_symbolic(graph, machine, tiling, fuse=fuse, residency=residency, online=online,
                                 split_options=split_options, allocation_options=allocation_options,
                                 callback=callback)
    done = _Recorder(callback)
    done("graph", graph)
    # An embedder may bring its own plan (e.g. fspyre.stages.tiling_plan.plan_groups).
    searched: Placed | None = None
    if isinstance(tiling, TilingPlan):
        plan = tiling
    elif tiling == "auto":
        options = SearchOptions(fuse=fuse, residency=residency, online=OnlineOptions(enabled=online),
                                split=split_options, allocation=allocation_options)
        searched = search_placed(graph, machine, options)
        plan = done("tiling_search", searched.search).plan
    else:
        plan = plan_tiling(graph, TilingOptions(mode=tiling, online=OnlineOptions(enabled=online)))
    done("tiling_plan", plan)
    if searched is not None and searched.tree is not None:
        # the search compiled its plan under these very options to judge it: its loop tree and
        # placement are the stages' output (tests/tiling/test_tiling_search.py: the same program)
        tiled = done("loop_tree", searched.tree)
    else:
        tiled = done("loop_tree", tile(graph, plan, OnlineOptions(enabled=online)))
    given = searched.placed if searched is not None else None
    placed = _place(tiled, machine, done, residency, split_options, allocation_options, given)
    return _finish(graph, machine, plan, tiled, placed.split, placed.program, done)


def _check_options(where: str, tiling: object, **options: Any) -> None:
    """The one check of ``compile``'s options (``resume`` takes the same ones): a one-line
    error naming the option and what it got."""
    if not isinstance(tiling, TilingPlan) and tiling not in TILINGS:
        raise TilingError(f"{where}: tiling={short(tiling)}: use one of {list(TILINGS)} or a TilingPlan")
    if options["fuse"] not in FUSE_MODES:
        raise TilingError(f"{where}: fuse={short(options['fuse'])}: use one of {list(FUSE_MODES)}")
    for flag in ("residency", "online", "prove"):
        if not isinstance(options[flag], bool):
            raise GraphError(f"{where}: {flag}={short(options[flag])} must be True or False")
    require(options["split_options"], SplitOptions, where, "split_options", WorkDivisionError)
    require(options["allocation_options"], AllocationOptions, where, "allocation_options", AllocationError)
    require_callable(options["callback"], where, "callback", GraphError)


class _Recorder:
    """The runner's record of the stages so far: ``done(name, artifact)`` keeps the artifact,
    calls the stage callback and returns the artifact."""

    def __init__(self, callback: StageCallback | None) -> None:
        self.callback = callback
        self.stages: list[tuple[str, Any]] = []

    def __call__(self, name: str, artifact: Any) -> Any:
        self.stages.append((name, artifact))
        if self.callback is not None:
            self.callback(name, artifact)
        return artifact


def _place(tree: LoopTree, machine: Machine, done: _Recorder, residency: bool, split_options: SplitOptions,
           allocation_options: AllocationOptions, given: Residency | None = None) -> Residency:
    # keep_resident judges its copies by dividing and allocating; its result carries both
    placed = given or place_copies(
        tree, machine, ResidencyOptions(enabled=residency, split=split_options, allocation=allocation_options))
    done("resident_tree", placed.tree)
    done("split_plan", placed.split)
    done("allocation", placed.allocation)
    verified(verify_loop_tree, placed.tree)  # once: keep_resident verified the trees it made
    # keep_resident emitted the program to judge its copies (emit_program verifies the split
    # plan and allocation against the tree it is given)
    done("program", verified(verify_program, placed.program))  # a tiling search verified the one it hands on
    return placed


def _finish(graph: Graph, machine: Machine, plan: TilingPlan, tiled: LoopTree, split: SplitPlan, program: Program,
            done: _Recorder) -> Compilation:
    # Stages return their warnings as data (a stage called alone still reports them); the
    # runner raises each as a Python warning once, naming the caller of compile.
    found = tuple(dict.fromkeys(plan.warnings + tiled.warnings + split.warnings))
    for text in found:
        warnings.warn(f"{graph.name}: {text}", FspyreWarning, stacklevel=3)
    return Compilation(graph=graph, machine=machine, stages=FrozenMap(done.stages), program=program, warnings=found)


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
    _fits_card(program)
    return run_outputs(program, inputs, RunOptions(check_written=checks == "full"))


def _fits_card(program: Program) -> None:
    """The memories the machine model allocates for ``program`` are a Spyre card's at most: a
    loaded or edited program asking for more is refused before the model allocates them."""
    from fspyre.machine.spyre import HBM_BYTES, LX_PHYSICAL_BYTES, MAX_CORES

    for what, value, most in (("cores", program.cores, MAX_CORES), ("hbm_bytes", program.hbm_bytes, HBM_BYTES),
                              ("lx_bytes", program.lx_bytes, LX_PHYSICAL_BYTES)):
        if not isinstance(value, int):
            raise ExecutionError(f"run: program {program.name} has {what}={value}, a size in symbolic dims, but no "
                                 f"symbolic record to bind them; compile the graph again")
        if value > most:
            raise ExecutionError(f"run: program {program.name} has {what}={value}, more than a Spyre card's {most}; "
                                 f"compile it again for the card")


# The stages ``compile`` records, in order: ``resume`` continues after the last one it is given.
STAGES = ("graph", "tiling_search", "tiling_plan", "loop_tree", "resident_tree", "split_plan", "allocation", "program")


def resume(stages: Mapping[str, Any], machine: Machine | None = None, tiling: Tiling = "auto",
           **options: Any) -> Compilation:
    """Continue a compilation from saved stage artifacts (``Compilation.stages``, or the
    ``NN_<stage>.json`` files ``fspyre compile --emit json`` writes, loaded). The stages given
    are kept as they are (an engineer may have edited one) and the pipeline runs on from the
    latest: a graph is compiled, a tiling plan tiled, a loop tree placed (a resident tree keeps
    its copies as they are) and divided, a resident tree with its split plan and allocation
    emitted, a program taken as it is. ``tiling`` and ``options`` (``compile``'s keyword
    options but ``prove``, with its defaults) apply to the stages that run. A symbolic
    compilation continues from its graph or program."""
    if not isinstance(stages, Mapping):
        raise GraphError(f"resume: stages must be a mapping of stage name to artifact (Compilation.stages, or "
                         f"fspyre.cli.load_stages(DIR)), got {type(stages).__name__} {short(stages)}")
    graph = require_graph(stages.get("graph"), "resume: the stage 'graph'")
    machine = require_machine(machine, "resume")
    unknown = [k for k in options if k not in _RESUME_OPTIONS]
    if unknown:
        raise GraphError(f"resume: unknown option {unknown[0]!r}; resume takes {', '.join(_RESUME_OPTIONS)}")
    options = {**_RESUME_OPTIONS, **options}
    _check_options("resume", tiling, prove=False, **options)
    callback, online, residency = options["callback"], options["online"], options["residency"]
    split_options, allocation_options = options["split_options"], options["allocation_options"]
    unknown = [n for n in stages if n not in STAGES and "@" not in n and n != "symbolic"]
    if unknown:
        raise GraphError(f"resume: unknown stage {unknown[0]!r}; the stages are {', '.join(STAGES)}")
    for name, cls in STAGE_TYPES.items():
        if name in stages and not isinstance(stages[name], cls):
            raise GraphError(f"resume: the stage {name!r} is a {type(stages[name]).__name__}, not a {cls.__name__}")
    done = _Recorder(callback)
    if "program" in stages:
        program = stages["program"]
        if program.cores != machine.cores:
            raise MachineError(f"resume: the program {program.name} was compiled for {program.cores} cores and the "
                               f"machine has {machine.cores}; pass a machine of {program.cores} cores")
        for name, artifact in stages.items():
            done(name, verify_program(artifact) if name == "program" else artifact)
        return Compilation(graph=graph, machine=machine, stages=FrozenMap(done.stages), program=program)
    if graph.symbolic or "tiling_plan" not in stages:
        return compile(graph, machine, tiling, **options)
    for name in ("graph", "tiling_search", "tiling_plan"):
        if name in stages:
            done(name, stages[name])
    plan = stages["tiling_plan"]
    if "loop_tree" in stages:
        tiled = done("loop_tree", verify_loop_tree(stages["loop_tree"]))
    else:
        tiled = done("loop_tree", tile(graph, plan, OnlineOptions(enabled=online)))
    if "resident_tree" not in stages:
        placed = _place(tiled, machine, done, residency, split_options, allocation_options)
        return _finish(graph, machine, plan, tiled, placed.split, placed.program, done)
    tree = verify_loop_tree(stages["resident_tree"])
    if "split_plan" in stages and "allocation" in stages:
        done("resident_tree", tree)
        split = done("split_plan", stages["split_plan"])
        done("allocation", stages["allocation"])
        program = done("program", verify_program(emit_program(tree, split, stages["allocation"], machine)))
        return _finish(graph, machine, plan, tiled, split, program, done)
    placed = _place(tree, machine, done, False, split_options, allocation_options)
    return _finish(graph, machine, plan, tiled, placed.split, placed.program, done)


# resume's options and their defaults: compile's keyword options (one home), but prove
_RESUME_OPTIONS: dict[str, Any] = {
    name: p.default for name, p in inspect.signature(compile).parameters.items()
    if p.kind is inspect.Parameter.KEYWORD_ONLY and name != "prove"}

# the artifact type of each stage compile records
STAGE_TYPES: dict[str, type] = {
    "graph": Graph, "tiling_search": TilingSearch, "tiling_plan": TilingPlan, "loop_tree": LoopTree,
    "resident_tree": LoopTree, "split_plan": SplitPlan, "allocation": Allocation, "program": Program,
}
