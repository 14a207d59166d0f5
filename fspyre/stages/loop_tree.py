"""Stage ``tile``: graph + TilingPlan -> LoopTree.

Each group of the plan becomes a nest of ``Loop`` nodes, outermost level first, with the
group's ops in the innermost body. A level of count ``c`` cuts its dim (the range left by the
outer levels) into tiles of ``ceil(E / c)``, rounded up to whole sticks of every full buffer
that advances along it (``_tile_sizes``); the loop runs the whole tiles and a peeled tail, a
copy of the level's body on the remainder, follows it (``_nest``; docs/tiling.md, "Tails").
An op's ``OpNode.tiling[L]`` records, per enclosing loop, the tile its dim moves per
iteration. Loads and stores keep the graph's full-buffer index for ``"full"`` buffers (the
program adds the loop advance; a tail's index starts at its offset); a ``"tile"`` buffer is
indexed with the tile's own contiguous index, and a tail uses part of it.

Loop-boundary buffers (docs/tiling.md):

- written and read only inside the group: a ``"tile"`` buffer of the per-tile shape, under the
  same name, at a fixed address;
- read after the group too, or a graph output: the full buffer, written tile by tile; when ops
  of the group read it as well, the producer writes ``<buf>_tile`` and a ``<buf>_copy`` op right
  after it copies the tile into the full buffer.

Tiled reductions (a level tiles a reduction dim): the op computes a per-tile partial into
``<buf>_part``, ``<op>_combine`` folds it into the accumulator ``<buf>_acc``, which
``<op>_fill`` sets to the identity before the first reduction level and ``<op>_finish`` copies
(mean: scales) into the output after it. Accumulators are float32 for float outputs and int32
otherwise. An output level nested inside the reduction level makes the accumulator span the
inner output tiles (a full buffer of the output's shape). var runs a nest computing the mean
before its reduction level, then sums squared deviations tile by tile. Ops of the group that
read a tiled reduction were moved to a later nest by the plan (loop fission); a plan that did
not do so is refused here.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import sympy

from fspyre.errors import TilingError
from fspyre.ir.dtypes import is_float
from fspyre.ir.graph import (
    Dim,
    Graph,
    Load,
    Op,
    Pointwise,
    Reduction,
    Scalar,
    Store,
    TensorType,
    iteration_dims,
    require_name,
    store_fault,
    sym,
)
from fspyre.ir.kinds import Scope
from fspyre.ir.looptree import (
    Loop,
    LoopTree,
    Node,
    OpNode,
    Peel,
    TileStep,
    TreeBuffer,
    carried_buffers,
    level_steps,
    op_nodes,
    walk,
)
from fspyre.ir.plans import Group, Level, TilingPlan
from fspyre.machine.formats import FORMATS
from fspyre.machine.numerics import compute_dtype
from fspyre.machine.spyre import Machine
from fspyre.stages.arguments import require, require_graph, verified
from fspyre.stages.online_softmax import Carried, OnlineOptions, OnlineSoftmax, match_online, online_amax, online_sum
from fspyre.stages.tiling_plan import verify_plan

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1

# Reduction -> (fn of the per-tile partial, combine fn, identity for float / int accumulators).
TILED_REDUCTIONS: Mapping[str, tuple[str, str, float, int]] = {
    "sum": ("sum", "add", 0.0, 0),
    "mean": ("sum", "add", 0.0, 0),
    "matmul": ("matmul", "add", 0.0, 0),
    "prod": ("prod", "mul", 1.0, 1),
    "amax": ("amax", "maximum", -math.inf, INT32_MIN),
    "amin": ("amin", "minimum", math.inf, INT32_MAX),
    # var's partial is the sum of squared deviations from the mean, computed in a first nest
    "var": ("sum", "add", 0.0, 0),
}


# Why each reduction missing from TILED_REDUCTIONS has no tile-by-tile form.
_UNTILED: Mapping[str, str] = {
    "gather": "each index is checked to name exactly one position of the whole range",
}


def tile(graph: Graph, plan: TilingPlan, online: OnlineOptions = OnlineOptions()) -> LoopTree:
    """``online``: whether a softmax tiled over its reduction dim becomes an online softmax."""
    graph = require_graph(graph, "tile")
    require(plan, TilingPlan, "tile", "plan")
    require(online, OnlineOptions, "tile", "online")
    verify_plan(graph, plan)
    ops = graph.op_table()
    group_of = {name: gi for gi, g in enumerate(plan.groups) for name in g.ops}
    first_of = {g.ops[0]: gi for gi, g in enumerate(plan.groups)}
    readers: dict[str, list[str]] = {}
    for op in graph.ops:
        for ld in op.loads:
            names = readers.setdefault(ld.buffer, [])
            if not names or names[-1] != op.name:
                names.append(op.name)
    ctx = _Context(
        graph=graph,
        buffers=graph.buffer_table(),
        ops=ops,
        group_of=group_of,
        readers=readers,
        outputs=frozenset(o.buffer for o in graph.outputs),
        regions=frozenset(b for b, k in Counter(op.store.buffer for op in graph.ops).items() if k > 1),
        taken=set(ops) | {b.name for b in graph.buffers},
        replaced={},
        extra={},
        online=online,
    )
    body: list[Node] = []
    warnings: list[str] = []
    for name in plan.order:
        if name in first_of:
            gi = first_of[name]
            body.extend(_tile_group(ctx, gi, plan.groups[gi], warnings))
        elif name not in group_of:
            body.append(OpNode(op=ops[name]))
    body = _own_tail_buffers(ctx, body)
    # a buffer an online softmax no longer writes (its max and sum live in accumulators)
    used = set(graph.inputs) | {o.buffer for o in graph.outputs} | {
        name for n in op_nodes(tuple(body)) for name in (n.op.store.buffer, *(ld.buffer for ld in n.op.loads))}
    buffers: list[TreeBuffer] = []
    for b in graph.buffers:
        if b.name in used:
            buffers.append(ctx.replaced.get(b.name) or TreeBuffer(name=b.name, type=b.type))
        buffers.extend(ctx.extra.get(b.name, ()))
    return verified(verify_loop_tree, LoopTree(
        name=graph.name, buffers=tuple(buffers), inputs=graph.inputs, outputs=graph.outputs, body=tuple(body),
        hints=graph.hints, warnings=tuple(warnings),
    ))


@dataclass(frozen=True, slots=True, kw_only=True)
class _Context:
    """Tables built once per ``tile`` call; ``taken``, ``replaced`` and ``extra`` collect the
    names and buffers the groups add (local to the call, never escaping it)."""

    graph: Graph
    buffers: Mapping
    ops: Mapping[str, Op]
    group_of: Mapping[str, int]
    readers: Mapping[str, list[str]]
    outputs: frozenset[str]
    regions: frozenset[str]  # buffers several ops write, each a region (GraphBuilder.concat)
    taken: set[str]
    replaced: dict[str, TreeBuffer]
    extra: dict[str, list[TreeBuffer]]
    online: OnlineOptions

    def is_full(self, buffer: str) -> bool:
        """A buffer addressed through the whole graph shape (moves with the loops): a graph
        buffer not replaced by its tile, or a helper of full scope (a spanning accumulator)."""
        if buffer in self.buffers:
            return buffer not in self.replaced
        return any(b.name == buffer and b.scope == "full" for bs in self.extra.values() for b in bs)

    def full_type(self, buffer: str) -> TensorType:
        if buffer in self.buffers:
            return self.buffers[buffer].type
        return next(b.type for bs in self.extra.values() for b in bs if b.name == buffer)

    def fresh(self, base: str) -> str:
        name, n = base, 1
        while name in self.taken:
            name, n = f"{base}{n}", n + 1
        self.taken.add(name)
        return name


@dataclass(frozen=True, slots=True, kw_only=True)
class _OpTiling:
    """How the levels of a group divide one op: ``per_level[L]`` is the dim level L tiles
    (None: invariant there), ``final`` the per-tile size of every iteration dim."""

    op: Op
    per_level: tuple[str | None, ...]
    final: Mapping[str, int]
    steps: tuple[tuple[TileStep, ...], ...]

    def extents(self, dim: str) -> tuple[int | None, ...]:
        """Elements ``dim`` moves per iteration of each level (None where it does not move)."""
        return tuple(next((s.extent for s in lv if s.dim == dim), None) for lv in self.steps)

    def out_steps(self) -> tuple[tuple[TileStep, ...], ...]:
        names = {d.name for d in self.op.ranges}
        return tuple(tuple(s for s in lv if s.dim in names) for lv in self.steps)

    def dims(self, dims: Sequence[Dim]) -> tuple[Dim, ...]:
        return tuple(Dim(d.name, self.final[d.name]) for d in dims)


def _where(k: int, level: Level) -> str:
    return f"level {k} ({level.source})" if level.source else f"level {k}"


def _levels_of(op: Op, levels: Sequence[Level]) -> tuple[str | None, ...]:
    """The dim each level tiles in ``op`` (None: invariant there), after refusing a level that
    names a dim the op lacks or tiles two of its dims."""
    size = {d.name: d.size for d in iteration_dims(op)}
    reduced = {d.name for d in op.reduction_ranges}
    per_level: list[str | None] = []
    for k, lv in enumerate(levels):
        dims = lv.tiled_dims(op)
        for d in dims:
            if d not in size:
                raise TilingError(
                    f"op {op.name}: {_where(k, lv)} tiles dim {d}, which the op does not iterate "
                    f"(its dims are {[x.name for x in iteration_dims(op)]})"
                )
        if len(dims) > 1:
            red = [d for d in dims if d in reduced]
            out = [d for d in dims if d not in reduced]
            if red and out:
                raise TilingError(
                    f"op {op.name} ({op.fn} over {[d.name for d in op.reduction_ranges]}): {_where(k, lv)} tiles "
                    f"output dim {out[0]} and reduction dim {red[0]} at once; one loop level may tile an op's output "
                    f"dims or its reduction dims, not both. Tile them at two levels (nested hint scopes)."
                )
            raise TilingError(
                f"op {op.name}: {_where(k, lv)} tiles dims {list(dims)} at once; one counted loop advances all of "
                f"them together and would only visit the diagonal tiles. Tile them at separate levels "
                f"(nested scopes, or slices={{{dims[0]!r}: ..., {dims[1]!r}: ...}} for nested loops)."
            )
        per_level.append(dims[0] if dims else None)
    return tuple(per_level)


def _analyse(op: Op, per_level: tuple[str | None, ...], tiles: Mapping[tuple[int, str], int]) -> _OpTiling:
    """``op``'s main-path tiling: every tiled dim's per-tile size is the tile of the innermost
    level tiling it, and each level moves its dim by that level's tile."""
    final = {d.name: d.size for d in iteration_dims(op)}
    steps: list[tuple[TileStep, ...]] = []
    for k, tiled in enumerate(per_level):
        if tiled is None:
            steps.append(())
            continue
        final[tiled] = tiles[k, tiled]
        steps.append((TileStep(dim=tiled, extent=tiles[k, tiled]),))
    return _OpTiling(op=op, per_level=per_level, final=final, steps=tuple(steps))


