"""Text printers, one per stage artifact: ``pretty(artifact, detailed=False) -> str``.

Each printer turns data into a document (``fspyre.pretty.doc``) and leaves line breaking to
the renderer. The compact view is what an engineer scans in a stage dump; the detailed view
adds everything the artifact records (tree paths, per-level tile steps, buffer scopes, kernel
arguments). Output depends only on the artifact's tuples and ordered maps, never on set or
dict iteration order or hashes, so it is the same under every PYTHONHASHSEED.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import sympy

from fspyre.errors import FspyreError
from fspyre.ir.graph import Dim, Graph, HintScope, Load, Op, Pointwise, Reduction, Scalar
from fspyre.ir.looptree import Loop, LoopTree, OpNode, TileStep, TreeBuffer
from fspyre.ir.plans import Allocation, Group, Level, OpSplit, Placement, SplitPlan, TilingPlan, TilingSearch
from fspyre.ir.program import ArgOperand, KernelArg, LoopSpec, OpInfo, OpSpec, Program, TensorArg
from fspyre.ir.report import TrafficReport
from fspyre.ir.symbolic import SymbolicSizes
from fspyre.pretty.doc import Doc, bracket, concat, hardline, lines, nest, render, text
from fspyre.proof.artifact import Proof, PropertyResult

WIDTH = 120
INDENT = 2


def pretty(artifact: Any, *, detailed: bool = False, width: int = WIDTH) -> str:
    """The text of any stage artifact (or of one of its parts: a Loop, an OpSpec, ...)."""
    for cls in type(artifact).__mro__:
        printer = _PRINTERS.get(cls)
        if printer is not None:
            return render(printer(artifact, detailed), width)
    raise FspyreError(
        f"pretty: no printer for {type(artifact).__name__}; printable artifacts are "
        f"{', '.join(sorted(c.__name__ for c in _PRINTERS))}"
    )


# -- small pieces ---------------------------------------------------------------------------
def _expr(e: sympy.Expr) -> str:
    return str(e)


def _dims(dims: Sequence[Dim]) -> str:
    return "[" + ", ".join(map(str, dims)) + "]"


def _names(names: Iterable[str]) -> str:
    return "[" + ", ".join(names) + "]"


def _counts(m: Mapping[str, int] | Mapping[int, int]) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in m.items()) + "}"


def _call(name: str, fields: Iterable[tuple[str, Doc | str]], *, force: bool = False) -> Doc:
    """``Name(k=v, ...)``: one line when it fits, else one field per line."""
    items = [concat(f"{k}=", v) for k, v in fields]
    return concat(name, bracket("(", items, ")", force=force))


def _table(rows: Sequence[Sequence[str]]) -> list[Doc]:
    """Left-aligned columns; the last column is not padded, so no line ends in spaces."""
    if not rows:
        return []
    widths = [max(len(r[i]) for r in rows if i < len(r)) for i in range(max(map(len, rows)))]
    out = []
    for r in rows:
        cells = [c.ljust(widths[i]) if i < len(r) - 1 else c for i, c in enumerate(r)]
        out.append(text("  ".join(cells).rstrip()))
    return out


def _under(head: str | Doc, body: Sequence[Doc]) -> Doc:
    """``head`` with ``body`` indented on the lines below it."""
    return concat(head, nest(INDENT, concat(hardline(), lines(body)))) if body else concat(head)


def _runs(extents: Iterable[int]) -> str:
    """Slice extents with repeats counted: ``(129 x 1, 128 x 31)``, ``(64 x 2, 22)``."""
    runs: list[list[int]] = []
    for e in extents:
        if runs and runs[-1][0] == e:
            runs[-1][1] += 1
        else:
            runs.append([e, 1])
    return "(" + ", ".join(f"{e} x {n}" if n > 1 else str(e) for e, n in runs) + ")"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _size(n: int) -> str:
    if n < 1 << 10:
        return f"{n} B"
    if n < 1 << 20:
        return f"{n} B ({n / (1 << 10):.2f} KiB)"
    return f"{n} B ({n / (1 << 20):.2f} MiB)"


# -- graph ----------------------------------------------------------------------------------
def _operand(o: Load | Scalar) -> str:
    return f"{o.buffer}[{_expr(o.index)}]" if isinstance(o, Load) else repr(o.value)


def _op_doc(op: Op, *, force: bool = False) -> Doc:
    """Inductor's ``Pointwise(ranges=[...], ...)`` line, as data."""
    fields: list[tuple[str, Doc | str]] = [("ranges", _dims(op.ranges))]
    if isinstance(op, Reduction):
        fields.append(("reduction_ranges", _dims(op.reduction_ranges)))
    fields.append(("fn", op.fn))
    if isinstance(op, Reduction) and op.fn == "var":
        fields.append(("correction", str(op.correction)))
    fields.append(("loads", bracket("[", (text(_operand(o)) for o in op.operands), "]")))
    fields.append(("store", f"{op.store.buffer}[{_expr(op.store.index)}]"))
    return _call(type(op).__name__, fields, force=force)


