"""Stage ``divide_work``: LoopTree + machine -> SplitPlan (each op's work across cores).

Per op, on its per-tile iteration space (following torch-spyre's ``work_division.py``):

1. **Stick adjustment.** A dim whose variable is the stick coordinate of some tensor the op
   touches is counted in sticks: ``ceil(size / eps)`` with ``eps`` the largest
   elements-per-stick among those tensors, so every core gets whole sticks (the last slice
   may end in the dim's partial stick).
2. **Span reduction** (pass 1, mandatory). A tensor whose per-core span (the outermost device
   dim a core touches more than once, times the bytes below it) exceeds ``machine.span_limit``
   forces splits: per device dim outer to inner, every combination of divisors of the dim's
   variables (at least the splits already committed) within the core budget; the fewest slices
   that fit win, else the smallest span. More than one split reduction dim is an error.
3. **User hint.** ``g.hint(work_div={"M": 2})`` on the op's scopes is authoritative (validated
   like the anchor: integers >= 1, at most the stick-adjusted size; a count that does not
   divide it gives uneven slices). An op that does not
   iterate a hinted dim, or iterates it at one point (a one-element tile), is not split along
   it (as a loop-invariant op under ``slices``); a
   hinted dim no op of the scope iterates, and a hint that would exceed the core budget, are
   dropped with a warning in ``SplitPlan.warnings`` (docs/tiling.md, "Hint warnings").
4. **Work distribution** (pass 3). The output dims' splits that make the largest core's share
   (the product over dims of ``ceil(adjusted / split)``) smallest within the core budget,
   uneven slices allowed; the anchor's choice (dims by decreasing adjusted size each take the
   largest divisor the remaining cores allow, ``rem //= split``) wins ties. Then at most one
   reduction dim, the one whose largest slice the remaining cores make smallest.

Uneven slices: a split ``k`` of ``n`` units (elements, or sticks along a stick dim) gives
ceil and floor shares, the larger first (``fspyre.machine.rules.slice_extents``); each op's
slice extents are recorded in ``OpSplit.slices``, so every core's iteration space is explicit.

Never split: the reduction dims of ``var`` (the interpreter cannot combine partial
variances) and dims no tensor index uses (every core would read the same elements; the
anchor's iteration space leaves them out). The final splits must keep every tensor within
the span limit.

Core -> slice: cores enumerate the slices of ``OpSplit.splits`` in iteration-space order,
the first dim fastest (``fspyre.machine.rules.core_slices``; the anchor's
``core_to_slice_mapping``): with splits ``{M: 2, N: 3}`` cores 0..5 take
``(0,0) (1,0) (0,1) (1,1) (0,2) (1,2)``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

import sympy

from fspyre.errors import HintError, WorkDivisionError
from fspyre.ir.frozen import FrozenMap, require_fields
from fspyre.ir.graph import HintScope, Op, Pointwise, Reduction, iteration_dims
from fspyre.ir.looptree import LoopTree, TreeBuffer, op_nodes
from fspyre.ir.plans import OpSplit, SplitPlan
from fspyre.machine.indexing import free_names
from fspyre.machine.rules import coord_terms, slice_extents, term_extremes
from fspyre.machine.spyre import MAX_CORES, Machine
from fspyre.stages.access import Access, access_plan, analyze_accesses, op_dims
from fspyre.stages.arguments import require, require_tree, verified


@dataclass(frozen=True, slots=True, kw_only=True)
class SplitOptions:
    """``max_cores``: the core budget (the anchor's SENCORES), 1..machine.cores; None = all.
    ``work_div`` hints come from the LoopTree's hint scopes; ``use_hints=False`` ignores them;
    ``distribute=False`` keeps only the splits the
    span limit forces (pass 1 alone); dims in ``whole`` are never split (the dims of a
    symbolic size a whole-form program holds whole, docs/tiling.md "Symbolic sizes")."""

    max_cores: int | None = None  # the core budget, 1..machine.cores; None: all of them
    use_hints: bool = True  # honour the hint scopes' work_div
    distribute: bool = True  # spread ops over the cores; False: only the splits the span limit forces
    whole: frozenset[str] = frozenset()  # dims never split (a whole-form symbolic size)

    def __post_init__(self) -> None:
        budget = self.max_cores
        if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool)
                                   or not 1 <= budget <= MAX_CORES):
            raise WorkDivisionError(
                f"max_cores={budget!r}: the core budget must be an integer in 1..{MAX_CORES} (a Spyre card's cores) "
                f"or None for all of the machine's; pass max_cores in that range"
            )
        require_fields(self, WorkDivisionError)


def divisors(n: int, at_most: int | None = None) -> list[int]:
    top = n if at_most is None else min(n, at_most)
    return [d for d in range(1, top + 1) if n % d == 0]


def core_split(n: int, cores: int) -> int:
    """The largest divisor of ``n`` that is at most ``cores``."""
    return max(divisors(n, cores))


def useful_splits(n: int, cores: int) -> list[int]:
    """The splits of ``n`` units worth trying within ``cores``: for each largest-slice size
    ``ceil(n / k)`` reachable, the fewest slices ``k`` that reach it (more would only add
    cores without shrinking the largest share)."""
    out, k = [], 1
    while k <= min(n, cores):
        out.append(k)
        q = -(-n // k)  # this k's largest slice; the next useful k has a smaller one
        if q == 1:
            break
        k = -(-n // (q - 1))
    return out


def divide_work(tree: LoopTree, machine: Machine, options: SplitOptions = SplitOptions()) -> SplitPlan:
    require(machine, Machine, "divide_work", "machine")
    require(options, SplitOptions, "divide_work", "options")
    require_tree(tree, "divide_work", machine)
    budget = machine.cores if options.max_cores is None else options.max_cores
    if not isinstance(budget, int) or isinstance(budget, bool) or not 1 <= budget <= machine.cores:
        raise WorkDivisionError(
            f"max_cores={budget!r}: the core budget must be an integer in 1..{machine.cores} (the machine has "
            f"{machine.cores} cores; a Spyre card at most {MAX_CORES}); pass max_cores in that range"
        )
    scopes = {h.id: h for h in tree.hints}
    analysis = analyze_accesses(tree, machine)
    plans: dict[str, OpSplit] = {}
    notes: list[str] = []
    warnings: list[str] = []
    nodes = op_nodes(tree)
    table = tree.buffer_table()
    # Ops of one shape (a chain's, a fan-out's, a candidate tiling's, the next copy trial's)
    # divide alike: each shape is divided once per process (``_DIVIDED``), unless its division
    # noted or warned (the messages name the op).
    for node in nodes:
        accesses = analysis.ops[node.name].tensors
        hint = _merged_hint(node.op, scopes) if options.use_hints else {}
        replicates = _replicates(node.op, table)
        # A peeled tail divides like the op it copies (docs/tiling.md, "Tails"): divided on its
        # own, the remainder's shape can pick other slices for its pointwise ops than for its
        # reductions, and the per-tile buffers between them would leave LX.
        origin = plans.get(node.origin) if node.peeled and not hint and options.distribute else None
        follow = None if origin is None else tuple(origin.splits.items())
        shape = _division_shape(node.op, accesses, hint, replicates)
        key = None if shape is None else (shape, budget, machine.span_limit, options.distribute, options.whole,
                                          follow)
        split = _DIVIDED.get(key) if key is not None else None
        if split is None:
            said = len(notes), len(warnings)
            split = _divide_op(node.op, accesses, budget, machine.span_limit, hint, options.distribute,
                               notes, warnings, replicates, options.whole, dict(follow or ()))
            if key is not None and (len(notes), len(warnings)) == said:
                _remember(_DIVIDED, key, split)
        plans[node.name] = split
    if options.use_hints:
        warnings[:0] = _uniterated_work_div(tree.hints, [n.op for n in nodes])
    return SplitPlan(ops=FrozenMap(plans), notes=tuple(notes), warnings=tuple(warnings), accesses=analysis)


def _uniterated_work_div(hints: Sequence[HintScope], ops: Sequence[Op]) -> list[str]:
    """A work_div dim that no op built in its scope iterates has no effect."""
    out = []
    built_in: dict[int, list[Op]] = {}  # one pass over the ops: keep_resident adds a scope per copy and pin
    for op in ops:
        for sid in op.hints:
            built_in.setdefault(sid, []).append(op)
    for scope in hints:
        members = built_in.get(scope.id, [])
        iterated = {d.name for op in members for d in iteration_dims(op) if d.size > 1}
        for dim, count in scope.work_div.items():
            if not members:
                out.append(f"hint scope {scope.id} work_div={{{dim!r}: {count}}}: no op was built inside it; "
                           f"hint ignored (build the ops to divide inside the `with g.hint(...)` block)")
            elif dim not in iterated:
                names = "[" + ", ".join(op.name for op in members) + "]"
                out.append(
                    f"hint scope {scope.id} work_div={{{dim!r}: {count}}}: no op of {names} iterates dim {dim}; "
                    f"hint ignored (remove it, or build the ops that iterate {dim} inside the scope)"
                )
    return out


# Divisions by their shape and the options that divided them: a tiling search divides the
# same op shapes in hundreds of candidate trees, and keep_resident re-divides each tree once
# per set of copies it tries. Bounded: a cleared table only costs the divisions again.
_DIVIDED: dict[tuple, OpSplit] = {}
_DIVIDED_MAX = 1 << 14


def _remember(table: dict, key: tuple, value: object) -> None:
    if len(table) >= _DIVIDED_MAX:
        table.clear()
    table[key] = value


def _division_shape(op: Op, accesses: Sequence[Access], hint: Mapping[str, object], replicates: bool) -> tuple | None:
    """Everything ``_divide_op`` reads but names: its dims, indices and tensors' layouts and
    device coordinates, the hint and the replica rule. None when a hint count is not an
    integer (``_divide_op`` refuses it)."""
    if not all(type(k) is int for k in hint.values()):
        return None
    return (type(op), op.fn, op.ranges, op.reduction_ranges, op.store.index, tuple(ld.index for ld in op.loads),
            tuple((acc.index, acc.coords, acc.layout) for acc in accesses), tuple(hint.items()), replicates)


def _merged_hint(op: Op, scopes: Mapping[int, HintScope]) -> dict[str, object]:
    """work_div entries of the op's scopes, inner scopes (larger ids) overriding outer ones."""
    out: dict[str, object] = {}
    for sid in sorted(op.hints):
        if sid in scopes:
            out.update(scopes[sid].work_div)
    return out


_MAX_GRID = 1 << 22  # a multi-variable coordinate term is swept over at most this many points


class _Span:
    """Per-core span of one tensor (torch-spyre ``get_per_core_span``): the first non-stick
    device dim, outer to inner, whose per-core extent exceeds 1, times the bytes one step of
    it covers. Extents come from slice 0, term by term (coordinates are sums of one-variable
    terms)."""

    def __init__(self, acc: Access, sizes: Mapping[str, int], eps: Mapping[str, int]) -> None:
        self.acc = acc
        self.sizes = sizes
        self.eps = eps
        self.coords = [coord_terms(c) for c in acc.coords[:-1]]
        # each group's variable names, looked up per candidate split (a name, not str(Symbol))
        self.names = [[tuple(v.name for v in syms) for syms, _ in groups] for _, groups in self.coords]
        ds = acc.layout.device_size
        self.below = [math.prod(ds[d + 1:]) * acc.layout.elem_bytes for d in range(len(ds) - 1)]

    def extent(self, d: int, split: Mapping[str, int]) -> int:
        _, groups = self.coords[d]
        ext = 1
        for names, (syms, term) in zip(self.names[d], groups):
            # slice 0, a largest slice (ceil shares come first)
            per = tuple(slice_extents(self.sizes[v], split.get(v, 1), self.eps.get(v, 1))[0] for v in names)
            if math.prod(per) > _MAX_GRID:
                return self.acc.layout.device_size[d]  # too large to sweep: assume the whole dim
            lo, hi = term_extremes(term, syms, tuple((n,) for n in per))
            ext += int(hi.max() - lo.min())
        return min(ext, self.acc.layout.device_size[d])

    def bytes(self, split: Mapping[str, int]) -> int:
        for d in range(len(self.coords)):
            ext = self.extent(d, split)
            if ext > 1:
                return ext * self.below[d]
        return self.acc.layout.elem_bytes

    def vars(self, d: int) -> list[str]:
        return [v for names in self.names[d] for v in names]


def per_core_span(access: Access, sizes: Mapping[str, int], split: Mapping[str, int],
                  eps: Mapping[str, int] | None = None) -> int:
    """Bytes one core (with a largest slice) spans in ``access``'s tensor when the op's dims of
    ``sizes`` (per-tile elements) are split by ``split``, in whole ``eps``-element sticks along
    the stick dims (reference section 3.2)."""
    return _Span(access, sizes, eps or {}).bytes(split)


def _replicates(op: Op, table: Mapping[str, TreeBuffer]) -> bool:
    """A copy into a per-tile buffer may be split along a dim no index uses, when a work_div
    asks for it: each core then copies the whole region into its own LX (keep_resident's
    replicated copies). Anywhere else such a split would only repeat work, or have several
    cores write the same HBM bytes."""
    return isinstance(op, Pointwise) and op.fn == "copy" and table[op.store.buffer].scope == "tile"


def splittable_reduction(op: Op, dims: set[str] | frozenset[str]) -> set[str]:
    """Those of ``dims`` (the op's reduction dims) the op may split across cores: each core's
    partial result is combined after (a sum, a max, a matmul's partial sums), except a
    variance's, whose partial variances cannot be combined."""
    return set() if isinstance(op, Reduction) and op.fn == "var" else set(dims)


def _divide_op(op: Op, accesses: Sequence[Access], budget: int, limit: int, hint: Mapping[str, object],
               distribute: bool, notes: list[str], warnings: list[str], replicates: bool = False,
               whole: frozenset[str] = frozenset(), follow: Mapping[str, int] | None = None) -> OpSplit:
    """``follow``: the splits of the op a peeled tail copies, taken as far as the tail's
    (smaller) extents go, in place of a division of its own."""
    dims = op_dims(op)
    names = [d.name for d in dims]
    size = {d.name: d.size for d in dims}
    reduction = {d.name for d in op.reduction_ranges if d.size > 1}

    eps: dict[str, int] = {}
    for acc in accesses:
        free = free_names(acc.coords[-1])
        if len(free) == 1 and next(iter(free)) in size:
            v = next(iter(free))
            eps[v] = max(eps.get(v, 0), acc.layout.elems_per_stick)
    adjusted = {n: -(-size[n] // eps[n]) if n in eps else size[n] for n in names}
    blocked: dict[str, str] = {}
    used = set().union(*(free_names(acc.index) for acc in accesses))
    for n in names:
        # the anchor's iteration space holds only vars some index uses
        if n not in used and not (replicates and n in hint):
            blocked[n] = "no tensor index uses it: every core would read the same elements"
    for n in reduction - splittable_reduction(op, reduction):
        blocked[n] = "partial variances cannot be combined across cores"
    for n in whole & set(names):
        blocked[n] = "its size is symbolic: each core takes all of it, at every size"

    spans = [_Span(acc, size, eps) for acc in accesses]
    committed = _span_reduction(op, spans, adjusted, blocked, reduction, budget, limit, notes)

    if hint:
        split = _apply_hint(op, hint, adjusted, blocked, reduction, committed, budget, notes, warnings)
    elif follow:
        # the origin's division fits the origin's larger tile, so its spans fit here too
        split = {n: min(k, adjusted[n]) for n, k in follow.items() if n in adjusted and k > 1 and n not in blocked}
    elif distribute:
        split = _distribute(names, adjusted, blocked, reduction, committed, budget)
    else:
        split = dict(committed)

    for sp in spans:
        got = sp.bytes(split)
        if got > limit:
            raise WorkDivisionError(
                f"op {op.name}: tensor {sp.acc.buffer} spans {got} bytes per core with splits "
                f"{ {n: split.get(n, 1) for n in names} }, over the {limit}-byte per-core span limit; "
                f"tile the op with g.hint(slices=...), give it more cores, or hint work_div on its outer dims"
            )

    final = FrozenMap((n, split.get(n, 1)) for n in names)
    out_coeffs, red_coeffs = _index_coeffs(op, final)
    return OpSplit(
        splits=final,
        cores=math.prod(final.values()),
        slices=FrozenMap((n, slice_extents(size[n], k, eps.get(n, 1))) for n, k in final.items() if k > 1),
        stick_elems=FrozenMap((n, eps[n]) for n in names if n in eps),
        span_splits=FrozenMap((n, committed[n]) for n in names if n in committed),
        output_coeffs=out_coeffs,
        reduction_coeffs=red_coeffs,
        hinted=bool(hint),
    )


def _span_reduction(op: Op, spans: Sequence[_Span], adjusted: Mapping[str, int],
                    blocked: Mapping[str, str], reduction: set[str], budget: int, limit: int,
                    notes: list[str]) -> dict[str, int]:
    """Pass 1: the minimum splits that bring every tensor's per-core span under ``limit``."""
    acc: dict[str, int] = {}
    for sp in spans:
        if sp.bytes(acc) <= limit:
            continue
        for d in range(len(sp.coords)):
            if sp.extent(d, acc) == 1:
                continue
            cand = [v for v in sp.vars(d) if v in adjusted and v not in blocked and adjusted[v] > 1]
            factors = []
            for v in cand:
                fs = [f for f in divisors(adjusted[v], budget) if f >= acc.get(v, 1)]
                if not fs:
                    raise WorkDivisionError(
                        f"op {op.name}: no valid split for dim {v} (size {adjusted[v]}"
                        f"{' sticks' if adjusted[v] != sp.sizes[v] else ''}, already split {acc.get(v, 1)}) "
                        f"within {budget} cores to reduce the span of tensor {sp.acc.buffer}"
                    )
                factors.append(fs)
            best, best_key = None, None
            for combo in itertools.product(*factors):
                trial = {**acc, **dict(zip(cand, combo))}
                if math.prod(trial.values()) > budget:
                    continue
                b = sp.bytes(trial)
                # Two tiers: any fit beats every miss; among fits the largest span (fewest
                # slices), among misses the smallest span. The first found wins ties.
                key = (0, -b) if b <= limit else (1, b)
                if best_key is None or key < best_key:
                    best, best_key = trial, key
            if best is None:
                notes.append(f"op {op.name}: tensor {sp.acc.buffer} spans {sp.bytes(acc)} bytes per core and no "
                             f"split of device dim {d} fits in {budget} cores")
                break
            acc = {v: s for v, s in best.items() if s > 1}
            if sp.bytes(acc) <= limit:
                break
            if sp.extent(d, acc) > 1:
                notes.append(f"op {op.name}: tensor {sp.acc.buffer} still spans {sp.bytes(acc)} bytes per core; "
                             f"inner device dims cannot reduce the span")
                break
    split_red = [v for v in acc if v in reduction]
    if len(split_red) > 1:
        raise WorkDivisionError(
            f"op {op.name}: the per-core span limit of {limit} bytes needs splits of reduction dims "
            f"{split_red} ({ {v: acc[v] for v in split_red} }); at most 1 reduction dim may be split. "
            f"Tile the reduction with g.hint(slices=...) or reshape the operands"
        )
    return acc


def _apply_hint(op: Op, hint: Mapping[str, object], adjusted: Mapping[str, int], blocked: Mapping[str, str],
                reduction: set[str], committed: Mapping[str, int], budget: int, notes: list[str],
                warnings: list[str]) -> dict[str, int]:
    all_dims = {d.name: d.size for d in iteration_dims(op)}
    split = dict(committed)
    for name, k in hint.items():
        where = f"op {op.name}: work_div hint {{{name!r}: {k!r}}}"
        if not isinstance(k, int) or isinstance(k, bool):
            raise HintError(f"{where}: the count must be an integer")
        if k < 1:
            raise HintError(f"{where}: the count must be positive")
        if all_dims.get(name, 1) == 1:
            # not split along a dim it lacks, or iterates at one point (a tile of one element):
            # _uniterated_work_div warns when no op of the scope iterates it
            continue
        if k > 1 and name in blocked:
            raise HintError(f"{where}: dim {name} may not be split ({blocked[name]})")
        used = math.prod(split.values()) // split.get(name, 1)
        if used * k > budget:
            warnings.append(
                f"{where}: skipped, {used} x {k} cores exceed the budget of {budget}, so the op is split "
                f"without the hint; hint a count of at most {budget // used} or give the machine more cores"
            )
            continue
        n = adjusted.get(name, all_dims[name])
        if k > n:
            # one slice per unit is as far as the hint can go (a tile of the dim may be smaller
            # than the scope's other ops' dims): honoured that far, and said so
            unit = f"{n} sticks" if n != all_dims[name] else f"{n} elements"
            warnings.append(f"{where}: {k} slices are more than dim {name} has ({unit}), so it is split into {n}; "
                            f"hint at most {n} to silence this")
            k = n
        if name in committed and committed[name] != k:
            notes.append(f"{where}: overrides the span split {committed[name]}")
        if k > 1:
            split[name] = k
        else:
            split.pop(name, None)
    split_red = [v for v in split if v in reduction and split[v] > 1]
    if len(split_red) > 1:
        raise HintError(
            f"op {op.name}: work_div splits reduction dims {split_red}; at most one reduction dim may be split"
        )
    return split


def _distribute(names: Sequence[str], adjusted: Mapping[str, int], blocked: Mapping[str, str], reduction: set[str],
                committed: Mapping[str, int], budget: int) -> dict[str, int]:
    """Pass 3: torch-spyre's ``multi_dim_iteration_space_split`` (each output dim by
    decreasing size takes the largest divisor the remaining cores allow), unless uneven
    slices or another combination make the largest core's share smaller."""
    split = dict(committed)
    rem = budget
    for m in committed.values():
        rem //= m
    free = [n for n in names if n not in committed and n not in blocked and adjusted[n] > 1]
    outs = sorted((n for n in free if n not in reduction), key=lambda n: -adjusted[n])
    reds = [] if any(v in reduction for v in committed) else sorted(
        (n for n in free if n in reduction), key=lambda n: -adjusted[n])
    anchor: dict[str, int] = {}
    left = rem
    for n in outs:
        if left <= 1:
            break
        s = core_split(adjusted[n], left)
        if s > 1:
            anchor[n] = s
            left //= s
    chosen = _balanced(outs, adjusted, rem, anchor)
    split.update({n: s for n, s in chosen.items() if s > 1})
    rem //= math.prod(chosen.values())
    if reds and rem > 1:
        # the reduction dim whose largest slice shrinks most (max keeps the first on ties)
        best = max(reds, key=lambda n: adjusted[n] / -(-adjusted[n] // min(adjusted[n], rem)))
        s = useful_splits(adjusted[best], rem)[-1]
        if s > 1:
            split[best] = s
    return split


def _balanced(outs: Sequence[str], adjusted: Mapping[str, int], budget: int,
              anchor: Mapping[str, int]) -> dict[str, int]:
    """The splits of ``outs`` (within ``budget`` cores) whose largest core share, the product
    of ``ceil(adjusted / split)``, is smallest, and among those the one using the most cores
    (the work spreads wider though the largest share is the same). Ties go to ``anchor`` (the
    anchor's choice), then to fewer uneven dims and more slices for the earlier (larger) dims."""
    units = tuple(adjusted[n] for n in outs)
    got = _balanced_units(units, budget, tuple(anchor.get(n, 1) for n in outs))
    return {n: k for n, k in zip(outs, got) if k > 1}


@lru_cache(maxsize=4096)
def _balanced_units(units: tuple[int, ...], budget: int, anchor: tuple[int, ...]) -> tuple[int, ...]:
    # cached: the ops of a chain, and the candidates of a tiling search, repeat their shapes
    def key(sp: Sequence[int]) -> tuple:
        share = math.prod(-(-n // k) for n, k in zip(units, sp))
        uneven = sum(1 for n, k in zip(units, sp) if n % k)
        return (share, -math.prod(sp), uneven, tuple(-k for k in sp))

    best, best_key = anchor, (*key(anchor)[:2], -1)  # the anchor's choice wins ties
    sp = [1] * len(units)

    def visit(i: int, left: int) -> None:
        nonlocal best, best_key
        if i == len(units):
            k = key(sp)
            if k < best_key:
                best, best_key = tuple(sp), k
            return
        for s in range(1, min(units[i], left) + 1):
            sp[i] = s
            visit(i + 1, left // s)
        sp[i] = 1

    visit(0, budget)
    return best


@lru_cache(maxsize=8192)
def _coeff(index: sympy.Expr, var: sympy.Symbol) -> int:
    # cached: ops of a chain share their indices, and expand() is the costly part
    return int(sympy.expand(index).coeff(var))


def _index_coeffs(op: Op, splits: Mapping[str, int]) -> tuple[FrozenMap[int, int], FrozenMap[int, int]]:
    """The anchor's coefficient-keyed splits: output dims by their coefficient in the write
    index, reduction dims by theirs in the first read index that uses them; 1s dropped."""
    out, red = {}, {}
    for d in op_dims(op):
        s = splits.get(d.name, 1)
        if s == 1:
            continue
        if d in op.reduction_ranges:
            for load in op.loads:
                c = _coeff(load.index, d.symbol)
                if c:
                    red[c] = s
                    break
        else:
            out[_coeff(op.store.index, d.symbol)] = s
    return FrozenMap(out), FrozenMap(red)


def splits_from_index_coeffs(op: Op, split: OpSplit) -> dict[str, int]:
    """Recover dim -> slices from the coefficient-keyed form (the anchor's
    ``apply_splits_from_index_coeff``); range-1 dims are skipped."""
    out = {}
    for d in op_dims(op):
        if d in op.reduction_ranges:
            c = next((_coeff(ld.index, d.symbol) for ld in op.loads if _coeff(ld.index, d.symbol)), 0)
            out[d.name] = split.reduction_coeffs.get(c, 1)
        else:
            out[d.name] = split.output_coeffs.get(_coeff(op.store.index, d.symbol), 1)
    return out


# -- verification ----------------------------------------------------------------------------
def verify_split_plan(tree: LoopTree, plan: SplitPlan, machine: Machine) -> SplitPlan:
    """The split plan divides exactly the tree's ops, each over its own iteration dims (in
    order), within the machine's cores, in whole slices (whole sticks along a stick dim) and
    within the per-core span limit: what ``allocate`` and ``emit_program`` rely on. Linear in
    the tree; a plan made for another tree, or edited, is refused naming the first mismatch."""
    verified(verify_split_shapes, tree, plan, machine)
    seen: dict[tuple, int] = {}  # ops of one shape share their spans: each is swept once
    for name, record in access_plan(tree, plan, machine).ops.items():
        split = plan.ops[name]
        if split.cores == 1:
            continue
        sizes = {d.name: d.size for d in record.dims}
        for acc in record.tensors:
            key = (acc.coords, acc.layout.device_size, acc.layout.elem_bytes, tuple(sizes.items()), split.splits)
            got = seen.get(key)
            if got is None:
                got = seen[key] = per_core_span(acc, sizes, split.splits, split.stick_elems)
            if got > machine.span_limit:
                raise WorkDivisionError(
                    f"split plan: op {name} spans {got} bytes of tensor {acc.buffer} per core with splits "
                    f"{dict(split.splits)}, over the {machine.span_limit}-byte per-core span limit; "
                    f"split its outer dims further"
                )
    return plan


def verify_split_shapes(tree: LoopTree, plan: SplitPlan, machine: Machine) -> SplitPlan:
    """``verify_split_plan`` without the per-core span check (the one part that sweeps
    coordinates): the plan names exactly the tree's ops and dims, within the machine's cores,
    in whole slices. ``allocate`` runs it on the plan it is handed, so a plan made for another
    tree is refused by name instead of failing on a missing key."""
    require(tree, LoopTree, "verify_split_plan", "tree")
    require(plan, SplitPlan, "verify_split_plan", "plan")
    require(machine, Machine, "verify_split_plan", "machine")
    records = access_plan(tree, plan, machine).ops  # each op's dims, as the program lists them
    extra = [name for name in plan.ops if name not in records]
    if extra:
        raise WorkDivisionError(
            f"split plan divides op {extra[0]}, which loop tree {tree.name} does not have (its ops: "
            f"{_few(records)}); the plan was made for another tree: divide_work(tree, machine)"
        )
    for name, record in records.items():
        split = plan.ops.get(name)
        if split is None:
            raise WorkDivisionError(
                f"split plan has no entry for op {name} of loop tree {tree.name} (it divides "
                f"{_few(plan.ops)}); the plan was made for another tree: divide_work(tree, machine)"
            )
        dims = record.dims
        if len(split.splits) != len(dims) or any(a != d.name for a, d in zip(split.splits, dims)):
            raise WorkDivisionError(
                f"split plan: op {name} iterates dims {[d.name for d in dims]} (size > 1, in order) but its "
                f"split lists {list(split.splits)}; the plan was made for another tree: divide_work(tree, machine)"
            )
        if split.cores > machine.cores:
            raise WorkDivisionError(
                f"split plan: op {name} runs on {split.cores} cores ({dict(split.splits)}), more than the "
                f"machine's {machine.cores}; divide its work for this machine"
            )
        if split.cores == 1:
            continue
        stray = [d for d in split.slices if split.splits.get(d, 1) == 1]
        if stray:
            raise WorkDivisionError(f"split plan: op {name} lists slices of dim {stray[0]}, which it does not split")
        for d in dims:
            k = split.splits[d.name]
            if k == 1:
                continue
            eps = split.stick_elems.get(d.name, 1)
            ext = split.slices.get(d.name)
            units = -(-d.size // eps)
            if ext is None or sum(ext) != d.size:
                got = "lists no slice extents" if ext is None else f"has slices of {sum(ext)} elements in all"
                raise WorkDivisionError(
                    f"split plan: op {name} splits dim {d.name} (size {d.size}) into {k} slices but {got}; the plan "
                    f"was made for another tree: divide_work(tree, machine)"
                )
            if any(e % eps for e in ext[:-1]):
                raise WorkDivisionError(
                    f"split plan: op {name} splits dim {d.name} (size {d.size}) into slices of {list(ext)} elements, "
                    f"which are not whole {eps}-element sticks per core (only the last may end in a partial stick); "
                    f"use fspyre.machine.rules.slice_extents({d.size}, {min(k, units)}, {eps})"
                )
    return plan


def _few(names, n: int = 6) -> str:
    names = list(names)
    return "[" + ", ".join(names[:n]) + (f", ... {len(names) - n} more" if len(names) > n else "") + "]"