def _full_accesses(ctx: _Context, gi: int, group: Group,
                   per_level: Mapping[str, tuple[str | None, ...]]) -> dict[str, list[tuple[str, sympy.Expr]]]:
    """Per op of ``group``, the full buffers it reads or writes, with their indices: the ones
    whose tiles advance through memory (a buffer the group both writes and reads is read as a
    per-tile buffer; one read only inside the group is one)."""
    cross = _crossing(ctx, gi, group)
    produced = {ctx.ops[n].store.buffer for n in group.ops} - cross
    out: dict[str, list[tuple[str, sympy.Expr]]] = {}
    for name in group.ops:
        op = ctx.ops[name]
        found = [(ld.buffer, ld.index) for ld in op.loads if ld.buffer not in produced]
        buf = op.store.buffer
        # a reduction whose accumulator spans inner output tiles writes its output as a full buffer
        spans = isinstance(op, Reduction) and any(
            d not in {x.name for x in op.reduction_ranges} for d in per_level[name][1:] if d is not None
        ) and any(d in {x.name for x in op.reduction_ranges} for d in per_level[name] if d is not None)
        if (spans or buf in ctx.outputs or buf in cross
                or any(ctx.group_of.get(rd) != gi for rd in ctx.readers.get(buf, ()))):
            found.append((buf, op.store.index))
        out[name] = found
    return out


def _crossing(ctx: _Context, gi: int, group: Group) -> set[str]:
    """Buffers an op of ``group`` writes that an op of the group at another depth reads: an
    outer op's result read tile by tile inside the inner loops, or an inner result read whole
    after them. A per-tile buffer never advances, so these stay full buffers."""
    out = set()
    for name in group.ops:
        buf = ctx.ops[name].store.buffer
        if any(ctx.group_of.get(rd) == gi and group.depth(rd) != group.depth(name) for rd in ctx.readers.get(buf, ())):
            out.add(buf)
    return out


def _stick_tile(ctx: _Context, d: str, t0: int, extent: int,
                accesses: Sequence[tuple[str, sympy.Expr, Mapping[str, int]]]) -> tuple[int, str]:
    """The smallest tile of ``d`` from ``t0`` up whose tiles of every full buffer in
    ``accesses`` (buffer, index, the op's per-tile sizes) advance by whole device sticks, and
    why it grew (empty if it did not). When no tile short of ``extent`` does, the whole range:
    the level makes no loop.

    In the default layout the last host dim of ``n`` elements is cut into sticks of ``eps``: a
    step of ``T`` along ``d`` moves ``coef * T`` host elements, ``coef * T % n`` of them along
    the stick dim, which must be whole sticks (a cheap test run first); ``_stick_fault`` then
    judges the whole tile, tail included, as ``_check_stick_steps`` will."""
    conds = []
    for buffer, index, sizes in accesses:
        btype = ctx.buffers[buffer].type
        n_last = btype.shape[-1] if btype.shape else 1
        coef = sympy.expand(index).coeff(sym(d))
        if n_last > 1 and coef != 0:
            conds.append((int(coef) if coef.is_Integer else 0, n_last, elems_per_stick(btype.dtype), buffer, btype,
                          index, sizes))

    def fault(tile: int) -> str | None:
        for coef, n_last, eps, buffer, btype, index, sizes in conds:
            if coef and coef * tile % n_last % eps:
                return (f"move {buffer} ({btype}) by {coef * tile % n_last} elements along its {eps}-element sticks, "
                        f"not whole sticks")
            main, rem = divmod(extent, tile)
            why = _stick_fault(index, {**sizes, d: tile}, [(d, tile, main)], n_last, eps)
            if why is None and rem:  # the tail: its own size, once moved past the whole tiles
                why = _stick_fault(index, {**sizes, d: rem}, [(d, main * tile, 2)], n_last, eps)
            if why is not None:
                return f"give tiles of {buffer} ({btype}) that {why}"
        return None

    first = fault(t0) if t0 < extent else None
    if first is None and t0 < extent:
        return t0, ""
    why = f"a tile of {t0} would {first}" if first else f"{extent} elements cannot be split further"
    for tile in range(t0 + 1, extent):
        if fault(tile) is None:
            return tile, f"{why}, so the tile is rounded up to {tile}"
    return extent, f"{why}, and no larger tile below {extent} is whole sticks, so the level makes no loop"


