"""The tiled loop tree: counted loops as tree nodes, ops with per-tile ranges as leaves.

This is the artifact of the ``tile`` stage. A ``Loop`` runs its body ``count`` times; an
``OpNode`` holds a graph op whose ranges are already the per-tile ranges, plus, for each
enclosing loop (outermost first), the dims that advance at that level and by how many
elements per iteration. An op whose entry at a level is empty is loop-invariant there.

Buffers know their ``scope``: a ``"full"`` buffer has the graph's shape and is addressed
with the op's index plus the loop advance; a ``"tile"`` buffer holds one tile, lives at a
fixed address and never advances.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Union

from fspyre.errors import TilingError
from fspyre.ir.frozen import require_int, require_tuple
from fspyre.ir.graph import HintScope, Op, Output, Pointwise, Reduction, TensorType
from fspyre.ir.kinds import RUNS, SCOPES, Runs, Scope, misplaced_guard


@dataclass(frozen=True, slots=True, kw_only=True)
class TileStep:
    """At one loop level, ``dim`` moves ``extent`` elements per iteration."""

    dim: str
    extent: int

    def __post_init__(self) -> None:
        if not isinstance(self.dim, str):
            raise TilingError(f"tile step: dim {self.dim!r:.60} must be a dim name")
        require_int(self.extent, f"tile step of dim {self.dim}: extent", TilingError, 1)


@dataclass(frozen=True, slots=True, kw_only=True)
class Peel:
    """A peeled tail starts dim ``dim`` at element ``start`` of the full range."""

    dim: str
    start: int

    def __post_init__(self) -> None:
        if not isinstance(self.dim, str):
            raise TilingError(f"peel: dim {self.dim!r:.60} must be a dim name")
        require_int(self.start, f"peel of dim {self.dim}: start", TilingError, 1)


@dataclass(frozen=True, slots=True, kw_only=True)
class OpNode:
    """An op with its per-tile ranges. ``tiling[L]`` is what enclosing loop L moves.

    A node of a peeled tail (docs/tiling.md, "Tails") is a copy of the op ``origin`` (the name
    the op has in the loop's main body) run once after a loop, on the remainder the loop's
    whole tiles leave: its ranges are the remainder's, its full-buffer indices start at the
    ``peeled`` offsets, and its name is its own.

    ``runs`` says which iterations of the innermost enclosing loop run the op: ``"every"``,
    or only the ``"first"`` (a copy of a loop-invariant operand, an accumulator's fill: what
    would run just before the loop) or the ``"last"`` (an accumulator's finish: what would run
    just after it). Such a *guarded* op does not move at that loop (its innermost tiling level
    is empty), and sits at the head (first) or the tail (last) of the loop's body, so it runs
    at the moment it would have run outside the loop, but inside the loop's kernel
    (docs/tiling.md, "Kernel boundaries"). Its buffers live as if it ran outside: what a
    first-iteration op writes lives across all iterations, what a last-iteration op reads
    lives until the last iteration."""

    op: Op
    tiling: tuple[tuple[TileStep, ...], ...] = ()
    origin: str = ""
    peeled: tuple[Peel, ...] = ()
    runs: Runs = "every"

    def __post_init__(self) -> None:
        if not isinstance(self.op, (Pointwise, Reduction)):
            raise TilingError(f"an op node holds a Pointwise or Reduction, got a {type(self.op).__name__}")
        require_tuple(self.tiling, f"op {self.op.name}: tiling", TilingError, tuple)
        for level in self.tiling:
            require_tuple(level, f"op {self.op.name}: a tiling level", TilingError, TileStep)
        require_tuple(self.peeled, f"op {self.op.name}: peeled", TilingError, Peel)
        if not isinstance(self.origin, str) or bool(self.origin) != bool(self.peeled):
            raise TilingError(f"op {self.op.name}: a peeled tail names its origin op and its offsets, got origin "
                              f"{self.origin!r:.60} and {len(self.peeled)} offsets")
        if self.runs not in RUNS:
            raise TilingError(f"op {self.op.name}: runs {self.runs!r:.40} must be one of {list(RUNS)}")
        if self.runs != "every" and (not self.tiling or self.tiling[-1]):
            where = "it sits in no loop" if not self.tiling else f"it moves {_listed(self.tiling[-1])} there"
            raise TilingError(f"op {self.op.name}: runs only in the {self.runs} iteration of its innermost loop, but "
                              f"{where}; a guarded op runs once per iteration of the loops outside that one")

    @property
    def guarded(self) -> bool:
        """The op runs in one iteration of its innermost loop only."""
        return self.runs != "every"

    @property
    def name(self) -> str:
        return self.op.name


@dataclass(frozen=True, slots=True, kw_only=True)
class Loop:
    """``count`` iterations of ``body``. ``steps`` is what the level tiles: the distinct
    ``(dim, extent)`` moves of the ops below at this level, in program order (empty when no
    op moves here). The stage that builds the loop records them, so printers and checks read
    the level instead of re-deriving it from the ops; ``verify_loop_tree`` checks the record
    against the ops' own ``tiling`` entries.

    ``carried`` names the buffers whose value one iteration hands to the next: a buffer the
    body reads before it writes it, in the same place (an accumulator ``<buf>_acc``, the
    running max and sum of an online softmax), sorted. They are written before the loop, live
    across all its iterations, and are read after it; every other buffer the body writes is
    dead at the end of an iteration. ``carried_buffers`` computes them; ``verify_loop_tree``
    checks the record against the body."""

    count: int
    steps: tuple[TileStep, ...]
    body: tuple[Union["Loop", OpNode], ...]
    carried: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.count, int) or isinstance(self.count, bool) or self.count < 1:
            raise TilingError(f"loop count {self.count!r} must be a positive integer")
        require_tuple(self.body, f"loop of count {self.count}: body", TilingError, (Loop, OpNode), non_empty=True)
        require_tuple(self.steps, f"loop of count {self.count}: steps", TilingError, TileStep)
        if len(set(self.steps)) != len(self.steps):
            raise TilingError(f"loop of count {self.count}: steps {_listed(self.steps)} repeat a (dim, extent) pair")
        require_tuple(self.carried, f"loop of count {self.count}: carried", TilingError, str)
        if list(self.carried) != sorted(set(self.carried)):
            raise TilingError(f"loop of count {self.count}: carried {list(self.carried)} must be sorted and distinct")
        misplaced = misplaced_guard([n.runs if isinstance(n, OpNode) else None for n in self.body])
        if misplaced is not None:
            k, where = misplaced
            odd = self.body[k]
            assert isinstance(odd, OpNode)
            raise TilingError(f"loop of count {self.count}: op {odd.name} runs in the {odd.runs} iteration only "
                              f"but is not at the {where} of the body; first-iteration ops come before every "
                              f"other node, last-iteration ops after")

    @property
    def dims(self) -> tuple[str, ...]:
        """The dims this level moves, in program order (a dim may move by different extents)."""
        return tuple(dict.fromkeys(s.dim for s in self.steps))



def _listed(steps: tuple[TileStep, ...]) -> str:
    return "[" + ", ".join(f"{s.dim}+{s.extent}" for s in steps) + "]"


def level_steps(body: tuple[Union[Loop, OpNode], ...], depth: int) -> tuple[TileStep, ...]:
    """The distinct steps at loop level ``depth`` over every op in ``body``, in program order:
    the ``steps`` of a loop at that depth built around ``body``."""
    seen: dict[TileStep, None] = {}
    for node, _ in walk(body):
        if isinstance(node, OpNode) and depth < len(node.tiling):
            seen.update(dict.fromkeys(node.tiling[depth]))
    return tuple(seen)


def carried_buffers(body: tuple[Union[Loop, OpNode], ...], depth: int,
                    full: Collection[str] = ()) -> tuple[str, ...]:
    """The buffers a loop at level ``depth`` around ``body`` carries from one iteration to the
    next: those some op of ``body`` reads before (in program order) the first op of ``body``
    that writes them. A buffer read but never written in the body is loop-invariant, not
    carried; nor is a ``full`` buffer (addressed with the loop's advance) that an op of the
    body moves through at this level: each iteration reads and writes its own region of it
    (an accumulator spanning the output tiles of an inner loop). The body's own guarded ops
    (``OpNode.runs``) run as if before (first) or after (last) the iterations: they hand
    nothing from one iteration to the next."""
    written: set[str] = set()
    read_first: set[str] = set()
    moving: set[str] = set()
    for node, _ in walk(body):
        if isinstance(node, OpNode) and not (node.guarded and len(node.tiling) == depth + 1):
            op = node.op
            read_first.update(ld.buffer for ld in op.loads if ld.buffer not in written)
            written.add(op.store.buffer)
            dims = {s.dim for s in node.tiling[depth]} if depth < len(node.tiling) else set()
            accesses = [(ld.buffer, ld.index) for ld in op.loads] + [(op.store.buffer, op.store.index)]
            for buffer, index in accesses:
                if buffer in full and dims & {v.name for v in index.free_symbols}:
                    moving.add(buffer)
    return tuple(sorted((read_first & written) - moving))


Node = Union[Loop, OpNode]


@dataclass(frozen=True, slots=True, kw_only=True)
class TreeBuffer:
    name: str
    type: TensorType
    scope: Scope = "full"

    def __post_init__(self) -> None:
        if self.scope not in SCOPES:
            raise TilingError(f"buffer {self.name}: scope {self.scope!r} must be one of {list(SCOPES)}")


@dataclass(frozen=True, slots=True, kw_only=True)
class LoopTree:
    name: str
    buffers: tuple[TreeBuffer, ...]
    inputs: tuple[str, ...]
    outputs: tuple[Output, ...]
    body: tuple[Node, ...]
    hints: tuple[HintScope, ...] = ()  # the graph's scopes: divide_work reads work_div here
    warnings: tuple[str, ...] = ()  # hinted counts the stage changed (docs/tiling.md, "Tails")

    def _repr_svg_(self) -> str | None:
        """A notebook shows the tree as its graphviz picture (None without graphviz's dot)."""
        from fspyre.pretty.dot import svg, to_dot

        return svg(to_dot(self))

    def __repr__(self) -> str:  # short: the whole tree prints with fspyre.pretty
        nodes = [n for n, _ in walk(self.body)]
        loops = sum(isinstance(n, Loop) for n in nodes)
        return f"LoopTree({self.name!r}: {loops} loops, {len(nodes) - loops} ops, {len(self.buffers)} buffers)"

    def __post_init__(self) -> None:
        what = f"loop tree {self.name}"
        require_tuple(self.buffers, f"{what}: buffers", TilingError, TreeBuffer)
        require_tuple(self.inputs, f"{what}: inputs", TilingError, str)
        require_tuple(self.outputs, f"{what}: outputs", TilingError, Output)
        require_tuple(self.body, f"{what}: body", TilingError, (Loop, OpNode))
        require_tuple(self.hints, f"{what}: hints", TilingError, HintScope)
        require_tuple(self.warnings, f"{what}: warnings", TilingError, str)

    def buffer_table(self) -> dict[str, TreeBuffer]:
        return {b.name: b for b in self.buffers}


def walk(body: tuple[Node, ...], depth: int = 0):
    """Yield ``(node, depth)`` in program order, loops before their bodies."""
    for node in body:
        yield node, depth
        if isinstance(node, Loop):
            yield from walk(node.body, depth + 1)


def op_nodes(tree_or_body: LoopTree | tuple[Node, ...]) -> list[OpNode]:
    body = tree_or_body.body if isinstance(tree_or_body, LoopTree) else tree_or_body
    return [n for n, _ in walk(body) if isinstance(n, OpNode)]


def loop_counts(tree: LoopTree) -> dict[str, tuple[int, ...]]:
    """Op name -> counts of its enclosing loops, outermost first."""
    out: dict[str, tuple[int, ...]] = {}

    def visit(body: tuple[Node, ...], counts: tuple[int, ...]) -> None:
        for node in body:
            if isinstance(node, Loop):
                visit(node.body, counts + (node.count,))
            else:
                out[node.name] = counts

    visit(tree.body, ())
    return out
