"""GraphBuilder: the programmatic way to write an fspyre graph.

Values are ``Tensor`` handles: a buffer plus the index expression a consumer uses to read
it. A view (``permute``, ``unsqueeze``, ``expand``, contiguous ``reshape``) is a new handle on
the same buffer with a different index, so it costs nothing until an op reads it.
Broadcasting is by dim name: operands line up on equal names; a size-1 dim stretches.
"""

from __future__ import annotations

import contextlib
import itertools
import numbers
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import sympy

from fspyre.errors import GraphError, HintError
from fspyre.ir.dtypes import check_dtype, is_float, promote, promote_scalar
from fspyre.ir.frozen import FrozenMap
from fspyre.ir.graph import (
    COMPARISONS,
    Buffer,
    Dim,
    Graph,
    HintScope,
    Load,
    Operand,
    Output,
    Pointwise,
    Reduction,
    Scalar,
    Store,
    TensorType,
    require_name,
    sym,
    verify_graph,
)
from fspyre.ir.symbolic import is_size_symbol, size_symbol

Number = float | int | bool

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
_builder_ids = itertools.count(1)


@dataclass(frozen=True, slots=True, kw_only=True)
class Tensor:
    """A value in a graph under construction: ``buffer`` read at ``index`` over ``type.dims``.
    ``builder`` identifies the GraphBuilder that made it: buffer names are only unique within
    one builder, so a handle used in another would silently read a different buffer."""

    buffer: str
    type: TensorType
    index: sympy.Expr
    builder: int = 0

    @property
    def dims(self) -> tuple[Dim, ...]:
        return self.type.dims

    @property
    def dtype(self) -> str:
        return self.type.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape


def _load(t: Tensor, out_dims: Sequence[Dim]) -> Load:
    """Read ``t`` inside an op iterating ``out_dims``: broadcast (size-1) dims drop out."""
    sizes = {d.name: d.size for d in out_dims}
    subs = {d.symbol: 0 for d in t.dims if d.size == 1 and sizes.get(d.name, 1) != 1}
    return Load(buffer=t.buffer, index=sympy.expand(t.index.subs(subs)) if subs else t.index)


def broadcast_dims(*types: TensorType, where: str) -> tuple[Dim, ...]:
    """Line dims up by name. The operand with most dims gives the order; others' extra dims follow."""
    lead = max(types, key=lambda t: len(t.dims))
    order = list(lead.names)
    for t in types:
        order += [n for n in t.names if n not in order]
    sizes: dict[str, int] = {}
    for t in types:
        for d in t.dims:
            have = sizes.get(d.name)
            if have is None or have == 1:
                sizes[d.name] = d.size
            elif d.size not in (1, have):
                raise GraphError(
                    f"{where}: dim {d.name} has size {have} in one operand and {d.size} in another; "
                    f"make them equal, or size 1 to broadcast"
                )
    return tuple(Dim(n, sizes[n]) for n in order)


def as_int(value: object, where: str) -> int:
    """``value`` as a Python int: numpy integers are accepted (sizes often come from shapes),
    bools and floats are not (a float size is usually a division that did not come out even)."""
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)):
        return int(value)
    raise GraphError(f"{where}: {value!r} ({type(value).__name__}) must be an integer")