def _tile_sizes(ctx: _Context, gi: int, group: Group, per_level: Mapping[str, tuple[str | None, ...]],
                warnings: list[str]) -> dict[tuple[int, str], int]:
    """The tile of each (level, dim) of ``group``: a level of count ``c`` on ``E`` elements (the
    dim's range, or the tile of the nearest outer level on the same dim) takes tiles of
    ``ceil(E / c)``, rounded up to whole sticks of every full buffer that advances along the
    dim (up to ``E`` itself, when no smaller tile is whole sticks: then the level makes no
    loop); the loop runs ``E // tile`` whole tiles and a peeled tail takes the ``E % tile``
    left (docs/tiling.md, "Tails"). A tiling whose iteration count differs from the hinted
    count is reported in ``warnings``."""
    levels = group.levels
    accesses = _full_accesses(ctx, gi, group, per_level)
    size: dict[str, int] = {}
    for name in group.ops:
        for x in iteration_dims(ctx.ops[name]):
            if x.name in per_level[name]:
                size.setdefault(x.name, x.size)
    tiles: dict[tuple[int, str], int] = {}
    for k, lv in enumerate(levels):
        by_dim: dict[str, list[str]] = {}
        for name in group.ops:
            tiled = per_level[name][k]
            if tiled is not None:
                by_dim.setdefault(tiled, []).append(name)
        for d, names in by_dim.items():
            outer = [j for j in range(k) if (j, d) in tiles]
            extent = tiles[outer[-1], d] if outer else size[d]
            after = f" of {size[d]} after the outer levels" if outer else ""
            count = lv.count
            found = []
            for n in names:
                sizes = {x.name: x.size for x in iteration_dims(ctx.ops[n])}
                for j in range(k):  # the op's tiles after the outer levels
                    dj = per_level[n][j]
                    if dj is not None:
                        sizes[dj] = tiles[j, dj]
                found += [(b, index, sizes) for b, index in accesses[n]]
            tile, why = _stick_tile(ctx, d, -(-extent // count), extent, found)
            main, rem = divmod(extent, tile)
            used = main + (rem > 0)
            if used != count:
                reason = why or f"tiles of ceil({extent}/{count}) = {tile} elements cover {extent} in {used}"
                shape = f"in {main} tile{'s' if main > 1 else ''} of {tile}" + (f" and a tail of {rem}" if rem else "")
                fix = f"Hint count {used} to silence this." if used > 1 else "Remove the level to silence this."
                warnings.append(
                    f"op {names[0]}: {_where(k, lv)} tiles dim {d} (range {extent}{after}) {shape}: {used} "
                    f"iteration{'s' if used > 1 else ''} instead of the hinted {count}, because {reason}. {fix}"
                )
            tiles[k, d] = tile
    return tiles


def _check_reduction(ctx: _Context, gi: int, op: Op, per_level: tuple[str | None, ...], levels: Sequence[Level],
                     members: set[str], online: bool = False) -> int | None:
    """The outermost level tiling a reduction dim of ``op`` (None if none does), after
    refusing what fspyre cannot tile correctly. ``online``: the op's max or sum is carried
    by an online softmax (``fspyre.stages.online_softmax``), so its readers in the group
    read the running value as the recurrence intends."""
    if not isinstance(op, Reduction):
        return None
    reduced = {d.name for d in op.reduction_ranges}
    red_levels = [k for k, d in enumerate(per_level) if d in reduced]
    if not red_levels:
        return None
    r = red_levels[0]
    where = _where(r, levels[r])
    over = [d.name for d in op.reduction_ranges]
    if op.fn not in TILED_REDUCTIONS:
        raise TilingError(
            f"op {op.name} ({op.fn} over {over}): {where} tiles its reduction dim {per_level[r]}, but {op.fn} has no "
            f"tile-by-tile combine ({_UNTILED[op.fn]}). Tile another dim of {op.name}."
        )
    for k in range(r + 1, len(levels)):
        d = per_level[k]
        if d is None:
            raise TilingError(
                f"op {op.name} ({op.fn} over {over}): {_where(k, levels[k])} tiles no dim of {op.name} but runs inside "
                f"{where}, which tiles its reduction dim {per_level[r]}; each partial {op.fn} would be folded "
                f"into the accumulator {levels[k].count} times. Tile a dim of {op.name} at that level too, or "
                f"put the reduction in a group of its own."
            )
    for reader in () if online else ctx.readers.get(op.store.buffer, ()):
        if reader in members:
            raise TilingError(
                f"op {reader} reads {op.store.buffer}, the {op.fn} of op {op.name}, inside the same loop nest (group "
                f"{gi}), but {where} tiles the reduction dim {per_level[r]}, so {op.store.buffer} is complete only "
                f"after that loop ends. plan_tiling and plan_groups split such a group into loop nests "
                f"(fspyre.stages.tiling_plan.split_at_tiled_reductions), unless it is a softmax, log-softmax or "
                f"attention that fspyre.stages.online_softmax rewrites; pass this plan through it, or end the "
                f"group before {reader}."
            )
    return r


# -- index helpers ---------------------------------------------------------------------------
def dim_vars(index: sympy.Expr, btype: TensorType, sizes: Mapping[str, int]) -> list[sympy.Symbol | None] | None:
    """The iteration variable addressing each dim of a contiguous buffer through ``index``
    (None for a dim not walked), or None when ``index`` is not one variable per dim."""
    strides = btype.strides()
    by_stride = {st: j for j, (st, d) in enumerate(zip(strides, btype.dims)) if d.size > 1}
    out: list[sympy.Symbol | None] = [None] * len(btype.dims)
    for term in sympy.Add.make_args(sympy.expand(index)):
        if term == 0:
            continue
        coef, var = term.as_coeff_Mul()
        if not coef.is_Integer or not var.is_Symbol:
            return None
        j = by_stride.get(int(coef))
        if j is None or out[j] is not None or sizes.get(var.name, 0) > btype.dims[j].size:
            return None
        out[j] = var
    return out


def _index(btype: TensorType, vars_: Sequence[sympy.Symbol | None]) -> sympy.Expr:
    return sympy.Add(*(st * v for st, v, d in zip(btype.strides(), vars_, btype.dims) if v is not None and d.size > 1))


@dataclass(frozen=True, slots=True, kw_only=True)
class _TileBuffer:
    """A per-tile buffer inside a group: its name and type, the producer's tiling and the
    producer variable of each of its dims."""

    name: str
    type: TensorType
    producer: _OpTiling
    vars: tuple[sympy.Symbol | None, ...]


def _tile_type(ctx: _Context, t: _OpTiling) -> tuple[TensorType, list[sympy.Symbol | None]]:
    op = t.op
    full = ctx.buffers[op.store.buffer].type
    sizes = {d.name: d.size for d in iteration_dims(op)}
    vars_ = dim_vars(op.store.index, full, sizes)
    if vars_ is None:
        if any(t.steps):
            raise TilingError(
                f"op {op.name} writes {op.store.buffer} through index {op.store.index}, which is not one iteration "
                f"variable per dim of {full}; fspyre cannot give it a per-tile buffer. Keep {op.name} outside the "
                f"hint scope."
            )
        return full, []
    dims = tuple(Dim(d.name, t.final[v.name]) if v is not None else d for d, v in zip(full.dims, vars_))
    return TensorType(dims=dims, dtype=full.dtype), vars_


def _read_tile(ctx: _Context, reader: _OpTiling, load: Load, tb: _TileBuffer, levels: Sequence[Level]) -> Load:
    """``load`` rewritten to read the tile buffer, after checking that ``reader`` walks the
    producer's tiles in lockstep (same per-tile extent, same advance at every level)."""
    full = ctx.buffers[load.buffer].type
    if not tb.vars:  # the producer is not tiled: its tile is the whole buffer, same index
        return Load(buffer=tb.name, index=load.index)
    sizes = {d.name: d.size for d in iteration_dims(reader.op)}
    vars_ = dim_vars(load.index, full, sizes)
    producer = tb.producer.op.name
    if vars_ is None:
        raise TilingError(
            f"op {reader.op.name} reads {load.buffer} (written by {producer} in the same loop nest) through index "
            f"{load.index}, which is not one iteration variable per dim of {full}, so it cannot read a per-tile "
            f"buffer. Move {reader.op.name} out of the hint scope."
        )
    for dim, pv, rv in zip(full.dims, tb.vars, vars_):
        if pv is None:
            continue
        want = (tb.producer.final[pv.name], tb.producer.extents(pv.name))
        have: tuple[int, tuple[int | None, ...]]
        if rv is None:  # the reader stays at coordinate 0: fine while the producer does not tile the dim
            have = (1, (None,) * len(levels))
            if not any(want[1]):
                continue
        else:
            have = (reader.final[rv.name], reader.extents(rv.name))
        if want != have:
            raise TilingError(
                f"op {reader.op.name} reads {load.buffer} along dim {dim.name} in tiles of {have[0]} moving "
                f"{_moves(have[1])}, but {producer}, in the same loop nest, writes it in tiles of {want[0]} moving "
                f"{_moves(want[1])}; a per-tile buffer serves only readers that walk the producer's tiles. Tile "
                f"both ops' dims alike, or move {reader.op.name} out of the hint scope."
            )
    return Load(buffer=tb.name, index=_index(tb.type, vars_))


def _moves(extents: Sequence[int | None]) -> str:
    return "[" + ", ".join(f"L{k}: {'-' if e is None else e}" for k, e in enumerate(extents)) + "]"


# -- one group -------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class _Item:
    """An op of a group as its main path runs it (main-tile ranges, graph indices into full
    buffers), ``steps[L]`` its move at each level, ``tiled`` the dims it tiles: ``_place``
    makes it an ``OpNode`` at any point of the nest, main loop or peeled tail."""

    op: Op
    steps: tuple[tuple[TileStep, ...], ...]
    tiled: frozenset[str]


@dataclass(frozen=True, slots=True, kw_only=True)
class _SubNest:
    """A pass of its own over the levels from the one it is placed at inwards (var's mean, an
    online softmax's normalising pass): ``fill``, the loops of ``body`` with their tails,
    ``finish``."""

    fill: tuple[_Item, ...]
    body: tuple[_Item, ...]
    finish: tuple[_Item, ...]


def _tile_group(ctx: _Context, gi: int, group: Group, warnings: list[str]) -> tuple[Node, ...]:
    levels = group.levels
    members = set(group.ops)
    depth = {name: group.depth(name) for name in group.ops}
    # an op of an outer scope runs under the outer levels only: invariant at none of the others
    per_level = {name: _levels_of(ctx.ops[name], levels[:depth[name]]) + (None,) * (len(levels) - depth[name])
                 for name in group.ops}
    # the online rewrite matches a softmax whose ops share every level
    online = None if group.depths else match_online([ctx.ops[name] for name in group.ops], per_level, ctx.readers,
                                                    ctx.outputs, ctx.online)
    if online is not None:
        chain = (online.amax, online.shift, online.exp, online.sum)
        odd = [n for n in chain if not is_float(ctx.buffers[ctx.ops[n].store.buffer].type.dtype)]
        if odd:  # the recurrence keeps its running max and sum in float32: a softmax of floats only
            raise TilingError(f"{_where(0, levels[0])}: the softmax of ops {list(chain)} tiled over its reduction "
                              f"dim {online.dim} stores {ctx.buffers[ctx.ops[odd[0]].store.buffer].type} in op "
                              f"{odd[0]}; the online rewrite computes a softmax of floats: do not tile {online.dim}")
    recurrence = _Recurrence(online) if online is not None else None
    reduced_at = {name: _check_reduction(ctx, gi, ctx.ops[name], per_level[name][:depth[name]], levels[:depth[name]],
                                         members,
                                         online=recurrence is not None and recurrence.role(name) in ("amax", "sum"))
                  for name in group.ops}
    cross = _crossing(ctx, gi, group)
    first_inner = next(i for i, name in enumerate(group.ops) if depth[name] == len(levels))
    sizes = _tile_sizes(ctx, gi, group, per_level, warnings)
    tilings = [_analyse(ctx.ops[name], per_level[name], sizes) for name in group.ops]
    tiles: dict[str, _TileBuffer] = {}  # graph buffer -> the tile its in-group readers read
    inner: list[_Item] = []
    fills: list[list[_Item | _SubNest]] = [[] for _ in levels]
    finishes: list[list[_Item | _SubNest]] = [[] for _ in levels]
    for t in tilings:
        op = t.op
        tiled = frozenset(d for d in t.per_level if d is not None)
        role = recurrence.role(op.name) if recurrence else None
        r = reduced_at[op.name]
        if role == "div":  # attention: e / l is folded into the finish, and its readers read e
            tiles[op.store.buffer] = tiles[ctx.ops[online.exp].store.buffer]  # type: ignore[union-attr]
            continue
        loads = {}
        for ld in op.loads:
            if ld.buffer in tiles and ld not in loads:
                loads[ld] = _read_tile(ctx, t, ld, tiles[ld.buffer], levels)
        operands = tuple(loads.get(o, o) if isinstance(o, Load) else o for o in op.operands)
        per_tile: Op
        if isinstance(op, Reduction):
            per_tile = replace(op, operands=operands, ranges=t.dims(op.ranges),  # type: ignore[arg-type]
                               reduction_ranges=t.dims(op.reduction_ranges))
        else:
            per_tile = replace(op, operands=operands, ranges=t.dims(op.ranges))
        out = op.store.buffer
        inside = out not in cross and any(ctx.group_of.get(rd) == gi for rd in ctx.readers.get(out, ()))
        # a buffer of several regions is whole only after its last writer: never a per-tile buffer
        outside = out in ctx.outputs or out in cross or out in ctx.regions or any(ctx.group_of.get(rd) != gi
                                                             for rd in ctx.readers.get(out, ()))
        store = op.store
        if r is not None and _spans_output_tiles(t, r):
            outside = True  # its finish writes a level-r tile, larger than a per-tile buffer
        if not outside:
            tile_type, vars_ = _tile_type(ctx, t)
            ctx.replaced[out] = TreeBuffer(name=out, type=tile_type, scope="tile")
            if vars_:
                store = Store(buffer=out, index=_index(tile_type, vars_))
            tiles[out] = _TileBuffer(name=out, type=tile_type, producer=t, vars=tuple(vars_))
        if r is not None and op.fn == "var" and loads:
            (ld,) = loads
            raise TilingError(
                f"op {op.name} (var over {[d.name for d in op.reduction_ranges]}): {_where(r, levels[r])} tiles its "
                f"reduction dim {t.per_level[r]}, so it reads {ld.buffer} twice, for the mean and for the "
                f"deviations, but {tiles[ld.buffer].producer.op.name} writes {ld.buffer} tile by tile in the same "
                f"loop nest. plan_tiling and plan_groups put such producers in an earlier loop nest "
                f"(fspyre.stages.tiling_plan.split_at_tiled_reductions); pass this plan through it."
            )
        target = inner if recurrence is None else recurrence.nodes_for(role, inner)
        if depth[op.name] < len(levels):  # an outer op: in level depth - 1's body, around the inner loops
            d = depth[op.name]
            target = fills[d] if group.ops.index(op.name) < first_inner else finishes[d]  # type: ignore[assignment]
        if r is not None:
            assert isinstance(per_tile, Reduction)
            if recurrence is not None and role in ("amax", "sum", "matmul"):
                inner.extend(recurrence.step(ctx, t, tiled, per_tile, store, r, role, tiles, fills, finishes))
            else:
                target.extend(_tiled_reduction(ctx, t, tiled, per_tile, store, r, fills, finishes))
            continue
        if outside and inside:
            tile_type, vars_ = _tile_type(ctx, t)
            name = ctx.fresh(f"{out}_tile")
            ctx.extra.setdefault(out, []).append(TreeBuffer(name=name, type=tile_type, scope="tile"))
            index = _index(tile_type, vars_) if vars_ else op.store.index
            tiles[out] = _TileBuffer(name=name, type=tile_type, producer=t, vars=tuple(vars_))
            target.append(_Item(op=replace(per_tile, store=Store(buffer=name, index=index)), steps=t.steps,
                                tiled=tiled))
            copy = Pointwise(
                name=ctx.fresh(f"{out}_copy"), fn="copy", operands=(Load(buffer=name, index=index),),
                ranges=t.dims(op.ranges), store=op.store, hints=op.hints,
            )
            target.append(_Item(op=copy, steps=t.out_steps(), tiled=tiled))
        else:
            target.append(_Item(op=replace(per_tile, store=store), steps=t.steps, tiled=tiled))
    if recurrence is not None and online.two_pass:  # type: ignore[union-attr]
        recurrence.second_pass(ctx, inner, finishes)
    extents = {d: next(x.size for n in group.ops if d in per_level[n] for x in iteration_dims(ctx.ops[n])
                       if x.name == d) for (_, d) in sizes}
    return tuple(_nest(ctx, levels, sizes, inner, fills, finishes, 0, extents, {}, (), ()))


def _nest(ctx: _Context, levels: Sequence[Level], sizes: Mapping[tuple[int, str], int], inner: Sequence[_Item],
          fills: Sequence[Sequence[_Item | _SubNest]], finishes: Sequence[Sequence[_Item | _SubNest]], k: int,
          extents: Mapping[str, int],
          offsets: Mapping[str, int], loops: tuple[tuple[int, int], ...], peeled: tuple[Peel, ...]) -> list[Node]:
    """The nodes of levels ``k`` and inwards on one path of the nest: ``extents`` are the
    elements of each tiled dim this path covers, starting at ``offsets``; ``loops`` the
    (level, count) of the enclosing loops; ``peeled`` the tails the path runs in.

    Level ``k`` runs ``extent // tile`` whole tiles as a loop (one tile runs in place, without
    a loop), then, when elements are left, the same levels inwards once more on the remainder:
    the peeled tail (docs/tiling.md, "Tails")."""
    def place(items: Sequence[_Item | _SubNest]) -> list[Node]:
        out: list[Node] = []
        for it in items:
            if isinstance(it, _SubNest):  # its own pass over levels k inwards, from this path's tile
                only = [list(it.fill) if j == k else [] for j in range(len(levels))]
                last = [list(it.finish) if j == k else [] for j in range(len(levels))]
                out.extend(_nest(ctx, levels, sizes, it.body, only, last, k, extents, offsets, loops, peeled))
            else:
                out.append(_place(ctx, it, extents, offsets, loops, peeled, levels))
        return out

    if k == len(levels):
        return place(inner)
    dims = sorted(d for (j, d) in sizes if j == k)
    whole = {d: divmod(extents[d], sizes[k, d]) for d in dims}
    if len({(m, r > 0) for m, r in whole.values()}) > 1:
        shown = ", ".join(f"{d} ({extents[d]} in tiles of {sizes[k, d]})" for d in dims)
        raise TilingError(
            f"{_where(k, levels[k])} tiles {shown}, which leave different numbers of whole tiles or tails; one "
            f"loop cannot peel them all. Give each dim a count that divides it."
        )
    # a level naming only dims no op of the group iterates moves nothing: it runs in place
    main = next(iter(whole.values()))[0] if whole else 1
    out = place(fills[k])
    tiled = {**extents, **{d: sizes[k, d] for d in dims}}
    if main == 1:  # one whole tile runs once, in place: no loop of one iteration
        out.extend(_nest(ctx, levels, sizes, inner, fills, finishes, k + 1, tiled, offsets, loops, peeled))
    elif main:
        body = _nest(ctx, levels, sizes, inner, fills, finishes, k + 1, tiled, offsets, loops + ((k, main),), peeled)
        out.append(Loop(count=main, steps=level_steps(tuple(body), len(loops)), body=tuple(body),
                        carried=carried_buffers(tuple(body), len(loops), _full_names(ctx))))
    if any(r for _, r in whole.values()):
        start = {d: offsets.get(d, 0) + main * sizes[k, d] for d in dims}
        out.extend(_nest(ctx, levels, sizes, inner, fills, finishes, k + 1,
                         {**extents, **{d: whole[d][1] for d in dims}}, {**offsets, **start}, loops,
                         peeled + tuple(Peel(dim=d, start=start[d]) for d in dims)))
    out.extend(place(finishes[k]))
    return out


def _place(ctx: _Context, it: _Item, extents: Mapping[str, int], offsets: Mapping[str, int],
           loops: tuple[tuple[int, int], ...], peeled: tuple[Peel, ...], levels: Sequence[Level]) -> OpNode:
    """``it`` on one path of the nest: its tiled dims take the path's extents, its full-buffer
    indices start at the path's offsets (per-tile buffers stay at their fixed address, a tail
    using part of the tile), and a tail copy gets a name of its own."""
    op = it.op
    shift = {sym(d): sym(d) + offsets[d] for d in it.tiled if offsets.get(d)}

    def moved(buffer: str, index: sympy.Expr) -> sympy.Expr:
        return sympy.expand(index.subs(shift)) if shift and ctx.is_full(buffer) else index

    def resized(dims: tuple[Dim, ...]) -> tuple[Dim, ...]:
        return tuple(Dim(d.name, extents[d.name]) if d.name in it.tiled else d for d in dims)

    fields: dict[str, object] = {
        "operands": tuple(Load(buffer=o.buffer, index=moved(o.buffer, o.index)) if isinstance(o, Load) else o
                          for o in op.operands),
        "ranges": resized(op.ranges),
        "store": Store(buffer=op.store.buffer, index=moved(op.store.buffer, op.store.index)),
    }
    if isinstance(op, Reduction):
        fields["reduction_ranges"] = resized(op.reduction_ranges)
    if peeled:
        fields["name"] = ctx.fresh(f"{op.name}_tail")
    node = OpNode(op=replace(op, **fields), tiling=tuple(it.steps[j] for j, _ in loops),  # type: ignore[arg-type]
                  origin=op.name if peeled else "", peeled=peeled)
    _check_stick_steps(ctx, node, loops, levels)
    return node


def _own_tail_buffers(ctx: _Context, body: list[Node]) -> list[Node]:
    """A peeled tail writes and reads its own copy of a per-tile buffer when no value crosses
    between it and the main body: its uses of the buffer run back to back, start with a write,
    and the next use after them (in program order, and at the head of every loop around them)
    is a write. The tail's ops are split across cores for the remainder, so their per-core
    boxes differ from the main tile's; sharing one name would make the allocator refuse LX
    for the buffer in the main loop too (docs/tiling.md, "Tails")."""
    tiles = {b.name: (owner, b) for owner, b in ctx.replaced.items() if b.scope == "tile"}
    tiles.update((b.name, (owner, b)) for owner, bs in ctx.extra.items() for b in bs if b.scope == "tile")
    uses: dict[str, list[tuple[bool, OpNode, tuple[int, ...]]]] = {}  # (writes, op, enclosing loop ids)
    loops = 0

    def visit(nodes: Sequence[Node], chain: tuple[int, ...]) -> None:
        nonlocal loops
        for node in nodes:
            if isinstance(node, Loop):
                loops += 1
                visit(node.body, chain + (loops,))
                continue
            for b in dict.fromkeys(ld.buffer for ld in node.op.loads):
                if b in tiles:
                    uses.setdefault(b, []).append((False, node, chain))
            if node.op.store.buffer in tiles:
                uses.setdefault(node.op.store.buffer, []).append((True, node, chain))

    visit(body, ())
    renames: dict[str, dict[str, str]] = {}  # op -> {buffer: the tail's own}
    for b, us in uses.items():
        head: dict[int, bool] = {}  # loop id -> whether the buffer's first use inside it writes
        for writes, _, chain in us:
            for lid in chain:
                head.setdefault(lid, writes)
        start = 0
        while start < len(us):
            end = start
            while end + 1 < len(us) and us[end + 1][1].peeled == us[start][1].peeled:
                end += 1
            writes, node, _ = us[start]
            if (node.peeled and writes and (end + 1 == len(us) or us[end + 1][0])
                    and all(head[lid] for lid in us[end][2])):
                owner, buffer = tiles[b]
                own = ctx.fresh(f"{b}_peeled")
                ctx.extra.setdefault(owner, []).append(TreeBuffer(name=own, type=buffer.type, scope="tile"))
                for _, n, _ in us[start:end + 1]:
                    renames.setdefault(n.name, {})[b] = own
            start = end + 1
    if not renames:
        return body
    full = _full_names(ctx)

    def rename(nodes: Sequence[Node], depth: int) -> list[Node]:
        out: list[Node] = []
        for node in nodes:
            if isinstance(node, Loop):
                inner = tuple(rename(node.body, depth + 1))
                out.append(replace(node, body=inner, carried=carried_buffers(inner, depth, full)))
            elif node.name in renames:
                names = renames[node.name]
                op = node.op
                fields: dict[str, object] = {
                    "operands": tuple(replace(o, buffer=names.get(o.buffer, o.buffer)) if isinstance(o, Load) else o
                                      for o in op.operands),
                    "store": replace(op.store, buffer=names.get(op.store.buffer, op.store.buffer)),
                }
                out.append(replace(node, op=replace(op, **fields)))  # type: ignore[arg-type]
            else:
                out.append(node)
        return out

    return rename(body, 0)


def _full_names(ctx: _Context) -> set[str]:
    """The buffers made so far that are full (addressed with the loops' advance)."""
    return ({name for name in ctx.buffers if name not in ctx.replaced}
            | {b.name for bs in ctx.extra.values() for b in bs if b.scope == "full"})


class _Recurrence:
    """The online softmax of one group while ``_tile_group`` builds it (scratch state local
    to one call): which role each op plays, the carried buffers made so far, and the ops of
    the second loop and of the gap between the loops."""

    def __init__(self, online: OnlineSoftmax) -> None:
        self.online = online
        self.roles = {online.amax: "amax", online.shift: "shift", online.exp: "exp", online.sum: "sum"}
        if online.div is not None and online.matmul is not None:
            self.roles |= {online.div: "div", online.matmul: "matmul"}
        self.roles |= {name: "second" for name in online.second} | {name: "between" for name in online.between}
        self.second: list[_Item] = []
        self.between: list[_Item] = []
        self.carried: dict[str, Carried] = {}  # "amax" (the running max), "alpha", "sum"
        self.level: int | None = None

    def role(self, name: str) -> str | None:
        return self.roles.get(name)

    def nodes_for(self, role: str | None, inner: list[_Item]) -> list[_Item]:
        """Where the nodes of an op with ``role`` go: the second loop, the gap, or ``inner``."""
        return self.second if role == "second" else self.between if role == "between" else inner

    def step(self, ctx: _Context, t: _OpTiling, tiled: frozenset[str], per_tile: Reduction, store: Store, r: int,
             role: str, tiles: dict[str, _TileBuffer], fills: list[list[_Item | _SubNest]],
             finishes: list[list[_Item | _SubNest]]) -> list[_Item]:
        out = t.op.store.buffer
        if role == "matmul":
            acc_type = TensorType(dims=t.dims(t.op.ranges), dtype="float32")
            acc = Carried(name=ctx.fresh(f"{out}_acc"), type=acc_type, index=acc_type.contiguous_index())
            total = self.carried["sum"]

            def finish(acc_load: Load) -> Op:
                return Pointwise(name=ctx.fresh(f"{t.op.name}_finish"), fn="div",
                                 operands=(acc_load, Load(buffer=total.name, index=total.index)),
                                 ranges=acc_type.dims, store=store, hints=t.op.hints)

            nodes = online_sum(per_tile, t.steps, t.out_steps(), r, acc, self.carried["alpha"], ctx.fresh, finish)
        else:
            tile_type = tiles[out].type
            acc = Carried(name=ctx.fresh(f"{out}_acc"), type=replace(tile_type, dtype="float32"), index=store.index)
            del ctx.replaced[out]  # readers read the accumulator; the graph's buffer is never written
            if role == "amax":
                self.level = r
                nodes, self.carried["alpha"] = online_amax(per_tile, t.steps, t.out_steps(), r, acc, ctx.fresh)
                self.carried["amax"] = acc
            else:
                nodes = online_sum(per_tile, t.steps, t.out_steps(), r, acc, self.carried["alpha"], ctx.fresh)
                self.carried["sum"] = acc
            tiles[out] = replace(tiles[out], name=acc.name, type=acc.type)
        ctx.extra.setdefault(out, []).extend(nodes.buffers)

        def items(made: Sequence[OpNode]) -> list[_Item]:
            return [_Item(op=n.op, steps=n.tiling, tiled=tiled) for n in made]

        fills[r].extend(items(nodes.fill))
        finishes[r].extend(items(nodes.finish))
        return items(nodes.body)

    def second_pass(self, ctx: _Context, inner: Sequence[_Item], finishes: list[list[_Item | _SubNest]]) -> None:
        """The ops that need the final max and sum: those iterating the tiled dim in a second
        pass over the same levels (after recomputing what they read), tails included; the
        others between the passes."""
        r = self.level
        assert r is not None
        again = set(self.online.again)
        body = tuple(replace(it, op=replace(it.op, name=ctx.fresh(f"{it.op.name}_again")))
                     for it in inner if it.op.name in again) + tuple(self.second)
        finishes[r].extend(replace(it, steps=it.steps[:r]) for it in self.between)
        finishes[r].append(_SubNest(fill=(), body=body, finish=()))



# -- whole-stick tiles -----------------------------------------------------------------------
def elems_per_stick(dtype: str) -> int:
    """Elements of ``dtype`` in one 128-byte device stick (every fp16 format is 2 bytes, so the
    machine's choice of format does not change it)."""
    return FORMATS[Machine().device_format(dtype)].elems_per_stick


def _stick_fault(index: sympy.Expr, sizes: Mapping[str, int], moves: Sequence[tuple[str, int, int]],
                 n_last: int, eps: int) -> str | None:
    """Why a full buffer read or written at ``index`` cannot advance by one fixed address step
    per iteration in whole sticks (None when it can).

    ``sizes`` are the op's per-tile sizes; ``moves`` holds, per enclosing level, ``(dim,
    extent, count)`` for the dim it moves (several entries for one level add up). In the
    default layout the last host dim (``n_last`` elements) is cut into sticks of ``eps``; a
    tile origin moved by ``s`` host elements moves by ``s // n_last`` whole rows of that dim,
    which every layout position follows by one fixed step, plus ``s % n_last`` positions along
    the stick dim. That part must be whole sticks (the device moves 128-byte sticks), and no
    element of any tile may be carried past the end of the stick dim into the next row, where
    its device offset jumps by a different amount: so the tile's largest position in the stick
    dim plus every shift must stay below ``n_last``. Checking only the moved variable (as the
    emitter's advance check does) misses views whose other variables wrap, e.g. a reshape
    splitting the stick dim."""
    expr = sympy.expand(index)
    shift = 0
    for dim, extent, count in moves:
        flat = int(expr.coeff(sym(dim))) * extent
        along = flat % n_last
        if along % eps:
            return f"starts {along % eps} elements into a {eps}-element stick"
        shift += (count - 1) * along
    if shift == 0 or n_last == eps:
        return None  # one stick per row: the device offset is the host offset, linear everywhere
    reach = sum((int(c) % n_last) * (sizes.get(v.name, 1) - 1) if v.is_Symbol else int(c) % n_last
                for v, c in expr.as_coefficients_dict().items())
    if reach + shift >= n_last:
        return (f"spans positions up to {min(reach, n_last - 1)} of the stick dim and moves {shift} further along "
                f"it, past its {n_last} elements into the next row")
    return None


def _check_stick_steps(ctx: _Context, node: OpNode, loops: Sequence[tuple[int, int]], levels: Sequence[Level]) -> None:
    """Refuse a full buffer whose tiles do not start on a stick boundary or do not move by one
    fixed step (``_stick_fault``).

    A full buffer is addressed per iteration as base + tile_advance; the device moves whole
    128-byte sticks, so a tile that starts inside a stick either reads and writes the
    neighbouring tile's elements or, for the last tile, runs past the end of the allocation
    (an emitted program that ``check_memory`` reports out of bounds), and a tile whose elements
    do not all move by the same step reads the wrong elements. ``_tile_sizes`` rounds tiles up
    to whole sticks and peels the rest; what is left here is a view whose tiles wrap the stick
    dim, which no tile size short of the whole range fixes."""
    op = node.op
    sizes = {d.name: d.size for d in iteration_dims(op)}
    accesses = [(ld.buffer, ld.index, "reads") for ld in op.loads] + [(op.store.buffer, op.store.index, "writes")]
    for buffer, index, verb in accesses:
        if not ctx.is_full(buffer):
            continue  # a per-tile buffer sits at a fixed address and never advances
        btype = ctx.full_type(buffer)
        n_last = btype.shape[-1] if btype.shape else 1
        if n_last == 1:
            continue  # every element of a size-1 stick dim has a stick of its own
        eps = elems_per_stick(btype.dtype)
        moves = [(s.dim, s.extent, count) for steps, (_, count) in zip(node.tiling, loops) for s in steps]
        fault = _stick_fault(index, sizes, moves, n_last, eps)
        if fault is None:
            continue
        # Name the first level that is wrong on its own (else the innermost moving one).
        at = len(moves) - 1
        for j, m in enumerate(moves):
            if _stick_fault(index, sizes, [m], n_last, eps):
                at = j
                break
        dim, extent, count = moves[at]
        k = next(k for steps, (k, _) in zip(node.tiling, loops) for s in steps if (s.dim, s.extent) == (dim, extent))
        span = extent * count
        works = []
        for c in range(2, span + 1):
            if span % c or (sizes[dim] * count) % c:
                continue
            trial = [(d, span // c if j == at else e, c if j == at else n) for j, (d, e, n) in enumerate(moves)]
            # the tile of ``dim`` grows or shrinks with the count (other levels kept as they are)
            tile = {**sizes, dim: sizes[dim] * count // c}
            if _stick_fault(index, tile, trial, n_last, eps) is None:
                works.append(c)
        raise TilingError(
            f"op {op.name} {verb} {buffer} ({btype}) in tiles that cannot advance by one fixed step of whole "
            f"sticks: {_where(k, levels[k])} (count {count}) moves dim {dim} (range {span}) by {extent} elements "
            f"per iteration, so a tile of {buffer} {fault} ({eps}-element sticks along its last dim "
            f"{btype.dims[-1]}); the device moves whole 128-byte sticks. Counts of {dim} that keep tiles whole "
            f"sticks: {works[:12] or 'none'}; otherwise tile another dim, or keep {op.name} out of the hint scope."
        )


def _tiled_reduction(ctx: _Context, t: _OpTiling, tiled: frozenset[str], per_tile: Reduction, store: Store, r: int,
                     fills: list[list[_Item | _SubNest]], finishes: list[list[_Item | _SubNest]]) -> list[_Item]:
    """partial + combine in the loop body; identity fill before and finish after level ``r``.

    var is the untiled two-pass algorithm with its sums tiled: before level ``r``, a nest of
    the levels from ``r`` inwards (tails included) computes the mean of the output tile (a
    tiled mean into the float32 buffer ``<buf>_mean``); the main nest then subtracts it,
    squares in float32 (``<buf>_dev``) and sums the squares tile by tile; the finish divides by
    N - correction. Its operand must be whole before the first nest, which loop fission sees to
    (``split_at_tiled_reductions`` puts in-group producers of a tiled var in an earlier pass)."""
    op = t.op
    owner = op.store.buffer
    out_dtype = ctx.buffers[owner].type.dtype
    if op.fn != "var":
        fill, body, finish = _accumulation(ctx, t, tiled, per_tile, op.fn, store, out_dtype, owner, r)
        fills[r].append(fill)
        finishes[r].append(finish)
        return body
    out_dims, red_dims = t.dims(op.ranges), t.dims(op.reduction_ranges)
    # the mean spans the output tiles of levels inside r, as the accumulators do
    spans = _spans_output_tiles(t, r)
    mean_type = TensorType(dims=ctx.buffers[owner].type.dims if spans else out_dims, dtype="float32")
    dev_type = TensorType(dims=out_dims + red_dims, dtype="float32")
    midx, didx = op.store.index if spans else mean_type.contiguous_index(), dev_type.contiguous_index()
    mean, dev = ctx.fresh(f"{owner}_mean"), ctx.fresh(f"{owner}_dev")
    ctx.extra.setdefault(owner, []).extend([TreeBuffer(name=mean, type=mean_type, scope="full" if spans else "tile"),
                                            TreeBuffer(name=dev, type=dev_type, scope="tile")])
    mean_op = replace(per_tile, name=ctx.fresh(f"{op.name}_sum"), fn="mean", correction=0)
    m_fill, m_body, m_finish = _accumulation(ctx, t, tiled, mean_op, "mean", Store(buffer=mean, index=midx),
                                             "float32", owner, r)
    deviation = Pointwise(
        name=ctx.fresh(f"{op.name}_center"), fn="sub", operands=(per_tile.operands[0], Load(buffer=mean, index=midx)),
        ranges=out_dims + red_dims, store=Store(buffer=dev, index=didx), hints=op.hints,
    )
    square = Pointwise(
        name=ctx.fresh(f"{op.name}_square"), fn="mul",
        operands=(Load(buffer=dev, index=didx), Load(buffer=dev, index=didx)),
        ranges=out_dims + red_dims, store=Store(buffer=dev, index=didx), hints=op.hints,
    )
    squares = replace(per_tile, operands=(Load(buffer=dev, index=didx),), correction=0)
    fill, body, finish = _accumulation(ctx, t, tiled, squares, "var", store, out_dtype, owner, r)
    fills[r].extend([_SubNest(fill=(m_fill,), body=tuple(m_body), finish=(m_finish,)), fill])
    finishes[r].append(finish)
    return [_Item(op=deviation, steps=t.steps, tiled=tiled), _Item(op=square, steps=t.steps, tiled=tiled), *body]


def _spans_output_tiles(t: _OpTiling, r: int) -> bool:
    """A level inside the reduction level ``r`` tiles an output dim of the reduction."""
    return any(t.out_steps()[r + 1:])


def _accumulation(ctx: _Context, t: _OpTiling, tiled: frozenset[str], per_tile: Reduction, fn: str, store: Store,
                  out_dtype: str, owner: str, r: int) -> tuple[_Item, list[_Item], _Item]:
    """The fill (before level ``r``), the loop body (partial, combine) and the finish (after
    level ``r``) of a tiled ``fn`` of ``per_tile``'s operands into ``store`` (of
    ``out_dtype``); helper buffers are named after ``store`` and listed after the graph
    buffer ``owner``.

    The accumulator holds the output tile the body of level ``r`` sees. When no level inside
    ``r`` tiles an output dim, that is the per-tile output: a ``"tile"`` buffer. Otherwise
    (an output level nested in the reduction level) it spans the inner output tiles: a
    ``"full"`` buffer of the whole output shape, which the combine walks with the output's
    advance and the fill and finish cover one level-``r`` tile at a time. The fill and finish
    take the graph op's output ranges, which ``_place`` cuts to the output tile at level
    ``r`` on each path of the nest (a tail's, too)."""
    op = t.op
    base = store.buffer
    partial_fn, combine_fn, float_identity, int_identity = TILED_REDUCTIONS[fn]
    # the dtype the untiled reduction computes in (a bool result of float operands sums floats)
    operands = [ctx.buffers[ld.buffer].type.dtype for ld in op.loads if ld.buffer in ctx.buffers]
    acc_float = compute_dtype(out_dtype, operands).kind == "f"
    acc_dtype = "float32" if acc_float else "int32"
    part_type = TensorType(dims=t.dims(op.ranges), dtype=acc_dtype)
    idx = part_type.contiguous_index()
    outer = t.out_steps()
    acc_scope: Scope
    if _spans_output_tiles(t, r):
        # the output's own shape and index, so it walks (and lays out in sticks) as the output does
        acc_type, acc_scope = TensorType(dims=ctx.buffers[op.store.buffer].type.dims, dtype=acc_dtype), "full"
        acc_idx = op.store.index
    else:
        acc_type, acc_scope = part_type, "tile"
        acc_idx = acc_type.contiguous_index()
    part = ctx.fresh(f"{base}_part")
    acc = ctx.fresh(f"{base}_acc")
    ctx.extra.setdefault(owner, []).extend(
        [TreeBuffer(name=part, type=part_type, scope="tile"), TreeBuffer(name=acc, type=acc_type, scope=acc_scope)]
    )
    out_dims = part_type.dims
    partial = replace(per_tile, fn=partial_fn, store=Store(buffer=part, index=idx))
    combine = Pointwise(
        name=ctx.fresh(f"{per_tile.name}_combine"), fn=combine_fn,
        operands=(Load(buffer=acc, index=acc_idx), Load(buffer=part, index=idx)),
        ranges=out_dims, store=Store(buffer=acc, index=acc_idx), hints=op.hints,
    )
    fill = Pointwise(
        name=ctx.fresh(f"{per_tile.name}_fill"), fn="full",
        operands=(Scalar(value=float_identity if acc_float else int_identity),),
        ranges=op.ranges, store=Store(buffer=acc, index=acc_idx), hints=op.hints,
    )
    finish_ops: tuple[Load | Scalar, ...] = (Load(buffer=acc, index=acc_idx),)
    finish_fn = "cast"
    count = math.prod(d.size for d in op.reduction_ranges)
    if fn == "mean":
        finish_fn, finish_ops = "mul", finish_ops + (Scalar(value=1.0 / count),)
    elif fn == "var":  # as the untiled var divides: by N - correction, 0 when the correction is larger
        assert isinstance(op, Reduction)
        finish_fn, finish_ops = "div", finish_ops + (Scalar(value=float(max(count - op.correction, 0))),)
    finish = Pointwise(
        name=ctx.fresh(f"{per_tile.name}_finish"), fn=finish_fn, operands=finish_ops,
        ranges=op.ranges, store=store, hints=op.hints,
    )
    body = [_Item(op=partial, steps=t.steps, tiled=tiled), _Item(op=combine, steps=outer, tiled=tiled)]
    return _Item(op=fill, steps=outer, tiled=tiled), body, _Item(op=finish, steps=outer, tiled=tiled)


# -- verification ----------------------------------------------------------------------------
def verify_loop_tree(tree: LoopTree) -> LoopTree:
    """Tree invariants: one tiling entry per enclosing loop, steps on dims the op iterates,
    each loop's ``steps`` the moves of the ops below it, every buffer known, every read
    preceded by a write (or an input), every peeled tail a copy of an op of the main body.
    An op of a loop's first or last iteration (``OpNode.runs``) is checked where it is built:
    inside a loop that does not move it, at the head or the tail of that loop's body; and here
    against what the loop does (``_verify_guards``). Each buffer's dims are checked against
    the indices its writers store through (``_verify_addressing``)."""
    require(tree, LoopTree, "verify_loop_tree", "tree")
    require_name(tree.name, "loop tree name")
    for b in tree.buffers:
        require_name(b.name, f"loop tree {tree.name}: buffer name")
    for node in op_nodes(tree):
        require_name(node.op.name, f"loop tree {tree.name}: op name")
    table = tree.buffer_table()
    if len(table) != len(tree.buffers):
        raise TilingError(f"loop tree {tree.name}: duplicate buffer names")
    for name in tree.inputs:
        if name not in table or table[name].scope != "full":
            raise TilingError(f"loop tree {tree.name}: input {name} must be a full buffer of the tree")
    written = set(tree.inputs)
    seen_ops: set[str] = set()
    for node, depth in walk(tree.body):
        if isinstance(node, Loop):
            continue
        op = node.op
        if op.name in seen_ops:
            raise TilingError(f"loop tree {tree.name}: op {op.name} appears twice")
        seen_ops.add(op.name)
        if len(node.tiling) != depth:
            raise TilingError(
                f"loop tree {tree.name}: op {op.name} sits in {depth} loops but has {len(node.tiling)} tiling levels"
            )
        names = {d.name for d in iteration_dims(op)}
        for k, level in enumerate(node.tiling):
            for s in level:
                if s.dim not in names:
                    raise TilingError(
                        f"loop tree {tree.name}: op {op.name} level {k} steps dim {s.dim}, which it does not iterate"
                    )
        for ld in op.loads:
            if ld.buffer not in table:
                raise TilingError(f"loop tree {tree.name}: op {op.name} reads unknown buffer {ld.buffer}")
            if ld.buffer not in written:
                raise TilingError(f"loop tree {tree.name}: op {op.name} reads {ld.buffer} before anything writes it")
        if op.store.buffer not in table:
            raise TilingError(f"loop tree {tree.name}: op {op.name} writes unknown buffer {op.store.buffer}")
        written.add(op.store.buffer)
    _verify_loop_steps(tree)
    fns = {n.name: n.op.fn for n, _ in walk(tree.body) if isinstance(n, OpNode) and not n.origin}
    for node, _ in walk(tree.body):
        if isinstance(node, OpNode) and node.origin and fns.get(node.origin) not in (node.op.fn, None):
            raise TilingError(f"loop tree {tree.name}: op {node.name}, a tail of {node.origin}, computes "
                              f"{node.op.fn} where {node.origin} computes {fns[node.origin]}")
        if isinstance(node, OpNode) and node.origin and node.origin not in fns:
            raise TilingError(f"loop tree {tree.name}: op {node.name} is a tail of {node.origin}, which is not an "
                              f"op of the tree's main body")
    _verify_coverage(tree)
    _verify_tile_reads(tree)
    _verify_addressing(tree)
    _verify_guards(tree)
    for o in tree.outputs:
        if o.buffer not in written or table[o.buffer].scope != "full":
            raise TilingError(
                f"loop tree {tree.name}: output {o.name} ({o.buffer}) must be a full buffer that is written"
            )
    return tree


def _verify_loop_steps(tree: LoopTree) -> None:
    """Each loop records exactly the moves its ops make at its level (in one pass: every op
    adds its entry ``k`` to the k-th enclosing loop's tally) and exactly the buffers its body
    carries from one iteration to the next."""
    full = {b.name for b in tree.buffers if b.scope == "full"}

    def visit(body: tuple[Node, ...], enclosing: tuple[tuple[Loop, set[TileStep]], ...]) -> None:
        for node in body:
            if isinstance(node, Loop):
                moves: set[TileStep] = set()
                visit(node.body, enclosing + ((node, moves),))
                depth = len(enclosing)
                if moves != set(node.steps):
                    raise TilingError(
                        f"loop tree {tree.name}: the loop at level {depth} (count {node.count}) records steps "
                        f"{_step_list(node.steps)} but its ops move {_step_list(moves)} there; build the loop "
                        f"with steps=level_steps(body, {depth})"
                    )
                # its first iteration reads what was written before the loop, which the tree-wide
                # read-after-write check above sees
                carried = carried_buffers(node.body, depth, full)
                if carried != node.carried:
                    raise TilingError(
                        f"loop tree {tree.name}: the loop at level {depth} (count {node.count}) records carried "
                        f"buffers {list(node.carried)} but its body reads {list(carried)} before writing them; "
                        f"build the loop with carried=carried_buffers(body, {depth}, <full buffers>)"
                    )
            else:
                for (_, moves), level in zip(enclosing, node.tiling):
                    moves.update(level)

    visit(tree.body, ())


# Separate tile runs along one dim of one op that the coverage check lists (a run is a stretch of
# whole tiles back to back; only an inner tail inside an outer loop breaks a dim into several)
_RUNS_LIMIT = 1 << 16


def _runs(node: OpNode, d: str, size: int, moves: Sequence[tuple[int, int]], start: int,
          where: str) -> list[tuple[int, int]]:
    """The elements of dim ``d`` one op node computes over all iterations of its loops, as
    sorted disjoint half-open runs: its per-tile range ``size`` from ``start`` (a tail's peel),
    moved ``count`` times by ``step`` at each level that moves it. Overlapping tiles are an
    error: an element computed twice by one node (a reduction would count it twice)."""
    runs = [(start, start + size)]
    for step, count in sorted(moves):
        if count == 1:
            continue
        if len(runs) == 1 and runs[0][1] - runs[0][0] == step:  # whole tiles back to back: one run
            runs = [(runs[0][0], runs[0][0] + count * step)]
            continue
        if runs[-1][1] - runs[0][0] > step:
            raise TilingError(f"{where}: op {node.name} moves dim {d} by {step} elements per iteration of a loop of "
                              f"{count}, but covers {runs[-1][1] - runs[0][0]} elements of it per iteration, so its "
                              f"tiles overlap; the ranges, steps or counts were edited")
        if len(runs) * count > _RUNS_LIMIT:
            raise TilingError(f"{where}: op {node.name} runs dim {d} in more than {_RUNS_LIMIT} separate stretches "
                              f"of tiles; tile it with fewer levels or counts that divide it")
        merged: list[tuple[int, int]] = []
        for i in range(count):
            for a, b in runs:
                a, b = a + i * step, b + i * step
                if merged and merged[-1][1] == a:
                    merged[-1] = (merged[-1][0], b)
                else:
                    merged.append((a, b))
        runs = merged
    return runs


def _disjoint(xs: list[tuple[int, int]], ys: list[tuple[int, int]]) -> bool:
    i = j = 0
    while i < len(xs) and j < len(ys):
        if xs[i][1] <= ys[j][0]:
            i += 1
        elif ys[j][1] <= xs[i][0]:
            j += 1
        else:
            return False
    return True


def _verify_coverage(tree: LoopTree) -> None:
    """Each op of the graph, with the tails that copy it, computes every point of its full
    iteration space exactly once: per dim, a node covers its per-tile range moved by the
    loops that move it (from its tail's peel offset), and the nodes of one op (the main body's
    and its tails) must tile the dim's full size without gaps or overlaps. The full size of a
    dim is its size in the full buffers (one size per name, docs/semantics.md); a dim no full
    buffer has takes the size the first op covers, and every other op must agree. A per-tile
    range edited, or a loop's count, breaks this where the step records do not see it. A
    loop moves an op along one dim at a time (the plan gives each tiled dim its own level).
    Symbolic sizes are skipped here: the symbolic stage checks their tiles at each witness.
    Not checked: ``keep_resident``'s copies into per-tile (LX) buffers, which copy just the
    region their readers read (a loop's main body, not its tail)."""
    where = f"loop tree {tree.name}"
    full: dict[str, int] = {}
    for b in tree.buffers:
        if b.scope == "full":
            for dim in b.type.dims:
                if type(dim.size) is int and dim.size != 1:
                    full.setdefault(dim.name, dim.size)
    table = tree.buffer_table()
    # op name (the main body's) -> its nodes, each with (dim -> its runs)
    families: dict[str, list[tuple[OpNode, dict[str, list[tuple[int, int]]]]]] = {}

    def visit(body: tuple[Node, ...], counts: tuple[int, ...]) -> None:
        for node in body:
            if isinstance(node, Loop):
                visit(node.body, counts + (node.count,))
                continue
            moves: dict[str, list[tuple[int, int]]] = {}
            for level, count in zip(node.tiling, counts):
                if count > 1 and len(level) > 1:
                    raise TilingError(f"{where}: op {node.name} moves {_step_list(level)} together in one loop of "
                                      f"{count}; a loop moves an op along one dim, by one step")
                for s in level:
                    moves.setdefault(s.dim, []).append((s.extent, count))
            starts = {p.dim: p.start for p in node.peeled}  # nested tails: the innermost offset is last
            runs: dict[str, list[tuple[int, int]]] = {}
            for dim in iteration_dims(node.op):
                if type(dim.size) is int:
                    runs[dim.name] = _runs(node, dim.name, dim.size, moves.get(dim.name, ()),
                                           starts.get(dim.name, 0), where)
            families.setdefault(node.origin or node.name, []).append((node, runs))

    visit(tree.body, ())
    for name, nodes in families.items():
        main, first = nodes[0]
        store = table.get(main.op.store.buffer)
        if main.op.fn == "copy" and store is not None and store.scope == "tile" and not main.origin:
            continue  # keep_resident's copy of a region into LX covers just what its readers read
        for node, runs in nodes:
            if set(runs) != set(first):
                raise TilingError(f"{where}: op {node.name}, a tail of {name}, iterates dims {sorted(runs)} where "
                                  f"{name} iterates {sorted(first)}")
        kept = {d.name: d.size for d in store.type.dims} if store is not None else {}
        # The op's own axis of size 1 (broadcast, keeping its dim's name: its store keeps size 1)
        # is not moved by a tail peeled along that dim: the tail runs its one point again.
        for d in first:
            if kept.get(d, 1) == 1 and all(len(r[d]) == 1 and r[d][0][1] - r[d][0][0] == 1 for _, r in nodes):
                for _, runs in nodes:
                    runs[d] = [(0, 1)]
        # A tail peeled along a dim the op does not iterate runs it again on the same points (an
        # accumulator's combine after the reduction's tail): like a loop that does not move it,
        # a repetition, which must cover the same points; the others partition the space.
        distinct: dict[tuple[tuple[int, int], ...], tuple[OpNode, dict[str, list[tuple[int, int]]]]] = {}
        for node, runs in nodes:
            key = tuple(runs[d][0] for d in sorted(runs))
            seen = distinct.setdefault(key, (node, runs))
            if seen[1] != runs:
                raise TilingError(f"{where}: ops {seen[0].name} and {node.name} compute overlapping parts of the "
                                  f"same iteration space; a tail covers only what its loop leaves")
        parts = list(distinct.values())
        whole = 1
        for d in first:
            spans = [runs[d] for _, runs in parts]
            if all(r == [(0, 1)] for r in spans) and kept.get(d, 1) == 1:
                size = 1  # the op's own axis of size 1 (a kept or broadcast axis keeps its dim's name)
            else:
                size = full.setdefault(d, max(r[-1][1] for r in spans))
            lowest, highest = min(r[0][0] for r in spans), max(r[-1][1] for r in spans)
            if lowest < 0 or highest > size:
                raise TilingError(f"{where}: op {name} (with its tails) computes dim {d} over elements "
                                  f"{lowest}..{highest - 1}, outside the dim's {size}; a per-tile range or a "
                                  f"loop count disagrees with the dim's full size")
            whole *= size
        for i in range(len(parts)):
            for j in range(i + 1, len(parts)):
                x, y = parts[i][1], parts[j][1]
                if not any(_disjoint(x[d], y[d]) for d in x):
                    raise TilingError(f"{where}: ops {parts[i][0].name} and {parts[j][0].name} compute overlapping "
                                      f"parts of the same iteration space; a tail covers only what its loop leaves")
        volume = sum(math.prod(sum(b - a for a, b in r) for r in runs.values()) for _, runs in parts)
        if volume != whole:
            covered = "; ".join(", ".join(f"{d} {_shown(r)}" for d, r in runs.items()) for _, runs in parts)
            raise TilingError(f"{where}: op {name} (with its tails) computes {volume} points of its iteration space "
                              f"of {whole} ({covered}); each point must be computed once: a per-tile range or a "
                              f"loop count disagrees with the dims' full sizes")


def _verify_tile_reads(tree: LoopTree) -> None:
    """A per-tile buffer holds one tile and never advances: an op that reads it along a dim a
    loop moves reads the tile of that iteration, so something in that loop writes it (a full
    buffer edited to per-tile scope would otherwise be read at its first tile every time)."""
    tiles = {b.name for b in tree.buffers if b.scope == "tile"}

    def written(body: tuple[Node, ...]) -> set[str]:
        return {n.op.store.buffer for n, _ in walk(body) if isinstance(n, OpNode)}

    def visit(body: tuple[Node, ...], loops: tuple[set[str], ...]) -> None:
        for node in body:
            if isinstance(node, Loop):
                visit(node.body, loops + (written(node.body),))
                continue
            for ld in node.op.loads:
                if ld.buffer not in tiles:
                    continue
                names = {v.name for v in ld.index.free_symbols}
                for level, inside in zip(node.tiling, loops):
                    moved = {st.dim for st in level} & names
                    if moved and ld.buffer not in inside:
                        raise TilingError(f"loop tree {tree.name}: op {node.name} reads per-tile buffer {ld.buffer} "
                                          f"along {sorted(moved)}, which its loop moves, but nothing in that loop "
                                          f"writes it; a buffer read tile by tile from outside is a full buffer")

    visit(tree.body, ())


def _verify_addressing(tree: LoopTree) -> None:
    """A buffer's dims are the ones its writers address (``store_fault``, the graph's rule), so
    a buffer's dims swapped, dropped or resized, which would lay it out differently and give
    an output another shape under the same indices, are refused. Full buffers agree on each
    dim's size (a full buffer has the graph's shape: a dim name is one axis, of one size)."""
    where = f"loop tree {tree.name}"
    sizes: dict[str, tuple[int, str]] = {}
    for b in tree.buffers:
        if b.scope != "full" or b.type.symbolic:
            continue
        for d in b.type.dims:
            if d.size != 1:
                size, first = sizes.setdefault(d.name, (d.size, b.name))
                if size != d.size:
                    raise TilingError(f"{where}: full buffer {b.name} has dim {d.name} of {d.size} elements where "
                                      f"full buffer {first} has {size}; a dim name is one axis, of one size")
    table = tree.buffer_table()
    for node in op_nodes(tree):
        fault = store_fault(node.op.store.index, table[node.op.store.buffer].type)
        if fault is not None:
            raise TilingError(f"{where}: op {node.name} stores into {node.op.store.buffer} {fault}")


def _verify_guards(tree: LoopTree) -> None:
    """An op of a loop's first or last iteration (``OpNode.runs``) stands for an op just before
    or just after the loop (docs/tiling.md, "Kernel boundaries"): an accumulator's fill or a
    copy of what the loop reads runs first, the finish of what the loop built last. A guard
    is inconsistent with the loop when it makes the iterations' work unseen:

    - what an iteration computes afresh (an op the loop moves) must reach, through ops of every
      iteration, a place the loop moves or a buffer it carries to the next iteration; reaching
      only a place rewritten in each iteration and read by the last iteration's ops or after
      the loop, the values of all iterations but the last are lost -- a combine guarded last
      drops all partials but the last (a value nothing reads, a dead op of the graph, loses
      nothing; a finish run in every iteration reads what the loop carries, and is legal);
    - a first-iteration op must not read what an op of every iteration writes in the same
      place each iteration: it would see only the value from before the loop, where an op of
      every iteration reads the value the iterations hand on.

    Each loop is checked over the ops below it (linear in the ops times the nesting depth)."""

    used: dict[str, set[str]] = {o.buffer: {f"output {o.name}"} for o in tree.outputs}  # buffer -> its readers
    for n in op_nodes(tree):
        for ld in n.op.loads:
            used.setdefault(ld.buffer, set()).add(n.name)

    def visit(body: tuple[Node, ...], depth: int) -> None:
        for node in body:
            if isinstance(node, Loop):
                _check_loop_guards(tree, node, depth, used)
                visit(node.body, depth + 1)

    visit(tree.body, 0)


def _check_loop_guards(tree: LoopTree, loop: Loop, depth: int, used: Mapping[str, set[str]]) -> None:
    where = f"loop tree {tree.name}: the loop at level {depth} (count {loop.count})"
    scopes = {b.name: b.scope for b in tree.buffers}
    nodes = [n for n, _ in walk(loop.body) if isinstance(n, OpNode)]
    own = [n for n in nodes if n.guarded and len(n.tiling) == depth + 1]  # guarded at this loop
    every = [n for n in nodes if not (n.guarded and len(n.tiling) == depth + 1)]

    def moved(node: OpNode) -> set[str]:
        return {s.dim for s in node.tiling[depth]} if depth < len(node.tiling) else set()

    def fixed(node: OpNode) -> bool:
        """The op writes the same place of its store in every iteration of the loop."""
        store = node.op.store
        return scopes.get(store.buffer) == "tile" or not moved(node) & {v.name for v in store.index.free_symbols}

    # What an iteration computes afresh (an op the loop moves reads a region of its own) is kept
    # when it reaches, through ops of every iteration, a place the loop moves (each iteration
    # writes its own), a buffer the loop carries to the next iteration, or a buffer nothing
    # reads (a dead op of the graph). Reaching only places rewritten in each iteration and read
    # after the loop (or by its last iteration alone), it survives from the last iteration
    # only. A finish run in every iteration instead of the last stays legal: it reads what the
    # loop carries, and the moving work reached that.
    readers: dict[str, list[OpNode]] = {}
    writers: dict[str, list[OpNode]] = {}
    for n in every:
        writers.setdefault(n.op.store.buffer, []).append(n)
        for ld in n.op.loads:
            readers.setdefault(ld.buffer, []).append(n)
    carried = set(loop.carried)
    kept: set[str] = set()  # op names
    work = [n for n in every if n.op.store.buffer in carried or not used.get(n.op.store.buffer) or not fixed(n)]
    while work:
        n = work.pop()
        if n.name not in kept:
            kept.add(n.name)
            work.extend(w for ld in n.op.loads for w in writers.get(ld.buffer, ()) if w.name not in kept)
    lost = [n for n in every if moved(n) and n.name not in kept]
    if lost and loop.count > 1:
        # name the op where the work stops: the last of its chain, read only outside the iterations
        tainted = {n.name for n in lost}
        work = list(lost)
        while work:
            n = work.pop()
            for r in readers.get(n.op.store.buffer, ()):
                if r.name not in tainted:
                    tainted.add(r.name)
                    work.append(r)
        end = next((n for n in every if n.name in tainted and n.op.store.buffer not in readers), lost[0])
        buffer = end.op.store.buffer
        late = sorted(g.name for g in own if g.runs == "last" and any(ld.buffer == buffer for ld in g.op.loads))
        by = f"only its last-iteration ops {late} read it" if late else "only ops after the loop read it"
        raise TilingError(f"{where}: op {end.name} writes {buffer} in the same place in each of the {loop.count} "
                          f"iterations, from what the loop moves, but {by}, and it reaches nothing the loop moves "
                          f"or carries, so the values of all iterations but the last are lost; the op that folds "
                          f"each iteration's {buffer} into what the loop carries runs in every iteration "
                          f"(runs='every')")
    firsts = [g for g in own if g.runs == "first"]
    rewritten = {n.op.store.buffer: n for n in every if fixed(n)} if firsts else {}
    for g in firsts:
        for ld in g.op.loads:
            w = rewritten.get(ld.buffer)
            if w is not None:
                raise TilingError(f"{where}: op {g.name} runs in the first iteration only but reads {ld.buffer}, "
                                  f"which op {w.name} rewrites in every iteration, so it would see only the value "
                                  f"from before the loop; an op that reads what the iterations hand on runs in "
                                  f"every iteration (runs='every')")


def _shown(runs: list[tuple[int, int]]) -> str:
    text = " ".join(f"{a}..{b - 1}" for a, b in runs[:3])
    return text + (f" +{len(runs) - 3} more" if len(runs) > 3 else "")


def _step_list(steps) -> str:
    return "[" + ", ".join(sorted(f"{s.dim}+{s.extent}" for s in steps)) + "]"
