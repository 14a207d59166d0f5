"""Graphviz pictures of a graph or a loop tree, as dot source text.

Node ids come from positions (``n_0_1_2`` is op 2 of loop 1 of loop 0; ``in_0`` the first
graph input, ``out_0`` the first output), never from ``id()`` or hashes, so the same
artifact always gives the same text and two dumps diff cleanly.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

from fspyre.errors import FspyreError
from fspyre.ir.graph import Graph, Load, Op, Output, Reduction, TensorType
from fspyre.ir.looptree import Loop, LoopTree, Node

_HEADER = (
    '  graph [fontname="Helvetica", fontsize=11, rankdir=TB];',
    '  node [fontname="Helvetica", fontsize=10];',
    '  edge [fontname="Helvetica", fontsize=9];',
)
_INPUT = 'shape=invhouse, style=filled, fillcolor="#dbe8f7"'
_OUTPUT = 'shape=house, style=filled, fillcolor="#dcf2dc"'
_OP = 'shape=box, style="rounded,filled", fillcolor="#ffffff"'
_LOOP_FILLS = ("#f4f4f4", "#e8e8e8", "#dcdcdc", "#d0d0d0")  # deeper loops darker, so nesting reads at a glance


def to_dot(artifact: Graph | LoopTree) -> str:
    if isinstance(artifact, Graph):
        return _graph(artifact)
    if isinstance(artifact, LoopTree):
        return _tree(artifact)
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
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _op_label(op: Op) -> str:
    space = ", ".join(map(str, op.ranges))
    if isinstance(op, Reduction):
        space += " | over " + ", ".join(map(str, op.reduction_ranges))
    return f"{op.name} = {op.fn}\n[{space}]"


def _edge_label(name: str, t: TensorType, scope: str | None = None) -> str:
    return f"{name}\n{t}" + (f" ({scope})" if scope else "")


def _io_nodes(inputs: tuple[str, ...], outputs: tuple[Output, ...]) -> tuple[list[str], dict[str, str]]:
    lines = [f"  in_{i} [label={_q(n)}, {_INPUT}];" for i, n in enumerate(inputs)]
    lines += [f"  out_{i} [label={_q(o.name)}, {_OUTPUT}];" for i, o in enumerate(outputs)]
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
    io, producers = _io_nodes(g.inputs, g.outputs)
    ops = [(f"n_{i}", op) for i, op in enumerate(g.ops)]
    nodes = [f"  {nid} [label={_q(_op_label(op))}, {_OP}];" for nid, op in ops]
    producers.update({op.store.buffer: nid for nid, op in ops})
    edges = _edges(ops, producers, g.outputs, lambda b: _edge_label(b, types[b]), lambda b: "")
    return "\n".join([f"digraph {_q(g.name)} {{", *_HEADER, *io, *nodes, *edges, "}"]) + "\n"


def _tree(t: LoopTree) -> str:
    table = t.buffer_table()
    io, producers = _io_nodes(t.inputs, t.outputs)
    ops: list[tuple[str, Op]] = []

    def body(nodes: tuple[Node, ...], path: tuple[int, ...], depth: int) -> Iterator[str]:
        pad = "  " * depth
        for i, n in enumerate(nodes):
            p = "_".join(map(str, path + (i,)))
            if isinstance(n, Loop):
                yield f"{pad}  subgraph cluster_{p} {{"
                fill = _LOOP_FILLS[min(depth, len(_LOOP_FILLS) - 1)]
                style = f'style="rounded,filled", fillcolor="{fill}", color="#888888"'
                yield f"{pad}    graph [label={_q(f'loop ×{n.count}')}, {style}];"
                yield from body(n.body, path + (i,), depth + 1)
                yield f"{pad}  }}"
            else:
                ops.append((f"n_{p}", n.op))
                once = "" if n.runs == "every" else f"\n({n.runs} iteration)"
                yield f"{pad}  n_{p} [label={_q(_op_label(n.op) + once)}, {_OP}];"

    nodes = list(body(t.body, (), 0))
    producers.update({op.store.buffer: nid for nid, op in ops})

    def label(b: str) -> str:
        buf = table.get(b)
        return b if buf is None else _edge_label(b, buf.type, "tile" if buf.scope == "tile" else None)

    def style(b: str) -> str:
        buf = table.get(b)
        return ", style=dashed" if buf is not None and buf.scope == "tile" else ""

    edges = _edges(ops, producers, t.outputs, label, style)
    return "\n".join([f"digraph {_q(t.name)} {{", *_HEADER, *io, *nodes, *edges, "}"]) + "\n"

