"""Which graph value each program element holds: labels ``L[buffer, index]`` (a graph buffer
and its flat host index) carried along the program's last-writer flow, checked against the
graph's ``Load`` and ``Store`` indices (docs/proof.md, "Graph values").

- A copy-in labels each host element of a kernel input ``L[input, index]``.
- An op named after graph op ``G`` (or its ``_again`` / ``_tail``) computes the graph points
  ``p`` of ``G`` whose ``Load`` indices match the labels of what it read (all operands at
  once); each instance must find one, and its write is labelled ``L[G's buffer, Store(p)]``.
  Over all its instances, ``G`` and its tail compute every point of ``G``'s domain once (a
  tiled or split reduction: each element's whole reduction range exactly once).
- Any other op (copies, accumulator fills, combines, finishes, online-softmax rescales) keeps
  the labels its operands of the output's device shape agree on: none agreeing is a refutation;
  an op with no such operand, or one reducing, writes values of no single graph element
  (unconstrained labels).
- Each copied-out host element must hold its own label.

Labels of an op that reads its own earlier writes (an accumulator) are found by iterating
from "unconstrained" until nothing changes.
"""

from __future__ import annotations

import heapq
import re
from functools import reduce

import islpy as isl
import sympy

from fspyre.ir.graph import Graph, Load, Op, Reduction
from fspyre.ir.program import ArgOperand, LoopSpec, OpSpec
from fspyre.proof.artifact import PropertyResult
from fspyre.proof.sets import CTX, Access, Model, NotAffine, isl_text

_ROUNDS = 8


def _graph_op(spec: OpSpec, ops: dict[str, Op]) -> Op | None:
    name = spec.name or spec.op
    if name in ops:
        return ops[name]
    m = re.fullmatch(r"(.+?)_(again|tail)\d*(_\d+)?", name)
    return ops.get(m.group(1)) if m else None


def _domain(op: Op) -> list:
    return list(op.ranges) + (list(op.reduction_ranges) if isinstance(op, Reduction) else [])


def _gspace(op: Op) -> tuple[str, str]:
    dims = _domain(op)
    names = [f"g{j}" for j in range(len(dims))]
    cond = " and ".join(f"0 <= {n} < {isl_text(d.size, {})}" for n, d in zip(names, dims)) or "true"
    return f"G[{', '.join(names)}]", cond


