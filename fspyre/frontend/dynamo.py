"""``torch.compile(f, backend="fspyre")``: Dynamo hands over an FX graph; fspyre traces it to
core ATen (the same decompositions as ``from_torch``) for the input shapes of each call,
splits it into the largest subgraphs fspyre can lower, compiles each, and runs them on the
machine-model interpreter; every other op runs in eager PyTorch between them.

- **Fallback.** ``CapabilityBasedPartitioner`` groups the ops fspyre has a rule for (with
  dtypes and sizes fspyre can hold) into maximal subgraphs without cycles; a subgraph the
  lowering still refuses falls back whole, with the lowering's message as its reason (a
  ``spyre_hint`` that cannot be honoured is the program's error, and raised). A subgraph
  whose compile fails (any exception fspyre raises while tracing, lowering or compiling it),
  or whose run on the interpreter fails, runs its ATen ops in eager instead, with a warning
  naming its ops and the failure: the backend never fails the user's call because fspyre
  could not compile a graph. Anything
  left in eager is reported in one line (``PartitionReport.summary``), warned once per
  compiled shape, and printed by ``explain(model, inputs)``. Views and ``getitem`` alone are
  not worth a trip to the device: a subgraph with nothing else stays in eager, unreported.
- **Shapes.** A graph without torch symbolic sizes is compiled for its shapes. A graph with
  them (Dynamo's default ``dynamic=None`` recompiles with symbolic sizes at the second shape;
  ``dynamic=True`` makes every dim symbolic) becomes one fspyre program over the size that
  changed between calls (``_SymbolicChoice``; docs/tiling.md, "Symbolic sizes"). Each call
  the program cannot take, and every graph that cannot be one program, is looked up by its
  input shapes (and the values of the ints Dynamo passes for symbolic sizes) in a cache and
  traced and compiled on a miss, so a model fed many sequence lengths stays under Dynamo's
  recompile limit.
- **Training.** A graph Dynamo traces with grad mode on and an input (parameters included)
  that requires grad goes through aot_autograd (``aot_compilers``): the joint graph is
  traced with fspyre's decompositions and partitioned into a forward and a backward graph,
  and each is split, compiled and run like an inference graph, with eager fallback for
  the backward ops fspyre has no lowering for (scatter-adds of embedding and gather, erf).

Options: ``torch.compile(f, backend="fspyre", options={"tiling": "none", "cores": 8})``;
``tiling`` defaults to ``"auto"`` and ``cores`` to 32; ``on_graph`` is called with each
fspyre Graph before it is compiled (printing, tests); ``on_report`` with each
``PartitionReport``.
"""

from __future__ import annotations

import copy
import operator
import sys
import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TextIO

import numpy as np
import torch
import torch.fx as fx

from fspyre.errors import FrontendError, FspyreError, FspyreWarning, HintError
from fspyre.frontend.annotations import preserve_hints, tensor_dim_names
from fspyre.frontend.capture import decompose, to_numpy
from fspyre.frontend.dimnames import Placeholder
from fspyre.frontend.lowering import TORCH_DTYPES, FxProgram, lower_with_constants
from fspyre.frontend.ops import RULES
from fspyre.ir.kinds import Tiling

BACKEND_NAME = "fspyre"


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendOptions:
    """The ``options=`` of ``torch.compile(..., backend="fspyre")``."""

    tiling: Tiling = "auto"
    cores: int = 32
    on_graph: Callable[[Any], None] | None = None
    on_report: Callable[[PartitionReport], None] | None = None

    @staticmethod
    def parse(options: Mapping[str, Any] | None) -> BackendOptions:
        options = dict(options or {})
        known = ("tiling", "cores", "on_graph", "on_report")
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise FrontendError(
                f"torch.compile(backend='fspyre'): unknown options {unknown}; fspyre takes {list(known)}"
            )
        return BackendOptions(**options)


@dataclass(frozen=True, slots=True, kw_only=True)
class Fallback:
    """An op left to eager PyTorch, and why."""

    op: str
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionReport:
    """How one Dynamo graph, specialised to one set of input shapes, was split."""

    name: str
    shapes: tuple[tuple[int, ...] | int | None, ...]  # per graph input: a tensor's shape, an int's value
    on_fspyre: tuple[int, ...]  # ops per fspyre subgraph
    eager: tuple[Fallback, ...]  # ops that compute in eager PyTorch

    def summary(self) -> str:
        """One line: what ran where, and every distinct reason an op fell back."""
        total = sum(self.on_fspyre) + len(self.eager)
        n = len(self.on_fspyre)
        head = (f"{self.name}: {sum(self.on_fspyre)} of {total} ops on fspyre "
                f"in {n} subgraph{'' if n == 1 else 's'}")
        if not self.eager:
            return f"{head}; none in eager"
        by_reason: dict[str, Counter[str]] = {}
        for f in self.eager:
            by_reason.setdefault(f.reason, Counter())[f.op] += 1
        parts = [f"{', '.join(f'{op} x{k}' if k > 1 else op for op, k in ops.items())} ({reason})"
                 for reason, ops in by_reason.items()]
        return f"{head}; {len(self.eager)} in eager: {'; '.join(parts)}"