def _scalar(value: object, where: str) -> Number:
    """A Python number for a scalar operand; numpy scalars are converted."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, np.ndarray):
        raise GraphError(
            f"{where}: got a numpy array {list(value.shape)}; graph values are Tensors: declare it with "
            f"g.input(name, dims, dtype) and pass the array to run/check, or use a Python number"
        )
    raise GraphError(f"{where}: got {type(value).__name__} {value!r:.60}; pass a Tensor of this builder or a number")


def _check_int32_scalar(x: object, where: str) -> None:
    """An op computing in int32 (docs/semantics.md) cannot hold a scalar outside int32: numpy
    would raise on the conversion, and a wrapped constant would be a silent wrong answer."""
    if isinstance(x, int) and not isinstance(x, bool) and not INT32_MIN <= x <= INT32_MAX:
        raise GraphError(
            f"{where}: the scalar {x} does not fit int32 ({INT32_MIN}..{INT32_MAX}), the type this op computes in; "
            f"use a smaller value, or a float scalar / cast to float32 first"
        )


class GraphBuilder:
    def __init__(self, name: str) -> None:
        require_name(name, "graph name")
        self.name = name
        self._id = next(_builder_ids)
        self._dims: dict[str, Dim] = {}
        self._buffers: dict[str, Buffer] = {}
        self._inputs: list[str] = []
        self._ops: list[Pointwise | Reduction] = []
        self._outputs: list[Output] = []
        self._hints: list[HintScope] = []
        self._active: list[int] = []
        self._counter = 0

    # -- dims, inputs, hints ---------------------------------------------------------------
    def dim(self, name: str, size: int | None = None) -> Dim:
        """Dim ``name`` of ``size`` elements; without a size, a symbolic dim whose size
        ``|name|`` is bound when the program runs (docs/tiling.md, "Symbolic sizes")."""
        if size is None:
            size = size_symbol(name)
        elif isinstance(size, numbers.Integral) and not isinstance(size, (bool, np.bool_)):
            size = int(size)
        d = Dim(name, size)
        have = self._dims.get(name)
        if have is not None and have != d:
            raise GraphError(f"dim {name} declared twice, with sizes {have.size} and {size}")
        self._dims[name] = d
        return d

    def input(self, name: str, dims: Sequence[Dim | str], dtype: str) -> Tensor:
        require_name(name, "input name")
        check_dtype(dtype, f"input {name}")
        if name in self._buffers:
            raise GraphError(f"input {name}: the name is already used")
        t = TensorType(dims=self._resolve_dims(dims, f"input {name}"), dtype=dtype)
        self._buffers[name] = Buffer(name=name, type=t)
        self._inputs.append(name)
        return Tensor(buffer=name, type=t, index=t.contiguous_index(), builder=self._id)

    def input_handle(self, name: str) -> Tensor:
        """The handle of input ``name`` declared before."""
        if name not in self._inputs:
            raise GraphError(f"input_handle: {name!r} is not an input (inputs are {self._inputs})")
        t = self._buffers[name].type
        return Tensor(buffer=name, type=t, index=t.contiguous_index(), builder=self._id)

    def _resolve_dims(self, dims: Sequence[Dim | str], where: str) -> tuple[Dim, ...]:
        if isinstance(dims, (str, Dim)) or not isinstance(dims, Sequence):
            raise GraphError(f"{where}: dims {dims!r} must be a list of dim names or Dims, e.g. ['A', 'B']")
        out = []
        for d in dims:
            if not isinstance(d, (str, Dim)):
                raise GraphError(
                    f"{where}: dim {d!r} must be a dim name or a Dim; declare sizes with g.dim(name, size)"
                )
            if isinstance(d, str):
                if d not in self._dims:
                    raise GraphError(f"{where}: dim {d!r} was never declared; call g.dim({d!r}, size) first")
                d = self._dims[d]
            if d.size != 1:  # a size-1 dim may share a name with a full one: it broadcasts
                self.dim(d.name, d.size)
            out.append(d)
        return tuple(out)

    @contextlib.contextmanager
    def hint(
        self, *, slices: Mapping[str, int] | None = None, work_div: Mapping[str, int] | None = None
    ) -> Iterator[HintScope]:
        """Ops built inside carry this scope: ``slices`` tiles dims into counted loops,
        ``work_div`` fixes how many cores split a dim."""
        given = {}
        for kind, m in (("slices", slices), ("work_div", work_div)):
            given[kind] = self._hint_counts(kind, {} if m is None else m)
        scope = HintScope(
            id=len(self._hints), slices=FrozenMap(given["slices"]), work_div=FrozenMap(given["work_div"])
        )
        self._hints.append(scope)
        self._active.append(scope.id)
        try:
            yield scope
        finally:
            self._active.pop()

    def _hint_counts(self, kind: str, m: object) -> dict[str, int]:
        if not isinstance(m, Mapping):
            raise HintError(f"hint {kind}={m!r}: give a dict {{dim name: count}}, e.g. {kind}={{'A': 2}}")
        out = {}
        for dim_name, count in m.items():
            if isinstance(dim_name, Dim):
                dim_name = dim_name.name
            if not isinstance(dim_name, str) or dim_name not in self._dims:
                raise HintError(
                    f"hint {kind}={{{dim_name!r}: {count!r}}}: unknown dim {dim_name!r}; "
                    f"declared dims are {sorted(self._dims)}"
                )
            if kind == "slices" and isinstance(count, sympy.Basic) and not count.is_Integer:
                out[dim_name] = self._symbolic_count(dim_name, count)
                continue
            integral = isinstance(count, numbers.Integral) and not isinstance(count, (bool, np.bool_))
            if not integral or count < 1:
                raise HintError(f"hint {kind}={{{dim_name!r}: {count!r}}}: the count must be an integer >= 1")
            out[dim_name] = int(count)
        return out

    def _symbolic_count(self, dim_name: str, count: sympy.Basic) -> sympy.Expr:
        """``|S|/T`` (or ``|S|//T``) for symbolic dim S: a fixed tile of T elements, a symbolic
        count of tiles; the only expression a slices hint takes."""
        d = self._dims[dim_name]
        what = f"hint slices={{{dim_name!r}: {count}}}"
        if not is_size_symbol(d.size):
            raise HintError(f"{what}: dim {dim_name} has the fixed size {d.size}; give an integer count")
        arg = count.args[0] if isinstance(count, sympy.floor) else count
        tile = sympy.simplify(d.size / arg)
        if not (tile.is_Integer and tile >= 1):
            raise HintError(f"{what}: a symbolic count must be |{dim_name}|/T for an integer tile T >= 1 "
                            f"(e.g. {{{dim_name!r}: {dim_name}.size // 64}}), or give an integer count")
        return d.size / tile

    @contextlib.contextmanager
    def reenter(self, scope: HintScope) -> Iterator[HintScope]:
        """Open an existing scope again (front ends replaying captured hint stacks), so ops
        built now join the ops built in it before."""
        if scope.id >= len(self._hints) or self._hints[scope.id] != scope:
            raise HintError(f"hint scope {scope.id} was not opened by this builder")
        self._active.append(scope.id)
        try:
            yield scope
        finally:
            self._active.pop()

    # -- op construction ---------------------------------------------------------------------
    def _fresh(self, prefix: str = "buf") -> str:
        while True:
            name = f"{prefix}{self._counter}"
            self._counter += 1
            if name not in self._buffers:
                return name

    def _emit(self, make, dims: tuple[Dim, ...], dtype: str) -> Tensor:
        name = self._fresh()
        t = TensorType(dims=dims, dtype=dtype)
        self._buffers[name] = Buffer(name=name, type=t)
        store = Store(buffer=name, index=t.contiguous_index())
        self._ops.append(make(name, store))
        return Tensor(buffer=name, type=t, index=t.contiguous_index(), builder=self._id)

    def _own(self, x: object, where: str) -> Tensor:
        """``x`` if it is a Tensor this builder made, else a GraphError saying what it is."""
        if not isinstance(x, Tensor):
            _scalar(x, where)  # names arrays and other objects
            raise GraphError(f"{where}: needs a Tensor, got the number {x!r}")
        if x.builder != self._id or x.buffer not in self._buffers:
            raise GraphError(
                f"{where}: tensor {x.buffer} {x.type} was made by another GraphBuilder; "
                f"a graph can only use tensors of its own builder (declare it here with g.input)"
            )
        return x

    def _value(self, x: object, where: str) -> Tensor | Number:
        return self._own(x, where) if isinstance(x, Tensor) else _scalar(x, where)

    def _view(self, x: Tensor, dims: Sequence[Dim], index: sympy.Expr) -> Tensor:
        return replace(x, type=TensorType(dims=tuple(dims), dtype=x.dtype), index=index)

    def _operand(self, x: Tensor | Number, dims: Sequence[Dim]) -> Operand:
        return Scalar(value=x) if isinstance(x, (int, float, bool)) else _load(x, dims)

    def pointwise(self, fn: str, *xs: Tensor | Number, dtype: str | None = None) -> Tensor:
        xs = tuple(self._value(x, fn) for x in xs)
        if dtype is not None:
            check_dtype(dtype, fn)
        tensors = [x for x in xs if isinstance(x, Tensor)]
        if not tensors:
            raise GraphError(f"{fn}: needs at least one tensor operand")
        dims = broadcast_dims(*(t.type for t in tensors), where=fn)
        if dtype is None:
            dtype = tensors[0].dtype
            for t in tensors[1:]:
                dtype = promote(dtype, t.dtype)
            for x in xs:
                if not isinstance(x, Tensor):
                    dtype = promote_scalar(dtype, x)
        if not is_float(dtype) and not any(is_float(t.dtype) for t in tensors):
            for x in xs:
                _check_int32_scalar(x, fn)
        operands = tuple(self._operand(x, dims) for x in xs)
        hints = tuple(self._active)
        return self._emit(
            lambda name, store: Pointwise(name=name, fn=fn, operands=operands, ranges=dims, store=store, hints=hints),
            dims,
            dtype,
        )

    def _float_result(self, fn: str, x: Tensor) -> Tensor:
        x = self._own(x, fn)
        return self.pointwise(fn, x, dtype=x.dtype if is_float(x.dtype) else "float32")

    # unary
    def neg(self, x: Tensor) -> Tensor: return self.pointwise("neg", x)
    def abs(self, x: Tensor) -> Tensor: return self.pointwise("abs", x)
    def relu(self, x: Tensor) -> Tensor: return self.pointwise("relu", x)
    def exp(self, x: Tensor) -> Tensor: return self._float_result("exp", x)
    def log(self, x: Tensor) -> Tensor: return self._float_result("log", x)
    def log1p(self, x: Tensor) -> Tensor: return self._float_result("log1p", x)
    def sqrt(self, x: Tensor) -> Tensor: return self._float_result("sqrt", x)
    def rsqrt(self, x: Tensor) -> Tensor: return self._float_result("rsqrt", x)
    def reciprocal(self, x: Tensor) -> Tensor: return self._float_result("reciprocal", x)
    def sigmoid(self, x: Tensor) -> Tensor: return self._float_result("sigmoid", x)
    def tanh(self, x: Tensor) -> Tensor: return self._float_result("tanh", x)
    def gelu(self, x: Tensor) -> Tensor: return self._float_result("gelu", x)
    def silu(self, x: Tensor) -> Tensor: return self._float_result("silu", x)
    def sin(self, x: Tensor) -> Tensor: return self._float_result("sin", x)
    def cos(self, x: Tensor) -> Tensor: return self._float_result("cos", x)
    def logical_not(self, x: Tensor) -> Tensor: return self.pointwise("logical_not", x, dtype="bool")
    def copy(self, x: Tensor) -> Tensor: return self.pointwise("copy", x)

    def cast(self, x: Tensor, dtype: str) -> Tensor:
        check_dtype(dtype, "cast")
        x = self._own(x, "cast")
        return self.pointwise("cast", x, dtype=dtype)

    # binary
    def add(self, a: Tensor | Number, b: Tensor | Number) -> Tensor: return self.pointwise("add", a, b)
    def sub(self, a: Tensor | Number, b: Tensor | Number) -> Tensor: return self.pointwise("sub", a, b)
    def mul(self, a: Tensor | Number, b: Tensor | Number) -> Tensor: return self.pointwise("mul", a, b)
    def maximum(self, a: Tensor | Number, b: Tensor | Number) -> Tensor: return self.pointwise("maximum", a, b)
    def minimum(self, a: Tensor | Number, b: Tensor | Number) -> Tensor: return self.pointwise("minimum", a, b)
    def fmod(self, a: Tensor | Number, b: Tensor | Number) -> Tensor: return self.pointwise("fmod", a, b)

    def div(self, a: Tensor | Number, b: Tensor | Number) -> Tensor:
        out = self._binary_dtype(a, b)
        return self.pointwise("div", a, b, dtype=out if is_float(out) else "float32")

    def pow(self, a: Tensor | Number, b: Tensor | Number) -> Tensor:
        out = self._binary_dtype(a, b)
        return self.pointwise("pow", a, b, dtype=out if is_float(out) else "float32")

    def _binary_dtype(self, a: Tensor | Number, b: Tensor | Number) -> str:
        a, b = self._value(a, "binary op"), self._value(b, "binary op")
        ts = [x for x in (a, b) if isinstance(x, Tensor)]
        if not ts:
            raise GraphError("binary op needs at least one tensor operand")
        dtype = ts[0].dtype if len(ts) == 1 else promote(ts[0].dtype, ts[1].dtype)
        for x in (a, b):
            if not isinstance(x, Tensor):
                dtype = promote_scalar(dtype, x)
        return dtype

    def compare(self, fn: str, a: Tensor | Number, b: Tensor | Number) -> Tensor:
        if fn not in COMPARISONS:
            raise GraphError(f"unknown comparison {fn!r}; use one of {COMPARISONS}")
        return self.pointwise(fn, a, b, dtype="bool")

    def eq(self, a, b): return self.compare("eq", a, b)  # noqa: E704
    def ne(self, a, b): return self.compare("ne", a, b)  # noqa: E704
    def lt(self, a, b): return self.compare("lt", a, b)  # noqa: E704
    def le(self, a, b): return self.compare("le", a, b)  # noqa: E704
    def gt(self, a, b): return self.compare("gt", a, b)  # noqa: E704
    def ge(self, a, b): return self.compare("ge", a, b)  # noqa: E704

    def where(self, cond: Tensor, a: Tensor | Number, b: Tensor | Number) -> Tensor:
        dtype = self._binary_dtype(a, b)
        return self.pointwise("where", cond, a, b, dtype=dtype)

    def constant(self, value: Number, dtype: str, dims: Sequence[Dim | str] = ()) -> Tensor:
        """A tensor filled with ``value`` (a 0-d scalar tensor when ``dims`` is empty)."""
        check_dtype(dtype, "constant")
        value = _scalar(value, "constant")
        if not is_float(dtype) and isinstance(value, float):
            if not np.isfinite(value):
                raise GraphError(f"constant: {value} cannot be stored as {dtype}; use a float dtype")
            value = int(value) if dtype == "int32" else bool(value)
        if dtype == "int32":
            _check_int32_scalar(value, "constant")
        ds = self._resolve_dims(dims, "constant")
        hints = tuple(self._active)
        return self._emit(
            lambda name, store: Pointwise(
                name=name, fn="full", operands=(Scalar(value=value),), ranges=ds, store=store, hints=hints
            ),
            ds,
            dtype,
        )

    # reductions
    def reduce(
        self, fn: str, x: Tensor, dims: Sequence[Dim | str], *, keepdim: bool = False, correction: int = 0
    ) -> Tensor:
        x = self._own(x, fn)
        if isinstance(dims, (str, Dim)):
            dims = (dims,)
        if not isinstance(dims, Sequence) or not all(isinstance(d, (str, Dim)) for d in dims):
            raise GraphError(f"{fn}: dims {dims!r} must be a dim name or a list of them (tensor dims are "
                             f"{list(x.type.names)})")
        names = [d if isinstance(d, str) else d.name for d in dims]
        if not names:
            raise GraphError(f"{fn}: name at least one dim to reduce over (tensor dims are {list(x.type.names)})")
        for n in names:
            if n not in x.type.names:
                raise GraphError(f"{fn}: dim {n!r} is not a dim of the operand {list(x.type.names)}")
        reduced = tuple(d for d in x.dims if d.name in names)
        kept = tuple(d for d in x.dims if d.name not in names)
        out_dims = tuple(Dim(d.name, 1) if d.name in names else d for d in x.dims) if keepdim else kept
        if fn in ("mean", "var"):
            dtype = x.dtype if is_float(x.dtype) else "float32"
        elif fn in ("amax", "amin"):
            dtype = x.dtype
        else:
            dtype = "int32" if x.dtype == "bool" else x.dtype
        operand = _load(x, x.dims)
        hints = tuple(self._active)
        return self._emit(
            lambda name, store: Reduction(
                name=name, fn=fn, operands=(operand,), ranges=kept, reduction_ranges=reduced,
                store=Store(buffer=name, index=store.index), correction=correction, hints=hints,
            ),
            out_dims,
            dtype,
        )

    def sum(self, x: Tensor, dims, keepdim=False) -> Tensor: return self.reduce("sum", x, dims, keepdim=keepdim)
    def amax(self, x: Tensor, dims, keepdim=False) -> Tensor: return self.reduce("amax", x, dims, keepdim=keepdim)
    def amin(self, x: Tensor, dims, keepdim=False) -> Tensor: return self.reduce("amin", x, dims, keepdim=keepdim)
    def mean(self, x: Tensor, dims, keepdim=False) -> Tensor: return self.reduce("mean", x, dims, keepdim=keepdim)
    def prod(self, x: Tensor, dims, keepdim=False) -> Tensor: return self.reduce("prod", x, dims, keepdim=keepdim)

    def var(self, x: Tensor, dims, keepdim: bool = False, correction: int = 1) -> Tensor:
        return self.reduce("var", x, dims, keepdim=keepdim, correction=correction)

    def matmul(self, a: Tensor, b: Tensor, contract: Dim | str | None = None, *, dtype: str | None = None) -> Tensor:
        """Contract ``a`` and ``b`` over one shared dim (default: ``a``'s last dim).
        Other shared dims are batch dims; output dims are batch, then a's, then b's.
        ``dtype`` stores the result in another type (float32 keeps the accumulator's
        precision for a following bias add, as torch's addmm rounds once)."""
        a, b = self._own(a, "matmul"), self._own(b, "matmul")
        if dtype is not None:
            check_dtype(dtype, "matmul")
        if contract is not None and not isinstance(contract, (str, Dim)):
            raise GraphError(f"matmul: contract={contract!r} must be a dim name or a Dim")
        k = contract.name if isinstance(contract, Dim) else contract or a.type.names[-1]
        if k not in a.type.names or k not in b.type.names:
            raise GraphError(
                f"matmul: contraction dim {k!r} must be a dim of both operands "
                f"(a has {list(a.type.names)}, b has {list(b.type.names)})"
            )
        ka = next(d for d in a.dims if d.name == k)
        kb = next(d for d in b.dims if d.name == k)
        if ka.size != kb.size:
            raise GraphError(f"matmul: contraction dim {k} has size {ka.size} in a and {kb.size} in b")
        batch = [d for d in a.dims if d.name != k and d.name in b.type.names]
        out = batch + [d for d in a.dims if d.name != k and d.name not in b.type.names]
        out += [d for d in b.dims if d.name != k and d.name not in a.type.names]
        for d in batch:
            other = next(e for e in b.dims if e.name == d.name)
            if other.size != d.size:
                raise GraphError(f"matmul: batch dim {d.name} has size {d.size} in a and {other.size} in b")
        if not out:
            raise GraphError("matmul: the result has no dims; use sum(mul(a, b)) for a dot product")
        dtype = check_dtype(dtype, "matmul") if dtype is not None else promote(a.dtype, b.dtype)
        iter_dims = tuple(out) + (ka,)
        operands = (_load(a, iter_dims), _load(b, iter_dims))
        hints = tuple(self._active)
        return self._emit(
            lambda name, store: Reduction(
                name=name, fn="matmul", operands=operands, ranges=tuple(out), reduction_ranges=(ka,),
                store=store, hints=hints,
            ),
            tuple(out),
            dtype,
        )

    def concat(self, xs: Sequence[Tensor], axis: int, out: Sequence[Dim | str]) -> Tensor:
        """``xs`` concatenated along dim ``axis`` into a tensor of dims ``out``: one ``copy``
        per piece, each writing its own region of the result (the piece's dims, its axis at
        the offset of the pieces before it). The pieces' other dims are the result's; the
        axis of each is its own dim, whose size may be symbolic (``|L|`` rows of a KV cache
        and one new row: two copies whatever ``|L|`` is). A buffer written by several ops
        is read only after the last of them (``verify_graph``)."""
        xs = [self._own(x, "concat") for x in xs]
        dims = self._resolve_dims(out, "concat")
        if not xs or not 0 <= axis < len(dims):
            raise GraphError(f"concat: {len(xs)} pieces along axis {axis} of {len(dims)} dims; give at least one "
                             f"piece and an axis of the result")
        dtype = xs[0].dtype
        for x in xs:
            same = len(x.dims) == len(dims) and all(  # a size-1 dim lines up whatever its name
                (e.name == d.name or d.size == 1) and e.size == d.size
                for j, (e, d) in enumerate(zip(x.dims, dims)) if j != axis)
            if not same or x.dtype != dtype:
                raise GraphError(f"concat: piece {x.type} does not match the result {[str(d) for d in dims]} of dtype "
                                 f"{dtype} but along axis {axis}; cast or reshape the piece first")
        total = sympy.expand(sum((x.dims[axis].size for x in xs), sympy.Integer(0)))
        if sympy.expand(total - dims[axis].size) != 0:
            raise GraphError(f"concat: pieces of sizes {[x.dims[axis].size for x in xs]} along axis {axis} do not "
                             f"add up to the result's {dims[axis]}")
        name = self._fresh()
        t = TensorType(dims=dims, dtype=dtype)
        self._buffers[name] = Buffer(name=name, type=t)
        strides = t.strides()
        hints = tuple(self._active)
        offset: sympy.Expr = sympy.Integer(0)
        for x in xs:
            ranges = tuple(x.dims[axis] if j == axis else d for j, d in enumerate(dims))
            x = self._view(x, ranges, sympy.expand(x.index.xreplace(
                {e.symbol: 0 for j, e in enumerate(x.dims) if j != axis and e.size == 1})))
            index = sympy.expand(sum((st * (r.symbol + (offset if j == axis else 0))
                                      for j, (st, r, d) in enumerate(zip(strides, ranges, dims)) if d.size != 1),
                                     sympy.Integer(0)))
            self._ops.append(Pointwise(name=self._fresh(f"{name}_part"), fn="copy", operands=(_load(x, ranges),),
                                       ranges=ranges,
                                       store=Store(buffer=name, index=index), hints=hints))
            offset = sympy.expand(offset + x.dims[axis].size)
        return Tensor(buffer=name, type=t, index=t.contiguous_index(), builder=self._id)

    def gather(self, values: Tensor, over: Dim | str, index: Tensor, positions: Tensor) -> Tensor:
        """``values`` with its dim ``over`` replaced by ``index``'s dims: each point of the result
        takes the element of ``values`` at the position along ``over`` that equals ``index``
        there, ``positions`` (int32 over ``over`` alone; the front end passes an iota) giving
        each position's number. Dims ``index`` shares with ``values`` by name are batch dims
        (torch.gather); the result has ``index``'s dims, then ``values``' other dims."""
        values, index, positions = (self._own(x, "gather") for x in (values, index, positions))
        k = over.name if isinstance(over, Dim) else over
        if not isinstance(k, str) or k not in values.type.names:
            raise GraphError(f"gather: over={over!r} must name a dim of values {list(values.type.names)}")
        kd = next(d for d in values.dims if d.name == k)
        if positions.type.names != (k,) or positions.dtype != "int32":
            raise GraphError(f"gather: positions must be int32 over [{k}] alone, got {positions.type}")
        if index.dtype != "int32" or k in index.type.names:
            raise GraphError(f"gather: index must be an int32 tensor without dim {k!r}, got {index.type}")
        for d in index.dims:
            other = next((e for e in values.dims if e.name == d.name), None)
            if other is not None and other.size != d.size:
                raise GraphError(f"gather: batch dim {d.name} has size {d.size} in index and {other.size} in values")
        out = tuple(index.dims) + tuple(d for d in values.dims if d.name != k and d.name not in index.type.names)
        iter_dims = out + (kd,)
        operands = (_load(index, iter_dims), _load(positions, iter_dims), _load(values, iter_dims))
        hints = tuple(self._active)
        return self._emit(
            lambda name, store: Reduction(
                name=name, fn="gather", operands=operands, ranges=out, reduction_ranges=(kd,), store=store,
                hints=hints,
            ),
            out,
            values.dtype,
        )

    # views: a new handle, no op
    def permute(self, x: Tensor, order: Sequence[Dim | str | int]) -> Tensor:
        """``order`` lists every dim of ``x`` once: by name, Dim, or position (negative from the end)."""
        x = self._own(x, "permute")
        have = list(x.type.names)
        if isinstance(order, (str, Dim)) or not isinstance(order, Sequence):
            raise GraphError(f"permute: order {order!r} must be a list of dim names or positions, e.g. {have[::-1]}")
        names = []
        for o in order:
            if isinstance(o, (str, Dim)):
                names.append(o if isinstance(o, str) else o.name)
                continue
            k = as_int(o, "permute: an axis")
            if not -len(have) <= k < len(have):
                raise GraphError(f"permute: axis {k} is out of range for a tensor with {len(have)} dims {have}")
            names.append(have[k])
        if sorted(names) != sorted(have):
            raise GraphError(
                f"permute: {names} is not a reordering of {have}; name each dim exactly once "
                f"({len(names)} given, {len(have)} needed)"
            )
        by = {d.name: d for d in x.dims}
        return self._view(x, [by[n] for n in names], x.index)

    def rename(self, x: Tensor, names: Mapping[str, str]) -> Tensor:
        """The same elements under new dim names (a view): ``x @ x.T`` needs its two dims apart."""
        x = self._own(x, "rename")
        if not isinstance(names, Mapping):
            raise GraphError(f"rename: {names!r} must be a dict {{old name: new name}}")
        unknown = set(names) - set(x.type.names)
        if unknown:
            raise GraphError(f"rename: {sorted(unknown)} are not dims of {list(x.type.names)}")
        dims = tuple(Dim(names.get(d.name, d.name), d.size) for d in x.dims)
        for d in dims:
            if d.size != 1:
                self.dim(d.name, d.size)
        subs = {sym(old): sym(new) for old, new in names.items()}
        return self._view(x, dims, x.index.xreplace(subs))

    def squeeze(self, x: Tensor, name: str) -> Tensor:
        """Drop a size-1 dim (a view)."""
        x = self._own(x, "squeeze")
        d = next((d for d in x.dims if d.name == name), None)
        if d is None or d.size != 1:
            raise GraphError(f"squeeze: {name!r} is not a size-1 dim of {x.type}")
        dims = tuple(e for e in x.dims if e.name != name)
        return self._view(x, dims, x.index.subs(d.symbol, 0))

    def unsqueeze(self, x: Tensor, position: int, name: str) -> Tensor:
        x = self._own(x, "unsqueeze")
        dims = list(x.dims)
        position = as_int(position, "unsqueeze: position")
        if not -len(dims) - 1 <= position <= len(dims):
            raise GraphError(
                f"unsqueeze: position {position} is out of range for a tensor with {len(dims)} dims "
                f"(use {-len(dims) - 1}..{len(dims)})"
            )
        dims.insert(position if position >= 0 else len(dims) + 1 + position, Dim(name, 1))
        return self._view(x, dims, x.index)

    def expand(self, x: Tensor, dims: Sequence[Dim | str]) -> Tensor:
        """Stretch size-1 dims (by name) and add new leading dims; a view, nothing is copied."""
        x = self._own(x, "expand")
        target = self._resolve_dims(dims, "expand")
        have = {d.name: d for d in x.dims}
        out, subs = [], {}
        for d in target:
            old = have.get(d.name)
            if old is not None and old.size not in (1, d.size):
                raise GraphError(f"expand: dim {d.name} has size {old.size}, cannot expand to {d.size}")
            if old is not None and old.size == 1:
                subs[old.symbol] = 0
            out.append(d)
        missing = set(have) - {d.name for d in target}
        if missing:
            raise GraphError(f"expand: target dims {[d.name for d in target]} drop {sorted(missing)}")
        return self._view(x, out, x.index.subs(subs))

    def _dim_of(self, x: Tensor, dim: Dim | str, where: str) -> Dim:
        name = dim.name if isinstance(dim, Dim) else dim
        d = next((d for d in x.dims if d.name == name), None)
        if d is None:
            raise GraphError(f"{where}: {name!r} is not a dim of {x.type} (its dims are {list(x.type.names)})")
        return d

    def slice(self, x: Tensor, dim: Dim | str, start: int, stop: int, step: int = 1,
              name: str | None = None) -> Tensor:
        """Elements ``start, start + step, ... < stop`` of ``dim`` (a view): the read index of
        the new dim ``name`` (default: ``dim``'s name when the size is unchanged, else
        ``<dim>_<start>_<stop>``) is ``start + step * i``. Whether the device can address a
        slice that begins mid-stick is decided where an op reads it (``device_coordinates``)."""
        x = self._own(x, "slice")
        d = self._dim_of(x, dim, "slice")
        start, stop, step = (as_int(v, f"slice: {k}") for k, v in (("start", start), ("stop", stop), ("step", step)))
        if step < 1 or not 0 <= start < stop <= d.size:
            raise GraphError(
                f"slice: {d.name}[{start}:{stop}:{step}] is empty or outside the dim's 0..{d.size}; "
                f"give 0 <= start < stop <= {d.size} and step >= 1"
            )
        size = -(-(stop - start) // step)
        if name is None:
            name = d.name if size == d.size else f"{d.name}_{start}_{stop}"
        new = Dim(name, size)
        if name != d.name and name in x.type.names:
            raise GraphError(f"slice: the new dim name {name!r} is already a dim of {x.type}")
        if size != 1:
            self.dim(name, size)
        dims = tuple(new if e.name == d.name else e for e in x.dims)
        return self._view(x, dims, sympy.expand(x.index.xreplace({d.symbol: start + step * new.symbol})))

    def unfold(self, x: Tensor, dim: Dim | str, size: int, step: int, name: str, tap: str,
               dilation: int = 1) -> Tensor:
        """Windows along ``dim`` (a view, torch's ``Tensor.unfold`` with a dilation): ``dim``
        becomes ``name``, the window count, followed by ``tap``, the position in a window of
        ``size`` taps; element ``(i, k)`` reads ``step * i + dilation * k`` of ``dim``. Windows
        overlap when ``step < dilation * (size - 1) + 1``: a convolution's im2col."""
        x = self._own(x, "unfold")
        d = self._dim_of(x, dim, "unfold")
        size, step, dilation = (as_int(v, f"unfold: {k}") for k, v in
                                (("size", size), ("step", step), ("dilation", dilation)))
        span = dilation * (size - 1) + 1
        if size < 1 or step < 1 or dilation < 1 or span > d.size:
            raise GraphError(
                f"unfold: windows of {size} taps at dilation {dilation} (span {span}) and step {step} do not fit "
                f"dim {d.name} of size {d.size}; give size, step, dilation >= 1 and a span <= {d.size}"
            )
        count = (d.size - span) // step + 1
        for n in (name, tap):
            if n in x.type.names and n != d.name:
                raise GraphError(f"unfold: the new dim name {n!r} is already a dim of {x.type}")
        new, k = Dim(name, count), Dim(tap, size)
        for e in (new, k):
            if e.size != 1:
                self.dim(e.name, e.size)
        at = x.type.names.index(d.name)
        dims = x.dims[:at] + (new, k) + x.dims[at + 1:]
        return self._view(x, dims, sympy.expand(x.index.xreplace({d.symbol: step * new.symbol + dilation * k.symbol})))

    def select(self, x: Tensor, dim: Dim | str, index: int) -> Tensor:
        """Element ``index`` of ``dim`` (negative from the end), which is dropped (a view)."""
        x = self._own(x, "select")
        d = self._dim_of(x, dim, "select")
        index = as_int(index, "select: index")
        if not -d.size <= index < d.size:
            raise GraphError(f"select: index {index} is out of range for dim {d} (use {-d.size}..{d.size - 1})")
        dims = tuple(e for e in x.dims if e.name != d.name)
        return self._view(x, dims, sympy.expand(x.index.xreplace({d.symbol: index % d.size})))

    def broadcast(self, x: Tensor, dims: Sequence[Dim | str]) -> Tensor:
        return self.expand(x, dims)

    def reshape(self, x: Tensor, dims: Sequence[Dim | str]) -> Tensor:
        """A view of ``x`` in row-major order (a permuted or broadcast ``x`` is copied first).
        Whether the device can address the view is decided where an op reads it:
        ``device_coordinates`` verifies its coordinates or refuses with a LoweringError."""
        x = self._own(x, "reshape")
        target = self._resolve_dims(dims, "reshape")
        new = TensorType(dims=target, dtype=x.dtype)
        if new.numel != x.type.numel:
            raise GraphError(f"reshape: {x.type.numel} elements cannot become {list(new.shape)} ({new.numel})")
        if sympy.expand(x.index - x.type.contiguous_index()) != 0:
            x = self.copy(x)
        # Buffer flat index == the new row-major index, because x is contiguous in host order.
        return replace(x, type=new, index=new.contiguous_index())

    # outputs and the result
    def output(self, name: str, x: Tensor) -> None:
        require_name(name, "output name")
        x = self._own(x, f"output {name}")
        if any(o.name == name for o in self._outputs):
            raise GraphError(f"output {name}: the name is already used")
        own = self._buffers[x.buffer].type
        if x.buffer in self._inputs or x.type != own or sympy.expand(x.index - own.contiguous_index()) != 0:
            x = self.copy(x)  # outputs are whole buffers of their own
        self._outputs.append(Output(name=name, buffer=x.buffer))

    def build(self) -> Graph:
        if not self._outputs:
            raise GraphError(f"graph {self.name} has no outputs; call g.output(name, tensor)")
        return verify_graph(
            Graph(
                name=self.name,
                buffers=tuple(self._buffers.values()),
                inputs=tuple(self._inputs),
                ops=tuple(self._ops),
                outputs=tuple(self._outputs),
                hints=tuple(self._hints),
            )
        )
