"""The correction of a searched plan in the whole program (``_corrected``): the search
(``tiling_search``) scores a plan as the sum of its groups' changes, each group judged alone;
compiled whole, the groups share LX and copies differently. When the whole program does not
bear their claims out (by more than ``_AGREE``), the groups are weighed again in it; and the
DP's runner-up plans whose claims come close are compiled whole too."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace

from fspyre.ir.plans import Alternative, GroupSearch, Level, TilingPlan
from fspyre.stages.search_context import (
    _canonical,
    _charged,
    _Compiled,
    _compiled,
    _in_place,
    _plan,
    _Search,
    _structure,
    _subgraph,
    _whole,
)

# How far the whole program's estimate may exceed what the search's groups claim (the hinted
# program's estimate plus each group's change against its ops there) before the groups are
# weighed again in the whole program: the claims add changes judged one group at a time, and
# groups share LX and copies differently together.
_AGREE = 0.01


def _corrected(ctx: _Search, hinted: TilingPlan, base: _Compiled, records: list[GroupSearch], plan: TilingPlan,
               mine: _Compiled, search: Callable[[_Search, TilingPlan], list[GroupSearch]],
               runner_ups: Callable[[_Search, GroupSearch], list[Alternative]]
               ) -> tuple[list[GroupSearch], TilingPlan, _Compiled, str]:
    """The records, plan and compiled program after weighing the groups in the whole program,
    and a note saying what changed; while the whole program is estimated within ``_AGREE`` of
    what the groups claim and not slower than the hinted plan, only step 4 runs.

    A group's claim is its estimate alone against its ops untiled in the hinted program. While
    the whole program does not bear the claims out, each step below runs, and each plan it
    tries is compiled whole and kept when estimated faster:
    1. (the dynamic program) the search runs again crediting each segment with its candidate
       of least change against its ops in the hinted program, where the first pass took the
       candidate fastest alone (``_in_context``): untiled, a segment is no group and changes
       nothing, so a tiling that ties with it alone is never credited with what its ops cost
       more in the whole program (a softmax whose sub spills in the hinted program). The
       judgements are the memo's; one whole compile.
    2. Each tiled group in turn gives way to the runner-up the DP weighed for its consumer (the
       tiled segment of least change besides it; when it judged none, the segment inside the
       group it screened with the least bound, judged then: ``runner_ups``, the search's
       ``_runner_ups``), which replaces every group it overlaps:
       rmsnorm -> matmul over 1,147 rows (8 cores, 128 KiB LX) took [x*x, mean] T:3 and
       [rsqrt .. matmul] T:3, 345.4 us together, where the runner-up for the matmul, the whole
       chain T:3, gives 283.2 us.
    3. The groups are left out one at a time, from the largest part of its claim that is
       context (its ops cost more in the hinted program than untiled alone: the part the whole
       program may not bear out) down.
    Steps 2 and 3 take the groups by kind (``_kinds``: the same group of each repeated block
    together), at most one whole compile per kind each.
    4. The DP's runner-up plans (``_Search.runner_ups``: each run's best plans ending in
       another segment at its last consumer), at most ``_RUNNER_UPS`` whole compiles: when the
       claims were not borne out, the best of them; else only those within ``_RUNNER_UP`` of
       the plan's claims. This step runs whether or not the plan agrees with its claims: a
       runner-up's claims may be off in its favour (the read/write turnaround, a property of
       the whole program's mix)."""
    notes: list[str] = []

    def better(trial_records: list[GroupSearch]) -> tuple[TilingPlan, _Compiled] | None:
        trial_plan = _plan(ctx, hinted, trial_records)
        if trial_plan.groups == plan.groups:
            return None
        trial: _Compiled | None = base
        if trial_plan is not hinted:
            ctx.tally["rechecked"] += 1
            trial = _compiled(ctx.options, ctx.machine, ctx.graph, trial_plan)
        if trial is None or _whole(trial.report) >= _whole(mine.report):
            return None
        notes.append(f"{mine.report.time_ns / 1000:.2f} -> {trial.report.time_ns / 1000:.2f} us")
        return trial_plan, trial

    current = list(records)
    credited = False  # the records are the second pass's (step 1)
    disagreed = _disagrees(ctx, base, current, mine)
    predicted = base.report.time_ns + sum(_claims(ctx, current).values())
    if (disagreed and not ctx.in_context and ctx.options.fuse == "max-producers"
            and ctx.options.strategy == "dp"):
        again = search(replace(ctx, in_context=True), hinted)
        if (found := better(again)) is not None:
            (plan, mine), records, current = found, again, list(again)
            notes[-1] = f"the groups credited in context ({notes[-1]})"
            credited = True
    # Steps 2 and 3 take the groups by kind (the same segment structure and tiling: the same
    # group of each repeated block), one whole compile per kind.
    seen: dict[tuple, tuple] = {}  # a group's kind, canonicalised once however often it is asked
    for kind in dict.fromkeys(_kinds(ctx, current, seen).values()):
        if not _disagrees(ctx, base, current, mine):
            break
        swaps: list[tuple[GroupSearch, Alternative]] = []
        for k, key in _kinds(ctx, current, seen).items():
            if key == kind:
                r = current[k]
                tiled = runner_ups(ctx, r)
                if tiled:
                    swaps.append((r, min(tiled, key=lambda a: a.change_ns)))
        if not swaps:
            continue
        taken = {o for _, alt in swaps for o in alt.ops}
        trial_records = [g for g in current if not set(g.ops) & taken] + [
            GroupSearch(consumer=r.consumer, ops=alt.ops, candidates=(alt.choice,), chosen=0)
            for r, alt in swaps if alt.choice is not None]
        if (found := better(trial_records)) is not None:
            (plan, mine), current = found, trial_records
            r, alt = swaps[0]
            assert alt.choice is not None
            notes[-1] = (f"{_short(alt.ops)} {_levels_text(alt.choice.levels)} for {_short(r.ops)}"
                         f"{f' and {len(swaps) - 1} alike' if len(swaps) > 1 else ''} ({notes[-1]})")
    claims = _claims(ctx, current)
    kinds = _kinds(ctx, current, seen)
    context: dict[tuple, float] = {}
    gain: dict[tuple, float] = {}
    for k, kind in kinds.items():
        in_place = _in_place(ctx, current[k].ops)[0]
        alone = next((c.time_ns for c in current[k].candidates if not c.levels and c.verdict != "refused"), in_place)
        context[kind] = max(context.get(kind, -math.inf), in_place - alone)
        gain[kind] = gain.get(kind, 0.0) + claims[k]
    kept = set(claims)
    for kind in sorted(context, key=lambda kind: (-context[kind], gain[kind])):
        if not _disagrees(ctx, base, [current[i] for i in kept], mine):
            break
        out = {k for k in kept if kinds[k] == kind}
        if (found := better([g for i, g in enumerate(current) if i in kept - out])) is not None:
            (plan, mine) = found
            kept -= out
            first = current[min(out)]
            notes[-1] = (f"left out {_short(first.ops)} {_levels_text(first.choice.levels)}"
                         f"{f' and {len(out) - 1} alike' if len(out) > 1 else ''} ({notes[-1]})")
    # Step 4: the DP's runner-ups, each compiled whole: where the claims were not borne out, the
    # best of them; else those within ``_RUNNER_UP`` of the plan's claims.
    ups = sorted(((gap, run, up) for (in_context, run), kept_ups in ctx.runner_ups.items() if in_context == credited
                  for gap, up in kept_ups if disagreed or gap <= _RUNNER_UP * predicted), key=lambda t: t[0])
    for gap, run, up in ups[:_RUNNER_UPS]:
        inside = set(run)
        at = next(k for k, r in enumerate(records) if set(r.ops) <= inside)
        trial_records = [r for r in records[:at] if not set(r.ops) <= inside] + list(up) + [
            r for r in records[at:] if not set(r.ops) <= inside]
        if (found := better(trial_records)) is not None:
            plan, mine = found
            notes[-1] = f"the runner-up {gap / 1000:.2f} us behind by its claims ({notes[-1]})"
    lead = "the whole program did not bear out the groups' claims" if disagreed else "compiled whole"
    note = f"{lead}: {'; '.join(notes)}" if notes else ""
    return records, plan, mine, note