def register_backend() -> None:
    """Make ``backend="fspyre"`` known to ``torch.compile`` (idempotent). Installing fspyre also
    registers it through the ``torch_dynamo_backends`` entry point."""
    from torch._dynamo.backends.registry import _BACKENDS, _COMPILER_FNS
    from torch._dynamo.backends.registry import register_backend as register

    # Once torch has discovered the entry point it registers the function itself after
    # loading it, and refuses a second registration under the same name. Loading the entry
    # point imports this package, so registering here at that moment would make torch's own
    # registration fail.
    if BACKEND_NAME not in _COMPILER_FNS and BACKEND_NAME not in _BACKENDS:
        register(compiler_fn=fspyre_backend, name=BACKEND_NAME)


def fspyre_backend(gm: fx.GraphModule, example_inputs: Sequence[Any], *,
                   options: Mapping[str, Any] | None = None, mode: str | None = None) -> Callable:
    """The Dynamo backend (``mode`` is accepted and ignored: fspyre has one). A graph traced
    with grad mode on whose inputs (parameters included) need gradients goes through
    aot_autograd: its forward and backward graphs are each split and compiled as below."""
    opts = BackendOptions.parse(options)
    if _needs_grad(example_inputs):
        return _training(gm, example_inputs, opts)
    return _specialising(gm, example_inputs, opts, compile_parts=True)


def _needs_grad(inputs: Sequence[Any]) -> bool:
    return torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in inputs)


def _training(gm: fx.GraphModule, example_inputs: Sequence[Any], options: BackendOptions) -> Callable:
    """aot_autograd traces the joint forward-backward graph with fspyre's decompositions and
    partitions it into a forward graph (which also returns what the backward needs) and a
    backward graph; each is a graph of core ATen ops, split and compiled like an inference
    graph (a shape cache of its own, eager fallback between fspyre subgraphs). aot_autograd
    runs both inside an autograd.Function, with grad mode off."""
    from torch._dynamo.backends.common import aot_autograd

    return aot_autograd(**aot_compilers(options))(gm, example_inputs)


def aot_compilers(options: BackendOptions) -> dict[str, Any]:
    """The keyword arguments of ``aot_autograd`` / ``aot_function`` that compile the forward,
    backward and inference graphs with fspyre (fspyre's decomposition table for the joint
    graph, so the partitioner sees the ops fspyre lowers)."""
    from functools import partial

    from torch._functorch.aot_autograd import make_boxed_func

    from fspyre.frontend.capture import decompositions

    def compiler(kind: str, graph: fx.GraphModule, inputs: Sequence[Any]) -> Callable:
        return make_boxed_func(_specialising(graph, inputs, options, compile_parts=True, name=f"torch_compiled_{kind}"))

    return {"fw_compiler": partial(compiler, "forward"), "bw_compiler": partial(compiler, "backward"),
            "inference_compiler": partial(compiler, "inference"), "decompositions": decompositions()}


def explain(fn: Callable | torch.nn.Module, example_inputs: Sequence[Any], *,
            file: TextIO | None = None) -> tuple[PartitionReport, ...]:
    """Print, one line per graph Dynamo captures from ``fn(*example_inputs)``, which ops would
    run on fspyre and which fall back to eager, and why; return the reports. Nothing is
    compiled for the machine: the subgraphs are lowered to fspyre graphs (so a refusal of the
    lowering shows) and then run in eager."""
    reports: list[PartitionReport] = []

    def backend(gm: fx.GraphModule, inputs: Sequence[Any]) -> Callable:
        return _specialising(gm, inputs, BackendOptions(on_report=reports.append), compile_parts=False)

    with torch.no_grad():
        torch.compile(fn, backend=backend)(*example_inputs)
    for i, r in enumerate(reports):  # several when Dynamo breaks the graph: numbered in call order
        print(f"graph {i}: {r.summary()}" if len(reports) > 1 else r.summary(), file=file or sys.stdout)
    return tuple(reports)


