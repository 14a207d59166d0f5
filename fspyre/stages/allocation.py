"""Stage ``allocate``: LoopTree + SplitPlan + machine -> Allocation (HBM and LX addresses).

**LX planning** (following torch-spyre's ``scratchpad/``). Program time is the index of an
op in program order, loop bodies counted once; lifetimes follow
``fspyre.machine.rules.live_intervals`` (a per-tile buffer lives within one iteration; a
buffer used inside a loop and outside it lives across the whole loop). An intermediate may
live in LX when

- every loop that moves its address either encloses all its uses (each iteration rewrites
  the same LX bytes: no loop advances it there) or walks it alike in every use: a region
  read in sibling loops (written tile by tile in the first, read tile by tile in the next)
  gets one slot per iteration, the slot the loops' iteration picks (``_lx_slots``),
- some op reads it,
- its producer does not split a reduction across cores (the combined value exists on one
  core only), and
- every consumer slices it exactly as the producer did on every core: the same LX box per
  core (``rules.lx_box``), on cores the producer wrote. That is the condition the
  interpreter's per-core LX addressing needs, so nothing placed in LX can read another
  core's data.

Its per-core footprint is the producer's largest per-core box (device bytes / the
producer's core count when the slices partition the tensor), rounded up to 128 bytes. A
pointwise op that reads a buffer at that buffer's last use, element for element where it
writes its result, may write the result in place. The solvers (``greedy`` default,
``firstfit``, ``bestfit``) place buffers at 128-byte aligned addresses below
``machine.lx_bytes``; what does not fit stays in HBM, with the reason recorded.

**HBM**: kernel arguments (graph inputs, then outputs) first, then a 128-byte aligned pool of
intermediates; with ``hbm_reuse`` buffers whose lifetimes do not overlap share pool space.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from fspyre.errors import AllocationError
from fspyre.ir.frozen import FrozenMap, require_fields
from fspyre.ir.graph import Pointwise
from fspyre.ir.kinds import LX_SOLVERS, LxSolver
from fspyre.ir.looptree import Loop, LoopTree, Node, OpNode
from fspyre.ir.plans import Allocation, OpSplit, Placement, SplitPlan
from fspyre.machine.layout import StickLayout
from fspyre.machine.rules import (
    box_bytes,
    common_loops,
    coord_bounds,
    live_chain,
    live_intervals,
    lx_box,
    writing_cores,
)
from fspyre.machine.spyre import HBM_ALIGN, LX_ALIGN, Machine
from fspyre.stages.access import Access, access_plan
from fspyre.stages.arguments import require, require_tree, verified
from fspyre.stages.split_plan import verify_split_shapes


@dataclass(frozen=True, slots=True, kw_only=True)
class AllocationOptions:
    lx_planning: bool = True  # place intermediates in the cores' LX scratchpads; False: every tensor in HBM
    lx_solver: LxSolver = "greedy"  # how LX is packed: greedy, firstfit or bestfit (docs/tiling.md)
    hbm_reuse: bool = True  # pool intermediates whose lifetimes do not overlap share addresses

    def __post_init__(self) -> None:
        require_fields(self, AllocationError)
        if self.lx_solver not in LX_SOLVERS:
            raise AllocationError(f"lx_solver={self.lx_solver!r}: use one of {list(LX_SOLVERS)}")


def _align(n: int, a: int = HBM_ALIGN) -> int:
    return -(-n // a) * a


@dataclass(frozen=True, slots=True, kw_only=True)
class LiveBuffer:
    """A solver's view of a buffer: aligned size, lifetime ``[start, end)``, number of uses,
    and the buffers whose slot it may take over in place."""

    name: str
    size: int
    start: int
    end: int
    uses: int = 1
    first_use_is_write: bool = True
    parents: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class _Use:
    time: int
    node: OpNode
    split: OpSplit
    access: Access
    chain: tuple[int, ...]  # the enclosing loops' ids, outermost first
    counts: tuple[int, ...]  # their counts
    lows: np.ndarray
    highs: np.ndarray
    cores: np.ndarray  # bool per core: the core performs this access


def allocate(tree: LoopTree, splits: SplitPlan, machine: Machine,
             options: AllocationOptions = AllocationOptions()) -> Allocation:
    require(splits, SplitPlan, "allocate", "splits")
    require(machine, Machine, "allocate", "machine")
    require(options, AllocationOptions, "allocate", "options")
    require_tree(tree, "allocate", machine)
    # a side table keyed by op name: refuse one made for another tree
    verified(verify_split_shapes, tree, splits, machine)
    analysis = access_plan(tree, splits, machine)
    layouts = analysis.layouts

    timeline: list[tuple[int, OpNode, tuple[int, ...]]] = []
    spans: dict[int, tuple[int, int]] = {}

    def visit(body: tuple[Node, ...], chain: tuple[int, ...]) -> None:
        for node in body:
            if isinstance(node, Loop):
                lid, start = len(spans), len(timeline)
                spans[lid] = (start, start)
                visit(node.body, chain + (lid,))
                spans[lid] = (start, len(timeline))
            else:
                timeline.append((len(timeline), node, chain))

    visit(tree.body, ())

    uses: dict[str, list[_Use]] = {}
    times: dict[str, list[tuple[int, tuple[int, ...]]]] = {}
    for t, node, chain in timeline:
        split = splits.ops[node.name]
        record = analysis.ops[node.name]
        dims = record.dims
        syms = [d.symbol for d in dims]
        cuts = [split.splits.get(d.name, 1) for d in dims]
        extents = [split.extents(d.name, d.size) for d in dims]
        red = {d.name for d in node.op.reduction_ranges}
        writers = writing_cores(cuts, [d.name in red for d in dims])
        for acc in record.tensors:
            lows, highs = coord_bounds(acc.coords, syms, extents)
            cores = writers if acc.is_write else np.ones(len(writers), dtype=bool)
            uses.setdefault(acc.buffer, []).append(
                _Use(time=t, node=node, split=split, access=acc, chain=chain, counts=record.counts, lows=lows,
                     highs=highs, cores=cores))
            times.setdefault(acc.buffer, []).append((t, live_chain(chain, node.runs)))
    live = live_intervals(times, spans)
    at_time: dict[int, list[_Use]] = {}
    for us in uses.values():
        for u in us:
            at_time.setdefault(u.time, []).append(u)

    outputs = [o.buffer for o in tree.outputs]
    args = list(dict.fromkeys(list(tree.inputs) + outputs))
    placements: dict[str, Placement] = {}
    addr = 0
    for i, name in enumerate(args):
        size = layouts[name].nbytes
        placements[name] = Placement(memory="hbm", address=addr, nbytes=size, arg_index=i,
                                     live=live.get(name, (0, 0)))
        addr = _align(addr + size)
    pool_base = addr

    intermediates = [b.name for b in tree.buffers if b.name not in placements]
    reasons: dict[str, str] = {}
    lx_items: list[LiveBuffer] = []
    footprint: dict[str, int] = {}
    slotted: dict[str, FrozenMap[str, tuple[int, ...]]] = {}
    for name in intermediates:
        why, nbytes, advances = _lx_verdict(uses.get(name, []), options, machine)
        if why:
            reasons[name] = why
            continue
        footprint[name] = nbytes
        slotted[name] = advances
    for name in intermediates:
        if name in footprint:
            us = uses[name]
            lx_items.append(LiveBuffer(
                name=name, size=footprint[name], start=live[name][0], end=live[name][1],
                uses=len(us), first_use_is_write=us[0].access.is_write,
                parents=() if slotted[name] else _in_place_parents(name, us, at_time, live, footprint, slotted)))

    placed = solve(lx_items, machine.lx_bytes, options.lx_solver)
    lx_peak = 0
    for item in lx_items:
        if item.name in placed:
            a, parent = placed[item.name]
            placements[item.name] = Placement(memory="lx", address=a, nbytes=item.size,
                                              live=(item.start, item.end), in_place_of=parent,
                                              advances=slotted[item.name])
            lx_peak = max(lx_peak, a + item.size)
        else:
            reasons[item.name] = (f"no room in LX during {list(live[item.name])} ({item.size} bytes per core, "
                                  f"{options.lx_solver} solver, {machine.lx_bytes}-byte LX)")

    pool = [LiveBuffer(name=n, size=_align(layouts[n].nbytes), start=live.get(n, (0, 0))[0],
                       end=live.get(n, (0, 0))[1]) for n in intermediates if n not in placements]
    offsets = {item.name: 0 for item in pool}  # a buffer no op uses occupies nothing
    used = [item for item in pool if item.end > item.start]
    if options.hbm_reuse:
        offsets.update((n, a) for n, (a, _) in _greedy(used, None, prefer_gaps=True).items())
    else:
        top = 0
        for item in used:
            offsets[item.name], top = top, top + item.size
    end = pool_base
    for item in pool:
        a = pool_base + offsets[item.name]
        placements[item.name] = Placement(memory="hbm", address=a, nbytes=layouts[item.name].nbytes,
                                          live=(item.start, item.end), reason=reasons.get(item.name, ""))
        if item.end > item.start:
            end = max(end, _align(a + item.size))
    if end > machine.hbm_bytes:
        _refuse_hbm(tree, layouts, pool_base, end, machine)
    ordered = FrozenMap((b.name, placements[b.name]) for b in tree.buffers)
    notes = tuple(f"{n}: in place of {p.in_place_of}" for n, p in ordered.items() if p.in_place_of)
    return Allocation(buffers=ordered, hbm_bytes=end, lx_peak_bytes=lx_peak, notes=notes,
                      no_room=tuple(item.name for item in lx_items if item.name not in placed))


def _refuse_hbm(tree: LoopTree, layouts: Mapping[str, StickLayout], pool_base: int, end: int,
                machine: Machine) -> None:
    outputs = {o.buffer for o in tree.outputs} - set(tree.inputs)
    inputs = sum(layouts[n].nbytes for n in dict.fromkeys(tree.inputs))
    outs = sum(layouts[n].nbytes for n in outputs)
    raise AllocationError(
        f"{tree.name}: needs {end} bytes of HBM (inputs {inputs}, outputs {outs}, intermediate pool "
        f"{end - pool_base}, alignment {pool_base - inputs - outs}), more than the machine's {machine.hbm_bytes}; "
        f"use smaller tensors, let intermediates share HBM (hbm_reuse=True) or stay in LX, "
        f"or pass a larger hbm_bytes to the machine"
    )


_NO_SLOTS: FrozenMap[str, tuple[int, ...]] = FrozenMap()


def _lx_verdict(us: Sequence[_Use], options: AllocationOptions, machine: Machine
                ) -> tuple[str, int, FrozenMap[str, tuple[int, ...]]]:
    """(reason it stays in HBM, 0, -) or ("", per-core LX footprint, per-op slot advances).
    The first write fixes each core's box; every later access (reads, and the writes of an
    accumulator) must use the same box on the same cores. A buffer loops walk through holds
    one box per slot (``_lx_slots``)."""
    if not us:
        return "no op uses it", 0, _NO_SLOTS
    if not options.lx_planning:
        return "LX planning is off", 0, _NO_SLOTS
    slots = _lx_slots([(u.node.name, u.access, u.chain, u.counts) for u in us])
    if isinstance(slots, str):
        return slots, 0, _NO_SLOTS
    writes = [u for u in us if u.access.is_write]
    if not any(not u.access.is_write for u in us):
        return "no op reads it", 0, _NO_SLOTS
    for u in writes:
        if not np.all(u.cores):
            reduced = {d.name for d in u.node.op.reduction_ranges}
            red = next(d for d, k in u.split.splits.items() if k > 1 and d in reduced)
            return (f"op {u.node.name} splits reduction dim {red} across cores; the combined value is on one core",
                    0, _NO_SLOTS)
    w = writes[0]
    dsize = w.access.layout.device_size
    wl, we = lx_box(w.lows, w.highs, dsize)
    for u in us:
        if u is w:
            continue
        if u.time < w.time:
            return f"op {u.node.name} reads it before op {w.node.name} writes it", 0, _NO_SLOTS
        ul, ue = lx_box(u.lows, u.highs, dsize)
        if len(ul) > len(wl):
            return (f"op {u.node.name} uses it on {len(ul)} cores, but op {w.node.name} writes it on "
                    f"{len(wl)}: core {len(wl)} would read LX nobody wrote"), 0, _NO_SLOTS
        diff = np.nonzero(np.any(ul != wl[: len(ul)], axis=1) | np.any(ue != we[: len(ul)], axis=1))[0]
        if len(diff):
            c = int(diff[0])
            return (f"op {u.node.name} slices it differently from op {w.node.name} on core {c} (box at "
                    f"{ul[c].tolist()} extent {ue[c].tolist()} vs at {wl[c].tolist()} extent {we[c].tolist()})"), \
                0, _NO_SLOTS
    slot = _align(int(box_bytes(we, w.access.layout.elem_bytes).max()), LX_ALIGN)
    counts, levels = slots
    nbytes = slot * math.prod(counts)
    if nbytes > machine.lx_bytes:
        held = f" ({math.prod(counts)} slots of {slot})" if counts else ""
        return (f"needs {nbytes} bytes of LX per core{held}, more than the {machine.lx_bytes} the machine has", 0,
                _NO_SLOTS)
    if not counts:
        return "", nbytes, _NO_SLOTS
    # slot strides: the innermost walking loop steps one slot, each outer one a whole row of
    # the inner loops' slots (row-major over the counts)
    strides = [slot * math.prod(counts[i + 1:]) for i in range(len(counts))]
    advances = {}
    for u, own in zip(us, levels):
        step = dict(zip(own, strides))
        advances[u.node.name] = tuple(step.get(k, 0) for k in range(len(u.chain)))
    return "", nbytes, FrozenMap(advances)


_Walk = tuple[str, Access, tuple[int, ...], tuple[int, ...]]  # op, its access, enclosing loop ids and counts


def _lx_slots(us: Sequence[_Walk]) -> tuple[tuple[int, ...], list[tuple[int, ...]]] | str:
    """How an LX buffer's uses walk it: the counts of its slots (outermost first) and, per use,
    the enclosing levels that pick the slot; or why they cannot share LX.

    A loop that moves the buffer's address and encloses every use rewrites the same region in
    each iteration, read in that same iteration: its iterations reuse one slot (no advance in
    LX). The loops that move it but do not enclose every use -- the sibling loops of a region
    written tile by tile in one loop and read tile by tile in the next -- keep every tile until
    the last of them: one slot per iteration, which every use must walk alike (the same counts
    and tile steps, in the same order), so iteration j of each loop meets the tile iteration j
    of the others left there."""
    common = common_loops([chain for _, _, chain, _ in us])
    walk = None
    first = ""
    levels: list[tuple[int, ...]] = []
    for op, access, chain, counts in us:
        moves = access.moves
        own = tuple(k for k in range(common, len(chain)) if moves[k])
        # alike in the buffer's own elements, not in the ops' dim names: a reader whose
        # variable A walks the buffer's second dim does not walk it as a writer's A does
        key = (access.element_steps[:common], tuple((counts[k], access.element_steps[k]) for k in own))
        if walk is None:
            walk, first = key, op
        elif key != walk:
            (a, ka), (b, kb) = sorted([(first, walk), (op, key)], key=lambda x: not any(x[1][1]))
            return (f"op {a} advances it with an enclosing loop (loop counts and element steps {_steps(ka)}), op {b} "
                    f"walks it otherwise ({_steps(kb)}); LX holds one slot per iteration of such loops, which "
                    f"every op must walk alike")
        levels.append(own)
    assert walk is not None
    return tuple(c for c, _ in walk[1]), levels


def _steps(key) -> str:
    common, own = key
    shown = [f"{n}x{step}" for n, step in own]
    return "[" + ", ".join([f"shared {list(common)}"] * any(common) + shown) + "]"


def _in_place_parents(name: str, us: Sequence[_Use], at_time: Mapping[int, Sequence[_Use]],
                      live: Mapping[str, tuple[int, int]], footprint: Mapping[str, int],
                      slotted: Mapping[str, FrozenMap[str, tuple[int, ...]]]) -> tuple[str, ...]:
    """LX candidates whose slot ``name`` may take: read by ``name``'s pointwise producer at
    their last use, element for element where it writes ``name``, at least as large."""
    w = next(u for u in us if u.access.is_write)
    if not isinstance(w.node.op, Pointwise) or live[name][0] != w.time:
        return ()
    here = [x for x in at_time[w.time] if not x.access.is_write]
    out: list[str] = []
    for u in here:
        p = u.access.buffer
        if (p in out or p not in footprint or slotted[p] or live[p][1] != w.time + 1
                or footprint[p] < footprint[name]):
            continue
        loads = [x for x in here if x.access.buffer == p]
        if all(x.access.coords == w.access.coords and x.access.layout.device_size == w.access.layout.device_size
               for x in loads):
            out.append(p)
    return tuple(out)


# -- solvers ------------------------------------------------------------------------------------


def solve(items: Sequence[LiveBuffer], capacity: int, solver: LxSolver = "greedy") -> dict[str, tuple[int, str]]:
    """Place ``items`` in ``[0, capacity)``: name -> (address, the parent whose slot it took or
    ""). Items left out do not fit (they stay in HBM)."""
    if solver == "greedy":
        return _greedy(items, capacity)
    if solver in ("firstfit", "bestfit"):
        return _fit(items, capacity, best=solver == "bestfit")
    raise AllocationError(f"lx_solver={solver!r}: use one of {list(LX_SOLVERS)}")


class _Free:
    """The free address ranges around the live buffers, as sorted gaps, so each placement
    looks at the holes rather than re-sorting every live buffer (wide DAGs keep thousands
    alive). The last gap is open-ended: its start is the top of everything live.

    Live buffers overlap only as in-place chains: a child takes its parent's slot at the same
    address and is no larger, so buffers are kept per address and a dying one frees only the
    part of its span no other buffer at its address still covers."""

    __slots__ = ("starts", "ends", "at")

    def __init__(self) -> None:
        self.starts: list[int] = [0]
        self.ends: list[float] = [math.inf]
        self.at: dict[int, dict[str, int]] = {}  # address -> {live buffer: size}

    def top(self) -> int:
        return self.starts[-1]

    def low_gap_end(self) -> float:
        """End of the free space starting at address 0 (0 when address 0 is taken)."""
        return self.ends[0] if self.starts[0] == 0 else 0

    def first_fit(self, size: int, capacity: int | None) -> int | None:
        """Lowest 128-byte aligned address where ``size`` bytes are free."""
        for start, end in zip(self.starts, self.ends):
            a = _align(start, LX_ALIGN)
            if a + size <= end:
                return a if capacity is None or a + size <= capacity else None
        return None  # unreachable: the last gap is open-ended

    def take(self, name: str, addr: int, size: int) -> None:
        owners = self.at.setdefault(addr, {})
        covered = max(owners.values(), default=0)
        owners[name] = size
        if size > covered:
            self._carve(addr + covered, addr + size)

    def release(self, name: str, addr: int) -> None:
        owners = self.at[addr]
        size = owners.pop(name)
        covered = max(owners.values(), default=0)
        if not owners:
            del self.at[addr]
        if size > covered:
            self._free(addr + covered, addr + size)

    def _carve(self, lo: int, hi: int) -> None:
        i = bisect.bisect_right(self.starts, lo) - 1
        start, end = self.starts[i], self.ends[i]
        assert start <= lo and hi <= end, (lo, hi, start, end)
        pieces = [(a, b) for a, b in ((start, lo), (hi, end)) if b > a]
        self.starts[i:i + 1] = [a for a, _ in pieces]
        self.ends[i:i + 1] = [b for _, b in pieces]

    def _free(self, lo: int, hi: int) -> None:
        i = bisect.bisect_left(self.starts, lo)
        end: float = hi
        if i < len(self.starts) and self.starts[i] == hi:  # joins the gap above
            end = self.ends[i]
            del self.starts[i], self.ends[i]
        if i > 0 and self.ends[i - 1] == lo:  # joins the gap below
            self.ends[i - 1] = end
        else:
            self.starts.insert(i, lo)
            self.ends.insert(i, end)


def _greedy(items: Sequence[LiveBuffer], capacity: int | None, prefer_gaps: bool = False) -> dict[str, tuple[int, str]]:
    """torch-spyre ``greedy_solver``: sweep the start/end times; at each, free the buffers
    ending there, then place those starting there in input order: (1) in place of a live,
    not yet taken over parent at least as large; (2) address 0 when everything live lies
    above it; (3) just above the highest live buffer; (4) the first gap that fits. With
    ``prefer_gaps`` (the HBM pool) the gap search comes before (3). A zero-size buffer
    occupies nothing and goes at address 0."""
    starts: dict[int, list[LiveBuffer]] = {}
    ends: dict[int, list[str]] = {}
    for it in items:
        starts.setdefault(it.start, []).append(it)
        ends.setdefault(it.end, []).append(it.name)
    live: dict[str, tuple[int, int]] = {}
    free = _Free()
    taken: set[str] = set()
    out: dict[str, tuple[int, str]] = {}
    for t in sorted(set(starts) | set(ends)):
        for n in ends.get(t, ()):
            span = live.pop(n, None)
            if span is not None and span[1]:
                free.release(n, span[0])
        for it in starts.get(t, ()):
            if capacity is not None and it.size > capacity:
                continue
            addr, parent = None, ""
            for p in it.parents:
                if p in live and p not in taken and it.size <= live[p][1]:
                    addr, parent = live[p][0], p
                    taken.add(p)
                    break
            if addr is None:
                if free.low_gap_end() >= it.size:
                    addr = 0
                elif prefer_gaps:
                    addr = free.first_fit(it.size, capacity)
                else:
                    top = _align(free.top(), LX_ALIGN)
                    fits = capacity is None or top + it.size <= capacity
                    addr = top if fits else free.first_fit(it.size, capacity)
            if addr is None:
                continue
            live[it.name] = (addr, it.size)
            if it.size:
                free.take(it.name, addr, it.size)
            out[it.name] = (addr, parent)
    return out


def _fit(items: Sequence[LiveBuffer], capacity: int, best: bool) -> dict[str, tuple[int, str]]:
    """torch-spyre ``firstfit_bestfit_solver``: the shortest-lived, most used buffers first;
    each goes in place of an already placed partner when that slot is free of everything else
    alive with it, else into the first (or the tightest) free gap."""
    order = {it.name: i for i, it in enumerate(items)}
    child_of = {p: it.name for it in items for p in it.parents}

    def key(it: LiveBuffer):
        span = it.end - it.start
        bonus = 0.25 * bool(it.parents) + 0.25 * (it.name in child_of)
        score = (span - bonus) / (it.uses + 0.5 * it.first_use_is_write)
        return (score, span, order[it.name])

    by_name = {it.name: it for it in items}
    placed: dict[str, int] = {}
    parent_of: dict[str, str] = {}
    for it in sorted(items, key=key):
        if it.size > capacity:
            continue
        alive = [n for n in placed if by_name[n].start < it.end and it.start < by_name[n].end]
        taken = set(parent_of.values())  # parents whose slot a child already took over
        partners = [(p, True) for p in it.parents if p in placed and p not in taken]
        c = child_of.get(it.name)
        if c is not None and c in placed and c not in parent_of:
            partners.append((c, False))
        addr = None
        for p, is_parent in partners:
            a = placed[p]
            fits = it.size <= by_name[p].size if is_parent else by_name[p].size <= it.size
            others = [(placed[n], by_name[n].size) for n in alive if n != p]
            if fits and a + it.size <= capacity and all(a + it.size <= oa or oa + os_ <= a for oa, os_ in others):
                addr = a
                if is_parent:
                    parent_of[it.name] = p
                else:
                    parent_of[p] = it.name
                break
        if addr is None:
            addr = _gap(sorted((placed[n], by_name[n].size) for n in alive), it.size, capacity, best)
        if addr is not None:
            placed[it.name] = addr
    return {n: (a, parent_of.get(n, "")) for n, a in placed.items()}


def _gap(spans: Sequence[tuple[int, int]], size: int, capacity: int, best: bool) -> int | None:
    gaps, cur = [], 0
    for a, s in spans:
        if a > cur:
            gaps.append((cur, a))
        cur = max(cur, a + s)
    gaps.append((cur, capacity))
    choice = None
    for lo, hi in gaps:
        start = _align(lo, LX_ALIGN)
        if start + size > hi:
            continue
        if not best:
            return start
        left = hi - start - size
        if choice is None or left < choice[0]:
            choice = (left, start)
    return None if choice is None else choice[1]


# -- verification ----------------------------------------------------------------------------
def verify_allocation(tree: LoopTree, plan: SplitPlan, alloc: Allocation, machine: Machine) -> Allocation:
    """The allocation places exactly the tree's buffers: inputs and outputs as HBM kernel
    arguments 0..n-1 in that order, intermediates without one; every HBM buffer with its full
    device size inside the allocation's HBM and the machine's; every LX buffer inside LX,
    never advancing, and sized to the largest per-core box of an op's access under ``plan``'s
    splits (as ``allocate`` sizes it).
    Linear in the tree; an allocation made for another tree, or edited, is refused naming the
    first mismatch (it does not re-check that live LX buffers do not overlap: ``check_memory``
    does, on the program)."""
    require(alloc, Allocation, "verify_allocation", "alloc")
    verified(verify_split_shapes, tree, plan, machine)
    analysis = access_plan(tree, plan, machine)
    layouts = analysis.layouts
    names = [b.name for b in tree.buffers]
    known = set(names)
    extra = [n for n in alloc.buffers if n not in known]
    if extra:
        raise AllocationError(
            f"allocation places buffer {extra[0]}, which loop tree {tree.name} does not have; the allocation "
            f"was made for another tree: allocate(tree, splits, machine)"
        )
    args = list(dict.fromkeys(list(tree.inputs) + [o.buffer for o in tree.outputs]))
    arg_of = {n: i for i, n in enumerate(args)}
    if alloc.hbm_bytes > machine.hbm_bytes:
        raise AllocationError(f"allocation uses {alloc.hbm_bytes} bytes of HBM, more than the machine's "
                              f"{machine.hbm_bytes}; allocate for this machine")
    for name in names:
        p = alloc.buffers.get(name)
        if p is None:
            raise AllocationError(
                f"allocation has no placement for buffer {name} of loop tree {tree.name}; the allocation was "
                f"made for another tree: allocate(tree, splits, machine)"
            )
        want = arg_of.get(name, -1)
        if p.arg_index != want or (want >= 0 and p.memory != "hbm"):
            role = f"kernel argument {want} (inputs, then outputs)" if want >= 0 else "an intermediate (arg_index -1)"
            raise AllocationError(
                f"allocation: buffer {name} is {role} but is placed in {p.memory} with arg_index {p.arg_index}; "
                f"allocate(tree, splits, machine) for this tree"
            )
        full = layouts[name].nbytes
        if p.memory == "hbm":
            if p.nbytes != full:
                raise AllocationError(
                    f"allocation: HBM buffer {name} is placed with {p.nbytes} bytes, but its device layout "
                    f"{list(layouts[name].device_size)} takes {full}; allocate(tree, splits, machine) for this tree"
                )
            if p.live[1] > p.live[0] and p.address + p.nbytes > alloc.hbm_bytes:
                raise AllocationError(
                    f"allocation: HBM buffer {name} at {p.address} + {p.nbytes} bytes ends past the allocation's "
                    f"{alloc.hbm_bytes} bytes of HBM"
                )
        elif p.address + p.nbytes > machine.lx_bytes:
            raise AllocationError(
                f"allocation: LX buffer {name} at {p.address} + {p.nbytes} bytes per core ends past the machine's "
                f"{machine.lx_bytes}-byte LX; allocate for this machine"
            )
    need: dict[str, tuple[int, OpNode]] = {}  # LX buffer -> (largest per-core box, the op using it)
    boxes: dict[tuple, int] = {}  # accesses of one shape share their boxes: each is swept once
    lx = {name for name, p in alloc.buffers.items() if p.memory == "lx"}
    walks: dict[str, list[_Walk]] = {}
    for node, chain in _chains(tree.body, ()):
        record = analysis.ops[node.name]
        shape: tuple | None = None  # the op's (symbols, slice extents), built at its first LX access
        for acc in record.tensors:
            if acc.buffer not in lx:
                continue
            walks.setdefault(acc.buffer, []).append((node.name, acc, chain, record.counts))
            if shape is None:
                op_split = plan.ops[node.name]
                shape = (tuple(d.symbol for d in record.dims),
                         tuple(op_split.extents(d.name, d.size) for d in record.dims))
            key = (acc.coords, acc.layout.device_size, acc.layout.elem_bytes, shape)
            got = boxes.get(key)
            if got is None:
                lows, highs = coord_bounds(acc.coords, *shape)
                _, extents = lx_box(lows, highs, acc.layout.device_size)
                got = boxes[key] = _align(int(box_bytes(extents, acc.layout.elem_bytes).max()), LX_ALIGN)
            if acc.buffer not in need or got > need[acc.buffer][0]:
                need[acc.buffer] = (got, node)
    for name, (got, node) in need.items():
        slots = _lx_slots(walks[name])
        if isinstance(slots, str):
            raise AllocationError(f"allocation: LX buffer {name}: {slots}; place it in HBM")
        counts, levels = slots
        held = alloc.buffers[name]
        want = got * math.prod(counts)
        if held.nbytes != want:
            raise AllocationError(
                f"allocation: LX buffer {name} is placed with {held.nbytes} bytes per core, but op "
                f"{node.name} uses {got} of it per core with splits {dict(plan.ops[node.name].splits)}"
                + (f", in {math.prod(counts)} slots" if counts else "")
                + "; allocate(tree, splits, machine) with this tree's split plan"
            )
        strides = [got * math.prod(counts[i + 1:]) for i in range(len(counts))]
        for (op, _, chain, _), own in zip(walks[name], levels):
            step = dict(zip(own, strides))
            expected = tuple(step.get(k, 0) for k in range(len(chain))) if counts else None
            if held.advances.get(op) != expected:
                raise AllocationError(
                    f"allocation: LX buffer {name} advances by {held.advances.get(op)} bytes per iteration in op "
                    f"{op}, but its slots ({list(counts)} of {got} bytes) need {expected}; "
                    f"allocate(tree, splits, machine) for this tree"
                )
    return alloc


def _chains(body: tuple[Node, ...], chain: tuple[int, ...], ids: list[int] | None = None):
    """``(op node, enclosing loop ids outermost first)`` in program order (loops numbered as
    ``allocate`` numbers them)."""
    ids = [0] if ids is None else ids
    for node in body:
        if isinstance(node, Loop):
            lid = ids[0]
            ids[0] += 1
            yield from _chains(node.body, chain + (lid,), ids)
        else:
            yield node, chain
