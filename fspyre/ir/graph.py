"""The graph IR: named dims, buffers, and ops that carry their loop bodies as data.

Each op is Inductor's loop-body information written down as values: the iteration
ranges (named dims; the iteration variable of dim ``D`` is ``sympy.Symbol("D")``), one
``Load`` per tensor operand with the flat host index it reads, and the ``Store`` it writes.
Views (permute, expand, unsqueeze, contiguous reshape) are only index expressions, never
copies. Everything here is frozen and hashable.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache, reduce
from operator import mul
from typing import Union

import sympy

from fspyre.errors import GraphError, HintError
from fspyre.ir.dtypes import check_dtype
from fspyre.ir.frozen import FrozenMap, require_map, require_tuple
from fspyre.ir.symbolic import is_size_expr, is_size_symbol
from fspyre.machine.rules import row_major_strides

# ---------------------------------------------------------------------------------------
# The op vocabulary: name -> arity. Semantics live in fspyre/machine/numerics.py.
UNARY = (
    "neg", "abs", "exp", "log", "sqrt", "rsqrt", "reciprocal", "relu", "sigmoid",
    "tanh", "gelu", "silu", "copy", "cast", "logical_not", "sin", "cos", "log1p",
)
BINARY = ("add", "sub", "mul", "div", "maximum", "minimum", "pow", "fmod")
COMPARISONS = ("eq", "ne", "lt", "le", "gt", "ge")
TERNARY = ("where",)
POINTWISE_FNS: FrozenMap[str, int] = FrozenMap(
    [(f, 1) for f in UNARY] + [(f, 2) for f in BINARY + COMPARISONS] + [(f, 3) for f in TERNARY] + [("full", 1)]
)
# Fns whose result is a float whatever their operands: the builder gives each a float dtype
# and torch refuses to store one into a bool tensor, so no graph stores one as a bool (a bool
# is made by a comparison, logical_not or a cast); verify_program holds a program's
# ``bool_store`` to the same rule.
FLOAT_RESULT_FNS = frozenset({"exp", "log", "log1p", "sqrt", "rsqrt", "reciprocal", "sigmoid", "tanh", "gelu",
                              "silu", "sin", "cos", "div", "pow", "mean", "var"})
REDUCTION_FNS = ("sum", "amax", "amin", "mean", "prod", "var", "matmul", "gather")
REDUCTION_OPERANDS: FrozenMap[str, int] = FrozenMap([(f, {"matmul": 2, "gather": 3}.get(f, 1)) for f in REDUCTION_FNS])


def _prod(xs: tuple[int, ...]) -> int:
    return reduce(mul, xs, 1)


NAME_LIMIT = 256  # characters in a graph, tensor, op or dim name


def require_name(name: object, what: str) -> str:
    """A name fspyre accepts: an ASCII identifier (letters, digits and ``_``, not starting with
    a digit) of at most NAME_LIMIT characters. Names are written into MLIR (comments, and a
    symbolic dim's name as a value name), JSON, DOT and SVG; such a name is a bare MLIR
    identifier and holds no quote, newline, brace or comment marker (docs/semantics.md, "Names")."""
    if type(name) is not str or not name.isascii() or not name.isidentifier() or len(name) > NAME_LIMIT:
        shown = " ".join(repr(name).split())
        raise GraphError(f"{what} {shown[:60]}{'...' if len(shown) > 60 else ''}: a name must be an ASCII "
                         f"identifier (letters, digits, _; not starting with a digit) of at most {NAME_LIMIT} "
                         f"characters")
    return name


@dataclass(frozen=True, slots=True)
class Dim:
    """A named iteration/tensor dimension. Dims with equal names are the same axis. The size
    is a positive integer, the size symbol of a symbolic dim (``fspyre.ir.symbolic``), or an
    affine form ``a*|S| + b`` in one (a dim that follows a symbolic dim)."""

    name: str
    size: int | sympy.Expr

    def __post_init__(self) -> None:
        require_name(self.name, "dim name")
        if type(self.size) is int and self.size > 0 or is_size_expr(self.size):
            return
        if not isinstance(self.size, int) or isinstance(self.size, bool) or self.size <= 0:
            raise GraphError(f"dim {self.name!r}: size {self.size!r} must be a positive integer")

    @property
    def symbol(self) -> sympy.Symbol:
        return sym(self.name)

    def __str__(self) -> str:
        return f"{self.name}={self.size}"


@lru_cache(maxsize=None)
def sym(name: str) -> sympy.Symbol:
    """The iteration variable of a dim. Integer and nonnegative so floor/Mod simplify.
    Cached: sympy returns the same Symbol for the same name and assumptions anyway, but
    building it costs an assumptions lookup, and every dim asks for its symbol often."""
    return sympy.Symbol(name, integer=True, nonnegative=True)


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorType:
    dims: tuple[Dim, ...]
    dtype: str

    def __post_init__(self) -> None:
        require_tuple(self.dims, "tensor dims", GraphError, Dim)
        check_dtype(self.dtype, "tensor")
        names = [d.name for d in self.dims]
        if len(set(names)) != len(names):
            raise GraphError(f"tensor dims {names} repeat a name; each dim of a tensor needs its own name")

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(d.size for d in self.dims)

    @property
    def symbolic(self) -> bool:
        return not all(type(d.size) is int for d in self.dims)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.dims)

    @property
    def numel(self) -> int:
        return _prod(self.shape)

    def strides(self) -> tuple[int, ...]:
        """Contiguous row-major host strides (expressions in the sizes of symbolic dims)."""
        return row_major_strides(tuple(d.size for d in self.dims))

    def contiguous_index(self) -> sympy.Expr:
        """Flat host index of element (d0, d1, ...) in terms of the dims' variables."""
        return _contiguous_index(self.dims)

    def __str__(self) -> str:
        return f"{self.dtype}[{', '.join(map(str, self.dims))}]"


@lru_cache(maxsize=4096)
def _contiguous_index(dims: tuple[Dim, ...]) -> sympy.Expr:
    # cached: building the sympy sum is the cost, and keep_resident asks it of every top-level
    # writer (thousands on a wide fan-out) for a handful of distinct types
    strides = row_major_strides(tuple(d.size for d in dims))
    return sympy.Add(*(st * d.symbol for st, d in zip(strides, dims) if d.size != 1))


@dataclass(frozen=True, slots=True, kw_only=True)
class Buffer:
    """A named storage: graph input, intermediate, or one written for a graph output."""

    name: str
    type: TensorType


@dataclass(frozen=True, slots=True, kw_only=True)
class Load:
    buffer: str
    index: sympy.Expr


@dataclass(frozen=True, slots=True, kw_only=True)
class Scalar:
    value: float | int | bool


Operand = Union[Load, Scalar]


@dataclass(frozen=True, slots=True, kw_only=True)
class Store:
    buffer: str
    index: sympy.Expr


@dataclass(frozen=True, slots=True, kw_only=True)
class Pointwise:
    """``store[index] = fn(*operands)`` for every point of ``ranges``."""

    name: str
    fn: str
    operands: tuple[Operand, ...]
    ranges: tuple[Dim, ...]
    store: Store
    hints: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        _check_op_fields(self)
        if self.fn not in POINTWISE_FNS:
            raise GraphError(f"op {self.name}: unknown pointwise fn {self.fn!r}")
        if len(self.operands) != POINTWISE_FNS[self.fn]:
            raise GraphError(
                f"op {self.name}: {self.fn} takes {POINTWISE_FNS[self.fn]} operands, got {len(self.operands)}"
            )

    @property
    def reduction_ranges(self) -> tuple[Dim, ...]:
        return ()

    @property
    def loads(self) -> tuple[Load, ...]:
        return tuple(o for o in self.operands if isinstance(o, Load))


@dataclass(frozen=True, slots=True, kw_only=True)
class Reduction:
    """``store[index] = reduce_fn over reduction_ranges of operand values``.

    ``matmul`` reduces the product of its two operands with sum. ``var`` uses ``correction``
    (1 = unbiased, like torch). ``mean`` and ``var`` divide by the full reduction extent.
    ``gather`` takes (index, positions, values) and selects: the result is the one value whose
    position along the reduced dim equals the index there (embedding, index_select,
    torch.gather); an index no position equals, or more than one does, is an ExecutionError
    when the op runs (docs/semantics.md, "Gather").
    """

    name: str
    fn: str
    operands: tuple[Load, ...]
    ranges: tuple[Dim, ...]
    reduction_ranges: tuple[Dim, ...]
    store: Store
    correction: int = 0
    hints: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        _check_op_fields(self)
        require_tuple(self.reduction_ranges, f"op {self.name}: reduction_ranges", GraphError, Dim)
        if self.fn not in REDUCTION_FNS:
            raise GraphError(f"op {self.name}: unknown reduction fn {self.fn!r}")
        want = REDUCTION_OPERANDS[self.fn]
        if len(self.operands) != want:
            raise GraphError(f"op {self.name}: {self.fn} takes {want} operands, got {len(self.operands)}")
        if not self.reduction_ranges:
            raise GraphError(f"op {self.name}: a {self.fn} reduction needs at least one reduced dim")
        names = [d.name for d in self.ranges + self.reduction_ranges]
        if len(set(names)) != len(names):
            raise GraphError(f"op {self.name}: dims {names} repeat a name")

    @property
    def loads(self) -> tuple[Load, ...]:
        return self.operands


Op = Union[Pointwise, Reduction]


def _check_op_fields(op: Op) -> None:
    require_tuple(op.operands, f"op {op.name}: operands", GraphError, (Load, Scalar))
    require_tuple(op.ranges, f"op {op.name}: ranges", GraphError, Dim)
    require_tuple(op.hints, f"op {op.name}: hints", GraphError, int)
    if not isinstance(op.store, Store):
        raise GraphError(f"op {op.name}: store must be a Store, got a {type(op.store).__name__}")
    names = [d.name for d in op.ranges]
    if len(set(names)) != len(names):
        raise GraphError(f"op {op.name}: ranges {names} repeat a dim; an op iterates each dim once")


@dataclass(frozen=True, slots=True, kw_only=True)
class HintScope:
    """One ``with g.hint(...)`` scope. ``id`` grows with opening order, so outer scopes are smaller."""

    id: int
    # a count, or on a symbolic dim ``|S|/T``: tiles of T elements, a symbolic count of them
    slices: FrozenMap[str, int | sympy.Expr] = field(default_factory=FrozenMap)
    work_div: FrozenMap[str, int] = field(default_factory=FrozenMap)

    def __post_init__(self) -> None:
        require_map(self.slices, f"hint scope {self.id}: slices", GraphError)
        require_map(self.work_div, f"hint scope {self.id}: work_div", GraphError)


@dataclass(frozen=True, slots=True, kw_only=True)
class Output:
    name: str
    buffer: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Graph:
    name: str
    buffers: tuple[Buffer, ...]
    inputs: tuple[str, ...]
    ops: tuple[Op, ...]
    outputs: tuple[Output, ...]
    hints: tuple[HintScope, ...] = ()

    def __repr__(self) -> str:  # short: the whole graph prints with fspyre.pretty
        dims = {d.name: d.size for b in self.buffers for d in b.type.dims}
        return (f"Graph({self.name!r}: {len(self.inputs)} inputs, {len(self.ops)} ops, {len(self.outputs)} outputs; "
                f"dims {', '.join(f'{k}={v}' for k, v in dims.items())})")

    def __post_init__(self) -> None:
        what = f"graph {self.name}"
        require_tuple(self.buffers, f"{what}: buffers", GraphError, Buffer)
        require_tuple(self.inputs, f"{what}: inputs", GraphError, str)
        require_tuple(self.ops, f"{what}: ops", GraphError, (Pointwise, Reduction))
        require_tuple(self.outputs, f"{what}: outputs", GraphError, Output)
        require_tuple(self.hints, f"{what}: hints", GraphError, HintScope)

    def buffer_table(self) -> dict[str, Buffer]:
        return {b.name: b for b in self.buffers}

    def op_table(self) -> dict[str, Op]:
        return {op.name: op for op in self.ops}

    def hint_table(self) -> dict[int, HintScope]:
        return {h.id: h for h in self.hints}

    @property
    def symbolic(self) -> bool:
        """Some buffer has a symbolic dim (docs/tiling.md, "Symbolic sizes")."""
        return any(b.type.symbolic for b in self.buffers)


def iteration_dims(op: Op) -> tuple[Dim, ...]:
    return tuple(op.ranges) + tuple(op.reduction_ranges)


def _verify_names_and_sizes(graph: Graph) -> None:
    """Every name is a name (``require_name``); a dim name is one axis, of one size wherever it
    appears with a size other than 1."""
    sizes: dict[str, int | sympy.Symbol] = {}

    def same(d: Dim, where: str) -> None:
        if d.size == 1:  # a kept or broadcast axis (sum(keepdim=True), expand) keeps its name
            return
        have = sizes.setdefault(d.name, d.size)
        if have != d.size:
            raise GraphError(f"graph {graph.name}: dim {d.name} has size {have} in one place and {d.size} in "
                             f"{where}; a dim name is one axis: give axes of different sizes different names")

    for b in graph.buffers:
        require_name(b.name, f"graph {graph.name}: buffer name")
        for d in b.type.dims:
            same(d, f"buffer {b.name}")
    for op in graph.ops:
        require_name(op.name, f"graph {graph.name}: op name")
        for d in iteration_dims(op):
            same(d, f"op {op.name}")
    for out in graph.outputs:
        require_name(out.name, f"graph {graph.name}: output name")
    for scope in graph.hints:
        for dim in (*scope.slices, *scope.work_div):
            require_name(dim, f"graph {graph.name}: hint scope {scope.id} names dim")


def _require_linear(op: Op, buffer: str, index: sympy.Expr) -> None:
    """An index is a sum of terms, each a constant (or a symbolic size) times at most one
    variable, under floor and Mod (the views a graph expresses); a product of two variables
    addresses no tensor."""
    for node in sympy.preorder_traversal(index):
        if isinstance(node, sympy.Mul) and sum(
                1 for a in node.args if any(not is_size_symbol(s) for s in a.free_symbols)) > 1:
            raise GraphError(f"op {op.name}: index {index} of {buffer} multiplies two variables ({node}); an index "
                             f"is linear in the op's dims, under floor and Mod")


def verify_graph(graph: Graph) -> Graph:
    """Whole-graph invariants: SSA buffers (but for the regions of a concatenation, each written by
    one op: ``_verify_regions``), defined-before-use, index vars within ranges, each store
    addressing its buffer's dims (``store_fault``)."""
    if not isinstance(graph, Graph):
        raise GraphError(f"verify_graph: expected an fspyre Graph, got a {type(graph).__name__}")
    require_name(graph.name, "graph name")
    _verify_names_and_sizes(graph)
    buffers = graph.buffer_table()
    if len(buffers) != len(graph.buffers):
        raise GraphError(f"graph {graph.name}: duplicate buffer names")
    defined = set(graph.inputs)
    for name in graph.inputs:
        if name not in buffers:
            raise GraphError(f"graph {graph.name}: input {name} has no buffer")
    writers: dict[str, list[Op]] = {}
    for op in graph.ops:
        writers.setdefault(op.store.buffer, []).append(op)
    last = {}
    for name, ops in writers.items():
        if len(ops) > 1 and name in buffers and name not in graph.inputs:
            _verify_regions(graph, buffers[name], ops)
        last[name] = ops[-1].name
    written: set[str] = set()
    for op in graph.ops:
        varset = {d.symbol for d in iteration_dims(op)}
        for load in op.loads:
            if load.buffer not in defined:
                raise GraphError(f"op {op.name} reads {load.buffer} before it is written")
            extra = {s for s in load.index.free_symbols - varset if not is_size_symbol(s)}
            if extra:
                raise GraphError(
                    f"op {op.name}: load of {load.buffer} uses {sorted(map(str, extra))}, "
                    f"not iteration dims of the op"
                )
        if op.store.buffer not in buffers:
            raise GraphError(f"op {op.name} writes unknown buffer {op.store.buffer}")
        for ld in op.loads:
            _require_linear(op, ld.buffer, ld.index)
        _require_linear(op, op.store.buffer, op.store.index)
        fault = store_fault(op.store.index, buffers[op.store.buffer].type)
        if fault is not None:
            raise GraphError(f"graph {graph.name}: op {op.name} stores into {op.store.buffer} {fault}")
        extra = {s for s in op.store.index.free_symbols - varset if not is_size_symbol(s)}
        if extra:
            raise GraphError(f"op {op.name}: store to {op.store.buffer} uses {sorted(map(str, extra))}, not "
                             f"iteration dims of the op")
        if op.fn in FLOAT_RESULT_FNS and buffers[op.store.buffer].type.dtype == "bool":
            raise GraphError(f"op {op.name}: {op.fn} computes a float, but stores into bool buffer "
                             f"{op.store.buffer}; make the bool with a comparison or a cast to bool")
        if op.store.buffer in written or op.store.buffer in graph.inputs:
            raise GraphError(f"op {op.name} writes {op.store.buffer}, which is already written")
        if last[op.store.buffer] == op.name:  # a buffer of several regions is whole after its last writer
            written.add(op.store.buffer)
            defined.add(op.store.buffer)
    for out in graph.outputs:
        if out.buffer not in defined:
            raise GraphError(f"graph output {out.name} names unknown buffer {out.buffer}")
    scopes = graph.hint_table()
    if len(scopes) != len(graph.hints):
        raise HintError(f"graph {graph.name}: hint scope ids {[h.id for h in graph.hints]} repeat an id")
    for op in graph.ops:
        for h in op.hints:
            if h not in scopes:
                raise HintError(f"op {op.name} carries hint scope {h}, which graph {graph.name} does not declare "
                                f"(declared scopes: {sorted(scopes)})")
    return graph


def store_fault(index: sympy.Expr, btype: TensorType) -> str | None:
    """Why a store through ``index`` does not address a buffer of type ``btype`` as its dims say,
    or None. An index is the flat row-major host index, and the variable of a dim is named
    after it: the variable of each dim of size above 1 the buffer has moves by that dim's
    stride, and any other variable (a concatenated piece's own axis) by the stride of some such
    dim. A buffer whose dims were swapped, dropped or resized under the same store would lay
    its elements out otherwise, and an output would come out transposed or reshaped. Loads are
    not held to this (a view reads through a reshape or an expand); a dim of size 1 appears in
    no index; a buffer of symbolic size is checked at each witness size."""
    if btype.symbolic:
        return None
    named = {d.name: st for d, st in zip(btype.dims, btype.strides()) if d.size != 1}
    terms = sympy.Add.make_args(index)
    if any(not (t.is_Number or t.is_Symbol or (t.is_Mul and all(a.is_Number or a.is_Symbol for a in t.args)))
           for t in terms):
        terms = sympy.Add.make_args(sympy.expand(index))
    for term in terms:
        coef, var = term.as_coeff_Mul()
        if term.is_Number or not var.is_Symbol or is_size_symbol(var) or not coef.is_Integer:
            continue
        want = named.get(var.name)
        if int(coef) != want and (want is not None or int(coef) not in named.values()):
            need = (f"dim {var.name}'s stride {want}" if want is not None
                    else f"the stride of one of its dims {sorted(set(named.values()), reverse=True)}")
            return (f"{btype} through index {index}, which moves {var.name} by {coef} elements where the buffer's "
                    f"dims need {need}; the buffer's dims (their order, sizes) disagree with what its writer "
                    f"addresses")
    return None


def store_region(op: Op, dims: tuple[Dim, ...]) -> tuple[int, sympy.Expr] | None:
    """(axis, offset) when ``op`` writes a region of a buffer of ``dims``: its ranges are the
    buffer's dims but along one axis, where it covers its own range from ``offset`` on, and
    its store index is the buffer's row-major index there. None for any other store."""
    if len(op.ranges) != len(dims) or isinstance(op, Reduction):
        return None
    axes = [j for j, (r, d) in enumerate(zip(op.ranges, dims))
            if r.name != d.name or sympy.expand(r.size - d.size) != 0]
    if len(axes) != 1:
        return None
    (axis,) = axes
    strides = row_major_strides(tuple(d.size for d in dims))
    index = sympy.expand(op.store.index)
    base = sympy.expand(sum((st * r.symbol for st, r, d in zip(strides, op.ranges, dims) if d.size != 1),
                            sympy.Integer(0)))
    offset = sympy.expand(index.xreplace({r.symbol: 0 for r in op.ranges}))
    if sympy.expand(index - offset - base) != 0:
        return None
    along = sympy.simplify(offset / strides[axis]) if dims[axis].size != 1 else sympy.Integer(0)
    if sympy.expand(along * strides[axis] - offset) != 0 or any(s.name in {r.name for r in op.ranges}
                                                              for s in along.free_symbols):
        return None
    return axis, along


def _verify_regions(graph: Graph, buffer: Buffer, ops: list[Op]) -> None:
    """A buffer written by several ops (``GraphBuilder.concat``): each writes a region, all
    along one axis, the regions in op order one after another from 0 to the axis's size, so
    every element is written exactly once."""
    dims = buffer.type.dims
    regions = [store_region(op, dims) for op in ops]
    bad = next((op for op, r in zip(ops, regions) if r is None), None)
    if bad is not None:
        other = ops[0].name if bad is not ops[0] else ops[1].name
        raise GraphError(f"op {bad.name} writes {buffer.name}, which {other} also writes; several ops may write "
                         f"one buffer only each in a region of it along one "
                         f"axis (GraphBuilder.concat)")
    axis = regions[0][0]  # type: ignore[index]
    at: sympy.Expr = sympy.Integer(0)
    for op, (a, offset) in zip(ops, regions):  # type: ignore[misc]
        if a != axis or sympy.expand(offset - at) != 0:
            raise GraphError(f"op {op.name} writes {buffer.name} along axis {a} from {offset}, where the regions "
                             f"of its writers {[o.name for o in ops]} along axis {axis} need {at}; each element "
                             f"is written exactly once, in order")
        at = sympy.expand(at + op.ranges[axis].size)
    if sympy.expand(at - dims[axis].size) != 0:
        raise GraphError(f"buffer {buffer.name}: its writers {[o.name for o in ops]} cover {at} of the "
                         f"{dims[axis].size} elements along axis {axis}; each element is written exactly once")