def _specialising(gm: fx.GraphModule, example_inputs: Sequence[Any], options: BackendOptions, *,
                  compile_parts: bool, name: str = "torch_compiled") -> Callable:
    """A callable for ``gm`` that traces and splits it once per input signature."""
    # Dynamo's inputs are the real tensors (parameters included), in graph-input order:
    # name_tensor_dims names are looked up on them here, while their identity is known.
    dims = tuple(tensor_dim_names(x) if isinstance(x, torch.Tensor) else None for x in example_inputs)
    shapes = tuple(tuple(x.shape) if isinstance(x, torch.Tensor) else None for x in example_inputs)
    cache: dict[tuple, Callable] = {}
    scalars = _read_values(gm)
    symbolic = _SymbolicChoice(gm, example_inputs, dims, options, name) if compile_parts else None

    def run(*args: Any) -> Any:
        if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            raise FrontendError(
                f"{name}: this graph was compiled for inference (no example input needed gradients) and this "
                f"call needs gradients; compile it with grad mode on (torch.compile does) or call it under "
                f"torch.no_grad()"
            )
        if symbolic is not None:
            try:
                got = symbolic(args)
            except Exception as e:  # noqa: BLE001  (this shape is compiled on its own instead)
                _reraise_hint(e)
                _warn_static(name, f"its run failed: {_failure(e)}")
                got = None
            if got is not None:
                return got
        key = tuple(_signature(a, i in scalars) for i, a in enumerate(args))
        if key not in cache:
            names = tuple(
                tensor_dim_names(a) or (d if isinstance(a, torch.Tensor) and tuple(a.shape) == s else None)
                if isinstance(a, torch.Tensor) else None
                for a, d, s in zip(args, dims, shapes)
            )
            cache[key] = _specialise(gm, args, names, options, compile_parts=compile_parts, name=name,
                                     scalars=scalars)
        with torch.no_grad():
            return cache[key](*args)

    return run


# The sizes a torch symbolic size is traced at to find the fspyre graph over it: the graph
# must be the same at each but for that dim's size and the strides it enters (checked).
PROBES = (1088, 1216, 1344)


class _SymbolicChoice:
    """Which torch symbolic size of a graph becomes fspyre's symbolic dim, and its program.

    The symbol is one whose value *changed* between calls, never one merely marked dynamic:
    under ``dynamic=True`` Dynamo makes every dim symbolic (an MLP's hidden dim too, which
    its matmuls reduce over), so the first call is compiled for its shape and the first call
    with other sizes names the symbols that move. Under Dynamo's default automatic dynamic a
    symbolic graph exists only because its sizes changed, so it is compiled at once. Symbols
    that move by one step (a KV cache's keys and values) are one size: the first is fspyre's
    symbolic dim and the others follow it at their offsets. Symbols that move by different
    steps, or a graph that cannot be one program (a warning says why), keep the per-shape
    cache."""

    def __init__(self, gm: fx.GraphModule, example_inputs: Sequence[Any], dims: Sequence[tuple[str, ...] | None],
                 options: BackendOptions, name: str) -> None:
        self.gm, self.dims, self.options, self.name = gm, dims, options, name
        self.symbols = _torch_symbols(gm)
        self.first = _symbol_values(gm, example_inputs)
        self.run: _SymbolicRun | None = None
        self.done = not self.symbols
        if not self.done and set(self.first) != self.symbols:
            missing = ", ".join(sorted(map(str, self.symbols - set(self.first))))
            self._give_up(f"the sizes of {missing} are not an input's dims")
        elif not self.done and torch._dynamo.config.assume_static_by_default:
            self._compile(example_inputs, sorted(self.symbols, key=str))

    def _give_up(self, why: str) -> None:
        self.done = True
        _warn_static(self.name, why)

    def _compile(self, args: Sequence[Any], moved: Sequence[Any]) -> None:
        """One program over the first of ``moved``; the others follow it at their offsets
        from it (the keys and values of a KV cache: two symbols, one length)."""
        self.done = True
        values = _symbol_values(self.gm, args)
        sym = moved[0]
        fixed: dict[Any, Any] = {k: v for k, v in values.items() if k not in moved}
        fixed.update({k: sym + (values[k] - values[sym]) for k in moved[1:]})
        try:
            self.run = _symbolic_run(self.gm, args, self.dims, self.options, self.name, sym, fixed)
        except Exception as e:  # noqa: BLE001  (each shape is then compiled on its own, with its own fallback)
            _reraise_hint(e)
            _warn_static(self.name, _failure(e))

    def __call__(self, args: Sequence[Any]) -> tuple[torch.Tensor, ...] | None:
        if not self.done:
            values = _symbol_values(self.gm, args)
            moved = sorted((s for s in self.symbols if values.get(s) != self.first[s]), key=str)
            steps = {values[s] - self.first[s] for s in moved}
            if len(steps) == 1:
                self._compile(args, moved)
            elif moved:
                self._give_up(f"sizes {', '.join(map(str, moved))} changed by different steps {sorted(steps)}; fspyre "
                              f"compiles one symbolic size per graph")
        return self.run(args) if self.run is not None else None


def _warn_static(name: str, why: str) -> None:
    warnings.warn(FspyreWarning(f"{name}: compiled for each input shape, not once for a symbolic size: {why}"),
                  stacklevel=4)


def _torch_symbols(gm: fx.GraphModule) -> set[Any]:
    out: set[Any] = set()
    for n in gm.graph.nodes:
        if n.op != "placeholder":
            continue
        v = n.meta.get("example_value")
        sizes = [v] if isinstance(v, torch.SymInt) else list(v.shape) if isinstance(v, torch.Tensor) else []
        for x in sizes:
            if isinstance(x, torch.SymInt):
                out |= x.node.expr.free_symbols
    return out


