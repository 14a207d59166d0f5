"""Stage ``plan_tiling``: graph (with hint scopes) -> TilingPlan (op order and loop groups).

``plan_groups`` builds the same plan from explicit groups, for embedders that tile without
hints. ``verify_plan`` checks a plan against its graph; ``tile`` runs it on every plan it gets.

Hints to groups (docs/tiling.md):

- An op's *key* is the set of hint scopes with ``slices`` it was built under. Scopes with only
  ``work_div`` make no loops and do not take part. Consecutive ops (in program order) with the
  same non-empty key form one group; ops under nested scopes therefore form a group of their
  own, apart from the ops of the outer scope alone.
- A group's levels are its scopes' slices, outer scope first, and inside one scope in the
  order they are written: ``slices={"A": 2, "B": 4}`` is a loop over A enclosing a loop over B.
- A level with count 1, or whose dim no op of the group iterates, and a scope no op was built
  in, are dropped with a warning in ``TilingPlan.warnings`` (data: the pipeline, not this
  stage, turns them into Python warnings).
- An unhinted op between two ops of one run (an *interloper*) moves before the run if it reads
  nothing the run wrote before it, else after the run if nothing later in the run reads it,
  else the plan is refused with a HintError naming the op, the run and both blocking ops.
- Loop fission (``split_at_tiled_reductions``): a reduction whose reduction dim a level of its
  group tiles is complete only after that loop ends, so the ops of the group that read it (and
  what reads those) move into a second loop nest with the same levels, after the first; the
  plan's ``notes`` say so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from fspyre.errors import HintError, TilingError
from fspyre.ir.frozen import FrozenMap, require_fields
from fspyre.ir.graph import Graph, HintScope, Op, Reduction, iteration_dims
from fspyre.ir.kinds import TILING_MODES, TilingMode
from fspyre.ir.plans import Group, Level, TilingPlan
from fspyre.stages.arguments import require, require_graph
from fspyre.stages.online_softmax import OnlineOptions, match_online


@dataclass(frozen=True, slots=True, kw_only=True)
class TilingOptions:
    mode: TilingMode = "hints"  # "none": no loops; "hints": groups from the graph's hint scopes
    # whether a softmax tiled over its reduction dim stays one group for ``tile`` to rewrite
    # online (fspyre.stages.online_softmax) rather than being split by loop fission
    online: OnlineOptions = OnlineOptions()

    def __post_init__(self) -> None:
        if self.mode not in TILING_MODES:
            raise TilingError(
                f"tiling={self.mode!r} (TilingOptions.mode): use 'none' or 'hints' here; 'auto' needs a machine to "
                f"search against "
                f"(fspyre.compile(..., tiling='auto') or fspyre.stages.tiling_search.search_tiling)"
            )
        require_fields(self, TilingError)


def plan_tiling(graph: Graph, options: TilingOptions = TilingOptions()) -> TilingPlan:
    graph = require_graph(graph, "plan_tiling")
    require(options, TilingOptions, "plan_tiling", "options")
    if options.mode == "none":
        return TilingPlan(order=tuple(op.name for op in graph.ops))
    return _plan_from_hints(graph, options.online)


# -- hints -----------------------------------------------------------------------------------
def _plan_from_hints(graph: Graph, online: OnlineOptions) -> TilingPlan:
    scopes = graph.hint_table()
    _check_scopes(graph, scopes)
    slicing = {h.id for h in graph.hints if h.slices}
    keys = {op.name: tuple(sorted(h for h in op.hints if h in slicing)) for op in graph.ops}
    ops = _reorder_interlopers(graph.ops, keys)
    groups: list[Group] = []
    warnings: list[str] = []
    i = 0
    while i < len(ops):
        key = keys[ops[i].name]
        j = i + 1
        while j < len(ops) and keys[ops[j].name] == key:
            j += 1
        if key:
            members = ops[i:j]
            levels = _levels(key, members, scopes, warnings)
            if levels:
                groups.append(Group(ops=tuple(op.name for op in members), levels=levels))
            else:
                warnings.append(
                    f"ops {_listing(op.name for op in members)} under hint scopes {list(key)}: no loop level is "
                    f"left, so they run untiled"
                )
        i = j
    used = {h for op in graph.ops for h in op.hints}
    for scope in graph.hints:
        if scope.slices and scope.id not in used:
            warnings.append(f"hint scope {scope.id} slices={dict(scope.slices)}: no op was built inside it; "
                            f"hint ignored (build the ops to tile inside the `with g.hint(...)` block)")
    plan = TilingPlan(order=tuple(op.name for op in ops), groups=tuple(groups), warnings=tuple(warnings))
    return nest_outer_scopes(graph, split_at_tiled_reductions(graph, plan, online))


# -- outer-scope ops around a nested scope -----------------------------------------------------
def nest_outer_scopes(graph: Graph, plan: TilingPlan) -> TilingPlan:
    """Adjacent groups whose levels are a proper prefix one of the other -- the ops of an outer
    hint scope before and after a nested scope -- become one group: the outer ops run in the
    body of the outer loops, before and after the inner ones (``Group.depths``), instead of
    in loop nests of their own. Along the merged group the depths rise to one innermost run
    and fall after it; a second inner run would need sibling loops, so it starts a group of
    its own. Groups whose ops tile a reduction over its reduction dim are left as they are
    (loop fission and the online rewrite decide where their readers run), and so are groups an
    op of which would read, inside the shared loop, a result the other writes tile by tile but
    it does not read in step (``_read_off_tile``): merged, it would read tiles not yet written."""
    table = graph.op_table()
    buffers = graph.buffer_table()
    notes: list[str] = []
    position = {name: i for i, name in enumerate(plan.order)}

    def tiles_a_reduction(group: Group) -> bool:
        return any(isinstance(table[n], Reduction) and set(d for lv in group.levels for d in lv.tiled_dims(table[n]))
                   & {d.name for d in table[n].reduction_ranges} for n in group.ops)

    out: list[Group] = []
    falling = False
    for group in plan.groups:
        last = out[-1] if out else None
        if (last is None or position[group.ops[0]] != position[last.ops[-1]] + 1 or tiles_a_reduction(last)
                or tiles_a_reduction(group)):
            out.append(group)
            falling = False
            continue
        mine, theirs = last.levels, group.levels
        if len(theirs) > len(mine) and theirs[:len(mine)] == mine and not falling:
            depths = {n: last.depth(n) for n in last.ops} | {n: len(theirs) for n in group.ops}
        elif len(theirs) < len(mine) and mine[:len(theirs)] == theirs and last.depth(last.ops[-1]) >= len(theirs):
            depths = {n: last.depth(n) for n in last.ops} | {n: len(theirs) for n in group.ops}
            falling = True
        else:
            out.append(group)
            falling = False
            continue
        levels = max(mine, theirs, key=len)
        merged = Group(ops=last.ops + group.ops, levels=levels,
                       depths=FrozenMap((n, d) for n, d in depths.items() if d < len(levels)))
        ops = [table[n] for n in merged.ops]
        off = _read_off_tile(merged, ops, {op.store.buffer: op.name for op in ops}, table, buffers)
        if off:
            (p, c), how = min(off.items())
            notes.append(f"groups {_listing(last.ops)} and {_listing(group.ops)} stay separate loop nests: in one "
                         f"outer loop {c} would read {table[p].store.buffer}, which {p} writes tile by tile, {how}")
            out.append(group)
            falling = False
            continue
        out[-1] = merged
    if len(out) == len(plan.groups):
        return plan if not notes else replace(plan, notes=plan.notes + tuple(notes))
    return replace(plan, groups=tuple(out), notes=plan.notes + tuple(notes))


def _check_scopes(graph: Graph, scopes: Mapping[int, HintScope]) -> None:
    # that every op's scopes are declared is the graph's own invariant (verify_graph)
    for scope in graph.hints:
        for dim, count in scope.slices.items():
            if not isinstance(count, int) or isinstance(count, bool) or count < 1:
                raise HintError(
                    f"hint scope {scope.id} slices={{{dim!r}: {count!r}}}: the count must be an integer >= 1"
                )


def _source(scope: int, dim: str, count: int) -> str:
    return f"hint scope {scope} slices={{{dim!r}: {count}}}"


def _levels(key: tuple[int, ...], members: Sequence[Op], scopes: Mapping[int, HintScope],
            warnings: list[str]) -> tuple[Level, ...]:
    iterated = {d.name for op in members for d in iteration_dims(op) if d.size > 1}
    levels = []
    for sid in key:
        for dim, count in scopes[sid].slices.items():
            src = _source(sid, dim, count)
            names = _listing(op.name for op in members)
            if count == 1:
                warnings.append(f"{src}: count 1 makes no loop; level dropped for ops {names} "
                                f"(remove it, or give a count >= 2)")
            elif dim not in iterated:
                warnings.append(f"{src}: no op of {names} iterates dim {dim}; hint ignored "
                                f"(remove it, or build the ops that iterate {dim} inside the scope)")
            else:
                levels.append(Level(count=count, dims=(dim,), source=src))
    return tuple(levels)


def _listing(names, limit: int = 6) -> str:
    names = list(names)
    if len(names) <= limit:
        return "[" + ", ".join(names) + "]"
    return "[" + ", ".join(names[:limit]) + f", ... {len(names) - limit} more]"


def _reorder_interlopers(ops: Sequence[Op], keys: Mapping[str, tuple[int, ...]]) -> tuple[Op, ...]:
    """Move each unhinted op that sits inside a run of same-key ops out of it (before wins)."""
    writer = {op.store.buffer: i for i, op in enumerate(ops)}
    readers: dict[str, list[int]] = {}
    for i, op in enumerate(ops):
        for ld in op.loads:
            readers.setdefault(ld.buffer, []).append(i)
    out: list[Op] = []
    n, i = len(ops), 0
    while i < n:
        key = keys[ops[i].name]
        if not key:
            out.append(ops[i])
            i += 1
            continue
        run, last, j = [i], i, i + 1
        while j < n:
            kj = keys[ops[j].name]
            if kj == key:
                run.append(j)
                last = j
            elif kj:
                break
            j += 1
        interlopers = [p for p in range(i, last + 1) if not keys[ops[p].name]]
        if not interlopers:
            out.extend(ops[i:last + 1])
            i = last + 1
            continue
        run_set, post_set = set(run), set()
        pre, post = [], []
        for u in interlopers:
            op = ops[u]
            before = next(((ld.buffer, w) for ld in op.loads if (w := writer.get(ld.buffer, -1)) >= 0
                           and ((w in run_set and w < u) or w in post_set)), None)
            if before is None:
                pre.append(u)
                continue
            after = next((r for r in readers.get(op.store.buffer, ()) if r in run_set and r > u), None)
            if after is None:
                post.append(u)
                post_set.add(u)
                continue
            buf, w = before
            raise HintError(
                f"cannot reorder unhinted op {op.name}: it sits inside the run {_listing(ops[p].name for p in run)} "
                f"under hint scopes {list(key)}, but it reads {buf} (written by {ops[w].name}), so it cannot move "
                f"before the run, and {ops[after].name} in the run reads its result {op.store.buffer}, so it cannot "
                f"move after. Build {op.name} inside the same hint scopes, or outside the run."
            )
        out.extend(ops[p] for p in pre)
        out.extend(ops[p] for p in run)
        out.extend(ops[p] for p in post)
        i = last + 1
    return tuple(out)


# -- explicit groups -------------------------------------------------------------------------
GroupSpec = tuple  # (ops, K) | (ops, K, dims) | (ops, [(K1, dims1), (K2, dims2), ...])


def plan_groups(graph: Graph, groups: Sequence[GroupSpec], online: OnlineOptions = OnlineOptions()) -> TilingPlan:
    """A TilingPlan from explicit groups, in the anchor's forms (program order = graph order):

    - ``(ops, K)``: one loop of K iterations tiling each op's first output dim;
    - ``(ops, K, dims)``: one loop tiling ``dims``;
    - ``(ops, [(K1, dims1), (K2, dims2), ...])``: nested loops, outermost first.

    ``ops`` are op names. A dim is a dim name (every op iterating it is tiled; the others are
    loop-invariant at that level) or an output-dim index into each op's ``ranges``.
    """
    graph = require_graph(graph, "plan_groups")
    require(online, OnlineOptions, "plan_groups", "online")
    if isinstance(groups, (str, bytes)) or not isinstance(groups, Sequence):
        raise TilingError(f"plan_groups: groups must be a list of (ops, K[, dims]) groups, got "
                          f"{type(groups).__name__} {groups!r:.40}")
    table = graph.op_table()
    out: list[Group] = []
    warnings: list[str] = []
    for gi, spec in enumerate(groups):
        ops, levels = _normalise(gi, spec)
        for name in ops:
            if not isinstance(name, str):
                raise TilingError(f"group {gi}: ops must be op names (strings), got {name!r}")
            if name not in table:
                raise TilingError(
                    f"group {gi}: op {name} is not in graph {graph.name} (its ops are {_listing(table)})"
                )
        members = [table[n] for n in ops]
        kept = [lv for k, (count, dims) in enumerate(levels)
                if (lv := _level(gi, k, count, dims, members, warnings)) is not None]
        if kept:
            out.append(Group(ops=tuple(ops), levels=tuple(kept)))
    plan = TilingPlan(order=tuple(op.name for op in graph.ops), groups=tuple(out), warnings=tuple(warnings))
    verify_plan(graph, plan)
    return split_at_tiled_reductions(graph, plan, online)


def _normalise(gi: int, spec: GroupSpec) -> tuple[Sequence[str], list[tuple[int, Sequence]]]:
    if not isinstance(spec, (tuple, list)) or len(spec) not in (2, 3):
        raise TilingError(
            f"group {gi}: {spec!r} is not (ops, K), (ops, K, dims) or (ops, [(K1, dims1), (K2, dims2), ...])"
        )
    ops = spec[0]
    if isinstance(ops, str) or not isinstance(ops, Sequence) or not ops:
        raise TilingError(f"group {gi}: the first element must be a non-empty list of op names, got {ops!r}")
    if len(spec) == 2 and isinstance(spec[1], (list, tuple)):
        levels = list(spec[1])
        if not levels:
            raise TilingError(f"group {gi}: the nested form needs at least one (count, dims) level")
        for k, lv in enumerate(levels):
            if not isinstance(lv, (list, tuple)) or len(lv) != 2:
                raise TilingError(f"group {gi} level {k}: {lv!r} is not a (count, dims) pair")
        return ops, [(c, d) for c, d in levels]
    dims = spec[2] if len(spec) == 3 else None
    return ops, [(spec[1], [0] if dims is None else dims)]


def _level(gi: int, k: int, count, dims, members: Sequence[Op], warnings: list[str]) -> Level | None:
    """The level, or None with a warning when it would tile nothing (as a hint with no
    effect is a warning, not an error)."""
    src = f"group {gi} level {k}"
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise TilingError(f"{src}: count {count!r} must be an integer >= 1")
    if isinstance(dims, (str, int)):
        dims = [dims]
    dims = list(dims)
    if not dims:
        warnings.append(f"{src}: names no dim to tile; level ignored (name the dims to tile)")
        return None
    for d in dims:
        if not isinstance(d, (str, int)) or isinstance(d, bool):
            raise TilingError(f"{src}: dim {d!r} must be a dim name or an output-dim index")
    if all(isinstance(d, str) for d in dims):
        if not any(d.name in dims and d.size > 1 for op in members for d in iteration_dims(op)):
            warnings.append(f"{src}: no op of {[op.name for op in members]} iterates any of {dims}; level ignored "
                            f"(name a dim the group's ops iterate)")
            return None
        return Level(count=count, dims=tuple(dict.fromkeys(dims)), source=src)
    per_op: dict[str, tuple[str, ...]] = {}
    for op in members:
        names: list[str] = []
        iterated = {d.name for d in iteration_dims(op) if d.size > 1}
        for d in dims:
            if isinstance(d, int):
                if not -len(op.ranges) <= d < len(op.ranges):
                    raise TilingError(
                        f"{src}: op {op.name} has {len(op.ranges)} output dims "
                        f"{[x.name for x in op.ranges]}; index {d} is out of range"
                    )
                names.append(op.ranges[d].name)
            elif d in iterated:
                names.append(d)
        per_op[op.name] = tuple(dict.fromkeys(names))
    union = tuple(dict.fromkeys(n for names in per_op.values() for n in names))
    if not union:
        warnings.append(f"{src}: no op of {[op.name for op in members]} iterates any of {dims}; level ignored "
                        f"(name a dim the group's ops iterate)")
        return None
    return Level(count=count, dims=union, op_dims=FrozenMap(per_op), source=src)


# -- loop fission ----------------------------------------------------------------------------
def split_at_tiled_reductions(graph: Graph, plan: TilingPlan, online: OnlineOptions = OnlineOptions()) -> TilingPlan:
    """Loop fission of every group in which an op reads a reduction that a level of the group
    tiles over its reduction dim: inside that loop the reduction holds only a partial result,
    complete once the loop ends. A group holding a softmax, log-softmax or attention that
    ``fspyre.stages.online_softmax`` recognises stays whole unless ``online`` is disabled:
    ``tile`` carries its running max and sum across the tiles instead.

    Each op of such a group gets a *pass*: the earliest one after every tiled reduction it
    depends on inside the group (a reader of a tiled reduction runs one pass after it), then,
    consumers first, the latest one that still precedes its readers' passes, so an op joins the
    nest of the ops that read it and its result stays a per-tile buffer where it can. Each
    pass becomes a group of its own, in pass order, with the levels of the original group that
    tile a dim one of its ops iterates; what a later pass reads from an earlier one is a full
    buffer, written by the earlier nest and re-read by the later (docs/tiling.md, "Loop
    fission"). A var tiled over its reduction dim reads its operand in two nests of its own
    (the mean, then the squared deviations), so its producers in the group run a pass before
    it. Softmax tiled over its row is three passes: max, sum of exp, normalise. A plan with
    nothing to split is returned as it is."""
    table = graph.op_table()
    fissioned: dict[str, tuple[Group, ...]] = {}
    notes: list[str] = []
    readers: dict[str, list[str]] = {}
    for op in graph.ops:
        for buffer in dict.fromkeys(ld.buffer for ld in op.loads):
            readers.setdefault(buffer, []).append(op.name)
    outputs = frozenset(o.buffer for o in graph.outputs)
    for group in plan.groups:
        ops = [table[n] for n in group.ops]
        tiled = {op.name: tuple(next(iter(lv.tiled_dims(op)), None) for lv in group.levels) for op in ops}
        if match_online(ops, tiled, readers, outputs, online) is not None:
            continue  # one nest: tile rewrites its softmax online (two nests at most, where fission makes three)
        passes = _passes(group, table, graph.buffer_table())
        if len(passes) > 1:
            fissioned[group.ops[0]] = passes
            notes.append(_fission_note(group, passes, table, graph.buffer_table()))
    if not fissioned:
        return plan
    members = {name for g in plan.groups for name in g.ops}
    starts = {g.ops[0]: g for g in plan.groups}
    order: list[str] = []
    groups: list[Group] = []
    for name in plan.order:
        if name in fissioned:
            for p in fissioned[name]:
                order.extend(p.ops)
                groups.extend([p] if p.levels else [])
        elif name in starts:
            order.extend(starts[name].ops)
            groups.append(starts[name])
        elif name not in members:
            order.append(name)
    out = TilingPlan(order=tuple(order), groups=tuple(groups), warnings=plan.warnings,
                     notes=plan.notes + tuple(notes))
    return verify_plan(graph, out)


def _tiles_its_reduction(op: Op, levels: Sequence[Level]) -> str | None:
    """The reduction dim of ``op`` that a level tiles (None if it is not a reduction or no
    level tiles one of its reduction dims)."""
    if not isinstance(op, Reduction):
        return None
    reduced = {d.name for d in op.reduction_ranges}
    return next((d for lv in levels for d in lv.tiled_dims(op) if d in reduced), None)


def _passes(group: Group, table: Mapping[str, Op], buffers: Mapping) -> tuple[Group, ...]:
    """The group split into passes (one group, unchanged, when nothing in it needs a split).
    A pass left with no level is returned with ``levels=()``: its ops run untiled."""
    ops = [table[n] for n in group.ops]
    writer = {op.store.buffer: op.name for op in ops}
    tiled = {op.name for op in ops if _tiles_its_reduction(op, group.levels) is not None}
    # a tiled var reads its operand in two nests (mean, then deviations): it must be whole
    whole = {op.name for op in ops if op.name in tiled and op.fn == "var"}
    producers = {op.name: {writer[ld.buffer] for ld in op.loads if ld.buffer in writer} for op in ops}
    viewed = _read_off_tile(group, ops, writer, table, buffers)

    def gap(p: str, c: str) -> int:
        return int(p in tiled or c in whole or (p, c) in viewed)

    phase: dict[str, int] = {}
    for op in ops:  # program order is a data-flow order
        phase[op.name] = max((phase[p] + gap(p, op.name) for p in producers[op.name]), default=0)
    if max(phase.values()) == 0:
        return (group,)
    consumers: dict[str, list[str]] = {op.name: [] for op in ops}
    for op in ops:
        for p in producers[op.name]:
            consumers[p].append(op.name)
    for op in reversed(ops):
        if consumers[op.name]:
            phase[op.name] = min(phase[c] - gap(op.name, c) for c in consumers[op.name])
    out = []
    for k in sorted(set(phase.values())):
        names = tuple(n for n in group.ops if phase[n] == k)
        levels = tuple(lv for lv in (_restrict(lv, names) for lv in group.levels)
                       if lv is not None and any(lv.tiled_dims(table[n]) for n in names))
        out.append(Group(ops=names, levels=levels))
    return tuple(out)


def _read_off_tile(group: Group, ops: Sequence[Op], writer: Mapping[str, str], table: Mapping[str, Op],
                   buffers: Mapping) -> dict[tuple[str, str], str]:
    """(producer, reader) pairs of the group where a loop enclosing both writes the producer's
    result tile by tile but the reader does not read it tile by tile, each with why: it reads
    through a view that is not one iteration variable per dim (a reshape splitting or merging
    dims), or the dim the loop walks in the producer is read with another variable (a reshape
    that renames it, a slice) or with none, so the reader is loop-invariant there. Inside the
    loop the reader would read tiles not yet written; it runs in a later pass and reads the full
    buffer the producer's nest wrote."""
    from fspyre.stages.loop_tree import dim_vars  # loop_tree imports this module

    out: dict[tuple[str, str], str] = {}
    for op in ops:
        sizes = {d.name: d.size for d in iteration_dims(op)}
        for ld in op.loads:
            p = writer.get(ld.buffer)
            if p is None or p == op.name or (p, op.name) in out:
                continue
            producer, btype = table[p], buffers[ld.buffer].type
            shared = group.levels[:min(group.depth(p), group.depth(op.name))]
            walked = [(lv, set(lv.tiled_dims(producer))) for lv in shared]
            if not any(dims for _, dims in walked):
                continue
            read = dim_vars(ld.index, btype, sizes)
            if read is None:
                out[(p, op.name)] = "through a view that is not one iteration variable per dim"
                continue
            written = dim_vars(producer.store.index, btype, {d.name: d.size for d in iteration_dims(producer)})
            if written is None:
                continue  # a producer storing through a view: tile() decides (and refuses what it cannot place)
            off = next(((lv, w, r) for lv, dims in walked for w, r in zip(written, read) if w is not None
                        and w.name in dims and (r is None or r.name != w.name or r.name not in lv.tiled_dims(op))),
                       None)
            if off is not None:
                lv, w, r = off
                what = "no variable" if r is None else f"variable {r.name}"
                out[(p, op.name)] = (f"where the loop of {lv.count} walks dim {w.name}, with {what}, which that "
                                     f"loop does not walk in step")
    return out


def _fission_note(group: Group, passes: Sequence[Group], table: Mapping[str, Op], buffers: Mapping) -> str:
    written = {table[n].store.buffer: n for n in group.ops}
    why = []
    for (p, c), how in sorted(_read_off_tile(group, [table[n] for n in group.ops], written, table, buffers).items()):
        why.append(f"{c} reads {table[p].store.buffer}, which {p} writes tile by tile, {how}, so it reads it whole "
                   f"after that nest")
    for name in group.ops:
        op = table[name]
        dim = _tiles_its_reduction(op, group.levels)
        if dim is None:
            continue
        level = next(lv for lv in group.levels if dim in lv.tiled_dims(op))
        loop = f"the loop of {level.count}" + (f" ({level.source})" if level.source else "")
        if op.fn == "var" and any(ld.buffer in written for ld in op.loads):
            (ld,) = op.loads
            why.append(f"the var of op {name} over {dim}, which {loop} tiles, reads {ld.buffer} whole twice (for "
                       f"the mean, then the deviations), so it runs after the nest of {written[ld.buffer]}")
        reader = next((r for r in group.ops if any(ld.buffer == op.store.buffer for ld in table[r].loads)), None)
        if reader is not None:
            why.append(f"{reader} reads {op.store.buffer}, the {op.fn} of op {name} over {dim}, which {loop} tiles, "
                       f"so it is complete only after that loop")
    nests = " | ".join(_listing(p.ops) + ("" if p.levels else " untiled") for p in passes)
    return (f"loop fission of group {_listing(group.ops)} into {len(passes)} loop nests {nests}: {'; '.join(why)}; "
            f"a later nest reads what an earlier one wrote from its full buffer")


def _restrict(level: Level, names: Sequence[str]) -> Level | None:
    """``level`` for the ops ``names`` only (the positional form keeps only their entries)."""
    if not level.op_dims:
        return level
    kept = {n: ds for n, ds in level.op_dims.items() if n in names and ds}
    dims = tuple(dict.fromkeys(d for ds in kept.values() for d in ds))
    if not dims:
        return None
    return Level(count=level.count, dims=dims, op_dims=FrozenMap(kept), source=level.source)


# -- checks ---------------------------------------------------------------------------------
def verify_plan(graph: Graph, plan: TilingPlan) -> TilingPlan:
    """The plan's order runs every op of the graph once, after the ops it reads from, and each
    group is a contiguous slice of that order."""
    require(graph, Graph, "verify_plan", "graph")
    require(plan, TilingPlan, "verify_plan", "plan")
    table = graph.op_table()
    position: dict[str, int] = {}
    for i, name in enumerate(plan.order):
        if name not in table:
            raise TilingError(f"tiling plan: op {name} in the program order is not in graph {graph.name}")
        if name in position:
            raise TilingError(f"tiling plan: op {name} appears twice in the program order")
        position[name] = i
    missing = [op.name for op in graph.ops if op.name not in position]
    if missing:
        raise TilingError(f"tiling plan: the program order leaves out ops {_listing(missing)} of graph {graph.name}")
    writer = {op.store.buffer: op.name for op in graph.ops}
    for name in plan.order:
        for ld in table[name].loads:
            w = writer.get(ld.buffer)
            if w is not None and position[w] > position[name]:
                raise TilingError(
                    f"tiling plan: op {name} runs before op {w}, which writes {ld.buffer} that {name} reads"
                )
    owner: dict[str, int] = {}
    for gi, group in enumerate(plan.groups):
        if not group.ops:
            raise TilingError(f"tiling plan: group {gi} has no ops")
        if not group.levels:
            raise TilingError(f"tiling plan: group {gi} {_listing(group.ops)} has no loop levels")
        for name in group.ops:
            if name not in position:
                raise TilingError(
                    f"tiling plan: op {name} (group {gi}) is not in graph {graph.name}"
                )
            if name in owner:
                raise TilingError(f"tiling plan: op {name} is in group {owner[name]} and in group {gi}")
            owner[name] = gi
        pos = [position[n] for n in group.ops]
        if pos != sorted(pos):
            raise TilingError(
                f"tiling plan: group {gi} lists its ops {_listing(group.ops)} out of program order "
                f"{_listing(plan.order[p] for p in sorted(pos))}"
            )
        lo, hi = pos[0], pos[-1]
        if hi - lo + 1 != len(pos):
            members = set(group.ops)
            cross = next(plan.order[p] for p in range(lo, hi + 1) if plan.order[p] not in members)
            before = max(p for p in pos if p < position[cross])
            after = min(p for p in pos if p > position[cross])
            raise TilingError(
                f"tiling plan: group {gi} {_listing(group.ops)} is not contiguous: op {cross} runs between its ops "
                f"{plan.order[before]} and {plan.order[after]} but is not in the group (a data-flow dependency "
                f"crosses the group boundary). Add {cross} to the group, or split the group around it."
            )
    return plan