def _hint_doc(h: HintScope) -> Doc:
    parts = [f"hint #{h.id}:"]
    if h.slices:
        parts.append(f"slices={_counts(h.slices)}")
    if h.work_div:
        parts.append(f"work_div={_counts(h.work_div)}")
    return text(" ".join(parts))


def _graph(g: Graph, detailed: bool) -> Doc:
    buffers = g.buffer_table()
    params = (text(f"{n}: {buffers[n].type}") for n in g.inputs)
    results = (text(f"{o.name}: {o.buffer}") for o in g.outputs)
    out: list[Doc] = [concat(f"graph {g.name}", bracket("(", params, ")"), " -> ", bracket("(", results, ")"))]
    out += [_hint_doc(h) for h in g.hints]
    if detailed:
        outputs = {o.buffer: o.name for o in g.outputs}
        rows = []
        for b in g.buffers:
            kind = "input" if b.name in g.inputs else f"output {outputs[b.name]}" if b.name in outputs else ""
            rows.append([b.name, str(b.type), f"{b.type.numel} elems", kind])
        out.append(_under("buffers:", _table(rows)))
    for op in g.ops:
        head = f"{op.name}: ComputedBuffer  {buffers[op.store.buffer].type}"
        if op.hints:
            head += "  hints=[" + ", ".join(f"#{i}" for i in op.hints) + "]"
        out.append(_under(head, [_op_doc(op, force=detailed)]))
    return lines(out)


# -- tiling plan ----------------------------------------------------------------------------
def _levels(group: Group) -> str:
    return " > ".join(f"{lv.count} x {_names(lv.dims)}" for lv in group.levels)


def _level_doc(k: int, lv: Level) -> Doc:
    line = f"level {k}: count={lv.count} dims={_names(lv.dims)}"
    if lv.op_dims:
        line += " op_dims={" + ", ".join(f"{op}: {_names(ds)}" for op, ds in lv.op_dims.items()) + "}"
    if lv.source:
        line += f"  from {lv.source}"
    return text(line)


def _tiling_plan(p: TilingPlan, detailed: bool) -> Doc:
    n = len(p.groups)
    out: list[Doc] = [
        text(f"tiling plan: {_plural(len(p.order), 'op')}, {_plural(n, 'group')}" + ("" if n else " (untiled)")),
        concat("order: ", bracket("[", map(text, p.order), "]")),
    ]
    for i, g in enumerate(p.groups):
        head = concat(f"group {i}: ", bracket("[", map(text, g.ops), "]"))
        if g.depths:
            head = concat(head, "  outer ops {" + ", ".join(f"{op}: {d}" for op, d in g.depths.items()) + "}")
        if detailed:
            out.append(_under(head, [_level_doc(k, lv) for k, lv in enumerate(g.levels)]))
        else:
            out.append(concat(head, f"  loops {_levels(g)}" if g.levels else "  (no loops)"))
    if p.notes:
        out.append(_under("notes:", [text(n) for n in p.notes]))
    if p.warnings:
        out.append(_under("warnings:", [text(w) for w in p.warnings]))
    return lines(out)