def _symbol_values(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> dict[Any, int]:
    """Each torch symbol that is a dim of an input, and its size in ``example_inputs``."""
    out: dict[Any, int] = {}
    nodes = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for n, x in zip(nodes, example_inputs):
        v = n.meta.get("example_value")
        if isinstance(v, torch.Tensor) and isinstance(x, torch.Tensor):
            for s, k in zip(v.shape, x.shape):
                if isinstance(s, torch.SymInt) and s.node.expr.is_Symbol:
                    out[s.node.expr] = int(k)
        elif isinstance(v, torch.SymInt) and v.node.expr.is_Symbol and isinstance(x, int):
            out[v.node.expr] = x
    return out


def _pattern(v: Any, fixed: Mapping[Any, Any]) -> Any:
    """A graph input's shape (a tensor) or value (an int) with the other symbols substituted
    (a value, or the symbolic size plus an offset)."""
    import sympy

    env = {k: sympy.sympify(n) for k, n in fixed.items()}
    if isinstance(v, torch.SymInt):
        return sympy.sympify(v.node.expr.xreplace(env))
    if isinstance(v, torch.Tensor):
        return tuple(sympy.sympify(x.node.expr.xreplace(env)) if isinstance(x, torch.SymInt) else int(x)
                     for x in v.shape)
    return None


def _at(pattern: Any, v: Any, example: Any, sym: Any, size: int) -> Any:
    """Graph input ``v`` (its example value) at ``sym = size``: zeros of that shape, or the int."""
    if isinstance(v, torch.SymInt):
        return int(pattern.subs(sym, size))
    if isinstance(v, torch.Tensor) and any(isinstance(x, torch.SymInt) for x in v.shape):
        return torch.zeros([int(x.subs(sym, size)) if hasattr(x, "subs") else x for x in pattern], dtype=v.dtype)
    return example


def _symbolic_run(gm: fx.GraphModule, example_inputs: Sequence[Any], dims: Sequence[tuple[str, ...] | None],
                  options: BackendOptions, name: str, sym: Any, fixed: Mapping[Any, Any]) -> _SymbolicRun:

    import fspyre
    from fspyre.ir.symbolic import size_symbol
    from fspyre.machine.spyre import spyre
    from fspyre.stages.symbolic import SymbolicError, generalize

    values = [n.meta.get("example_value") for n in gm.graph.nodes if n.op == "placeholder"]
    patterns = tuple(_pattern(v, fixed) for v in values)
    probes = []
    for size in PROBES:
        args = [_at(p, v, x, sym, size) for p, v, x in zip(patterns, values, example_inputs)]
        vals = _fake_args(args)
        with torch.no_grad(), preserve_hints(), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            aten_gm = decompose(_with_values(gm, args, _read_values(gm)), vals)
        report, parts = _split(aten_gm, name, dims, tuple(_shape_of(a) for a in args))
        if report.eager or len(parts) != 1:
            raise SymbolicError(f"{report.summary()}; a symbolic program takes the whole graph on fspyre")
        (part,) = parts
        if any(p < 0 for p in part.positions):  # a subgraph may read no input at all
            raise SymbolicError("the fspyre subgraph reads a value computed in eager")
        outs = aten_gm.graph.output_node().args[0]
        results = [o for o in outs if isinstance(o, fx.Node) and _is_getitem(o)] if isinstance(
            outs, (tuple, list)) else []
        sources = [o.args[0] for o in results]
        if len(results) != len(outs) or not all(  # type: ignore[arg-type]
                isinstance(x, fx.Node) and x.op == "call_module" and x.target == part.module for x in sources):
            raise SymbolicError("the graph's results are not the fspyre subgraph's")
        probes.append((part, tuple(int(o.args[1]) for o in results)))  # type: ignore[arg-type]
    first = probes[0][0]
    graphs = tuple(p.graph for p, _ in probes)
    # the dim whose size is the torch symbol's value (dims of size s + 1 follow it)
    moved = [d.name for a, b in zip(graphs[0].buffers, graphs[1].buffers) for d, e in zip(a.type.dims, b.type.dims)
             if (d.size, e.size) == PROBES[:2]]
    if not moved:
        raise SymbolicError(f"no dim of the fspyre graph has the symbolic size {sym}")
    symbol = size_symbol(moved[0])
    graph = generalize(graphs, PROBES, symbol, f"graph {graphs[0].name}")
    for p, taken in probes[1:]:
        if p.inputs != first.inputs or p.positions != first.positions or taken != probes[0][1]:
            raise SymbolicError("the fspyre subgraph's inputs change with the size")
    sized = {k: _sized_constant(k, tuple(p.constants[k] for p, _ in probes)) for k in first.constants
             if not all(np.array_equal(p.constants[k], first.constants[k]) for p, _ in probes[1:])}
    graph, scalars = _sized_scalars(graph, symbol)
    sized |= scalars
    shapes = generalize(tuple(tuple(tuple(like.shape) for _, like in p.outputs) for p, _ in probes), PROBES, symbol,
                        "output shapes")
    if options.on_graph is not None:
        options.on_graph(graph)
    compiled = fspyre.compile(graph, machine=spyre(cores=int(options.cores)), tiling=options.tiling)
    read = {i: example_inputs[i].item() for i in _read_values(gm)}
    return _SymbolicRun(name=name, compiled=compiled, part=first, results=probes[0][1], shapes=shapes,
                        symbol=symbol, patterns=patterns, torch_symbol=sym, read=read, sized=sized)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Arange:
    """A constant input whose values follow the symbolic size: ``start + step * i`` for ``i <
    count``, ``start`` and ``count`` lines in the size (the positions ``arange(|L| + 1)`` of
    a KV cache's keys that a causal mask compares, an iota over a dim of size ``|L| + 1``).
    The symbolic program takes it as a host input of that size, made for each call."""

    start: tuple[Any, Any]  # start = start[0] + start[1] * size (exact rationals)
    count: tuple[Any, Any]
    step: Any
    dtype: Any

    def __call__(self, size: int) -> np.ndarray:
        start = self.start[0] + self.start[1] * size
        count = int(self.count[0] + self.count[1] * size)
        # in float64, as torch's arange computes, then one rounding (int32 positions are exact)
        return (float(start) + float(self.step) * np.arange(count, dtype=np.float64)).astype(self.dtype)


def _sized_scalars(graph: Any, symbol: Any) -> tuple[Any, dict[str, _Arange]]:
    """``graph`` with each integer scalar operand that is a line in the symbolic size (the
    position of the new token, ``|L|``, which the trace took as a number) read from a
    one-element host input instead, and the rule that makes each input's value per call."""
    import sympy

    from fspyre.ir.graph import Buffer, Dim, Load, Scalar, TensorType, verify_graph
    from fspyre.stages.symbolic import SymbolicError

    rules: dict[str, _Arange] = {}
    names: dict[Any, str] = {}
    taken = {b.name for b in graph.buffers} | {op.name for op in graph.ops}
    buffers = list(graph.buffers)

    def operand(o: Any) -> Any:
        if not isinstance(o, Scalar) or not isinstance(o.value, sympy.Expr) or not o.value.free_symbols:
            return o
        value = sympy.expand(o.value)
        a, b = sympy.sympify(value.coeff(symbol)), sympy.sympify(value.xreplace({symbol: 0}))
        if not (a.is_Integer and b.is_Integer and value.free_symbols == {symbol}):
            raise SymbolicError(f"graph {graph.name}: the scalar {value} is not an integer line in {symbol}")
        if value not in names:
            name = next(n for k in range(len(taken) + 1) if (n := f"size_scalar{k}") not in taken)
            taken.add(name)
            names[value] = name
            buffers.append(Buffer(name=name, type=TensorType(dims=(Dim(f"{name}_0", 1),), dtype="int32")))
            rules[name] = _Arange(start=(int(b), int(a)), count=(1, 0), step=0, dtype=np.dtype(np.int32))
        return Load(buffer=names[value], index=sympy.Integer(0))

    ops = tuple(replace(op, operands=tuple(operand(o) for o in op.operands)) for op in graph.ops)
    if not rules:
        return graph, {}
    return verify_graph(replace(graph, buffers=tuple(buffers), inputs=graph.inputs + tuple(rules), ops=ops)), rules


def _sized_constant(name: str, values: Sequence[np.ndarray]) -> _Arange:
    """The rule that gives constant ``name`` its value at each probe size, or a SymbolicError:
    an arange whose start and length are lines in the size, checked against every probe."""
    from fractions import Fraction

    from fspyre.stages.symbolic import SymbolicError

    def line(ys: Sequence[Any]) -> tuple[Any, Any]:
        slope = Fraction(ys[1] - ys[0]) / (PROBES[1] - PROBES[0]) if all(
            isinstance(y, (int, np.integer)) for y in ys) else (ys[1] - ys[0]) / (PROBES[1] - PROBES[0])
        return ys[0] - slope * PROBES[0], slope

    if any(v.ndim != 1 or v.dtype != values[0].dtype for v in values):
        raise SymbolicError(f"the constant {name} changes with the size and is not a range of values")
    step = next(((v[1] - v[0]).item() for v in values if v.size >= 2), 0)  # one element: its start alone
    rule = _Arange(start=line([v[0].item() for v in values]), count=line([v.size for v in values]), step=step,
                   dtype=values[0].dtype)
    if any(not np.array_equal(rule(size), v) for size, v in zip(PROBES, values)):
        raise SymbolicError(f"the constant {name} changes with the size and is not a range whose start and length "
                            f"are lines in it")
    return rule


class _SymbolicRun:
    """The one program of a graph with a torch symbolic size: binds the size from the call's
    inputs and runs; None (and a warning, once per size) when the size breaks an assumption
    of the program, so the caller compiles that shape on its own."""

    def __init__(self, *, name: str, compiled: Any, part: _Part, results: tuple[int, ...], shapes: tuple,
                 symbol: Any, patterns: tuple, torch_symbol: Any, read: Mapping[int, Any],
                 sized: Mapping[str, _Arange]) -> None:
        self.name, self.compiled, self.part, self.results, self.read = name, compiled, part, results, read
        self.sized = sized
        self.shapes, self.symbol, self.patterns, self.torch_symbol = shapes, symbol, patterns, torch_symbol
        self.refused: set[Any] = set()

    def _refuse(self, key: Any, why: str) -> None:
        if key not in self.refused:  # once per size
            self.refused.add(key)
            warnings.warn(FspyreWarning(f"{self.name}: {why}; compiling this shape on its own"), stacklevel=4)

    def __call__(self, args: Sequence[Any]) -> tuple[torch.Tensor, ...] | None:
        import fspyre
        from fspyre.stages.symbolic import bind_sizes

        changed = [i for i, v in self.read.items() if args[i].item() != v]
        if changed:  # the trace took these values
            self._refuse(("read", tuple(args[i].item() for i in changed)),
                         f"input {changed[0]} is {args[changed[0]].item()}, the program was traced at "
                         f"{self.read[changed[0]]}")
            return None
        host = {n: to_numpy(args[i]) for n, i in zip(self.part.inputs, self.part.positions)} | {
            k: v for k, v in self.part.constants.items() if k not in self.sized}
        program = self.compiled.program
        sizes = bind_sizes(program, host)
        (n,) = sizes.values()
        host |= {k: rule(n) for k, rule in self.sized.items()}
        for a, p in zip(args, self.patterns):  # the sizes kept fixed must have their values
            have = tuple(a.shape) if isinstance(a, torch.Tensor) else a
            want = (tuple(int(x.subs(self.torch_symbol, n)) if hasattr(x, "subs") else x for x in p)
                    if isinstance(p, tuple) else int(p.subs(self.torch_symbol, n)) if p is not None else have)
            if have != want:
                what = f"an input of shape {have}" if isinstance(a, torch.Tensor) else f"a size of {have}"
                self._refuse((n, have), f"{what} where the symbolic program takes {want}")
                return None
        broken = program.symbolic.violated(sizes)
        if broken:
            self._refuse(n, f"size {n} breaks the symbolic program's assumption {str(broken[0]).split('  (')[0]}")
            return None
        with torch.no_grad():
            got = fspyre.run(self.compiled, host)
        outs = []
        for k in self.results:
            out_name, like = self.part.outputs[k]
            shape = [int(x.subs(self.symbol, n)) if hasattr(x, "subs") else int(x) for x in self.shapes[k]]
            outs.append(torch.from_numpy(np.ascontiguousarray(got[out_name])).to(like.dtype).reshape(shape))
        return tuple(outs)


def _signature(a: Any, by_value: bool = False) -> Any:
    if isinstance(a, torch.Tensor):
        value = a.item() if by_value else None
        return (tuple(a.shape), tuple(a.stride()), a.dtype, a.device.type, value)
    return (type(a).__name__, a)


def _read_values(gm: fx.GraphModule) -> frozenset[int]:
    """The graph inputs whose value the graph reads with ``.item()``: a float Dynamo does not
    specialise (``dynamic=True`` passes a module's float attribute, an embedding's
    ``norm_type``, as a 0-d tensor). The trace takes their values (``_with_values``), so the
    shape cache keys them by value and a symbolic program runs only at the values it took."""
    inputs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    return frozenset(i for i, n in enumerate(inputs)
                     if any(u.op == "call_method" and u.target == "item" for u in n.users))


def _fake_args(args: Sequence[Any]) -> list[Any]:
    """Fake tensors with static shapes for ``args``: the trace specialises on these sizes,
    whatever Dynamo made symbolic."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    fake = FakeTensorMode(allow_non_fake_inputs=True)  # constants the graph holds are real
    return [fake.from_tensor(a, static_shapes=True) if isinstance(a, torch.Tensor) else a for a in args]


def _with_values(gm: fx.GraphModule, args: Sequence[Any], read: frozenset[int]) -> fx.GraphModule:
    """``gm`` with each ``.item()`` of an input in ``read`` replaced by that input's value in
    ``args`` (a fake tensor has none to give the trace)."""
    if not read:
        return gm
    graph = copy.deepcopy(gm.graph)
    inputs = [n for n in graph.nodes if n.op == "placeholder"]
    for i in read:
        value = args[i].item()
        for node in [u for u in inputs[i].users if u.op == "call_method" and u.target == "item"]:
            def put(n: fx.Node, node: fx.Node = node, value: Any = value) -> Any:
                return value if n is node else n

            for user in list(node.users):
                user.args = fx.node.map_arg(user.args, put)
                user.kwargs = fx.node.map_arg(user.kwargs, put)
            graph.erase_node(node)
    return fx.GraphModule(gm, graph)


def _specialise(gm: fx.GraphModule, args: Sequence[Any], dims: Sequence[tuple[str, ...] | None],
                options: BackendOptions, *, compile_parts: bool, name: str,
                scalars: frozenset[int] = frozenset()) -> fx.GraphModule:
    """The core-ATen graph of ``gm`` for these arguments, with each fspyre subgraph replaced by
    a module that runs it on the interpreter (or, with ``compile_parts=False``, by its ATen
    subgraph, lowered but run in eager)."""
    vals = _fake_args(args)
    try:
        with torch.no_grad(), preserve_hints(), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            aten_gm = decompose(_with_values(gm, args, scalars), vals)
        report, parts = _split(aten_gm, name, dims, tuple(_shape_of(a) for a in args))
    except Exception as e:  # noqa: BLE001  (a failure of fspyre's own must not fail the user's call)
        _reraise_hint(e)
        warnings.warn(FspyreWarning(f"torch.compile(backend='fspyre'): {name}: the whole graph runs in eager: "
                                    f"tracing it to core ATen failed: {_failure(e)}"), stacklevel=2)
        return gm
    failed: list[tuple[_Part, str]] = []
    for part in parts:
        if options.on_graph is not None:
            options.on_graph(part.graph)
        if compile_parts:
            eager_sub = aten_gm.get_submodule(part.module)
            try:
                aten_gm.add_submodule(part.module, _OnFspyre(part, options, eager_sub))
            except Exception as e:  # noqa: BLE001  (the subgraph's ATen ops stay in eager)
                _reraise_hint(e)
                failed.append((part, f"compile failed: {_failure(e)}"))
    if failed:
        report = replace(report, on_fspyre=tuple(n for p, n in zip(parts, report.on_fspyre)
                                                 if p not in {f for f, _ in failed}),
                         eager=report.eager + tuple(Fallback(op=op, reason=why) for p, why in failed for op in p.ops))
    if options.on_report is not None:
        options.on_report(report)
    if report.eager and compile_parts:
        warnings.warn(FspyreWarning(f"torch.compile(backend='fspyre'): {report.summary()}"), stacklevel=2)
    return aten_gm


def _reraise_hint(e: Exception) -> None:
    """A ``spyre_hint`` that cannot be honoured is the program's error: running the graph in
    eager would hide it."""
    if isinstance(e, HintError) or isinstance(e.__cause__, HintError):
        raise e


def _failure(e: Exception) -> str:
    """A failure as one line: fspyre's own message, or an unexpected exception's type and text."""
    return _first_line(e) if isinstance(e, FspyreError) else f"{type(e).__name__}: {_first_line(e)}"


def _shape_of(a: Any) -> tuple[int, ...] | int | None:
    if isinstance(a, torch.Tensor):
        return tuple(a.shape)
    return a if isinstance(a, int) else None


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class _Part:
    """One fspyre subgraph: the submodule it replaces, its graph and constant inputs, and
    the torch type of each of its results."""

    module: str
    graph: Any  # fspyre.ir.graph.Graph
    inputs: tuple[str, ...]
    constants: Mapping[str, np.ndarray]
    outputs: tuple[tuple[str, torch.Tensor], ...]  # (fspyre output name, torch value it stands for)
    positions: tuple[int, ...] = ()  # per input, the graph input it is (-1: an intermediate)
    ops: tuple[str, ...] = ()  # the ATen ops it computes, for the report when it falls back


def _split(gm: fx.GraphModule, name: str, dims: Sequence[tuple[str, ...] | None],
           shapes: tuple[tuple[int, ...] | int | None, ...]) -> tuple[PartitionReport, tuple[_Part, ...]]:
    """Fuse each maximal supported subgraph of ``gm`` into a submodule (in place: ``gm`` is
    the trace ``_specialise`` just made). Returns the report and the lowered subgraphs."""
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
    from torch.fx.passes.operator_support import create_op_support
    from torch.fx.passes.tools_common import stable_topological_sort
    from torch.fx.passes.utils.fuser_utils import erase_nodes, fuse_as_graphmodule, insert_subgm, topo_sort

    refused = {n: r for n in gm.graph.nodes if n.op == "call_function" and (r := _refusal(n)) is not None}
    support = create_op_support(lambda _, n: n.op == "call_function" and n not in refused)
    proposed = CapabilityBasedPartitioner(gm, support, allows_single_node_partition=True).propose_partitions()
    inputs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    eager: dict[fx.Node, str] = dict(refused)
    parts: list[_Part] = []
    on_fspyre: list[int] = []
    position = {n: i for i, n in enumerate(gm.graph.nodes)}
    for partition in sorted(proposed, key=lambda p: min(position[n] for n in p.nodes)):
        nodes = topo_sort(list(partition.nodes))
        if all(_computes_nothing(n) for n in nodes):
            continue
        module = f"fspyre_{len(parts)}"
        sub, outer_inputs, outer_outputs = fuse_as_graphmodule(gm, nodes, module, partition.nodes,
                                                               always_return_tuple=True)
        try:
            part = _lower_part(sub, f"{name}_{len(parts)}", module, outer_inputs, inputs, dims)
        except Exception as e:  # noqa: BLE001  (fspyre's refusal, or a failure of its own: eager either way)
            _reraise_hint(e)
            why = _first_line(e) if isinstance(e, FspyreError) else f"lowering failed: {_failure(e)}"
            eager.update((n, f"subgraph refused: {why}") for n in nodes if not _computes_nothing(n))
            continue
        part = replace(part, ops=tuple(_op_name(n) for n in nodes if not _computes_nothing(n)))
        insert_subgm(gm, sub, outer_inputs, outer_outputs, nodes[-1])
        erase_nodes(gm, nodes)
        parts.append(part)
        on_fspyre.append(sum(not _is_getitem(n) for n in nodes))
    report = PartitionReport(
        name=name, shapes=shapes, on_fspyre=tuple(on_fspyre),
        eager=tuple(Fallback(op=_op_name(n), reason=eager[n]) for n in gm.graph.nodes if n in eager),
    )
    # A fused call sits where its subgraph's last op was; eager users of its earlier ops move
    # after it. (The sort rebuilds the graph: its nodes are new objects.)
    stable_topological_sort(gm)
    gm.graph.lint()
    gm.recompile()
    return report, tuple(parts)


def _refusal(node: fx.Node) -> str | None:
    """Why fspyre cannot take ``node`` whatever surrounds it, or None."""
    if node.target not in RULES:
        return "no fspyre lowering"
    source = node.args[0] if _is_getitem(node) else None
    if isinstance(source, fx.Node) and source.op == "call_function" and _refusal(source):
        return "a result of an op in eager"
    for v in [node.meta.get("val")] + [a.meta.get("val") for a in node.all_input_nodes]:
        for t in v if isinstance(v, (tuple, list)) else (v,):
            if not isinstance(t, torch.Tensor):
                continue
            if t.dtype not in TORCH_DTYPES:
                return f"dtype {str(t.dtype).removeprefix('torch.')}"
            # an empty result of several (batch norm's saved statistics in eval mode) is one
            # fspyre does not compute; a getitem that reads it is refused for its own value
            if 0 in t.shape and not isinstance(v, (tuple, list)):
                return "a zero-size tensor"
    return None


def _lower_part(sub: fx.GraphModule, name: str, module: str, outer_inputs: Sequence[fx.Node],
                inputs: Sequence[fx.Node], dims: Sequence[tuple[str, ...] | None]) -> _Part:
    """Lower one subgraph; its inputs that are graph inputs keep their user dim names."""
    index = {n: i for i, n in enumerate(inputs)}
    sub_inputs = [n for n in sub.graph.nodes if n.op == "placeholder"]
    placeholders = tuple(
        Placeholder(node=p.name, name=f"in{j}_{p.name}",
                    dims=dims[index[o]] if o in index and index[o] < len(dims) else None)
        for j, (p, o) in enumerate(zip(sub_inputs, outer_inputs))
    )
    outs = sub.graph.output_node().args[0]
    assert isinstance(outs, tuple)  # fused with always_return_tuple
    output_names = tuple(f"out{i}" for i in range(len(outs)))
    graph, constants = lower_with_constants(
        FxProgram(name=name, graph=sub.graph, placeholders=placeholders, output_names=output_names))
    return _Part(module=module, graph=graph, inputs=tuple(p.name for p in placeholders), constants=constants,
                 outputs=tuple((n, o.meta["val"]) for n, o in zip(output_names, outs)),
                 positions=tuple(index.get(o, -1) for o in outer_inputs))


class _OnFspyre(torch.nn.Module):
    """A subgraph compiled by fspyre, run on the machine-model interpreter; a run that fails
    (the interpreter refuses an input, e.g. an index out of range) runs the subgraph's ATen
    ops in eager instead, with a warning."""

    def __init__(self, part: _Part, options: BackendOptions, eager: torch.nn.Module) -> None:
        import fspyre
        from fspyre.machine.spyre import spyre

        super().__init__()
        self.part = part
        self.eager = eager
        self.compiled = fspyre.compile(part.graph, machine=spyre(cores=int(options.cores)),
                                       tiling=options.tiling)

    def forward(self, *args: Any) -> tuple[torch.Tensor, ...]:
        import fspyre

        try:
            host = {n: to_numpy(a) for n, a in zip(self.part.inputs, args)} | dict(self.part.constants)
            got = fspyre.run(self.compiled, host)
            return tuple(_to_torch(got[n], like) for n, like in self.part.outputs)
        except Exception as e:  # noqa: BLE001  (eager gives the user's values; the warning says why)
            ops = ", ".join(dict.fromkeys(self.part.ops))
            warnings.warn(FspyreWarning(f"torch.compile(backend='fspyre'): {self.part.graph.name} ({ops}) ran in "
                                        f"eager: its run on fspyre failed: {_failure(e)}"), stacklevel=2)
            return tuple(self.eager(*args))


def _to_torch(values: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(values))
    return t.to(like.dtype).reshape(like.shape)


def _is_getitem(node: fx.Node) -> bool:
    return node.target is operator.getitem


def _computes_nothing(node: fx.Node) -> bool:
    """A view or a ``getitem``: free in eager, and no reason to leave it."""
    return _is_getitem(node) or bool(getattr(node.target, "is_view", False))


def _op_name(node: fx.Node) -> str:
    return str(node.target)


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
