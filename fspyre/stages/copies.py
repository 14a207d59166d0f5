"""keep_resident's copies: HBM regions read more than once, each copied into LX once by an
explicit ``copy`` op and read from there (docs/tiling.md, "LX residency"), kept only where the
allocator gives the copy LX and the estimate improves; and readers that take their producer's
slices of an intermediate so it stays in LX (``aligned``)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import sympy

from fspyre.errors import FspyreError
from fspyre.ir.frozen import FrozenMap
from fspyre.ir.graph import Dim, HintScope, Load, Op, Pointwise, Store, TensorType
from fspyre.ir.kinds import Runs
from fspyre.ir.looptree import Loop, LoopTree, Node, OpNode, TileStep, TreeBuffer, op_nodes, walk
from fspyre.ir.plans import OpSplit, SplitPlan
from fspyre.machine.formats import FORMATS
from fspyre.machine.indexing import free_names
from fspyre.machine.rules import slice_extents
from fspyre.machine.spyre import Machine
from fspyre.stages.allocation import allocate
from fspyre.stages.guards import guard_boundaries
from fspyre.stages.loop_tree import dim_vars, elems_per_stick
from fspyre.stages.pins import pin_buffers, unpinned
from fspyre.stages.split_plan import divide_work, splittable_reduction
from fspyre.stages.trials import Trial, TrialJudge, better, fresh_name

if TYPE_CHECKING:
    from fspyre.stages.residency import ResidencyOptions


def chosen_copies(tree: LoopTree, unchanged: Trial, machine: Machine, options: ResidencyOptions,
                   judge: TrialJudge) -> Trial:
    regions = [r for r in _regions(tree) if unchanged.allocation.buffers[r.buffer].memory == "hbm"]
    if not regions:
        return unchanged
    reduced = {n.name: {d.name for d in n.op.reduction_ranges} for n in op_nodes(tree)}
    # the reduction dims an op may not split across cores (a variance's): no reader moves onto them
    unsplit = {n.name: reduced[n.name] - splittable_reduction(n.op, reduced[n.name]) for n in op_nodes(tree)}
    table = tree.buffer_table()
    replicas = {r.name: rep[0] for r in regions if (rep := _replicate(r, unchanged.split, reduced)) is not None}
    # a replica larger than a core's LX is copied by slices from the start (a trial would spill it)
    too_large = {n for n, r in replicas.items() if _never_fits(r, table[r.buffer].type.dtype, machine)}
    found = _copies(tree, unchanged, regions, machine, options, reduced, unsplit, too_large, judge)
    replicated = set(replicas)
    if not replicated - too_large:
        return found or unchanged  # no replica was tried: the plan without them is the one judged
    # Replicas keep their readers' work division, which may keep other copies' readers from
    # moving theirs: judge the plan without replicas too, and take the faster.
    sliced = _copies(tree, unchanged, regions, machine, options, reduced, unsplit, replicated, judge)
    if found is None or sliced is None:
        return found or sliced or unchanged
    return found if judge.estimate(found) <= judge.estimate(sliced) else sliced


# -- readers that take their producer's slices ------------------------------------------------
def aligned(tree: LoopTree, chosen: Trial, unchanged: Trial, machine: Machine,
            options: ResidencyOptions, judge: TrialJudge) -> Trial | None:
    """``chosen`` with every intermediate its allocation left in HBM because a reader slices
    it differently from its writer (each op is divided on its own, so a matmul moved onto a
    copy's dim and the gelu after it split their tiles differently) read where it lives: the
    reader takes the writer's slices of the buffer -- a matmul reading its operand's slices
    splits its contraction dim -- and the copies the reader reads follow it. Judged by the
    estimate like the copies (a reader that splits its reduction writes partial sums, whose
    result leaves LX); None when it does not improve, or a reader cannot take the slices.
    The readers of unrelated intermediates are independent parts (``_follow``), so a reader
    that loses by its new division (a matmul splitting its contraction over every core) must
    not keep another from a division that wins (a mean reading its square's slices), nor ride
    along with it: besides all of them together, each kernel takes its parts one at a time in
    program order, kept where they make that kernel faster, and the faster of the two results
    is taken. Every kernel takes its next part in the same trial, so the trials are as many as
    the most parts one kernel has, not as the parts (42 in a 4-layer Llama's untiled program,
    each trial a division and an allocation of the whole program)."""
    parts = _follow(chosen, {n for n, s in unchanged.split.ops.items() if s.hinted})
    if not parts:
        return None
    best = chosen
    everything = {k: v for part in parts for k, v in part.items()}
    whole = _aligned_trial(tree, chosen, everything, machine, options)
    if whole is not None and judge.estimate(whole) < judge.estimate(best):
        best = whole
    if len(parts) > 1:
        step = _by_kernel(tree, chosen, parts, everything, whole, machine, options, judge)
        if step is not None and judge.estimate(step) < judge.estimate(best):
            best = step
    return None if best is chosen else best


def _by_kernel(tree: LoopTree, chosen: Trial, parts: Sequence[Mapping[str, FrozenMap[str, int]]],
               everything: Mapping[str, FrozenMap[str, int]], whole: Trial | None, machine: Machine,
               options: ResidencyOptions, judge: TrialJudge) -> Trial | None:
    """``chosen`` with the parts each kernel keeps when it takes them one at a time, in
    program order, keeping those that make it faster. None when it keeps none. A kernel is
    known by its ops: divisions change no kernel boundary, but a trial may withdraw a copy
    (``_aligned_trial``), and a copy that was a kernel of its own renumbers those after it."""
    kernel_of = {o.name: o.kernel for o in judge.report(chosen).ops}
    queues: dict[int, list[Mapping[str, FrozenMap[str, int]]]] = {}
    for part in parts:
        queues.setdefault(kernel_of[next(iter(part))], []).append(part)
    times = {k.index: k.time_ns for k in judge.report(chosen).kernels}
    kept: dict[str, FrozenMap[str, int]] = {}
    last: Trial | None = None
    for depth in range(max(len(q) for q in queues.values())):
        tried = {k: q[depth] for k, q in queues.items() if depth < len(q)}
        proposal = {**kept, **{name: split for part in tried.values() for name, split in part.items()}}
        trial = whole if proposal == everything else _aligned_trial(tree, chosen, proposal, machine, options)
        if trial is None:
            continue  # refused together: none of this round's parts is kept
        report = judge.report(trial)
        at = {o.name: o.kernel for o in report.ops}
        took = {k.index: k.time_ns for k in report.kernels}
        now = {k: took[at[next(iter(part))]] for k, part in tried.items()}
        faster = [k for k in tried if now[k] < times[k]]
        for k in faster:
            kept.update(tried[k])
            times[k] = now[k]
        if len(faster) == len(tried):
            last = trial
        elif faster:
            last = None
    if not kept:
        return None
    return last if last is not None else _aligned_trial(tree, chosen, kept, machine, options)


def _aligned_trial(tree: LoopTree, chosen: Trial, proposal: Mapping[str, FrozenMap[str, int]], machine: Machine,
                   options: ResidencyOptions) -> Trial | None:
    """``chosen`` with the readers and copies of ``proposal`` divided as it says; None when
    the division refuses it or cannot honour a hint as written. A copy or a pin the new
    division leaves in HBM is withdrawn, as ``_copies`` and ``pinned`` withdraw one: its
    readers would read back from HBM what it just wrote there, so it only adds traffic (a
    copy follows one reader, and another reader may still slice it the old way; a pin's
    writer that splits its reduction leaves its result on one core)."""
    hints = {**chosen.hints, **proposal}
    regions = chosen.regions
    pins = pin_buffers(tree)
    while True:
        rewritten = _rewrite(tree, regions, hints)
        try:
            split = divide_work(rewritten, machine, options.split)
        except FspyreError:
            return None  # a reader cannot be divided that way (a blocked dim, a second reduction dim)
        if set(split.warnings) - set(chosen.split.warnings):
            return None  # a hint of ours the division could not honour as written
        alloc = allocate(rewritten, split, machine, options.allocation)
        spilled = {f"{r.name}_copy" for r in regions if alloc.buffers[r.name].memory != "lx"}
        unpin = {p for p in pins if alloc.buffers[p].memory != "lx"}
        if not spilled and not unpin:
            return Trial(tree=rewritten, split=split, allocation=alloc, regions=regions, hints=FrozenMap(hints))
        regions = tuple(r for r in regions if f"{r.name}_copy" not in spilled)
        hints = {n: h for n, h in hints.items() if n not in spilled}
        if unpin:
            tree, pins = unpinned(tree, unpin), pins - unpin


def _follow(c: Trial, fixed: set[str]) -> list[dict[str, FrozenMap[str, int]]]:
    """The work_div of each reader (in program order, so a chain follows its head) that reads
    an HBM intermediate with slices other than its writer's, and of the copies it reads; ops
    in ``fixed`` (the user's hints) keep theirs. In independent parts, in program order: a
    reader is in the part of its writer when the writer's division is itself proposed (it
    follows the new one), and readers of one copy are in one part (the copy follows them)."""
    table = c.tree.buffer_table()
    io = set(c.tree.inputs) | {o.buffer for o in c.tree.outputs}
    nodes = op_nodes(c.tree)
    writes = Counter(n.op.store.buffer for n in nodes)
    writer = {n.op.store.buffer: n for n in nodes if writes[n.op.store.buffer] == 1}
    copy_of = {r.name: f"{r.name}_copy" for r in c.regions if r.replicas == 1}
    copies = {r.name for r in c.regions}
    splits = {n: dict(s.splits) for n, s in c.split.ops.items()}
    out: dict[str, FrozenMap[str, int]] = {}
    part: dict[str, str] = {}  # proposed op -> an op of its part (union-find)

    def head(name: str) -> str:
        while part[name] != name:
            name = part[name]
        return name

    replicated = {r.name for r in c.regions if r.replicas > 1}
    for node in nodes:
        if (node.name in fixed or node.name in {f"{r}_copy" for r in copies}
                or any(ld.buffer in replicated for ld in node.op.loads)):
            continue  # copies follow their readers; a replica's readers keep the division its slots count
        for ld in node.op.loads:
            w = writer.get(ld.buffer)
            if w is None or ld.buffer in io or ld.buffer in copies or c.allocation.buffers[ld.buffer].memory == "lx":
                continue
            if any(splits[w.name].get(d.name, 1) > 1 for d in w.op.reduction_ranges):
                continue  # partial sums are combined by one core: the buffer cannot be in LX anyway
            mapped = _mapped_split(w, splits[w.name], c.split.ops[w.name].stick_elems, node,
                                   c.split.ops[node.name].stick_elems, ld, table[ld.buffer].type)
            if mapped is None:
                continue
            mapped = {d: mapped.get(d, 1) for d in splits[node.name]}
            if mapped == splits[node.name]:
                continue
            splits[node.name] = mapped
            out[node.name] = FrozenMap(mapped)
            part[node.name] = head(w.name) if w.name in out else node.name
            for other in node.op.loads:
                if other.buffer in copy_of:
                    copy = copy_of[other.buffer]
                    out[copy] = FrozenMap((d, mapped.get(d, 1)) for d in splits[copy])
                    if copy in part:
                        part[head(copy)] = head(node.name)
                    else:
                        part[copy] = head(node.name)
            break
    parts: dict[str, dict[str, FrozenMap[str, int]]] = {}
    for name, split in out.items():  # in program order: a part is where its first op is
        parts.setdefault(head(name), {})[name] = split
    return list(parts.values())


def _mapped_split(w: OpNode, wsplit: Mapping[str, int], weps: Mapping[str, int], r: OpNode,
                  reps: Mapping[str, int], load: Load, btype: TensorType) -> dict[str, int] | None:
    """The reader's splits that give it, on every core, the slice of the buffer its writer
    wrote there: each buffer dim the writer splits must be walked by the reader over the same
    extent and cut into the same slices (a dim the reader counts in sticks where the writer
    counts elements is not). None when the reader cannot."""
    wvars = dim_vars(w.op.store.index, btype, _sizes(w.op))
    rvars = dim_vars(load.index, btype, _sizes(r.op))
    if wvars is None or rvars is None:
        return None
    wsizes, rsizes = _sizes(w.op), _sizes(r.op)
    reduced = {d.name for d in r.op.reduction_ranges}
    out: dict[str, int] = {}
    for wv, rv in zip(wvars, rvars):
        if wv is None or wsplit.get(wv.name, 1) == 1:
            continue
        k = wsplit[wv.name]
        if rv is None or rsizes[rv.name] != wsizes[wv.name] or rv.name in out:
            return None
        if rv.name in reduced and rv.name not in splittable_reduction(r.op, reduced):
            return None  # a variance read in slices of the dim it reduces: its partials cannot be combined
        size, weps_, reps_ = wsizes[wv.name], weps.get(wv.name, 1), reps.get(rv.name, 1)
        if k > -(-size // reps_) or slice_extents(size, k, weps_) != slice_extents(size, k, reps_):
            return None
        out[rv.name] = k
    if math.prod(out.values()) != math.prod(k for k in wsplit.values()):
        return None  # the writer splits a dim of its own the buffer lacks: cores would not line up
    return out


def _copies(tree: LoopTree, unchanged: Trial, regions: list[Region], machine: Machine,
            options: ResidencyOptions, reduced: Mapping[str, set[str]], unsplit: Mapping[str, set[str]],
            whole: set[str],
            judge: TrialJudge) -> Trial | None:
    """The rewrite with the copies of ``regions`` that fit LX and pay off (regions named in
    ``whole`` are not replicated), judged by the real stages; None when none do."""
    split = unchanged.split
    whole = set(whole)  # grows with the replicas that do not fit: copied by slices instead
    hints, regions = _align(regions, split, machine, reduced, unsplit, whole)
    tries = 0
    table = tree.buffer_table()
    while regions:
        # a copy larger than LX can hold under any division spills in every trial: it is
        # withdrawn as a spilled one would be, without a trial (a division and an allocation)
        spilled = [r for r in regions if _never_fits(r, table[r.buffer].type.dtype, machine)]
        if not spilled:
            rewritten = _rewrite(tree, regions, hints)
            try:
                new_split = divide_work(rewritten, machine, options.split)
            except FspyreError:
                return None  # a copy's work division was refused: leave the tree as it was
            new_alloc = allocate(rewritten, new_split, machine, options.allocation)
            spilled = [r for r in regions if new_alloc.buffers[r.name].memory != "lx"]
        if spilled:
            # a replicated copy that did not fit gets one more chance as one slice per core, a
            # region kept across loops as the copies of its loops' own re-reads
            whole |= {r.name for r in spilled if r.replicas > 1}
            regions = [replace(r, replicas=1) if r.name in whole else r
                       for r in regions if r not in spilled or r.replicas > 1]
            regions += [part for r in spilled for part in r.parts]
            hints, regions = _align(regions, split, machine, reduced, unsplit, whole)
            continue
        done = Trial(tree=rewritten, split=new_split, allocation=new_alloc, regions=tuple(regions),
                          hints=FrozenMap(hints))
        if better(done, unchanged, judge):
            return done
        if len(regions) == 1 or tries >= _MAX_TRIES:
            return None
        # The copies fit but cost more than they save -- typically they pushed intermediates
        # out of LX. Give up the largest and judge the rest again.
        tries += 1
        regions = [r for r in regions if r is not max(regions, key=_region_bytes)]
        hints, regions = _align(regions, split, machine, reduced, unsplit, whole)
    return None


def _never_fits(r: Region, dtype: str, machine: Machine) -> bool:
    """Whether the copy of ``r`` needs more LX than any core has however it is divided: a
    replica holds the whole region on each core; a sliced copy holds at least its share of
    the region on one of the machine's cores (the allocator's per-core box, whole sticks,
    is never smaller)."""
    nbytes = math.prod(d.size for d in r.dims) * FORMATS[machine.device_format(dtype)].nbytes
    return nbytes > machine.lx_bytes * (1 if r.replicas > 1 else machine.cores)


_MAX_TRIES = 3  # subsets of copies judged after the full set loses: each costs a division and allocation


def _region_bytes(r: Region) -> int:
    return math.prod(d.size for d in r.dims) * r.slots


def _align(regions: Sequence[Region], split: SplitPlan, machine: Machine, reduced: Mapping[str, set[str]],
           unsplit: Mapping[str, set[str]],
           no_replicas: set[str]) -> tuple[dict[str, FrozenMap[str, int]], list[Region]]:
    """work_div for each copy (and readers that must change) so the copy writes, on every
    core, exactly the slice that core's readers read. A reader splitting a dim the copy does
    not have would need the copy on several cores at once; it moves its cores onto the
    copy's first output dim instead. Regions whose readers cannot agree are dropped."""
    hints: dict[str, FrozenMap[str, int]] = {}
    kept: list[Region] = []
    for r in regions:
        names = [d.name for d in r.dims]
        replicated = None if r.name in no_replicas else _replicate(r, split, reduced)
        if replicated is not None:
            r, proposal = replicated
            if not any(n in hints and hints[n] != h for n, h in proposal.items()):
                hints.update(proposal)
                kept.append(r)
                continue
        # a peeled tail's reader divides like its origin (capped at the remainder, which no
        # dim of the region is), so it slices the copy as its origin does under the new division
        readers = [n for n in r.readers if n not in r.tails]
        found = [_reader_split(split.ops[n], reduced[n], unsplit[n], names, r, machine)
                 for n in readers]
        wanted = [w for w in found if w is not None]
        if len(wanted) != len(found):
            continue
        common = {d: k for d, k in wanted[0].items() if d in names}
        if any({d: k for d, k in w.items() if d in names} != common for w in wanted):
            continue
        # The copy counts its last dim in sticks, which its readers may count in elements (x[I, S=1]
        # read I:7 is copied into a [I] buffer of 4 sticks): a count past the copy's units is the
        # division's to cap, with a warning about a scope the user never wrote; it is capped here.
        units = {d.name: -(-d.size // r.stick) if d == r.dims[-1] else d.size for d in r.dims}
        proposal = {**{n: FrozenMap(w) for n, w in zip(readers, wanted) if w != dict(split.ops[n].splits)},
                    # a size-1 dim is not iterated: a work_div on it would be a warning about a
                    # scope the user never wrote
                    f"{r.name}_copy": FrozenMap((d.name, min(common.get(d.name, 1), units[d.name]))
                                                for d in r.dims if d.size > 1)}
        if any(n in hints and hints[n] != h for n, h in proposal.items()):
            continue
        hints.update(proposal)
        kept.append(r)
    return hints, kept


def _replicate(r: Region, split: SplitPlan, reduced: Mapping[str, set[str]]
               ) -> tuple[Region, dict[str, FrozenMap[str, int]]] | None:
    """The region as a replicated copy, and the work_div of the copy and of its readers (kept
    as they are), when every reader splits only dims the region does not have -- so each of
    its cores reads the whole region: the weights of a token-split matmul, k and v of a
    query-split attention -- all readers split alike (a peeled tail's readers on the same or
    fewer cores), and no split dim is reduced. None otherwise."""
    names = {d.name for d in r.dims}
    main = [n for n in r.readers if n not in r.tails]
    first = split.ops[main[0]] if main else None
    if first is None or r.slots > 1 or first.cores < 2 or any(split.ops[n].splits != first.splits for n in main):
        return None  # (a region kept across loops is sliced like its readers, one slot per iteration)
    if any(k > 1 and (d in names or any(d in reduced[n] for n in r.readers))
           for n in r.readers for d, k in split.ops[n].splits.items()):
        return None
    # A peeled tail divides like its origin with each split capped at the remainder
    # (docs/tiling.md, "Tails"), so it may run on fewer of the cores: each of those holds the
    # whole region too. It keeps following its origin (no hint of its own).
    if any(split.ops[n].cores > first.cores for n in r.tails):
        return None
    hints = {n: FrozenMap(first.splits) for n in main}
    hints[f"{r.name}_copy"] = FrozenMap([(f"{r.name}_cores", first.cores)]
                                        + [(d.name, 1) for d in r.dims if d.size > 1])
    return replace(r, replicas=first.cores), hints


def _reader_split(split: OpSplit, reduced: set[str], unsplit: set[str], names: Sequence[str], r: Region,
                  machine: Machine) -> dict[str, int] | None:
    if all(k == 1 or d in names for d, k in split.splits.items()):
        return dict(split.splits)
    for d in sorted(r.dims, key=lambda d: d.name in reduced):  # output dims first: no partial sums
        if d.name in unsplit:
            continue  # (divide_work would refuse the hint, and with it every copy of the trial)
        # whole sticks on both sides: the reader's stick dims and the copy's last dim
        elems = max(split.stick_elems.get(d.name, 1), r.stick if d == r.dims[-1] else 1)
        if d.size % elems:
            continue
        units = d.size // elems
        k = max(c for c in range(1, min(split.cores, machine.cores) + 1) if units % c == 0)
        if k > 1:
            return {**{n: 1 for n in split.splits}, d.name: k}
    return None


# -- finding re-read regions ----------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class Region:
    """One region of a full buffer that ``readers`` read, and where its copy goes: before the
    node at ``anchor`` (a path of body indices) whose subtree holds every reader."""

    name: str  # the copy's buffer (and, with "_copy", its op)
    buffer: str
    index: sympy.Expr
    dims: tuple[Dim, ...]  # the per-tile extent of each buffer dim the load walks
    stick: int  # elements per stick of the buffer (its last dim is the stick dim)
    steps: tuple[tuple[TileStep, ...], ...]  # the copy's tiling: the levels that move the region
    anchor: tuple[int, ...]
    readers: tuple[str, ...]
    # A replicated copy (``replicas`` > 1): every core its readers run on reads the whole
    # region, so the copy runs once on each of those cores and each writes the whole region
    # into its own LX.
    replicas: int = 1
    # A region kept across sibling loops (``slots`` > 1, the iterations of the loops that walk
    # it): the copy sits in the first loop and writes a full-scope buffer the allocator gives
    # one LX slot per iteration; ``parts`` are the copies each loop would make on its own,
    # tried instead when the slots do not fit.
    slots: int = 1
    parts: tuple[Region, ...] = ()
    runs: Runs = "every"  # the iterations of its innermost loop the copy runs in (its readers')
    # A peeled tail's copy is laid out at the main tile's extents (``tile``, when they differ
    # from ``dims``) like the tail's other per-tile buffers (docs/tiling.md, "Tails"), so what
    # its readers write may take its LX slot in place, as in the main body.
    tile: tuple[Dim, ...] = ()
    # the readers that are a peeled tail's copies of another reader (a loop-invariant region
    # the tail reads through the loop's copy, as the op it copies does)
    tails: tuple[str, ...] = ()


def _regions(tree: LoopTree) -> list[Region]:
    table = tree.buffer_table()
    written_at: dict[str, int] = {}
    order: dict[str, int] = {}
    for node, _ in walk(tree.body):
        if isinstance(node, OpNode):
            order[node.name] = len(order)
            written_at[node.op.store.buffer] = order[node.name]
    found: dict[tuple, list[tuple[tuple[int, ...], str, int]]] = {}
    counts: dict[tuple[int, ...], int] = {}  # loop path -> count
    runs: dict[str, Runs] = {}
    tiles: dict[tuple, tuple[Dim, ...]] = {}  # a tail region's main-tile extents
    nodes = {n.name: n for n in op_nodes(tree)}
    for path, node in _op_paths(tree.body, (), counts):
        for ld in node.op.loads:
            buf = table[ld.buffer]
            if buf.scope != "full":
                continue
            walked = _walked_dims(ld.index, buf.type, _sizes(node.op))
            if walked is None:
                continue
            names = free_names(ld.index)
            moving = [k for k, level in enumerate(node.tiling) if any(s.dim in names for s in level)]
            depth = (moving[-1] + 1) if moving else 0
            if node.peeled and node.guarded and names & {p.dim for p in node.peeled}:
                # a tail run in its loop's last iteration that reads its own remainder there:
                # the copy is shared by the tail's ops only, made in that iteration (before the
                # loop it would hold LX through every iteration). A region no peeled dim
                # walks (a matmul's weights, a norm's gamma) is the one the main tile reads:
                # its key is the main body's, so the tail reads the loop's copy of it.
                depth = len(node.tiling)
            steps = tuple(tuple(s for s in level if s.dim in names) for level in node.tiling[:depth])
            key = (ld.buffer, ld.index, walked, steps, path[:depth])
            runs[node.name] = node.runs
            origin = nodes.get(node.origin)
            if origin is not None:
                tile = _walked_dims(ld.index, buf.type, _sizes(origin.op))
                if tile is not None and tile != walked and all(
                        t.name == w.name and t.size >= w.size for t, w in zip(tile, walked, strict=True)):
                    tiles[key] = tile
            # a guarded op runs once per iteration of the loops outside its innermost one
            found.setdefault(key, []).append((path, node.name, len(node.tiling) - node.guarded))
    regions: list[Region] = []
    taken = {b.name for b in tree.buffers} | set(order)

    def region(buffer, index, walked, steps, outer, uses, slots=1, parts=()) -> Region | None:
        # before the first reader inside ``outer`` (the first of the loops, for one kept across them)
        anchor = outer + (min(p[len(outer)] for p, _, _ in uses if p[:len(outer)] == outer),)
        if buffer in written_at and not written_at[buffer] < _first_op_at(tree.body, anchor, order):
            return None  # written at or after the place the copy would go
        readers = tuple(dict.fromkeys(name for _, name, _ in uses))
        tails = tuple(n for n in readers if nodes[n].origin in readers)
        # a copy at a guarded tail's level (its last level moves nothing) runs when its readers do
        guard = runs[readers[0]] if steps and not steps[-1] else "every"
        return Region(name=fresh_name(f"{buffer}_lx", taken), buffer=buffer, index=index, dims=walked,
                       stick=elems_per_stick(table[buffer].type.dtype), steps=steps, anchor=anchor,
                       readers=readers, slots=slots, parts=parts, runs=guard,
                       tile=tiles.get((buffer, index, walked, steps, outer), ()), tails=tails)

    # the same regions walked by sibling loops (same steps, different loops at some level)
    siblings: dict[tuple, list[tuple[int, ...]]] = {}
    for buffer, index, walked, steps, outer in found:
        if steps and steps[-1]:  # (not a guarded tail's copy: made in the one iteration its readers run)
            siblings.setdefault((buffer, index, walked, steps), []).append(outer)
    # Not across loops with a peeled tail: the slots hold the main tiles only, so the copy
    # would not cover its dim (the tail reads its remainder on its own), which divide_work
    # refuses -- and with it every copy of the trial (rmsnorm -> matmul over 1,147 rows in two
    # loops of 383-row tiles kept no copy at all). Each loop's own re-reads are copied instead.
    # Nor where a peeled tail reads its own remainder (sibling loops after the main loop, each
    # over the tail's rows): the slots would be a full-scope twin of the buffer whose copy
    # covers the remainder only, which verify_loop_tree refuses -- and with it every copy of
    # the trial (softmax over 97 rows R:13 x C:2 on 4 cores, 8 KiB, kept no copy at all).
    tailed = {(n.origin, p.dim) for n in op_nodes(tree) for p in n.peeled}

    def tail_walks(k: tuple, outers: list[tuple[int, ...]]) -> bool:
        readers = [nodes[name] for outer in outers for _, name, _ in found[(*k, outer)]]
        return any((n.name, st.dim) in tailed for n in readers for level in k[3] for st in level) or any(
            {p.dim for p in n.peeled} & free_names(k[1]) for n in readers)

    across = {k: outers for k, outers in siblings.items() if len(outers) > 1 and not tail_walks(k, outers)}
    for (buffer, index, walked, steps, outer), uses in found.items():
        if (buffer, index, walked, steps) in across:
            continue
        deeper = any(d > len(outer) for _, _, d in uses)
        if len(uses) < 2 and not deeper:
            continue  # read once per iteration of the loops that move it: nothing to save
        made = region(buffer, index, walked, steps, outer, uses)
        if made is not None:
            regions.append(made)
    for (buffer, index, walked, steps), outers in across.items():
        outers = sorted(outers)  # program order: the first loop makes the copy
        shared = 0
        while len({o[shared] for o in outers}) == 1:
            shared += 1
        # one slot per iteration of the loops below the shared ones that walk the region
        slots = math.prod(counts[outers[0][:k + 1]] for k in range(shared, len(outers[0])) if steps[k])
        everyone = [u for outer in outers for u in found[(buffer, index, walked, steps, outer)]]
        made = region(buffer, index, walked, steps, outers[0], everyone, slots)
        parts = []
        for outer in outers:
            uses = found[(buffer, index, walked, steps, outer)]
            if len(uses) >= 2 or any(d > len(outer) for _, _, d in uses):
                part = region(buffer, index, walked, steps, outer, uses)
                if part is not None:
                    parts.append(part)
        regions.extend([replace(made, parts=tuple(parts))] if made is not None else parts)
    return regions


def _op_paths(body: Sequence[Node], prefix: tuple[int, ...], counts: dict[tuple[int, ...], int] | None = None):
    """``(path, op node)`` in program order; ``counts`` collects each loop's count by path."""
    for i, node in enumerate(body):
        if isinstance(node, Loop):
            if counts is not None:
                counts[prefix + (i,)] = node.count
            yield from _op_paths(node.body, prefix + (i,), counts)
        else:
            yield prefix + (i,), node


def _first_op_at(body: Sequence[Node], path: tuple[int, ...], order: Mapping[str, int]) -> int:
    node: Node = body[path[0]]
    for i in path[1:]:
        assert isinstance(node, Loop)
        node = node.body[i]
    first = next(n for n, _ in walk((node,)) if isinstance(n, OpNode))
    return order[first.name]


def _sizes(op: Op) -> dict[str, int]:
    return {d.name: d.size for d in (*op.ranges, *op.reduction_ranges)}


def _walked_dims(index: sympy.Expr, btype: TensorType, sizes: Mapping[str, int]) -> tuple[Dim, ...] | None:
    """The per-tile extent of each buffer dim ``index`` walks with one iteration variable (in
    buffer order), or None when the index is not of that form (the copy would need it). A
    constant term is where a peeled tail's remainder starts (docs/tiling.md, "Tails"): the
    copy loads through the whole index, so the walk is the index without it."""
    vars_ = dim_vars(sympy.expand(index).as_coeff_Add()[1], btype, sizes)
    if vars_ is None or any(v is not None and v.name not in sizes for v in vars_):
        return None
    return tuple(Dim(v.name, sizes[v.name]) for v in vars_ if v is not None)


# -- rewriting ----------------------------------------------------------------------------------
def _rewrite(tree: LoopTree, regions: Sequence[Region], hints: Mapping[str, FrozenMap[str, int]]) -> LoopTree:
    """The tree with each region's copy in place and its readers reading it; ``hints`` gives
    ops (copies and readers) a work division of their own, as a hint scope after the graph's."""
    table = tree.buffer_table()
    first = max((h.id for h in tree.hints), default=-1) + 1
    scope_of = {op: first + i for i, op in enumerate(hints)}
    redirect: dict[tuple[str, str, sympy.Expr], Load] = {}
    copies: dict[tuple[int, ...], list[OpNode]] = {}
    added: dict[str, list[TreeBuffer]] = {}
    for r in regions:
        ttype = TensorType(dims=r.tile or r.dims, dtype=table[r.buffer].type.dtype)
        local = ttype.contiguous_index()
        if r.slots > 1:
            # kept across loops: a full-scope twin of the buffer, addressed like it, which the
            # loops walk slot by slot in LX
            ttype, local = table[r.buffer].type, r.index
        cname = f"{r.name}_copy"
        # a replicated copy runs once per core (its leading dim, split one slot per core) and
        # every core stores the whole region at the same place of its own LX: the store index
        # does not use the slot
        slots = (Dim(f"{r.name}_cores", r.replicas),) if r.replicas > 1 else ()
        copy = Pointwise(name=cname, fn="copy", operands=(Load(buffer=r.buffer, index=r.index),),
                         ranges=slots + r.dims, store=Store(buffer=r.name, index=local),
                         hints=(scope_of[cname],) if cname in scope_of else ())
        copies.setdefault(r.anchor, []).append(OpNode(op=copy, tiling=r.steps, runs=r.runs))
        added.setdefault(r.buffer, []).append(TreeBuffer(name=r.name, type=ttype,
                                                         scope="full" if r.slots > 1 else "tile"))
        for reader in r.readers:
            redirect[(reader, r.buffer, r.index)] = Load(buffer=r.name, index=local)
    body = _rewrite_body(tree.body, (), copies, redirect, scope_of)
    buffers: list[TreeBuffer] = []
    for b in tree.buffers:
        buffers.append(b)
        buffers.extend(added.get(b.name, ()))
    scopes = tuple(HintScope(id=scope_of[op], work_div=h) for op, h in hints.items())
    # a copy placed before a loop runs in the loop's first iteration
    return guard_boundaries(replace(tree, body=body, buffers=tuple(buffers), hints=tree.hints + scopes))


def _rewrite_body(body: Sequence[Node], prefix: tuple[int, ...], copies: Mapping[tuple[int, ...], list[OpNode]],
                  redirect: Mapping[tuple[str, str, sympy.Expr], Load],
                  scope_of: Mapping[str, int]) -> tuple[Node, ...]:
    out: list[Node] = []
    for i, node in enumerate(body):
        path = prefix + (i,)
        out.extend(copies.get(path, ()))
        if isinstance(node, Loop):
            out.append(replace(node, body=_rewrite_body(node.body, path, copies, redirect, scope_of)))
            continue
        # a redirect maps a load to a load, so a reduction's operands stay loads
        operands: Any = tuple(redirect.get((node.name, o.buffer, o.index), o) if isinstance(o, Load) else o
                              for o in node.op.operands)
        hints = node.op.hints + ((scope_of[node.name],) if node.name in scope_of else ())
        if operands == node.op.operands and hints == node.op.hints:
            out.append(node)
        else:
            out.append(replace(node, op=replace(node.op, operands=operands, hints=hints)))
    return tuple(out)