def _listing(names: Sequence[str], limit: int = 8) -> str:
    """A long op list shortened to its ends: a search over a 1000-op chain stays readable."""
    if len(names) <= limit:
        return _names(names)
    return f"[{', '.join(names[:limit // 2])}, ... {', '.join(names[-(limit // 2):])}] ({len(names)} ops)"


def _candidate_levels(levels: Sequence[Level]) -> str:
    return " x ".join(f"{lv.dims[0]}:{lv.count}" for lv in levels) or "untiled"


def _tiling_search(s: TilingSearch, detailed: bool) -> Doc:
    tiled = sum(1 for g in s.groups if g.choice.levels)
    out: list[Doc] = [text(f"tiling search ({s.fuse}): {_plural(len(s.groups), 'group')} searched, {tiled} tiled; "
                           f"{s.compiled} candidates compiled, {s.reused} segments reused, {s.screened} screened"
                           + (f", {_plural(s.rechecked, 'whole-program recheck')}" if s.rechecked else ""))]
    for i, g in enumerate(s.groups):
        head = text(f"group {i} (consumer {g.consumer}): {_listing(g.ops)}  -> {_candidate_levels(g.choice.levels)}")
        shown = g.candidates if detailed else (g.choice,)
        rows = [[("* " if c is g.choice else "  ") + _candidate_levels(c.levels), c.verdict,
                 f"{c.time_ns / 1000:.2f} us" if c.time_ns >= 0 else "-",
                 f"{c.hbm_bytes} B" if c.hbm_bytes >= 0 else "-", c.reason] for c in shown]
        body = _table(rows)
        if detailed and g.alternatives:
            # the segments the dynamic programming weighed for this consumer: each with the
            # change of the run's estimate against untiled (its bound when it was screened)
            alts = [["* " if a.ops == g.ops else "  ", _listing(a.ops, 4),
                     "screened" if a.choice is None else _candidate_levels(a.choice.levels),
                     f"bound {a.bound_ns / 1000:+.2f} us",
                     "-" if a.choice is None else f"change {a.change_ns / 1000:+.2f} us"] for a in g.alternatives]
            body = [*body, _under(text("alternatives:"), _table(alts))]
        out.append(_under(head, body))
    if s.note:
        out.append(text(f"note: {s.note}"))
    out.append(_tiling_plan(s.plan, detailed))
    return lines(out)


# -- loop tree ------------------------------------------------------------------------------
def _path(path: tuple[int, ...]) -> str:
    return ".".join(map(str, path))


def _loop_head(node: Loop) -> tuple[str, str]:
    var = ", ".join(node.dims) or "_"
    tiles = ", ".join(f"{s.dim}={s.extent}" for s in node.steps)
    head = f"(tile {tiles})" if tiles else "(no dim advances)"
    return var, head + (f"  carries {', '.join(node.carried)}" if node.carried else "")


def _call_text(op: Op) -> str:
    args = ", ".join(o.buffer if isinstance(o, Load) else repr(o.value) for o in op.operands)
    return f"{op.store.buffer} = {op.fn}({args})"


def _space(op: Op) -> str:
    if isinstance(op, Reduction):
        return f"{_dims(op.ranges)} over {_dims(op.reduction_ranges)}"
    return _dims(op.ranges)


def _steps(level: tuple[TileStep, ...]) -> str:
    return ", ".join(f"{s.dim}+{s.extent}" for s in level) or "invariant"


def _peeled(node: OpNode) -> str:
    """Where a peeled tail starts: "  tail A@68, B@128" (empty for other ops)."""
    if not node.origin:
        return ""
    return "  tail " + ", ".join(f"{p.dim}@{p.start}" for p in node.peeled)


def _once(runs: str) -> str:
    """``"  [first iteration]"`` for a guarded op (empty for one of every iteration)."""
    return "" if runs == "every" else f"  [{runs} iteration]"


