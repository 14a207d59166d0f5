"""keep_resident's trials: a rewritten tree with its work division and allocation
(``Trial``), the judge that emits and estimates each trial once (``TrialJudge``), and the rule
that says whether a trial beats the tree it rewrote (``better``). The copies
(``fspyre.stages.copies``) and the pins (``fspyre.stages.pins``) are judged by them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fspyre.ir.frozen import FrozenMap
from fspyre.ir.looptree import LoopTree
from fspyre.ir.plans import Allocation, SplitPlan
from fspyre.ir.program import Program
from fspyre.ir.report import TrafficReport
from fspyre.machine.report import traffic_report
from fspyre.machine.spyre import Machine
from fspyre.stages.program import emit_made_for

if TYPE_CHECKING:
    from fspyre.stages.copies import Region


@dataclass(frozen=True, slots=True, kw_only=True)
class Trial:
    """A tree with its division and allocation, not yet emitted; ``regions`` and ``hints``
    are the copies and work divisions the stage rewrote the tree with (none: the tree as
    given), so a later step can rewrite it again with more hints."""

    tree: LoopTree
    split: SplitPlan
    allocation: Allocation
    regions: tuple[Region, ...] = ()
    hints: FrozenMap[str, FrozenMap[str, int]] = FrozenMap()


class TrialJudge:
    """Emits and estimates each trial at most once: the unchanged tree is compared with every
    set of copies tried, and the chosen trial's program is the stage's output."""

    def __init__(self, machine: Machine) -> None:
        self.machine = machine
        self._programs: dict[int, tuple[Trial, Program]] = {}
        self._reports: dict[int, TrafficReport] = {}

    def program(self, c: Trial) -> Program:
        if id(c) not in self._programs:  # the trial is kept alongside, so its id stays its own
            self._programs[id(c)] = (c, emit_made_for(c.tree, c.split, c.allocation, self.machine))
        return self._programs[id(c)][1]

    def estimate(self, c: Trial) -> tuple[float, int]:
        report = self.report(c)
        return report.time_ns, report.hbm_bytes

    def report(self, c: Trial) -> TrafficReport:
        if id(c) not in self._reports:
            self._reports[id(c)] = traffic_report(self.program(c))
        return self._reports[id(c)]

    def reported(self, c: Trial) -> TrafficReport | None:
        """The trial's report if it was estimated, else None (nothing is computed)."""
        return self._reports.get(id(c))


def better(new: Trial, old: Trial, judge: TrialJudge) -> bool:
    """Copies only take reads off HBM, but fewer HBM bytes are not always less estimated time: a
    copy is work of its own, and the fitted model derates short tiles (a copy of a few rows can
    cost more than the strided reads it saves). The estimates decide, time first, then bytes."""
    return judge.estimate(new) < judge.estimate(old)


def fresh_name(base: str, taken: set[str]) -> str:
    name, n = base, 1
    while name in taken:
        name, n = f"{base}{n}", n + 1
    taken.add(name)
    return name
