"""Stage ``keep_resident``: LoopTree -> LoopTree in which loop-invariant work runs once and
HBM regions read more than once are copied into LX once and read from there.

First, an op that no level of its innermost loop moves, and that reads nothing the loop
writes, is hoisted before that loop (``fspyre.stages.hoisting``), level by level outwards.

An op's read of a full (HBM) buffer covers one region per iteration of the loop levels that
move it: the levels whose tile steps touch a variable of the load's index. Two kinds of
re-read are worth a copy (docs/tiling.md, "LX residency"):

- *shared*: several ops of one loop body (or of the program's top level) read the same
  region in the same iteration -- row-tiled softmax reads ``x`` for its max and again for
  the subtraction;
- *loop-invariant*: an op inside a loop reads a region no level of that loop moves -- the
  weights of a matmul under a token loop;
- *across loops*: sibling loops walk the same regions tile by tile -- the two loops of an
  online softmax whose result is kept read ``x`` once each, the passes of loop fission read
  what the first pass read. The first loop copies each tile into an LX buffer that holds one
  slot per iteration (the allocator lays the slots out: ``fspyre.stages.allocation``), and
  the later loops read the tile back from its slot.

For each such region the stage places one ``copy`` op into a per-tile buffer right before
the outermost node that holds its readers, inside the innermost loop that moves the region,
and points the readers at the copy. A copy pays only if its buffer lives in LX, which only
the real allocator can say: the stage runs ``divide_work`` and ``allocate`` on the rewritten
tree and withdraws every copy whose buffer was left in HBM (recording why), until all that
remain are in LX. Copies whose readers slice the region differently across cores are
withdrawn the same way (the allocator refuses to place them in LX).

A graph output that later top-level ops read is written into LX for them and copied to HBM
once (a *pin*, ``fspyre.stages.pins``). Last, the ops next to a loop that run for it join its
first or last iteration (``fspyre.stages.guards``).

One module per job: this one composes them (``place_copies``); the copies and readers taking
their producer's slices live in ``fspyre.stages.copies``, the pins in
``fspyre.stages.pins``, the trials both are judged by in ``fspyre.stages.trials``, hoisting
in ``fspyre.stages.hoisting`` and the first/last-iteration guards in
``fspyre.stages.guards``.
"""

from __future__ import annotations

from dataclasses import dataclass

from fspyre.errors import TilingError
from fspyre.ir.frozen import require_fields
from fspyre.ir.looptree import LoopTree
from fspyre.ir.plans import Allocation, SplitPlan
from fspyre.ir.program import Program
from fspyre.ir.report import TrafficReport
from fspyre.machine.spyre import Machine
from fspyre.stages.allocation import AllocationOptions, allocate, verify_allocation
from fspyre.stages.arguments import require, require_tree
from fspyre.stages.copies import aligned, chosen_copies
from fspyre.stages.guards import guard_boundaries
from fspyre.stages.hoisting import hoist_invariants
from fspyre.stages.pins import pin_sites, pinned
from fspyre.stages.split_plan import SplitOptions, divide_work, verify_split_plan
from fspyre.stages.trials import Trial, TrialJudge


@dataclass(frozen=True, slots=True, kw_only=True)
class ResidencyOptions:
    """``enabled`` False returns the tree unchanged; ``split`` and ``allocation`` are the
    options the downstream stages will run with (the copies are judged under them)."""

    enabled: bool = True  # copy re-read HBM regions into LX and run loop-invariant ops once
    split: SplitOptions = SplitOptions()  # the work division the copies are judged under
    allocation: AllocationOptions = AllocationOptions()  # the allocation the copies are judged under
    # confirm the chosen trial's division and allocation with their verifiers; a tiling search
    # judging candidates skips it (the program of the plan it hands on is compiled with it)
    verify: bool = True

    def __post_init__(self) -> None:
        require_fields(self, TilingError)


def keep_resident(tree: LoopTree, machine: Machine, options: ResidencyOptions = ResidencyOptions()) -> LoopTree:
    _require(tree, machine, options, "keep_resident")
    return place_copies(tree, machine, options).tree


@dataclass(frozen=True, slots=True, kw_only=True)
class Residency:
    """The rewritten tree with the work division and allocation the stage judged it by
    (the same ``divide_work`` and ``allocate`` the pipeline would run next, under the same
    options) and the program they emit, so a caller need not run those stages again."""

    tree: LoopTree
    split: SplitPlan
    allocation: Allocation
    program: Program
    # the program's traffic report when the stage estimated it to compare trials (None when
    # there was nothing to compare): a caller that needs it need not compute it again
    report: TrafficReport | None = None


def _require(tree: object, machine: object, options: object, where: str) -> None:
    require(machine, Machine, where, "machine")
    require(options, ResidencyOptions, where, "options")
    require_tree(tree, where, machine)


def place_copies(tree: LoopTree, machine: Machine, options: ResidencyOptions = ResidencyOptions()) -> Residency:
    _require(tree, machine, options, "place_copies")
    guarded_first = False
    if options.enabled:
        tree = hoist_invariants(tree)
        if not (options.allocation.lx_planning and pin_sites(tree)):
            # no pin can be made (pins need the allocation, the guards go on after them): the
            # guards go on now, and the tree is divided and allocated once, not twice
            tree, guarded_first = guard_boundaries(tree), True
    split = divide_work(tree, machine, options.split)
    alloc = allocate(tree, split, machine, options.allocation)
    judge = TrialJudge(machine)
    unchanged = Trial(tree=tree, split=split, allocation=alloc)
    if options.enabled and options.allocation.lx_planning and not guarded_first:
        unchanged = pinned(unchanged, machine, options, judge)
    if options.enabled and not guarded_first:
        guarded = guard_boundaries(unchanged.tree)
        if guarded is not unchanged.tree:
            split = divide_work(guarded, machine, options.split)
            unchanged = Trial(tree=guarded, split=split,
                              allocation=allocate(guarded, split, machine, options.allocation))
    return _settled(judge, _choose(unchanged.tree, unchanged, machine, options, judge), options.verify)


def _choose(tree: LoopTree, unchanged: Trial, machine: Machine, options: ResidencyOptions,
            judge: TrialJudge) -> Trial:
    if not options.enabled or not options.allocation.lx_planning:
        return unchanged
    # a buffer the allocator already keeps in LX gains nothing from a copy
    chosen = chosen_copies(tree, unchanged, machine, options, judge)
    return aligned(tree, chosen, unchanged, machine, options, judge) or chosen


def _settled(judge: TrialJudge, c: Trial, verify: bool) -> Residency:
    # a trial's division and allocation are made from its tree, so the verifiers only confirm
    # them: once, for the one handed on (emit_program would for each trial)
    if verify:
        verify_split_plan(c.tree, c.split, judge.machine)
        verify_allocation(c.tree, c.split, c.allocation, judge.machine)
    return Residency(tree=c.tree, split=c.split, allocation=c.allocation, program=judge.program(c),
                     report=judge.reported(c))