def _loop_tree(t: LoopTree, detailed: bool) -> Doc:
    table = t.buffer_table()

    def compact(body) -> list[Doc]:
        out: list[Doc] = []
        for n in body:
            if isinstance(n, Loop):
                var, tiles = _loop_head(n)
                inner = compact(n.body)
                out.append(_under(f"for {var} in 0..{n.count}:  {tiles}", inner))
            else:
                out.append(text(f"{_call_text(n.op)}  {_space(n.op)}{_peeled(n)}{_once(n.runs)}"))
        return out

    def scoped(name: str) -> str:
        b = table.get(name)
        return f"{name}: {b.scope}" if b is not None else f"{name}: ?"

    def full(body, path: tuple[int, ...]) -> list[Doc]:
        out: list[Doc] = []
        for i, n in enumerate(body):
            p = path + (i,)
            if isinstance(n, Loop):
                _, tiles = _loop_head(n)
                head = f"[{_path(p)}] loop count={n.count}  {tiles}"
                out.append(_under(head, full(n.body, p)))
            else:
                op = n.op
                ins = ", ".join(scoped(o.buffer) if isinstance(o, Load) else repr(o.value) for o in op.operands)
                head = f"[{_path(p)}] {op.name}: {op.fn}({ins}) -> {scoped(op.store.buffer)}{_once(n.runs)}"
                levels = ", ".join(f"L{k}: {_steps(lv)}" for k, lv in enumerate(n.tiling))
                detail = [_op_doc(op), text(f"tiling=[{levels}]")]
                if n.origin:
                    detail.append(text(f"tail of {n.origin}:{_peeled(n)[len('  tail'):]}"))
                out.append(_under(head, detail))
        return out

    if not detailed:
        return lines(compact(t.body))
    outputs = {o.buffer: o.name for o in t.outputs}
    rows = []
    for b in t.buffers:
        kind = "input" if b.name in t.inputs else f"output {outputs[b.name]}" if b.name in outputs else ""
        rows.append([b.name, str(b.type), b.scope, kind])
    return lines([
        text(f"loop tree {t.name}"),
        _under("buffers:", _table(rows)),
        _under("body:", full(t.body, ())),
    ])


def _loop(node: Loop, detailed: bool) -> Doc:
    # A bare loop or op node prints as the body of a one-node tree.
    return _loop_tree(LoopTree(name="loop", buffers=(), inputs=(), outputs=(), body=(node,)), detailed)


def _op_node(node: OpNode, detailed: bool) -> Doc:
    return _loop_tree(LoopTree(name=node.name, buffers=(), inputs=(), outputs=(), body=(node,)), detailed)


def _tree_buffer(b: TreeBuffer, detailed: bool) -> Doc:
    return text(f"{b.name}: {b.type}  {b.scope}")


# -- split plan -----------------------------------------------------------------------------
def _split_row(name: str, s: OpSplit, detailed: bool) -> list[str]:
    why = ["work_div hint"] if s.hinted else []
    if s.span_splits:
        why.append(f"span limit needs {_counts(s.span_splits)}")
    uneven = {d: e for d, e in s.slices.items() if len(set(e)) > 1}
    if not detailed:
        split = ", ".join(f"{d}/{k}" + (f" {_runs(uneven[d])}" if d in uneven else "")
                          for d, k in s.splits.items() if k > 1) or "unsplit"
        return [name, _plural(s.cores, "core"), split, "; ".join(why)]
    row = [name, f"cores={s.cores}", f"splits={_counts(s.splits)}"]
    if uneven:
        row.append("slices={" + ", ".join(f"{d}: {_runs(e)}" for d, e in uneven.items()) + "}")
    if s.stick_elems:
        row.append(f"stick_elems={_counts(s.stick_elems)}")
    # The anchor's op_it_space_splits form, keyed by index coefficient, for comparing dumps.
    if s.output_coeffs or s.reduction_coeffs:
        row.append(f"anchor={_counts(s.output_coeffs)}" + (f" reduce={_counts(s.reduction_coeffs)}"
                                                          if s.reduction_coeffs else ""))
    return row + why


def _split_plan(p: SplitPlan, detailed: bool) -> Doc:
    rows = [_split_row(name, s, detailed) for name, s in p.ops.items()]
    out = [_under(f"split plan: {_plural(len(p.ops), 'op')}", _table(rows))]
    if p.notes:
        out.append(_under("notes:", [text(n) for n in p.notes]))
    if p.warnings:
        out.append(_under("warnings:", [text(w) for w in p.warnings]))
    return lines(out)


