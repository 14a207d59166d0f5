"""Lowering a core-ATen FX graph to an fspyre Graph, through ``GraphBuilder`` only.

One pass over the nodes in order: each op node's captured ``spyre_hint`` stack is replayed
(``g.hint`` the first time a scope is met, ``g.reenter`` after, so one torch scope is one
``HintScope``), its operands are renamed to the names ``dimnames`` chose, and its rule builds
it. Every result is checked against torch's own shape and dtype for the node, so a wrong
lowering fails at the node that caused it, not as a wrong number later.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.fx as fx

from fspyre.errors import FrontendError, FspyreError, FspyreWarning
from fspyre.frontend.annotations import node_hints
from fspyre.frontend.dimnames import DimNames, Placeholder, name_dims
from fspyre.frontend.ops import RULES, Lowered, describe_node, shape, val
from fspyre.frontend.scopes import fit_hint_scopes
from fspyre.ir.builder import GraphBuilder, Tensor
from fspyre.ir.graph import Dim, Graph, HintScope

TORCH_DTYPES: dict[torch.dtype, str] = {
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float32: "float32",
    torch.int32: "int32",
    torch.int64: "int32",  # narrowed: see below
    torch.bool: "bool",
}
"""Each torch dtype fspyre takes, and the fspyre dtype that holds it. int64 (token ids,
positions, what ``arange`` and integer reductions make) is narrowed to int32: the device
has no 64-bit integer format, and ids and positions fit in 31 bits. Narrowing is checked
where values enter: a host array with a value outside int32 is an ExecutionError when it is
passed in (``fspyre.machine.hostio``), an int scalar or constant outside int32 a GraphError
when the graph is built. Arithmetic on the narrowed values wraps at 32 bits where torch's
would not (docs/semantics.md, rule 2; docs/deviations.md); results return to torch as int64
under ``torch.compile`` and as int32 arrays from ``fspyre.evaluate`` / ``fspyre.run``."""


def fspyre_dtype(dtype: torch.dtype, where: str) -> str:
    try:
        return TORCH_DTYPES[dtype]
    except KeyError:
        hint = " (use int32)" if dtype in (torch.int16, torch.int8, torch.uint8) else (
            " (use float32)" if dtype == torch.float64 else "")
        raise FrontendError(
            f"{where}: dtype {str(dtype).removeprefix('torch.')} is not an fspyre dtype{hint}; "
            f"fspyre takes {', '.join(str(t).removeprefix('torch.') for t in TORCH_DTYPES)}"
        ) from None


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class FxProgram:
    """What the lowering needs from a trace: the ATen graph, the inputs' fspyre names (and
    user dim names), and a name per flat output."""

    name: str
    graph: fx.Graph
    placeholders: tuple[Placeholder, ...]
    output_names: tuple[str, ...]


class Lowering:
    """What a rule sees: the builder, and the names and torch types of nodes."""

    def __init__(self, g: GraphBuilder, names: DimNames) -> None:
        self.g = g
        self.names = names
        self.constants: dict[str, np.ndarray] = {}

    def iota(self, dim: Dim) -> Tensor:
        """``0, 1, ..., dim.size - 1`` (int32) along ``dim``. The graph IR has no op whose value
        depends on its position, so this is a constant computed here and passed as a graph
        input, like the constants torch.export lifts; its value travels with the capture."""
        return self.constant_input(f"iota_{dim.name}", (dim,), np.arange(dim.size, dtype=np.int32), "int32")

    def constant_input(self, name: str, dims: Sequence[Dim], values: np.ndarray, dtype: str) -> Tensor:
        """A graph input named ``name`` whose value, ``values``, travels with the capture
        (the first call with a name defines it)."""
        if name not in self.constants:
            self.constants[name] = values
            return self.g.input(name, list(dims), dtype)
        return self.g.input_handle(name)

    def out_names(self, node: fx.Node, index: int = 0) -> tuple[str, ...]:
        return self.names.of(node.name, index)

    def red_names(self, node: fx.Node) -> tuple[str, ...]:
        return tuple(self.names.names[k] for k, _ in self.names.alignments[node.name].reduced)

    def dims(self, node: fx.Node, index: int = 0) -> tuple[Dim, ...]:
        return tuple(Dim(n, s) for n, s in zip(self.out_names(node, index), shape(node, index)))

    def dtype(self, node: fx.Node, index: int = 0) -> str:
        return fspyre_dtype(val(node, index).dtype, describe_node(node))

    def rename(self, t: Tensor, names: Sequence[str]) -> Tensor:
        """``t`` with its dims called ``names``. Through ``reshape``, which is a view when ``t``
        is read contiguously; the builder has no renaming view for other layouts yet, so those
        are copied first."""
        if tuple(names) == t.type.names:
            return t
        return self.g.reshape(t, [Dim(n, d.size) for n, d in zip(names, t.dims)])


def lower(program: FxProgram) -> Graph:
    """Build the fspyre graph of ``program``. Raises FrontendError naming the node on any
    failure, and if the graph needs constant inputs (``lower_with_constants`` returns them)."""
    graph, constants = lower_with_constants(program)
    if constants:
        raise FrontendError(f"{program.name}: the graph needs constant inputs {sorted(constants)}; "
                            f"use lower_with_constants")
    return graph


def lower_with_constants(program: FxProgram) -> tuple[Graph, dict[str, np.ndarray]]:
    """The graph of ``program`` and the values of the constant inputs the lowering added."""
    placeholders = {p.node: p for p in program.placeholders}
    _check_types(program.graph, placeholders)
    names = name_dims(program.graph, placeholders)
    g = GraphBuilder(program.name)
    for n, size in names.sizes.items():
        g.dim(n, size)
    ctx = Lowering(g, names)
    scopes: dict[int, HintScope] = {}
    values: dict[str, Lowered] = {}
    for node in program.graph.nodes:
        if node.op == "placeholder":
            ph = placeholders.get(node.name)
            if ph is None or not isinstance(node.meta.get("val"), torch.Tensor):
                raise FrontendError(
                    f"{program.name}: graph input {ph.name if ph else node.name} is "
                    f"{type(node.meta.get('val')).__name__}, not a tensor; fspyre graphs take tensors with static "
                    f"shapes (under torch.compile, pass dynamic=False)"
                )
            values[node.name] = g.input(ph.name, ctx.dims(node), ctx.dtype(node))
        elif node.op == "call_function":
            values[node.name] = _lower_node(ctx, node, values, scopes)
        elif node.op == "output":
            outs = node.args[0] if isinstance(node.args[0], (tuple, list)) else (node.args[0],)
            if len(outs) != len(program.output_names):
                raise FrontendError(f"{program.name}: {len(outs)} outputs but {len(program.output_names)} names")
            for name, out in zip(program.output_names, outs):
                value = values.get(out.name) if isinstance(out, fx.Node) else None
                if not isinstance(value, Tensor):
                    raise FrontendError(f"{program.name}: output {name} is {out!r}, not a tensor fspyre computes")
                g.output(name, value)
        elif node.op != "get_attr":
            raise FrontendError(
                f"{program.name}: FX node {node.name} has kind {node.op}; fspyre takes ATen call graphs"
            )
    try:
        graph = g.build()
    except FspyreError as e:
        raise FrontendError(f"{program.name}: {e}") from e
    graph, moved = fit_hint_scopes(graph, _origins(program.graph, graph, values))
    for message in moved:
        warnings.warn(FspyreWarning(f"{program.name}: {message}"), stacklevel=3)
    return graph, ctx.constants


def _origins(fx_graph: fx.Graph, graph: Graph, values: Mapping[str, Lowered]) -> dict[str, str]:
    """Each op of ``graph`` -> the torch op it lowers (as ``describe_node`` tells it). Ops are
    built in node order, so a node owns the ops up to the last one whose result it returns."""
    position = {op.store.buffer: i for i, op in enumerate(graph.ops)}
    out: dict[str, str] = {}
    done = 0
    for node in fx_graph.nodes:
        value = values.get(node.name)
        results = value if isinstance(value, tuple) else (value,)
        last = max((position.get(t.buffer, -1) for t in results if isinstance(t, Tensor)), default=-1)
        if last >= done:
            out.update((op.name, describe_node(node)) for op in graph.ops[done:last + 1])
            done = last + 1
    return out


def _lower_node(ctx: Lowering, node: fx.Node, values: Mapping[str, Lowered], scopes: dict[int, HintScope]) -> Lowered:
    al = ctx.names.alignments[node.name]
    where = describe_node(node)
    try:
        with contextlib.ExitStack() as stack:
            for h in node_hints(node.meta):
                if h.id in scopes:
                    stack.enter_context(ctx.g.reenter(scopes[h.id]))
                else:
                    scopes[h.id] = stack.enter_context(ctx.g.hint(slices=dict(h.slices), work_div=dict(h.work_div)))
            xs = []
            for use in al.uses:
                v = values[use.arg.name]
                t = v[use.index] if isinstance(v, tuple) else v
                if t is None:
                    raise FrontendError(
                        f"{where}: reads result {use.index} of {use.arg.name}, which fspyre cannot compute"
                    )
                wanted = [ctx.names.names[d] if d is not None else t.dims[j].name for j, d in enumerate(use.dst)]
                xs.append(ctx.rename(t, wanted))
            result = RULES[node.target].lower(ctx, node, xs)
    except FrontendError:
        raise
    except FspyreError as e:
        raise FrontendError(f"{where}: {e}") from e
    for i, t in enumerate(result if isinstance(result, tuple) else (result,)):
        if t is not None:
            _check_result(ctx, node, i if isinstance(result, tuple) else 0, t)
    return result


def _check_result(ctx: Lowering, node: fx.Node, index: int, t: Tensor) -> None:
    want_shape, want_dtype = shape(node, index), ctx.dtype(node, index)
    want_names = ctx.out_names(node, index)
    got_names = tuple(d.name if d.size != 1 else w for d, w in zip(t.dims, want_names))
    if t.shape != want_shape or t.dtype != want_dtype or got_names != want_names:
        raise FrontendError(
            f"internal: lowering {describe_node(node)} gave {t.type} but torch says "
            f"{want_dtype}{list(want_shape)} with dims {list(want_names)}; please report this"
        )


def _check_types(graph: fx.Graph, placeholders: dict[str, Placeholder]) -> None:
    """Every tensor the graph makes must be one fspyre can hold: a known dtype, static nonzero sizes."""
    for node in graph.nodes:
        v = node.meta.get("val")
        if not isinstance(v, torch.Tensor):
            continue
        where = f"input {placeholders[node.name].name}" if node.name in placeholders else describe_node(node)
        fspyre_dtype(v.dtype, where)
        if not all(isinstance(s, int) for s in v.shape):
            raise FrontendError(
                f"{where}: symbolic sizes {list(v.shape)}; fspyre needs static shapes "
                f"(under torch.compile, pass dynamic=False)"
            )
        if any(s == 0 for s in v.shape):
            raise FrontendError(f"{where}: a zero-size dim {list(v.shape)}; fspyre tensors have at least one element")