# The DP's runner-up plans (``_segments``: the best plans of a run ending in another segment)
# the correction compiles whole: at most this many, and where the whole program bears out the
# plan's claims only those whose claims are within ``_RUNNER_UP`` of its (a relative share of
# the plan's claimed time). The claims add changes judged one group at a time, and the
# program-wide read/write turnaround alone moves a group's estimate by a percent or two with the
# mix of the rest: exp(x * w) read by three outputs, x[129, 237] fp16 on 6 cores and 9,088 B of
# LX, the six ops R:3 claimed 6,649.8 ns and are 6,649.8 whole; the producer chain C:2 with the
# amax and the last mul untiled claimed 6,745.1 (1.4 % more) and is 6,625.4 whole.
_RUNNER_UPS = 2
_RUNNER_UP = 0.02


def _kinds(ctx: _Search, records: Sequence[GroupSearch], seen: dict[tuple, tuple]) -> dict[int, tuple]:
    """index -> the kind of each tiled record: its segment's structure (``_structure``) and its
    levels on the segment's canonical dims, the same for the same group of each repeated block.
    ``seen`` remembers each group's kind (by its ops and levels): the correction asks again per
    kind, and canonicalising every group each time was quadratic in the groups."""
    out: dict[int, tuple] = {}
    for k, r in enumerate(records):
        if r.choice.levels:
            key = (r.ops, r.choice.levels)
            if key not in seen:
                canon, names = _canonical(_subgraph(ctx, r.ops))
                dims = {real: c for c, real in names.items()}
                seen[key] = (_structure(canon), tuple((lv.count, tuple(dims.get(d, d) for d in lv.dims))
                                                      for lv in r.choice.levels))
            out[k] = seen[key]
    return out


def _claims(ctx: _Search, records: Sequence[GroupSearch]) -> dict[int, float]:
    """index -> what each tiled record claims to change against its ops in the hinted program."""
    return {k: r.choice.time_ns - _charged(ctx, r.ops)[0] for k, r in enumerate(records) if r.choice.levels}


def _disagrees(ctx: _Search, base: _Compiled, records: Sequence[GroupSearch], mine: _Compiled) -> bool:
    """Whether the whole program ``mine`` is estimated slower than the hinted one, or slower by
    more than ``_AGREE`` than the hinted one changed by every claim of ``records``."""
    predicted = base.report.time_ns + sum(_claims(ctx, records).values())
    return _whole(mine.report) > _whole(base.report) or mine.report.time_ns > predicted * (1 + _AGREE)


def _short(ops: Sequence[str]) -> str:
    return ops[0] if len(ops) == 1 else f"{ops[0]}..{ops[-1]}"


def _levels_text(levels: Sequence[Level]) -> str:
    return " x ".join(f"{'/'.join(lv.dims)}:{lv.count}" for lv in levels)