def _op_split(s: OpSplit, detailed: bool) -> Doc:
    return text("  ".join(_split_row("", s, True)[1:]))


# -- allocation -----------------------------------------------------------------------------
def _placement_row(name: str, pl: Placement, detailed: bool) -> list[str]:
    row = [name, pl.memory, hex(pl.address), str(pl.nbytes), str(pl.arg_index) if pl.arg_index >= 0 else "-"]
    if detailed:
        row += [hex(pl.address + pl.nbytes), f"[{pl.live[0]}, {pl.live[1]})"]
        notes = ([f"in place of {pl.in_place_of}"] if pl.in_place_of else []) + ([pl.reason] if pl.reason else [])
        row.append("; ".join(notes))
    return row


def _allocation(a: Allocation, detailed: bool) -> Doc:
    head = f"allocation: hbm {_size(a.hbm_bytes)}, lx peak {a.lx_peak_bytes} B per core"
    rows = [["buffer", "memory", "address", "bytes", "arg"] + (["end", "live", "notes"] if detailed else [])]
    rows += [_placement_row(name, pl, detailed) for name, pl in a.buffers.items()]
    out = [_under(head, _table(rows))]
    if a.notes:
        out.append(_under("notes:", [text(n) for n in a.notes]))
    return lines(out)


# -- program --------------------------------------------------------------------------------
def _tensor_arg(a: TensorArg, detailed: bool) -> Doc:
    fields: list[tuple[str, Doc | str]] = [
        ("name", repr(a.name)),
        ("is_input", str(a.is_input)),
        ("arg_index", str(a.arg_index)),
        ("device_dtype", a.device_dtype),
        ("device_size", bracket("[", (text(str(s)) for s in a.device_size), "]")),
        ("device_coordinates", bracket("[", (text(_expr(c)) for c in a.device_coordinates), "]")),
        ("memory", repr(a.memory)),
        ("address", _address(a.address)),
    ]
    if detailed or a.tile_advance:
        fields.append(("tile_advance", bracket("[", (text(str(s)) for s in a.tile_advance), "]")))
    return _call("TensorArg", fields)


def _op_info(info: OpInfo, detailed: bool = False) -> Doc:
    """The record's own fields; defaults (a pointwise op's count, no bool store) only when detailed."""
    operands = (text(f"arg {o.index}" if isinstance(o, ArgOperand) else f"scalar {o.value!r}") for o in info.operands)
    fields: list[tuple[str, Doc | str]] = [("operands", bracket("[", operands, "]")), ("compute", info.compute)]
    if detailed or info.bool_store:
        fields.append(("bool_store", str(info.bool_store)))
    if detailed or info.reduced:
        fields += [("reduced", _names(map(_expr, info.reduced))), ("count", str(info.count))]
    if detailed or info.correction:
        fields.append(("correction", str(info.correction)))
    if detailed or info.rows or info.cols:
        fields += [("rows", _names(map(_expr, info.rows))), ("cols", _names(map(_expr, info.cols)))]
    return _call("OpInfo", fields)


def _op_spec(s: OpSpec, detailed: bool) -> Doc:
    space = bracket("{", (text(f"{_expr(k)}: ({n}, {split})") for k, (n, split) in s.iteration_space.items()), "}")
    tiled = bracket("[", (text(_names(map(_expr, lv))) for lv in s.tiled_symbols), "]")
    fields: list[tuple[str, Doc | str]] = [
        ("op", repr(s.op)),
        ("is_reduction", str(s.is_reduction)),
        ("iteration_space", space),
        ("op_info", _op_info(s.op_info, detailed)),
        ("tiled_symbols", tiled),
        ("args", bracket("[", (_tensor_arg(a, detailed) for a in s.args), "]")),
    ]
    if detailed or s.runs != "every":
        fields.append(("runs", repr(s.runs)))
    if not s.even:  # an even division follows from the splits alone
        names = [_expr(k) for k in s.iteration_space]
        cores = (text("(" + ", ".join(f"{n}[{a}:{a + e}]" for n, (a, e) in zip(names, space)) + ")")
                 for space in s.core_spaces)
        fields.append(("core_spaces", bracket("[", cores, "]")))
    if detailed:
        fields.append(("name", repr(s.name)))
    return _call("OpSpec", fields, force=True)