class _Labels:
    """Where graph values live: buffer ``b``'s element is ``L<b>[i_0, .., i_{r-1}]`` (its host
    index) when every index the graph uses for ``b`` splits into in-range coordinates along
    its row-major strides (the usual case: then matching an index is matching coordinates,
    no integer division), else ``L<b>[flat index]``. ``U[]`` is a value of no single graph
    element (an accumulator's, before its labels settle)."""

    def __init__(self, model: Model, graph: Graph) -> None:
        self.model = model
        self.bids = {b.name: j for j, b in enumerate(graph.buffers)}
        self.shape = {b.name: tuple(int(n) for n in b.type.shape) if all(_fixed(n) for n in b.type.shape) else None
                      for b in graph.buffers}
        self.split: dict[tuple[str, str], tuple | None] = {}
        self.multi = {b: shape is not None for b, shape in self.shape.items()}
        for op in graph.ops:
            for buffer, index in [(o.buffer, o.index) for o in op.operands if isinstance(o, Load)] + \
                                 [(op.store.buffer, op.store.index)]:
                parts = self._split(op, buffer, index)
                self.split[(op.name, str(index) + "@" + buffer)] = parts
                if parts is None:
                    self.multi[buffer] = False
        self.cache: dict = {}

    def _split(self, op: Op, buffer: str, index: sympy.Expr) -> tuple | None:
        """``index`` as one coordinate per dim of ``buffer``, each inside its dim over the op's
        domain, or None."""
        shape = self.shape.get(buffer)
        if shape is None or not shape:
            return () if shape == () and index == 0 else None
        strides = _strides(shape)
        parts = [sympy.Integer(0)] * len(shape)
        ranges = {d.symbol: d.size for d in _domain(op)}
        for term in sympy.Add.make_args(sympy.expand(index)):
            coeff, rest = term.as_coeff_Mul()
            if not coeff.is_Integer:
                return None
            d = next(d for d, st in enumerate(strides) if int(coeff) % st == 0)
            parts[d] += (int(coeff) // strides[d]) * rest
        for part, n in zip(parts, shape):
            low = high = 0
            for term in sympy.Add.make_args(part):
                coeff, rest = term.as_coeff_Mul()
                if rest == 1:
                    low, high = low + int(coeff), high + int(coeff)
                elif rest in ranges and _fixed(ranges[rest]) and coeff.is_Integer:
                    ends = (0, int(coeff) * (int(ranges[rest]) - 1))
                    low, high = low + min(ends), high + max(ends)
                else:
                    return None  # not a sum of independent domain symbols: the flat index decides
            if low < 0 or high >= n:  # bounds by intervals: wider than the truth, never narrower
                return None
        # in range along the row-major strides: the flat index and the coordinates determine
        # each other
        return tuple(parts)

    def graph(self, op: Op, buffer: str, index: sympy.Expr) -> isl.UnionMap:
        """The graph op's points -> the element of ``buffer`` at ``index``."""
        key = (op.name, buffer, str(index))
        if key not in self.cache:
            names = {d.symbol: f"g{j}" for j, d in enumerate(_domain(op))}
            space, cond = _gspace(op)
            parts = self.split.get((op.name, str(index) + "@" + buffer)) if self.multi[buffer] else None
            at = ", ".join(isl_text(x, names) for x in parts) if parts is not None else isl_text(index, names)
            self.cache[key] = self.model.union_map([f"{space} -> L{self.bids[buffer]}[{at}] : {cond}"])
        return self.cache[key]

    def flat(self, op: Op, index: sympy.Expr) -> isl.UnionMap:
        """The graph op's points -> ``A[index]``: the flat index, whichever buffer."""
        key = (op.name, "A", str(index))
        if key not in self.cache:
            names = {d.symbol: f"g{j}" for j, d in enumerate(_domain(op))}
            space, cond = _gspace(op)
            self.cache[key] = self.model.union_map([f"{space} -> A[{isl_text(index, names)}] : {cond}"])
        return self.cache[key]

    def host(self, acc: Access) -> str:
        """The label text of a kernel argument's host element ``h``."""
        buffer = acc.arg.buffer
        if self.multi.get(buffer) and self.shape[buffer] == tuple(int(n) for n in acc.arg.host_shape
                                                                  if _fixed(n)):
            return f"L{self.bids[buffer]}[{', '.join(acc.dims)}]"
        idx = " + ".join(f"{_stride(acc, j)} * h{j}" for j in range(len(acc.dims))) or "0"
        return f"L{self.bids[buffer]}[{idx}]"

    def flatten(self) -> isl.UnionMap:
        """Every label -> ``A[its flat index]`` (an element of whichever buffer: what an op
        combining several keeps), ``A`` to itself, and ``U[]`` -> every ``A``."""
        if "flatten" in self.cache:
            return self.cache["flatten"]
        parts = ["U[] -> A[x]", "A[x] -> A[x]"]
        for b in self.bids:
            shape = self.shape[b]
            if self.multi[b] and shape is not None:
                xs = [f"i{j}" for j in range(len(shape))]
                flat = " + ".join(f"{st} * {x}" for st, x in zip(_strides(shape), xs)) or "0"
                parts.append(f"L{self.bids[b]}[{', '.join(xs)}] -> A[{flat}]")
            else:
                parts.append(f"L{self.bids[b]}[x] -> A[x]")
        self.cache["flatten"] = self.model.union_map(parts)
        return self.cache["flatten"]


def _strides(shape: tuple[int, ...]) -> list[int]:
    return [int(sympy.Mul(*shape[d + 1:])) for d in range(len(shape))]


def _fixed(n) -> bool:
    return isinstance(n, int) or bool(getattr(n, "is_Integer", False))


def _instances(model: Model, acc: Access) -> isl.UnionSet:
    return model.instances(acc)


def _to_op(model: Model, acc: Access, drop_reduced: bool = False) -> isl.UnionMap:
    """Instances of ``acc`` -> the op's instance ``O<t>[loops, c, point]``; for the write,
    every point of the reduced symbols (the write stands for all of them)."""
    key = ("to_op", acc.stmt, drop_reduced)
    if key in model.cache:
        return model.cache[key]
    dims = list(acc.dims)
    target = list(dims)
    if drop_reduced and acc.spec is not None:
        reduced = set(acc.spec.op_info.reduced) if acc.spec.is_reduction else set()
        # the reduced symbols' points, and the slices holding them, range over the whole reduction
        n, at = len(acc.syms), acc.loops + 1 + len(acc.syms)
        target = [f"q{j}" if (at <= j < at + n and acc.syms[j - at] in reduced)
                  or (acc.loops + 1 <= j < at and acc.syms[j - acc.loops - 1] in reduced) else d
                  for j, d in enumerate(dims)]
    out = model.union_map([f"{acc.head()} -> O{acc.t}[{', '.join(target)}]"]).intersect_domain(_instances(model, acc))
    model.cache[key] = out
    return out


def graph_values(model: Model, graph: Graph, deps: isl.UnionMap) -> tuple[PropertyResult | None, PropertyResult | None]:
    """(a coverage refutation or None, a dataflow refutation or None); raises NotAffine."""
    from fspyre.proof.properties import counterexample

    ops = {op.name: op for op in graph.ops}
    labels_of = _Labels(model, graph)
    writes = [a for a in model.accesses if a.is_write]
    reads = [a for a in model.accesses if not a.is_write]
    back = deps.reverse()  # read -> its last writer

    fixed = model.union_map([])
    for acc in writes:  # noqa: B007
        if acc.spec is None:  # copy-in: each host element is its own graph value
            fixed = fixed.union(model.union_map([f"{acc.head()} -> {labels_of.host(acc)} : {cond}"
                                                 for cond, _, _, _ in acc.pieces]))
    op_writes = [a for a in writes if a.spec is not None]
    anything = {a.stmt: _instances(model, a) for a in op_writes}
    label_of: dict[str, isl.UnionMap] = {}
    for acc in writes:
        label_of[acc.stmt] = (fixed.intersect_domain(_instances(model, acc)) if acc.spec is None
                              else _universe(model, {acc.stmt: anything[acc.stmt]}))
    by_op: dict[int, list[Access]] = {}
    for a in reads:
        if a.spec is not None:
            by_op.setdefault(a.t, []).append(a)
    sources = {a.stmt: back.intersect_domain(_instances(model, a)) for a in reads}
    points: dict[str, isl.UnionMap] = {}

    def labelled(a: Access) -> isl.UnionMap:
        src = sources[a.stmt]
        out = model.union_map([])
        for name in _tuple_names(src.range()):
            out = out.union(label_of[name])
        return src.apply_range(out)

    # Gauss-Seidel in program order over a worklist: one sweep settles what flows forward; an
    # op whose label changes after a reader of it ran (a loop carries it: an accumulator
    # reading its own last write) sends that reader round again
    order = {w.stmt: j for j, w in enumerate(op_writes)}
    readers: dict[str, set[int]] = {}
    for w in op_writes:
        for a in by_op.get(w.t, []):
            for name in _tuple_names(sources[a.stmt].range()):
                readers.setdefault(name, set()).add(order[w.stmt])
    pending = set(range(len(op_writes)))
    queue = sorted(pending)
    runs = [0] * len(op_writes)
    while queue:
        j = heapq.heappop(queue)
        pending.discard(j)
        runs[j] += 1
        if runs[j] > _ROUNDS:
            return None, PropertyResult(name="dataflow", verdict="undecided",
                                        reason=f"the graph values did not settle in {_ROUNDS} passes")
        w = op_writes[j]
        spec = w.spec
        assert spec is not None
        operands = by_op.get(w.t, [])
        op_map = {k: _to_op(model, a).reverse().apply_range(labelled(a)) for k, a in enumerate(operands)}
        domain = _op_domain(model, operands, w)
        g = _graph_op(spec, ops)
        if g is not None:
            p = _points(model, spec, g, operands, op_map, labels_of, domain)
            missing = domain.subtract(p.domain())
            if not missing.is_empty():
                ce = counterexample(model, _to_op(model, operands[0]).intersect_range(missing).domain())
                return None, PropertyResult(
                    name="dataflow", verdict="refuted", counterexample=ce,
                    reason=f"op {ce.op} reads its operands at elements no point of graph op {g.name} reads "
                           f"together (a read at another element than the graph's index)")
            points[w.stmt] = p
            store = labels_of.graph(g, g.store.buffer, g.store.index)
            label = _to_op(model, w, drop_reduced=True).apply_range(p).apply_range(store)
        else:
            same = [k for k, a in enumerate(operands) if tuple(a.arg.device_size) == tuple(w.arg.device_size)]
            if spec.is_reduction or not same:
                label = label_of[w.stmt]
            else:
                # one operand (a copy, a finish) passes its values on; several (a combine, a
                # rescale) must agree on the element, whichever graph buffer they hold it for
                agreed = op_map[same[0]]
                if len(same) > 1:
                    forget = labels_of.flatten()
                    agreed = agreed.apply_range(forget)
                    for k in same[1:]:
                        agreed = agreed.intersect(op_map[k].apply_range(forget))
                missing = domain.subtract(agreed.domain())
                if not missing.is_empty():
                    ce = counterexample(model, _to_op(model, operands[same[0]]).intersect_range(missing).domain())
                    return None, PropertyResult(
                        name="dataflow", verdict="refuted", counterexample=ce,
                        reason=f"op {ce.op} combines elements that hold different graph values (its operands "
                               f"of the output's shape disagree)")
                label = _to_op(model, w).apply_range(agreed)
        if runs[j] == 1 or not label.is_equal(label_of[w.stmt]):
            label_of[w.stmt] = label
            for r in readers.get(w.stmt, set()) - pending:
                pending.add(r)
                heapq.heappush(queue, r)
    labels = model.union_map([])
    for m in label_of.values():
        labels = labels.union(m)
    # each copied-out host element holds its own graph value
    for acc in model.accesses:
        if acc.spec is not None or acc.is_write:
            continue
        want = model.union_map([f"{acc.head()} -> {labels_of.host(acc)} : {cond}" for cond, _, _, _ in acc.pieces])
        have = back.intersect_domain(want.domain()).apply_range(labels)
        # an element holding a value of no single graph element (U), or the element's flat
        # index of whichever buffer (A), is not shown wrong here
        loose = have.intersect_range(isl.UnionSet.read_from_str(CTX, model.space("U[]; A[x]")))
        flat = labels_of.flatten()
        explained = want.apply_range(flat).intersect(loose.apply_range(flat)).domain()
        wrong = want.subtract(have).subtract_domain(explained)
        if not wrong.is_empty():
            ce = counterexample(model, wrong.domain())
            return None, PropertyResult(name="dataflow", verdict="refuted", counterexample=ce,
                                        reason=f"output {acc.arg.name}: a host element holds another graph value "
                                               f"than its own")
    # partials folded into an accumulator (an op that reads and writes one tensor): a point of
    # the reduction computed twice into them is counted twice; anywhere else a recomputation
    # writes the same value again
    folded, carried = set(), set()
    for t, accs in by_op.items():
        w = next(a for a in writes if a.t == t and a.spec is not None)
        if w.arg.name in {a.arg.name for a in accs}:
            folded |= {a.arg.name for a in accs if a.arg.name != w.arg.name}
            carried.add(w.arg.name)
    # a value an accumulation carries (a partial, a running value) is read before anything
    # overwrites it: one overwritten unread drops a tile's contribution (a fill run again, a
    # partial written twice before its combine)
    read_writes = deps.domain()
    for w in op_writes:
        if w.arg.name not in folded | carried:
            continue
        lost = _instances(model, w).subtract(read_writes)
        if not lost.is_empty():
            ce = counterexample(model, lost)
            return PropertyResult(name="coverage", verdict="refuted", counterexample=ce,
                                  reason=f"op {ce.op} writes a partial of {w.arg.name} that is overwritten before "
                                         f"anything reads it (a tile's contribution lost)"), None
    # every point of every graph op computed, and a folded reduction's once
    for g in graph.ops:
        mine = [s for s, _ in points.items() if _graph_op(_spec(model, s), ops) is g
                and not (_spec(model, s).name or "").split(g.name, 1)[-1].startswith("_again")]
        if not mine:
            continue
        space, cond = _gspace(g)
        once = isinstance(g, Reduction) and any(_write(model, s).arg.name in folded for s in mine)
        epochs = _epochs(model, g, mine, by_op, carried) if once else []
        # a loop that restarts the accumulation (its fill runs in each of its iterations) and
        # tiles none of g's dims computes the whole reduction again in each iteration: each
        # point once per iteration, so the iteration is part of the point
        bounds = " and ".join([cond] + [f"0 <= e{L} < {_count(model, mine[0], L)}" for L in epochs])
        full = isl.UnionSet.read_from_str(CTX, model.space(
            f"[{space} -> E[{', '.join(f'e{L}' for L in epochs)}]] : {bounds}" if epochs else f"{space} : {cond}"))
        union = model.union_map([])
        for s in mine:
            union = union.union(points[s].range_product(_epoch_map(model, s, epochs)) if epochs else points[s])
        # a map that is not single-valued (an op whose operands leave its point open: a
        # broadcast of all of them) has a larger range, never a smaller one: "lost" stays sound
        lost = full.subtract(union.range())
        if not lost.is_empty():
            where = union.domain()
            ce = counterexample(model, _reads_of(model, where, by_op))
            return PropertyResult(name="coverage", verdict="refuted", counterexample=ce,
                                  reason=f"graph op {g.name}: some of its points (e.g. {_sample(lost)}) no op "
                                         f"computes (a reduction range or tile left out)"), None
        if not once or not union.is_single_valued():
            continue
        # partials folded into different accumulators that nothing folds together (a peeled
        # tail's recomputation of the whole reduction into its own accumulator, whose finish
        # writes the same output again) are separate computations: twice means in one of them
        roots = {s: _root(model, _write(model, s).arg.name, by_op, carried) for s in mine}
        together = model.union_map([])
        for root in ({None} if None in roots.values() else set(roots.values())):
            ins = [points[s].domain() for s in mine if root is None or roots[s] == root]
            one = reduce(lambda a, b: a.union(b), ins)
            together = together.union(isl.UnionMap.from_domain_and_range(one, one))
        twice = union.apply_range(union.reverse()).intersect(_distinct(model, union)).intersect(together)
        if not twice.is_empty():
            ce = counterexample(model, _reads_of(model, twice.domain(), by_op))
            return PropertyResult(name="coverage", verdict="refuted", counterexample=ce,
                                  reason=f"graph op {g.name}: a point is computed twice (a reduction range or tile "
                                         f"counted twice)"), None
    return None, None


def _epochs(model: Model, g: Op, mine: list[str], by_op, carried: set[str]) -> list[int]:
    """The loops (by depth) that restart ``g``'s accumulation: they enclose every op of ``g``
    and every fill of the accumulator its partials fold into (an op writing it without reading
    it), the fill and ``g``'s ops run in each of their iterations (not only in the first or
    last iteration of the innermost one: a partial computed once and folded again after each
    fill is the whole program's once), and they tile none of ``g``'s dims (so each iteration
    computes the same points)."""
    made = {_write(model, s).arg.name for s in mine}
    folds = [t for t, accs in by_op.items() if {a.arg.name for a in accs} & made
             and _write(model, f"W{t}").arg.name in carried]
    accs = {_write(model, f"W{t}").arg.name for t in folds} | (made & carried)
    fills = [w for w in model.accesses if w.is_write and w.spec is not None and w.arg.name in accs
             and w.arg.name not in {a.arg.name for a in by_op.get(w.t, [])}]
    if not fills:
        return []
    ops = [_write(model, s) for s in mine]
    dims = {str(d.symbol) for d in _domain(g)}
    out = []
    for L in range(min(a.loops for a in ops + fills)):
        if len({a.path[:L + 1] for a in ops + fills}) != 1:
            break  # not a loop they all share
        if any(a.spec is not None and a.spec.runs != "every" and L == a.loops - 1 for a in ops + fills):
            continue  # a fill or an op of g in only one of its iterations: it does not restart them all
        if dims & {str(x) for x in _loop(model, ops[0].path[:L + 1]).tiled_symbols}:
            continue
        out.append(L)
    return out


def _root(model: Model, tensor: str, by_op, carried: set[str]) -> str | None:
    """The accumulator ``tensor``'s values end in: follow each fold (an op reading the tensor
    and reading and writing a carried one) to the last; None when a tensor is folded into
    more than one (then every computation counts as one)."""
    seen = {tensor}
    while True:
        into = {_write(model, f"W{t}").arg.name for t, accs in by_op.items()
                if tensor in {a.arg.name for a in accs} and _write(model, f"W{t}").arg.name in carried
                and _write(model, f"W{t}").arg.name in {a.arg.name for a in accs}} - {tensor}
        if not into:
            return tensor
        if len(into) > 1 or into & seen:
            return None
        tensor = into.pop()
        seen.add(tensor)


def _loop(model: Model, path: tuple[int, ...]) -> LoopSpec:
    body, spec = model.program.body, None
    for q in path:
        spec = body[q]
        body = spec.body if isinstance(spec, LoopSpec) else ()
    assert isinstance(spec, LoopSpec)
    return spec


def _count(model: Model, stmt: str, L: int) -> str:
    return isl_text(_write(model, stmt).counts[L], {})


def _epoch_map(model: Model, stmt: str, epochs: list[int]) -> isl.UnionMap:
    """Op instances of ``stmt``'s op -> ``E[their iterations of the loops in epochs]``."""
    w = _write(model, stmt)
    return model.union_map([f"O{w.t}[{', '.join(w.dims)}] -> E[{', '.join(f'i{L}' for L in epochs)}]"])


def _tuple_names(s: isl.UnionSet) -> list[str]:
    out: list[str] = []
    s.foreach_set(lambda x: out.append(x.get_tuple_name()))
    return out


def _reads_of(model: Model, op_instances: isl.UnionSet, by_op) -> isl.UnionSet:
    out = isl.UnionSet.read_from_str(CTX, model.space(""))
    for t, accs in by_op.items():
        r = _to_op(model, accs[0]).intersect_range(op_instances).domain()
        out = out.union(r)
    return out


def _sample(s: isl.UnionSet) -> str:
    pt = s.sample_point()
    n = pt.get_space().dim(isl.dim_type.set)
    return str([int(pt.get_coordinate_val(isl.dim_type.set, j).to_python()) for j in range(n)])


def _distinct(model: Model, union: isl.UnionMap) -> isl.UnionMap:
    """Pairs of op instances that are not the same instance."""
    ident = union.domain().identity()
    every = union.domain().universe()
    return isl.UnionMap.from_domain_and_range(every, every).subtract(ident)


def _write(model: Model, stmt: str) -> Access:
    return next(a for a in model.accesses if a.stmt == stmt)


def _spec(model: Model, stmt: str) -> OpSpec:
    spec = next(a.spec for a in model.accesses if a.stmt == stmt)
    assert spec is not None  # an op's write, not a copy-in
    return spec


def _stride(acc: Access, j: int) -> int:
    """The flat host index's step along host dim ``j`` (a symbolic one times ``h_j`` is not affine)."""
    out = sympy.Mul(*acc.arg.host_shape[j + 1:])
    if not out.is_Integer:
        raise NotAffine(f"kernel argument {acc.arg.name}: host dim {j} steps the flat index by {out}")
    return int(out)


def _universe(model: Model, instances: dict[str, isl.UnionSet]) -> isl.UnionMap:
    out = model.union_map([])
    lab = isl.UnionSet.read_from_str(CTX, model.space("U[]"))
    for s in instances.values():
        out = out.union(isl.UnionMap.from_domain_and_range(s, lab))
    return out


def _op_domain(model: Model, operands: list[Access], w: Access) -> isl.UnionSet:
    if operands:
        return _to_op(model, operands[0]).range()
    return _to_op(model, w).range()


def _points(model: Model, spec: OpSpec, g: Op, operands: list[Access], op_map: dict, labels: _Labels,
            domain: isl.UnionSet) -> isl.UnionMap:
    """Op instance -> the points of graph op ``g`` whose Load indices match what it read."""
    space, cond = _gspace(g)
    full = isl.UnionSet.read_from_str(CTX, model.space(f"{space} : {cond}"))
    p = isl.UnionMap.from_domain_and_range(domain, full)
    loads = [o for o in g.operands if isinstance(o, Load)]
    args = [o for o in spec.op_info.operands if isinstance(o, ArgOperand)]
    if len(loads) != len(args):
        raise NotAffine(f"op {spec.name}: {len(args)} tensor operands, graph op {g.name} loads {len(loads)}")
    for load, arg in zip(loads, args):
        k = arg.index
        if k >= len(operands):
            continue
        # a value of no single graph element (U) matches every point, one of whichever buffer
        # (A) every point loading its flat index
        lm = labels.graph(g, load.buffer, load.index).union(model.union_map([f"{space} -> U[] : {cond}"]))
        if "A" in _tuple_names(op_map[k].range()):
            lm = lm.union(labels.flat(g, load.index))
        p = p.intersect(op_map[k].apply_range(lm.reverse()))
    return p
