"""Online softmax: a softmax, log-softmax or attention whose reduction dim a loop tiles.

``tile`` refuses a group in which an op reads a reduction whose reduction dim the group's
loop tiles: inside the loop the reduction is only a partial. Softmax is the exception worth
rewriting (docs/tiling.md, "Online softmax"): its max and its sum of exponentials can be
carried across the tiles of the reduction dim as a running max ``m`` and a running sum
``l`` that is rescaled whenever the max grows (Milakov & Gimelshein, "Online normalizer
calculation for softmax", 2018; FlashAttention). Per tile ``j`` of the scores ``s``:

    part   = amax(s_j)                             <m>          (the amax, now a partial)
    alpha  = exp(min(m - part, 0))                 <m>_shift, <m>_clamp, <m>_exp
    m      = maximum(m, part)                      <m>_combine  (the tiled amax's combine)
    e_j    = exp(s_j - m)                          the graph's own sub and exp
    l      = l * alpha + sum(e_j)                  <l>, <l>_rescale, <l>_combine
    acc    = acc * alpha + e_j @ v_j               <o>, <o>_rescale, <o>_combine  (attention)

and after the loop ``o = acc / l`` (``<o>_finish``). ``m``, ``l`` and ``acc`` are the loop's
carried buffers (``Loop.carried``), per-tile float32 accumulators filled before the loop
(``m`` with the lowest finite float32, so that a tile whose scores are all ``-inf`` gives
``alpha = exp(0)`` instead of ``exp(-inf + inf) = nan``; ``l`` and ``acc`` with 0).
``alpha = exp(m_old - m_new)`` is written ``exp(min(m_old - part, 0))``: the same value,
without a second buffer for the new max.

Without a value product (a softmax or log-softmax whose result the program keeps) the
probabilities of a tile are final only once the whole row was seen: a second loop over the
same tiles recomputes the scores and ``s - m`` and runs the rest of the group with the final
``m`` and ``l`` (the division, the log-softmax's ``d - log l``, the casts after them); ops
of the rest that do not iterate the tiled dim (``log l``) run once between the two loops.
The input is read twice, where an untiled softmax reads it once: a row too long for LX
cannot be kept, and two passes are the fewest with which a long row can be normalised
(three without the online rewrite: max, sum, normalise).

This module decides *whether* a group holds such a softmax (``match_online``) and builds
the per-tile nodes of its recurrence (``online_amax``, ``online_sum``, ``online_matmul``);
``fspyre.stages.loop_tree.tile`` places them, as it places the fill / combine / finish of
any tiled reduction.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import sympy

from fspyre.errors import TilingError
from fspyre.ir.frozen import require_fields
from fspyre.ir.graph import Dim, Load, Op, Pointwise, Reduction, Scalar, Store, TensorType, iteration_dims
from fspyre.ir.looptree import OpNode, TileStep, TreeBuffer

# The fill of the running max: the lowest finite float32 rather than -inf, so that
# ``m_old - part`` is never ``-inf - (-inf)`` (docs/semantics.md, "Online softmax").
LOWEST = float(np.finfo(np.float32).min)


@dataclass(frozen=True, slots=True, kw_only=True)
class OnlineOptions:
    """``enabled`` False: no group is rewritten, and a softmax tiled over its reduction dim is
    refused as before."""

    enabled: bool = True  # rewrite a softmax, log-softmax or attention tiled over its reduction dim online

    def __post_init__(self) -> None:
        require_fields(self, TilingError)


@dataclass(frozen=True, slots=True, kw_only=True)
class OnlineSoftmax:
    """A softmax found in a group whose loop tiles its reduction dim ``dim``.

    ``amax``, ``shift`` (``s - m``), ``exp`` and ``sum`` are the graph's ops of the softmax.
    Attention: ``div`` (``e / l``), folded into the finish, and ``matmul``, the value product
    over ``dim`` that the casts between them feed. Otherwise ``second`` are the ops run in
    the second loop over ``dim``, ``between`` the ops run once between the two loops, and
    ``again`` the ops of the first loop the second recomputes."""

    dim: str
    amax: str
    shift: str
    exp: str
    sum: str
    div: str | None = None
    matmul: str | None = None
    second: tuple[str, ...] = ()
    between: tuple[str, ...] = ()
    again: tuple[str, ...] = ()

    @property
    def two_pass(self) -> bool:
        return self.matmul is None


def match_online(ops: Sequence[Op], tiled: Mapping[str, Sequence[str | None]], readers: Mapping[str, Sequence[str]],
                 outputs: frozenset[str], options: OnlineOptions = OnlineOptions()) -> OnlineSoftmax | None:
    """The first softmax of ``ops`` (one group, program order) whose amax reads along a dim
    the group's levels tile (``tiled[op]``: per level, outermost first, the dim it tiles for
    that op, None where the op is invariant), or None. Every level inside the first one
    tiling that dim must tile it again: the carried max, sum and product are per output tile,
    so an output level may enclose the reduction's loop but not run inside it.

    Matched exactly as the front end emits ``torch.softmax`` / ``log_softmax`` (and
    attention's ``softmax(s) @ v``): ``m = amax(s)``, ``d = s - m``, ``e = exp(d)``,
    ``l = sum(e)`` over the same one dim, consecutive, with ``m``, ``d``, ``e``, ``l`` read
    by nothing outside the group and not outputs. Anything else is left to the refusal in
    ``tile``."""
    if not options.enabled:
        return None
    position = {op.name: i for i, op in enumerate(ops)}
    for i, m in enumerate(ops[:-3]):
        if not (isinstance(m, Reduction) and m.fn == "amax" and len(m.reduction_ranges) == 1):
            continue
        dim = m.reduction_ranges[0].name
        levels = list(tiled[m.name])
        if dim not in levels or any(d != dim for d in levels[levels.index(dim):]):
            continue
        d, e, l_ = ops[i + 1], ops[i + 2], ops[i + 3]
        s_load = m.operands[0]
        if not (isinstance(d, Pointwise) and d.fn == "sub" and isinstance(s_load, Load)
                and d.operands[0] == s_load and _reads(d.operands[1], m)):
            continue
        if not (isinstance(e, Pointwise) and e.fn == "exp" and _reads(e.operands[0], d)):
            continue
        if not (isinstance(l_, Reduction) and l_.fn == "sum" and l_.reduction_ranges == m.reduction_ranges
                and l_.ranges == m.ranges and _reads(l_.operands[0], e)):
            continue
        core = (m, d, e, l_)
        inside = set(position)
        if any(op.store.buffer in outputs or any(r not in inside for r in readers.get(op.store.buffer, ()))
               for op in core):
            continue
        rest = ops[i + 4:]
        found = (_attention(core, rest, dim, readers, outputs)
                 or _two_pass(core, ops[:i], rest, dim, tiled, readers))
        if found is not None:
            return found
    return None


def _reads(operand, op: Op) -> bool:
    """``operand`` reads what ``op`` wrote at the point it wrote it: the recurrence rewrites the
    softmax elementwise (a broadcast read of the max reads it at the max's own index), so a
    read through any other index (another row, a transposed view) is not the softmax."""
    return isinstance(operand, Load) and operand.buffer == op.store.buffer and operand.index == op.store.index


def _attention(core: tuple[Op, ...], rest: Sequence[Op], dim: str, readers: Mapping[str, Sequence[str]],
               outputs: frozenset[str]) -> OnlineSoftmax | None:
    """``p = e / l``, then casts, then ``p @ v`` over ``dim``: each the only reader of the last."""
    m, d, e, l_ = core
    if not rest:
        return None
    p = rest[0]
    if not (isinstance(p, Pointwise) and p.fn == "div" and _reads(p.operands[0], e) and _reads(p.operands[1], l_)):
        return None
    if list(readers.get(e.store.buffer, ())) != [l_.name, p.name] or list(readers.get(l_.store.buffer, ())) != [p.name]:
        return None
    if list(readers.get(m.store.buffer, ())) != [d.name] or list(readers.get(d.store.buffer, ())) != [e.name]:
        return None
    last = p
    for op in rest[1:]:
        if list(readers.get(last.store.buffer, ())) != [op.name] or last.store.buffer in outputs:
            return None
        if isinstance(op, Pointwise) and op.fn == "cast" and _reads(op.operands[0], last):
            last = op
            continue
        if (isinstance(op, Reduction) and op.fn == "matmul" and _reads(op.operands[0], last)
                and tuple(r.name for r in op.reduction_ranges) == (dim,)
                and {r.name for r in m.ranges} <= {r.name for r in op.ranges}):
            return OnlineSoftmax(dim=dim, amax=m.name, shift=d.name, exp=e.name, sum=l_.name, div=p.name,
                                 matmul=op.name)
        return None
    return None


def _two_pass(core: tuple[Op, ...], before: Sequence[Op], rest: Sequence[Op], dim: str,
              tiled: Mapping[str, Sequence[str | None]], readers: Mapping[str, Sequence[str]]) -> OnlineSoftmax | None:
    """The ops after the sum run in a second loop (those that iterate ``dim``) or once between
    the loops (those that do not); the first loop's ops they need are recomputed."""
    m, d, e, l_ = core
    if not rest:
        return None
    second = [op for op in rest if dim in {x.name for x in iteration_dims(op) if x.size > 1}]
    between = [op for op in rest if op not in second]
    if any(not isinstance(op, Pointwise) for op in rest) or not second:
        return None
    later = {op.name for op in rest}
    # nothing but the softmax itself may read the running max, d or e inside the first loop
    allowed = {m.store.buffer: {d.name}, d.store.buffer: {e.name}, e.store.buffer: {l_.name}, l_.store.buffer: set()}
    for buf, first in allowed.items():
        if any(r not in first and r not in later for r in readers.get(buf, ())):
            return None
    made_second = {op.store.buffer for op in second}
    if any(ld.buffer in made_second for op in between for ld in op.loads):
        return None
    # the first loop's ops whose results the second loop reads, and what they read in turn
    need = {ld.buffer for op in second for ld in op.loads}
    again: list[Op] = []
    for op in reversed((*before, d, e)):
        if op.store.buffer in need:
            if isinstance(op, Reduction) and dim in {r.name for r in op.reduction_ranges}:
                return None
            if isinstance(op, Reduction) and set(tiled[op.name]) & {r.name for r in op.reduction_ranges}:
                return None  # a tiled reduction cannot be recomputed inside the second loop
            again.insert(0, op)
            need |= {ld.buffer for ld in op.loads}
    return OnlineSoftmax(dim=dim, amax=m.name, shift=d.name, exp=e.name, sum=l_.name,
                         second=tuple(op.name for op in second), between=tuple(op.name for op in between),
                         again=tuple(op.name for op in again))


# -- the per-tile nodes of the recurrence ----------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class Carried:
    """A carried accumulator: its buffer, its type and the index its own op's variables
    address it with."""

    name: str
    type: TensorType
    index: sympy.Expr


@dataclass(frozen=True, slots=True, kw_only=True)
class Nodes:
    """What one op of the recurrence becomes: ``body`` in the loop, ``fill`` before it,
    ``finish`` after it, and the per-tile buffers it adds."""

    body: tuple[OpNode, ...]
    fill: tuple[OpNode, ...] = ()
    finish: tuple[OpNode, ...] = ()
    buffers: tuple[TreeBuffer, ...] = ()


def online_amax(per_tile: Reduction, steps: tuple[tuple[TileStep, ...], ...], outer: tuple[tuple[TileStep, ...], ...],
                r: int, acc: Carried, fresh: Callable[[str], str]) -> tuple[Nodes, Carried]:
    """Partial max of the tile, ``alpha`` against the running max, then the running max
    (``acc``, the carried buffer readers of the amax read). Returns the nodes and alpha."""
    out = per_tile.store.buffer
    part, alpha = fresh(f"{out}_part"), fresh(f"{out}_alpha")
    ranges, idx, hints = per_tile.ranges, acc.index, per_tile.hints

    def pw(name: str, fn: str, operands, store: str) -> OpNode:
        return OpNode(op=Pointwise(name=fresh(f"{per_tile.name}_{name}"), fn=fn, operands=tuple(operands),
                                   ranges=ranges, store=Store(buffer=store, index=idx), hints=hints), tiling=outer)

    body = (
        OpNode(op=replace(per_tile, store=Store(buffer=part, index=idx)), tiling=steps),
        pw("shift", "sub", (Load(buffer=acc.name, index=idx), Load(buffer=part, index=idx)), alpha),
        pw("clamp", "minimum", (Load(buffer=alpha, index=idx), Scalar(value=0.0)), alpha),
        pw("exp", "exp", (Load(buffer=alpha, index=idx),), alpha),
        pw("combine", "maximum", (Load(buffer=acc.name, index=idx), Load(buffer=part, index=idx)), acc.name),
    )
    fill = OpNode(op=Pointwise(name=fresh(f"{per_tile.name}_fill"), fn="full", operands=(Scalar(value=LOWEST),),
                               ranges=ranges, store=Store(buffer=acc.name, index=idx), hints=hints),
                  tiling=outer[:r])
    buffers = tuple(TreeBuffer(name=n, type=acc.type, scope="tile") for n in (part, alpha, acc.name))
    return Nodes(body=body, fill=(fill,), buffers=buffers), Carried(name=alpha, type=acc.type, index=idx)


def online_sum(per_tile: Reduction, steps: tuple[tuple[TileStep, ...], ...], outer: tuple[tuple[TileStep, ...], ...],
               r: int, acc: Carried, alpha: Carried, fresh: Callable[[str], str],
               finish: Callable[[Load], Op] | None = None) -> Nodes:
    """``acc = acc * alpha + partial`` for the sum of exponentials (``finish`` None) or the
    value product (``finish`` builds the op that writes the result from the accumulator)."""
    out = per_tile.store.buffer
    part = fresh(f"{out}_part")
    ranges, idx, hints = per_tile.ranges, acc.index, per_tile.hints
    alpha_index = _broadcast(alpha, ranges)

    def pw(name: str, fn: str, operands, tiling) -> OpNode:
        return OpNode(op=Pointwise(name=fresh(f"{per_tile.name}_{name}"), fn=fn, operands=tuple(operands),
                                   ranges=ranges, store=Store(buffer=acc.name, index=idx), hints=hints),
                      tiling=tiling)

    body = (
        OpNode(op=replace(per_tile, store=Store(buffer=part, index=idx)), tiling=steps),
        pw("rescale", "mul", (Load(buffer=acc.name, index=idx), Load(buffer=alpha.name, index=alpha_index)), outer),
        pw("combine", "add", (Load(buffer=acc.name, index=idx), Load(buffer=part, index=idx)), outer),
    )
    fill = OpNode(op=Pointwise(name=fresh(f"{per_tile.name}_fill"), fn="full", operands=(Scalar(value=0.0),),
                               ranges=ranges, store=Store(buffer=acc.name, index=idx), hints=hints),
                  tiling=outer[:r])
    finishes = () if finish is None else (OpNode(op=finish(Load(buffer=acc.name, index=idx)), tiling=outer[:r]),)
    buffers = tuple(TreeBuffer(name=n, type=acc.type, scope="tile") for n in (part, acc.name))
    return Nodes(body=body, fill=(fill,), finish=finishes, buffers=buffers)


def _broadcast(small: Carried, ranges: Sequence[Dim]) -> sympy.Expr:
    """``small``'s index for an op over ``ranges``: its variables are named after the amax's
    output dims, which every op of the recurrence iterates under the same names."""
    names = {d.name for d in ranges}
    free = {s.name for s in small.index.free_symbols}
    assert free <= names, (small.name, free, names)
    return small.index