def _loop_spec(s: LoopSpec, detailed: bool) -> Doc:
    return _call("LoopSpec", [("count", str(s.count)), ("tiled_symbols", _names(map(_expr, s.tiled_symbols))),
                              ("body", _specs(s.body, detailed))], force=True)


def _specs(body, detailed: bool) -> Doc:
    return bracket("[", (_loop_spec(s, detailed) if isinstance(s, LoopSpec) else _op_spec(s, detailed) for s in body),
                   "]", force=True)


def _kernel_arg(k: KernelArg, detailed: bool) -> Doc:
    return _call("KernelArg", [
        ("name", repr(k.name)), ("arg_index", str(k.arg_index)), ("is_input", str(k.is_input)),
        ("dtype", repr(k.dtype)), ("host_shape", _names(map(str, k.host_shape))), ("device_dtype", k.device_dtype),
        ("device_size", _names(map(str, k.device_size))), ("stride_map", _names(map(str, k.stride_map))),
        ("address", _address(k.address)), ("buffer", repr(k.buffer)),
    ])


def _address(v: Any) -> str:
    """An address in hex; in a symbolic program an expression, its constant term in hex."""
    if isinstance(v, int):
        return hex(v)
    const, rest = v.as_coeff_Add()
    return f"{rest} + {hex(int(const))}" if const else str(rest)


def _symbolic_sizes(r: SymbolicSizes, detailed: bool) -> Doc:
    dims = [text(f"{d.name}: {d.form} fixed at {d.fixed} (count {d.count}, tile {d.tile})") for d in r.dims]
    out = [_under("# symbolic dims", dims), _under("assumptions:", [text(str(a)) for a in r.assumptions])]
    if detailed:
        names = ", ".join(d.name for d in r.dims)
        out.append(text(f"witnesses ({names}): " + ", ".join("(" + ", ".join(map(str, w)) + ")" for w in r.witnesses)))
    return lines(out)


def _program(p: Program, detailed: bool) -> Doc:
    head = text(f"# program {p.name}: cores={p.cores}, hbm_bytes={p.hbm_bytes}, lx_bytes={p.lx_bytes}")
    out = [head]
    if p.symbolic is not None:
        out.append(_symbolic_sizes(p.symbolic, detailed))
    if detailed:
        out.append(concat("kernel_args = ", bracket("[", (_kernel_arg(k, detailed) for k in p.kernel_args), "]",
                                                    force=True)))
        out.append(concat("body = ", _specs(p.body, detailed)))
    else:
        out.append(_specs(p.body, detailed))
    return lines(out)


_PRINTERS: dict[type, Callable[[Any, bool], Doc]] = {
    Graph: _graph,
    TilingPlan: _tiling_plan,
    TilingSearch: _tiling_search,
    LoopTree: _loop_tree,
    Loop: _loop,
    OpNode: _op_node,
    TreeBuffer: _tree_buffer,
    SplitPlan: _split_plan,
    OpSplit: _op_split,
    Allocation: _allocation,
    Placement: lambda pl, detailed: text("  ".join(_placement_row("", pl, detailed)[1:]).rstrip()),
    Program: _program,
    OpInfo: _op_info,
    TrafficReport: lambda r, detailed: lines([text(line) for line in str(r).splitlines()]),
    LoopSpec: _loop_spec,
    OpSpec: _op_spec,
    TensorArg: _tensor_arg,
    KernelArg: _kernel_arg,
    SymbolicSizes: _symbolic_sizes,
    HintScope: lambda h, detailed: _hint_doc(h),
    Pointwise: lambda op, detailed: _op_doc(op, force=detailed),
    Reduction: lambda op, detailed: _op_doc(op, force=detailed),
    Proof: lambda p, detailed: lines(text(x) for x in str(p).splitlines()),
    PropertyResult: lambda p, detailed: lines(text(x) for x in str(p).splitlines()),
}
