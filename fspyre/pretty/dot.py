"""Graphviz pictures of a graph or a loop tree, as dot source text.

Node ids come from positions (``n_0_1_2`` is op 2 of loop 1 of loop 0; ``in_0`` the first
graph input, ``out_0`` the first output), never from ``id()`` or hashes, so the same
artifact always gives the same text and two dumps diff cleanly.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator, Mapping
from typing import Any

from fspyre.errors import FspyreError
from fspyre.ir.graph import Graph, Load, Op, Output, Reduction, TensorType
from fspyre.ir.looptree import Loop, LoopTree, Node, OpNode, op_nodes
from fspyre.ir.plans import Allocation, SplitPlan

_HEADER = (
    '  graph [fontname="Helvetica", fontsize=11, rankdir=TB];',
    '  node [fontname="Helvetica", fontsize=10];',
    '  edge [fontname="Helvetica", fontsize=9];',
)
_INPUT_FILL, _OUTPUT_FILL, _FOLD_FILL = "#dbe8f7", "#dcf2dc", "#fff6d5"
_INPUT = f'shape=invhouse, style=filled, fillcolor="{_INPUT_FILL}"'
_OUTPUT = f'shape=house, style=filled, fillcolor="{_OUTPUT_FILL}"'
_MEMORY_COLOURS = {"hbm": "#2f6db5", "lx": "#d9730d"}
FOLD_AT = 24  # a tree of more ops folds its runs of ops (the Llama layer has 80)
_FOLD_RUN = 3  # the shortest run folded into one node
_OP = 'shape=box, style="rounded,filled", fillcolor="#ffffff"'
_LOOP_FILLS = ("#f4f4f4", "#e8e8e8", "#dcdcdc", "#d0d0d0")  # deeper loops darker, so nesting reads at a glance


def to_dot(artifact: Graph | LoopTree, *, split: SplitPlan | None = None, allocation: Allocation | None = None,
           fold: int = FOLD_AT) -> str:
    """The picture of a graph, or of a loop tree: loops as boxes labelled with their dims, count
    and tile; with the tree's ``split`` plan each op says its cores, with its ``allocation`` each
    tensor edge is coloured by memory (a legend explains them). A tree of more than ``fold`` ops
    draws each run of ops between loops as one node."""
    if isinstance(artifact, Graph):
        return _graph(artifact)
    if isinstance(artifact, LoopTree):
        return _tree(artifact, split, allocation, fold)
    raise FspyreError(f"to_dot: cannot draw a {type(artifact).__name__}; pass a Graph or a LoopTree")


def render(dot_source: str, path: str, fmt: str = "svg") -> bool:
    """Write the picture to ``path`` with graphviz's ``dot``. False (nothing written) when
    ``dot`` is not installed, so callers can skip the picture."""
    exe = shutil.which("dot")
    if exe is None:
        return False
    if not fmt.isalnum():
        raise FspyreError(f"render: format {fmt!r} is not a graphviz output format; use svg, png or pdf")
    done = subprocess.run([exe, f"-T{fmt}", "-o", path], input=dot_source.encode(), capture_output=True)
    if done.returncode != 0:
        raise FspyreError(f"render: dot -T{fmt} failed for {path}: {done.stderr.decode(errors='replace').strip()}")
    return True


def svg(dot_source: str) -> str | None:
    """The picture as SVG text (a notebook's ``_repr_svg_``); None when ``dot`` is not installed."""
    exe = shutil.which("dot")
    if exe is None:
        return None
    done = subprocess.run([exe, "-Tsvg"], input=dot_source.encode(), capture_output=True)
    if done.returncode != 0:
        raise FspyreError(f"svg: dot -Tsvg failed: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout.decode()


def _q(s: str) -> str:
    """A DOT quoted string; a line break is DOT's ``\\n``, any other control character its escape."""
    s = s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return '"' + "".join(c if c >= " " else c.encode("unicode_escape").decode("ascii") for c in s) + '"'


def _op_label(op: Op) -> str:
    space = ", ".join(map(str, op.ranges))
    if isinstance(op, Reduction):
        space += " | over " + ", ".join(map(str, op.reduction_ranges))
    return f"{op.name} = {op.fn}\n[{space}]"


def _edge_label(name: str, t: TensorType, scope: str | None = None) -> str:
    return f"{name}\n{t}" + (f" ({scope})" if scope else "")


def _io_nodes(inputs: tuple[str, ...], outputs: tuple[Output, ...], table: Mapping[str, Any]
              ) -> tuple[list[str], dict[str, str]]:
    """Graph inputs and outputs, each named with its type (an output also with the buffer it is)."""
    def typed(text: str, buffer: str) -> str:
        return f"{text}\n{table[buffer].type}" if buffer in table else text

    def output(o: Output) -> str:
        return typed(f"output {o.name}" if o.buffer == o.name else f"output {o.name} = {o.buffer}", o.buffer)

    lines = [f"  in_{i} [label={_q(typed(f'input {n}', n))}, {_INPUT}];" for i, n in enumerate(inputs)]
    lines += [f"  out_{i} [label={_q(output(o))}, {_OUTPUT}];" for i, o in enumerate(outputs)]
    return lines, {n: f"in_{i}" for i, n in enumerate(inputs)}


def _edges(
    ops: list[tuple[str, Op]], producers: dict[str, str], outputs: tuple[Output, ...],
    label: Any, style: Any,
) -> list[str]:
    """Tensor edges: producer (or graph input) -> each reading op, then producers -> outputs."""
    out: list[str] = []
    seen: set[tuple[str, str, str]] = set()
    for node_id, op in ops:
        for o in op.operands:
            if not isinstance(o, Load) or o.buffer not in producers:
                continue
            key = (producers[o.buffer], node_id, o.buffer)
            if key not in seen:
                seen.add(key)
                out.append(f"  {key[0]} -> {node_id} [label={_q(label(o.buffer))}{style(o.buffer)}];")
    for i, result in enumerate(outputs):
        b = result.buffer
        if b in producers:
            out.append(f"  {producers[b]} -> out_{i} [label={_q(label(b))}{style(b)}];")
    return out


def _graph(g: Graph) -> str:
    types = {b.name: b.type for b in g.buffers}
    io, producers = _io_nodes(g.inputs, g.outputs, g.buffer_table())
    ops = [(f"n_{i}", op) for i, op in enumerate(g.ops)]
    nodes = [f"  {nid} [label={_q(_op_label(op))}, {_OP}];" for nid, op in ops]
    producers.update({op.store.buffer: nid for nid, op in ops})
    edges = _edges(ops, producers, g.outputs, lambda b: _edge_label(b, types[b]), lambda b: "")
    return "\n".join([f"digraph {_q(g.name)} {{", *_HEADER, *io, *nodes, *edges, "}"]) + "\n"


def _loop_label(n: Loop) -> str:
    """The text printer's loop head: ``for S in 0..4 (tile S=16)``."""
    tiles = ", ".join(f"{st.dim}={st.extent}" for st in n.steps)
    head = f"for {', '.join(n.dims) or '_'} in 0..{n.count}  " + (f"(tile {tiles})" if tiles else "(no dim advances)")
    return head + (f"\ncarries {', '.join(n.carried)}" if n.carried else "")


def _cores(name: str, split: SplitPlan | None) -> str:
    """``"32 cores: S/32"``: how the op is divided (nothing without a split plan)."""
    s = split.ops.get(name) if split is not None else None
    if s is None:
        return ""
    dims = ", ".join(f"{d}/{k}" for d, k in s.splits.items() if k > 1)
    return f"{s.cores} core{'s' if s.cores > 1 else ''}" + (f": {dims}" if dims else "")


def _run_label(ops: list[OpNode], split: SplitPlan | None) -> str:
    """A folded run of ops: first and last name, their functions in order, the cores they use."""
    fns = [n.op.fn for n in ops]
    lines = [", ".join(fns[i:i + 6]) for i in range(0, len(fns), 6)]
    counts = sorted({split.ops[n.op.name].cores for n in ops if n.op.name in split.ops}) if split is not None else []
    more = "" if not counts else f"\non {counts[0]}" + (f"-{counts[-1]}" if len(counts) > 1 else "") + " cores"
    return f"{ops[0].op.name} .. {ops[-1].op.name}  ({len(ops)} ops)\n" + "\n".join(lines) + more


def _legend(memories: bool, folded: bool) -> list[str]:
    rows = []
    if memories:
        rows += [f'<tr><td><font color="{_MEMORY_COLOURS["hbm"]}">━━</font></td><td align="left">HBM tensor</td></tr>',
                 f'<tr><td><font color="{_MEMORY_COLOURS["lx"]}">━━</font></td><td align="left">LX tensor '
                 f'(each core its own slice)</td></tr>']
    rows += ['<tr><td>╌╌</td><td align="left">per-tile buffer</td></tr>',
             f'<tr><td bgcolor="{_INPUT_FILL}"> </td><td align="left">graph input</td></tr>',
             f'<tr><td bgcolor="{_OUTPUT_FILL}"> </td><td align="left">graph output</td></tr>',
             f'<tr><td bgcolor="{_LOOP_FILLS[0]}"> </td><td align="left">loop: dims, count, tile</td></tr>']
    if folded:
        rows.append(f'<tr><td bgcolor="{_FOLD_FILL}"> </td><td align="left">ops run back to back, folded</td></tr>')
    table = "".join(rows)
    return ["  subgraph cluster_legend {", '    graph [label="legend", style=rounded, color="#bbbbbb"];',
            f'    legend [shape=plaintext, label=<<table border="0" cellspacing="2">{table}</table>>];', "  }"]


def _folded_edges(t: LoopTree, ops: list[tuple[str, Op]], producers: dict[str, str], memory: Mapping[str, str]
                  ) -> tuple[list[str], list[str]]:
    """A folded tree's inputs as one node listing them, and one edge per pair of nodes naming
    the tensors it carries (the edges inside a folded run vanish)."""
    table = t.buffer_table()
    inputs = "".join(_escape(f"{n}  {table[n].type}" if n in table else n) + "\\l" for n in t.inputs)
    io = [f'  inputs [label="graph inputs\\n{inputs}", {_INPUT}, shape=box];']
    io += [f"  out_{i} [label={_q(f'output {o.name} = {o.buffer}')}, {_OUTPUT}];" for i, o in enumerate(t.outputs)]
    carried: dict[tuple[str, str], list[str]] = {}
    for node_id, op in ops:
        for o in op.operands:
            if isinstance(o, Load):
                src = "inputs" if o.buffer in t.inputs else producers.get(o.buffer)
                if src is not None and src != node_id and o.buffer not in carried.setdefault((src, node_id), []):
                    carried[(src, node_id)].append(o.buffer)
    for i, result in enumerate(t.outputs):
        if result.buffer in producers:
            carried.setdefault((producers[result.buffer], f"out_{i}"), []).append(result.buffer)
    edges = []
    for (src, dst), names in carried.items():
        text = ", ".join(names[:3]) + (f" +{len(names) - 3}" if len(names) > 3 else "")
        colours = {_MEMORY_COLOURS.get(memory.get(n, ""), "") for n in names}
        colour = f', color="{next(iter(colours))}", penwidth=1.6' if len(colours) == 1 and "" not in colours else ""
        edges.append(f"  {src} -> {dst} [label={_q(text)}{colour}];")
    return io, edges


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def _tree(t: LoopTree, split: SplitPlan | None, allocation: Allocation | None, fold: int) -> str:
    table = t.buffer_table()
    io, producers = _io_nodes(t.inputs, t.outputs, table)
    folding = len(op_nodes(t)) > fold
    ops: list[tuple[str, Op]] = []

    def body(nodes: tuple[Node, ...], path: tuple[int, ...], depth: int) -> Iterator[str]:
        pad = "  " * depth
        run: list[tuple[str, OpNode]] = []

        def close() -> Iterator[str]:
            if folding and len(run) >= _FOLD_RUN:
                fid = "f" + run[0][0][1:]
                ops.extend((fid, n.op) for _, n in run)
                label = _run_label([n for _, n in run], split)
                yield f'{pad}  {fid} [label={_q(label)}, {_OP}, fillcolor="{_FOLD_FILL}"];'
            else:
                for nid, n in run:
                    ops.append((nid, n.op))
                    cores = _cores(n.op.name, split)
                    text = _op_label(n.op) + (f"\n{cores}" if cores else "")
                    text += "" if n.runs == "every" else f"\n({n.runs} iteration)"
                    yield f"{pad}  {nid} [label={_q(text)}, {_OP}];"
            run.clear()

        for i, n in enumerate(nodes):
            p = "_".join(map(str, path + (i,)))
            if isinstance(n, Loop):
                yield from close()
                yield f"{pad}  subgraph cluster_{p} {{"
                fill = _LOOP_FILLS[min(depth, len(_LOOP_FILLS) - 1)]
                style = f'style="rounded,filled", fillcolor="{fill}", color="#888888"'
                yield f"{pad}    graph [label={_q(_loop_label(n))}, labeljust=l, {style}];"
                yield from body(n.body, path + (i,), depth + 1)
                yield f"{pad}  }}"
            else:
                run.append((f"n_{p}", n))
        yield from close()

    nodes = list(body(t.body, (), 0))
    producers.update({op.store.buffer: nid for nid, op in ops})
    memory = {} if allocation is None else {b: pl.memory for b, pl in allocation.buffers.items()}

    def label(b: str) -> str:
        buf = table.get(b)
        if buf is None or folding:
            return b
        return _edge_label(b, buf.type, "tile" if buf.scope == "tile" else None)

    def style(b: str) -> str:
        buf = table.get(b)
        dashed = ", style=dashed" if buf is not None and buf.scope == "tile" else ""
        colour = _MEMORY_COLOURS.get(memory.get(b, ""))
        return dashed + (f', color="{colour}", fontcolor="{colour}", penwidth=1.6' if colour else "")

    if folding:
        io, edges = _folded_edges(t, ops, producers, memory)
    else:
        edges = _edges(ops, producers, t.outputs, label, style)
    legend = _legend(bool(memory), folding)
    return "\n".join([f"digraph {_q(t.name)} {{", *_HEADER, *io, *nodes, *edges, *legend, "}"]) + "\n"
