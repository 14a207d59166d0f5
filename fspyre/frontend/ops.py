"""One rule per core-ATen op: how its operands' axes line up with its iteration axes
(``align``, used to name dims) and how it is built with ``GraphBuilder`` (``lower``).

Axes are identified by keys: ``("out", node, output index, axis)`` for an axis of a node's
result and ``("red", node, k)`` for the k-th axis an op reduces or contracts. ``align``
returns, for every tensor operand, the iteration axis each operand axis lines up with;
``fspyre.frontend.dimnames`` turns those into names and ``fspyre.frontend.lowering`` renames
each operand to them before calling ``lower``, so every rule below receives operands whose
dim names already line up and only has to pick the builder call.

Rules are registered with ``@rule(targets..., align=...)``; ``RULES`` is the supported set.
"""

from __future__ import annotations

import math
import operator
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeGuard

import torch
import torch.fx as fx

import fspyre.frontend.annotations  # noqa: F401  (registers fspyre::name_dims)
from fspyre.errors import FrontendError
from fspyre.ir.builder import Tensor
from fspyre.ir.dtypes import is_float
from fspyre.ir.graph import Dim

if TYPE_CHECKING:
    from fspyre.frontend.lowering import Lowering

aten = torch.ops.aten
Key = tuple


@dataclass(frozen=True, slots=True)
class Use:
    """A tensor operand: output ``index`` of ``arg``, and the iteration axis each of its axes
    lines up with (``None``: the rule does not relate that axis, e.g. axes a reshape merges)."""

    arg: fx.Node
    dst: tuple[Key | None, ...]
    index: int = 0
    stretch: bool = False  # an expand: a size-1 axis becomes the longer axis it lines up with


@dataclass(frozen=True, slots=True)
class Alignment:
    uses: tuple[Use, ...]
    outputs: tuple[tuple[Key, ...], ...]  # the axis keys of each result (several results may share keys)
    reduced: tuple[tuple[Key, int], ...] = ()  # reduction/contraction axes and their sizes
    user_names: Mapping[Key, str] = field(default_factory=dict)  # from fspyre::name_dims


# What a rule lowers an FX node to: its tensor, or one entry per result of a node with several
# (None for a result fspyre does not compute, e.g. the indices of max.dim)
Lowered = Tensor | tuple[Tensor | None, ...]


@dataclass(frozen=True, slots=True)
class Rule:
    align: Callable[[fx.Node], Alignment]
    lower: Callable[[Lowering, fx.Node, list[Tensor]], Lowered]


RULES: dict[Any, Rule] = {}


def rule(*targets: Any, align: Callable[[fx.Node], Alignment]):
    def register(fn):
        for t in targets:
            RULES[t] = Rule(align=align, lower=fn)
        return fn

    return register


def supported_ops() -> list[str]:
    return sorted({_op_name(t) for t in RULES})


def _op_name(target: Any) -> str:
    if target is operator.getitem:
        return "getitem"
    return str(target)


def _type_str(v: Any) -> str:
    if isinstance(v, torch.Tensor):
        return f"{str(v.dtype).removeprefix('torch.')}{list(v.shape)}"
    if isinstance(v, (tuple, list)):
        return "(" + ", ".join(_type_str(x) for x in v) + ")"
    return repr(v)


_LIBRARY_DIRS = (os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(__file__)))


def source_line(node: fx.Node) -> str:
    """The user's line that produced ``node`` (the innermost frame outside torch and fspyre), or ''."""
    stack = node.meta.get("stack_trace") or ""
    frames = re.findall(r'File "([^"]+)", line (\d+), in \S+\n\s*(.*)', stack)
    user = [f for f in frames if not f[0].startswith(_LIBRARY_DIRS)]
    if not user:
        return ""
    file, line, code = user[-1]
    return f" at {file}:{line}: `{code.strip()}`"


def describe_node(node: fx.Node) -> str:
    """``name = op(operand types) -> result type at file:line``, for error messages."""
    args = ", ".join(_type_str(a.meta.get("val")) if isinstance(a, fx.Node) else repr(a) for a in node.args)
    return f"{node.name} = {_op_name(node.target)}({args}) -> {_type_str(node.meta.get('val'))}{source_line(node)}"


# -- reading nodes ----------------------------------------------------------------------------
def val(node: fx.Node, index: int | None = None) -> Any:
    v = node.meta.get("val")
    return v[index] if index is not None and isinstance(v, (tuple, list)) else v


def node_args(node: fx.Node) -> tuple[Any, ...]:
    """``node.args``, read by position. FX types each as the union of every argument kind; which
    kind sits at a position is fixed by the op's schema, and the rule reading it knows that schema."""
    return node.args


def shape(node: fx.Node, index: int = 0) -> tuple[int, ...]:
    v = val(node)
    if isinstance(v, (tuple, list)):
        v = v[index]
    return tuple(int(s) for s in v.shape)


def bind(node: fx.Node) -> dict[str, Any]:
    """The op's arguments by schema name, defaults filled in."""
    schema = node.target._schema  # type: ignore[union-attr]
    out: dict[str, Any] = {}
    for i, a in enumerate(schema.arguments):
        if i < len(node.args) and not a.kwarg_only:
            out[a.name] = node_args(node)[i]
        elif a.name in node.kwargs:
            out[a.name] = node.kwargs[a.name]
        elif a.has_default_value():
            out[a.name] = a.default_value
        else:
            out[a.name] = None
    return out


def is_tensor_node(x: Any) -> TypeGuard[fx.Node]:
    return isinstance(x, fx.Node) and isinstance(x.meta.get("val"), torch.Tensor)


def out_keys(node: fx.Node, index: int = 0) -> tuple[Key, ...]:
    return tuple(("out", node.name, index, j) for j in range(len(shape(node, index))))


def _norm(d: int, rank: int) -> int:
    return d % rank if rank else 0


# -- alignments -------------------------------------------------------------------------------
def align_pointwise(node: fx.Node) -> Alignment:
    out = out_keys(node)
    uses = []
    for a in list(node.args) + list(node.kwargs.values()):
        if is_tensor_node(a):
            r = len(shape(a))
            uses.append(Use(a, out[len(out) - r:]))
    return Alignment(uses=tuple(uses), outputs=(out,))


def align_identity(node: fx.Node) -> Alignment:
    out = out_keys(node)
    return Alignment(uses=(Use(node_args(node)[0], out),), outputs=(out,))


def align_none(node: fx.Node) -> Alignment:
    return Alignment(uses=(), outputs=(out_keys(node),))


def align_getitem(node: fx.Node) -> Alignment:
    out = out_keys(node)
    return Alignment(uses=(Use(node_args(node)[0], out, index=node_args(node)[1]),), outputs=(out,))


def align_permute(node: fx.Node) -> Alignment:
    out = out_keys(node)
    perm = [_norm(p, len(out)) for p in node_args(node)[1]]
    dst: list[Key | None] = [None] * len(out)
    for i, p in enumerate(perm):
        dst[p] = out[i]
    return Alignment(uses=(Use(node_args(node)[0], tuple(dst)),), outputs=(out,))


def align_unsqueeze(node: fx.Node) -> Alignment:
    out = out_keys(node)
    d = _norm(node_args(node)[1], len(out))
    return Alignment(uses=(Use(node_args(node)[0], out[:d] + out[d + 1:]),), outputs=(out,))


def squeezed_axes(node: fx.Node) -> tuple[int, ...]:
    """The input axes a squeeze removes (only size-1 ones, as torch does)."""
    x = shape(node_args(node)[0])
    dims: Sequence[int]
    if node.target is aten.squeeze.default:
        dims = range(len(x))
    elif node.target is aten.squeeze.dim:
        dims = [node_args(node)[1]]
    else:
        dims = node_args(node)[1]
    return tuple(sorted({_norm(d, len(x)) for d in dims if x and x[_norm(d, len(x))] == 1}))


def align_squeeze(node: fx.Node) -> Alignment:
    out = out_keys(node)
    gone = squeezed_axes(node)
    it = iter(out)
    dst = tuple(None if j in gone else next(it) for j in range(len(shape(node_args(node)[0]))))
    return Alignment(uses=(Use(node_args(node)[0], dst),), outputs=(out,))


def align_view(node: fx.Node) -> Alignment:
    """A reshape keeps the axes of its common leading and trailing sizes; the rest are new."""
    out = out_keys(node)
    src, dst_shape = shape(node_args(node)[0]), shape(node)
    dst: list[Key | None] = [None] * len(src)
    p = 0
    while p < min(len(src), len(dst_shape)) and src[p] == dst_shape[p]:
        dst[p] = out[p]
        p += 1
    s = 1
    while s <= min(len(src), len(dst_shape)) - p and src[-s] == dst_shape[-s]:
        dst[len(src) - s] = out[len(dst_shape) - s]
        s += 1
    return Alignment(uses=(Use(node_args(node)[0], tuple(dst)),), outputs=(out,))


def align_expand(node: fx.Node) -> Alignment:
    out = out_keys(node)
    r = len(shape(node_args(node)[0]))
    return Alignment(uses=(Use(node_args(node)[0], out[len(out) - r:], stretch=True),), outputs=(out,))


def reduction_axes(node: fx.Node) -> tuple[tuple[int, ...], bool]:
    """(reduced input axes, keepdim) of a reduction node; an empty or absent dim list means all."""
    b = bind(node)
    rank = len(shape(node_args(node)[0]))
    dims = b.get("dim")
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        dims = range(rank)
    elif isinstance(dims, int):
        dims = [dims]
    return tuple(sorted({_norm(d, rank) for d in dims})) if rank else (), bool(b.get("keepdim") or False)


def align_reduction(node: fx.Node) -> Alignment:
    axes, keepdim = reduction_axes(node)
    x = node_args(node)[0]
    xs = shape(x)
    nout = len(val(node)) if isinstance(val(node), (tuple, list)) else 1
    out = out_keys(node)
    red = tuple(((("red", node.name, k), xs[j]) for k, j in enumerate(axes)))
    dst, it = [], iter(out)
    for j in range(len(xs)):
        if j in axes:
            dst.append(red[axes.index(j)][0])
            if keepdim:
                next(it)
        else:
            dst.append(next(it))
    # var_mean, max.dim: every result has the same axes as the first
    return Alignment(uses=(Use(x, tuple(dst)),), outputs=(out,) * nout, reduced=red)


def align_mm(node: fx.Node) -> Alignment:
    a, b = node_args(node)[:2]
    out = out_keys(node)
    k = ("red", node.name, 0)
    return Alignment(uses=(Use(a, (out[0], k)), Use(b, (k, out[1]))), outputs=(out,), reduced=((k, shape(a)[-1]),))


def align_addmm(node: fx.Node) -> Alignment:
    p = bind(node)
    bias, a, b = p["self"], p["mat1"], p["mat2"]
    out = out_keys(node)
    k = ("red", node.name, 0)
    uses = [Use(a, (out[0], k)), Use(b, (k, out[1]))]
    if is_tensor_node(bias):
        uses.insert(0, Use(bias, out[len(out) - len(shape(bias)):]))
    return Alignment(uses=tuple(uses), outputs=(out,), reduced=((k, shape(a)[-1]),))


def align_bmm(node: fx.Node) -> Alignment:
    a, b = node_args(node)
    out = out_keys(node)
    k = ("red", node.name, 0)
    return Alignment(
        uses=(Use(a, (out[0], out[1], k)), Use(b, (out[0], k, out[2]))), outputs=(out,), reduced=((k, shape(a)[-1]),)
    )


def align_mv(node: fx.Node) -> Alignment:
    a, b = node_args(node)
    out = out_keys(node)
    k = ("red", node.name, 0)
    return Alignment(uses=(Use(a, (out[0], k)), Use(b, (k,))), outputs=(out,), reduced=((k, shape(a)[-1]),))


def align_matmul_2d(node: fx.Node) -> Alignment:
    """``[..., K] @ [K, N]``: the only ``aten.matmul`` the front end makes (capture's
    ``_unflatten_matmuls``; core ATen decomposes every other)."""
    a, b = node_args(node)[:2]
    if len(shape(b)) != 2 or len(shape(a)) < 2:
        raise FrontendError(f"{describe_node(node)}: fspyre lowers matmul of [..., K] by [K, N] only")
    out = out_keys(node)
    k = ("red", node.name, 0)
    return Alignment(uses=(Use(a, out[:-1] + (k,)), Use(b, (k, out[-1]))), outputs=(out,),
                     reduced=((k, shape(a)[-1]),))


def align_name_dims(node: fx.Node) -> Alignment:
    out = out_keys(node)
    x, names = node_args(node)[:2]
    return Alignment(uses=(Use(x, out),), outputs=(out,), user_names=dict(zip(out, names.split(","))))


# -- lowering helpers -------------------------------------------------------------------------
def _wide(dtype: str) -> str:
    """Where one torch op becomes several fspyre ops, the ones in between keep float32, so the
    op still rounds once, at its result, as torch's does."""
    return "float32" if is_float(dtype) else dtype


def _operands(node: fx.Node, xs: list[Tensor]) -> list[Any]:
    """The op's positional args with tensor nodes replaced by their (renamed) handles."""
    it = iter(xs)
    return [next(it) if is_tensor_node(a) else a for a in node.args]


def _scalar(x: Any, node: fx.Node) -> Any:
    if isinstance(x, (bool, int, float)):
        return x
    raise FrontendError(f"node {node.name} ({node.target}): argument {x!r} is not a tensor or a Python number")


# -- pointwise --------------------------------------------------------------------------------
_UNARY: dict[object, str] = {
    aten.neg.default: "neg", aten.abs.default: "abs", aten.exp.default: "exp", aten.log.default: "log",
    aten.sqrt.default: "sqrt", aten.rsqrt.default: "rsqrt", aten.reciprocal.default: "reciprocal",
    aten.relu.default: "relu", aten.sigmoid.default: "sigmoid", aten.tanh.default: "tanh",
    aten.silu.default: "silu", aten.logical_not.default: "logical_not",
    aten.sin.default: "sin", aten.cos.default: "cos", aten.log1p.default: "log1p",
}
_BINARY: dict[object, str] = {
    aten.mul.Tensor: "mul", aten.mul.Scalar: "mul", aten.div.Tensor: "div", aten.div.Scalar: "div",
    aten.maximum.default: "maximum", aten.minimum.default: "minimum",
    aten.pow.Tensor_Tensor: "pow", aten.pow.Tensor_Scalar: "pow", aten.pow.Scalar: "pow",
    aten.eq.Tensor: "eq", aten.eq.Scalar: "eq", aten.ne.Tensor: "ne", aten.ne.Scalar: "ne",
    aten.lt.Tensor: "lt", aten.lt.Scalar: "lt", aten.le.Tensor: "le", aten.le.Scalar: "le",
    aten.gt.Tensor: "gt", aten.gt.Scalar: "gt", aten.ge.Tensor: "ge", aten.ge.Scalar: "ge",
    aten.where.self: "where", aten.fmod.Tensor: "fmod", aten.fmod.Scalar: "fmod",
}


@rule(*_UNARY, *_BINARY, align=align_pointwise)
def lower_pointwise(ctx: Lowering, node: fx.Node, xs: list[Tensor]) -> Tensor:
    fn = _UNARY.get(node.target) or _BINARY[node.target]
    args = [a if isinstance(a, Tensor) else _scalar(a, node) for a in _operands(node, xs)]
    return ctx.g.pointwise(fn, *args, dtype=ctx.dtype(node))


@rule(aten.add.Tensor, aten.add.Scalar, aten.sub.Tensor, aten.sub.Scalar, align=align_pointwise)
def lower_add_sub(ctx: Lowering, node: fx.Node, xs: list[Tensor]) -> Tensor:
    a, b = (x if isinstance(x, Tensor) else _scalar(x, node) for x in _operands(node, xs)[:2])
    alpha = bind(node).get("alpha", 1)
    out = ctx.dtype(node)
    if alpha != 1:
        if isinstance(b, Tensor):
            b = ctx.g.pointwise("mul", b, _scalar(alpha, node), dtype=_wide(out))
        else:
            b = b * alpha
    fn = "add" if node.target in (aten.add.Tensor, aten.add.Scalar) else "sub"
    return ctx.g.pointwise(fn, a, b, dtype=out)


@rule(aten.isinf.default, aten.isnan.default, align=align_pointwise)
def lower_isinf_isnan(ctx: Lowering, node: fx.Node, xs: list[Tensor]) -> Tensor:
    """``|x| == inf`` and ``x != x``. A float16 value on the device is DLFloat16, which has no
    infinity: ±inf saturate to ±8,573,157,376 when stored (docs/semantics.md, "Special
    values"), so ``isinf`` of a stored float16 tensor is false where torch's overflowed to inf."""
    (x,) = xs
    if node.target is aten.isnan.default:
        return ctx.g.pointwise("ne", x, x, dtype="bool")
    return ctx.g.pointwise("eq", ctx.g.pointwise("abs", x, dtype=_wide(x.dtype)), math.inf, dtype="bool")


@rule(aten.sign.default, align=align_pointwise)
def lower_sign(ctx: Lowering, node: fx.Node, xs: list[Tensor]) -> Tensor:
    """``(x > 0) - (x < 0)`` as selections of exact -1, 0, 1: NaN and -0.0 give 0, as torch's
    ``sign`` does (abs's backward multiplies by it)."""
    (x,) = xs
    g, out = ctx.g, ctx.dtype(node)
    return g.pointwise("where", g.gt(x, 0), 1, g.pointwise("where", g.lt(x, 0), -1, 0, dtype=out), dtype=out)


@rule(aten.gelu.default, align=align_pointwise)
def lower_gelu(ctx: Lowering, node: fx.Node, xs: list[Tensor]) -> Tensor:
    (x,) = xs
    out = ctx.dtype(node)
    if bind(node).get("approximate", "none") == "none":
        return ctx.g.pointwise("gelu", x, dtype=out)
    # tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), kept in float32 until the end
    g, w = ctx.g, _wide(out)
    x3 = g.pointwise("mul", g.pointwise("mul", x, x, dtype=w), x, dtype=w)
    inner = g.pointwise("add", x, g.pointwise("mul", x3, 0.044715, dtype=w), dtype=w)
    t = g.pointwise("tanh", g.pointwise("mul", inner, math.sqrt(2.0 / math.pi), dtype=w), dtype=w)
    half_x = g.pointwise("mul", x, 0.5, dtype=w)
    return g.pointwise("mul", half_x, g.pointwise("add", t, 1.0, dtype=w), dtype=out)


def _clamp(ctx: Lowering, node: fx.Node, x: Tensor, lo: Any, hi: Any) -> Tensor:
    out = ctx.dtype(node)
    if lo is None and hi is None:
        return ctx.g.pointwise("copy", x, dtype=out)
    if lo is not None:
        x = ctx.g.pointwise("maximum", x, lo, dtype=out if hi is None else _wide(out))
    if hi is not None:
        x = ctx.g.pointwise("minimum", x, hi, dtype=out)
    return x


@rule(aten.clamp.default, aten.clamp.Tensor, aten.clamp_min.default, aten.clamp_max.default,
      aten.clamp_min.Tensor, aten.clamp_max.Tensor, aten.hardtanh.default, align=align_pointwise)
def lower_clamp(ctx: Lowering, node: fx.Node, xs: list[Tensor]) -> Tensor:
    args = _operands(node, xs)
    x = args[0]
    if node.target in (aten.clamp_min.default, aten.clamp_min.Tensor):
        return _clamp(ctx, node, x, args[1], None)
    if node.target in (aten.clamp_max.default, aten.clamp_max.Tensor):
        return _clamp(ctx, node, x, None, args[1])
    b = bind(node)
    if node.target is aten.hardtanh.default:
        return _clamp(ctx, node, x, b["min_val"], b["max_val"])
    lo = args[1] if len(args) > 1 else b.get("min")
    hi = args[2] if len(args) > 2 else b.get("max")
    return _clamp(ctx, node, x, lo, hi)


@rule(aten.leaky_relu.default, align=align_pointwise)
def lower_leaky_relu(ctx: Lowering, node: fx.Node, xs: list[Tensor]) -> Tensor:
    (x,) = xs
    slope = _scalar(bind(node)["negative_slope"], node)
    out = ctx.dtype(node)
    g = ctx.g
    return g.pointwise("where", g.gt(x, 0), x, g.pointwise("mul", x, slope, dtype=_wide(out)), dtype=out)


@rule(aten._to_copy.default, aten.clone.default, aten.alias.default, aten.detach.default,
      aten.lift_fresh_copy.default, align=align_identity)
def lower_copy(ctx: Lowering, node: fx.Node, xs: list[Tensor]) -> Tensor:
    """Values are immutable, so a copy is the same handle; a dtype change is a cast."""
    (x,) = xs
    out = ctx.dtype(node)
    return x if x.dtype == out else ctx.g.cast(x, out)


# -- constants --------------------------------------------------------------------------------
@rule(aten.full.default, aten.scalar_tensor.default, aten.full_like.default, align=align_none)
def lower_full(ctx: Lowering, node: fx.Node, xs: list[Tensor]) -> Tensor:
    b = bind(node)
    value = b["s"] if node.target is aten.scalar_tensor.default else b["fill_value"]
    return ctx.g.constant(_scalar(value, node), ctx.dtype(node), ctx.dims(node))


@rule(aten.arange.start_step, aten.arange.start, aten.arange.default, align=align_none)
def lower_arange(ctx: Lowering, node: fx.Node, xs: list[Tensor]) -> Tensor:
    """A constant input holding torch's own ``arange`` values (its definition: the sizes and
    float steps round as torch rounds them), like ``iota``; they enter the device as any
    input does, rounded to its format."""
    b = bind(node)
    start = 0 if node.target is aten.arange.default else _scalar(b["start"], node)
    step = _scalar(b.get("step", 1), node)
    values = torch.arange(start, _scalar(b["end"], node), step, dtype=val(node).dtype)
    host = values.float() if values.dtype == torch.bfloat16 else values  # numpy has no bfloat16
    return ctx.constant_input(f"{node.name}_values", ctx.dims(node), host.numpy(), ctx.dtype(node))


# -- reductions -------------------------------------------------------------------------------
_REDUCE: dict[object, str] = {
    aten.sum.dim_IntList: "sum", aten.mean.dim: "mean", aten.mean.default: "mean",
    aten.amax.default: "amax", aten.amin.default: "amin", aten.prod.dim_int: "prod", aten.prod.default: "prod",
    aten.max.default: "amax", aten.min.default: "amin", aten.var.correction: "var",
}


def _reduce(ctx: Lowering, node: fx.Node, fn: str, x: Tensor, dtype: str | None = None, **kw: Any) -> Tensor:
    axes, keepdim = reduction_axes(node)
    out = dtype or ctx.dtype(node, 0)
    if x.dtype != out:
        x = ctx.g.cast(x, out)  # a dtype= argument
    if not axes:  # a 0-d operand: nothing to reduce
        return ctx.g.pointwise("copy", x, dtype=out)
    return ctx.g.reduce(fn, x, [x.dims[j].name for j in axes], keepdim=keepdim, **kw)


def _var(ctx: Lowering, node: fx.Node, x: Tensor) -> Tensor:
    """var with torch's ``correction``: the builder's for a whole number; otherwise the
    population variance, kept in float32, scaled by n / max(n - correction, 0) (torch's rule)."""
    c = bind(node).get("correction")
    c = 1 if c is None else c
    if c == int(c):
        return _reduce(ctx, node, "var", x, correction=int(c))
    axes, _ = reduction_axes(node)
    n = math.prod(shape(node_args(node)[0])[j] for j in axes) if axes else 1
    out = ctx.dtype(node, 0)
    wide = _reduce(ctx, node, "var", ctx.g.cast(x, _wide(out)) if x.dtype != _wide(out) else x, correction=0,
                   dtype=_wide(out))
    return ctx.g.pointwise("mul", wide, n / (n - c) if n > c else math.inf, dtype=out)


@rule(*_REDUCE, align=align_reduction)
def lower_reduce(ctx: Lowering, node: fx.Node, xs: list[Tensor]) -> Tensor:
    fn = _REDUCE[node.target]
    return _var(ctx, node, xs[0]) if fn == "var" else _reduce(ctx, node, fn, xs[0])


@rule(aten.any.default, aten.any.dim, aten.any.dims, aten.all.default, aten.all.dim, aten.all.dims,
      align=align_reduction)
def lower_any_all(ctx: Lowering, node: fx.Node, xs: list[Tensor]) -> Tensor:
    """``any`` is the maximum, ``all`` the minimum, of ``x != 0`` stored as bool (0/1)."""
    fn = "amax" if node.target in (aten.any.default, aten.any.dim, aten.any.dims) else "amin"
    return _reduce(ctx, node, fn, xs[0])


_LOGICAL: dict[object, str] = {
    aten.logical_and.default: "mul", aten.logical_or.default: "add", aten.logical_xor.default: "ne",
}


@rule(*_LOGICAL, align=align_pointwise)
def lower_logical(ctx: Lowering, node: fx.Node, xs: list[Tensor]) -> Tensor:
    """On operands cast to bool (``x != 0``): and is the product, or the sum (a bool store
    keeps ``!= 0``), xor is ``!=`` (docs/semantics.md, rule 3)."""
    a, b = (x if x.dtype == "bool" else ctx.g.cast(x, "bool") for x in xs)
    return ctx.g.pointwise(_LOGICAL[node.target], a, b, dtype=ctx.dtype(node))


_BITWISE: dict[object, str] = {
    aten.bitwise_and.Tensor: "mul", aten.bitwise_or.Tensor: "add", aten.bitwise_xor.Tensor: "ne",
    aten.bitwise_not.default: "logical_not",
}


@rule(*_BITWISE, align=align_pointwise)
def lower_bitwise(ctx: Lowering, node: fx.Node, xs: list[Tensor]) -> Tensor:
    """``~mask``, ``a & b``, ``a | b``, ``a ^ b`` on bool tensors are the logical ops; on
    integers they need bit operations fspyre does not have."""
    if any(x.dtype != "bool" for x in xs) or len(xs) != len(node.args):
        raise FrontendError(
            f"{describe_node(node)}: fspyre has bitwise ops on bool tensors only (masks); "
            f"for integers, rewrite with arithmetic or comparisons"
        )
    return ctx.g.pointwise(_BITWISE[node.target], *xs, dtype="bool")


@rule(aten.var_mean.correction, align=align_reduction)
def lower_var_mean(ctx: Lowering, node: fx.Node, xs: list[Tensor]) -> tuple[Tensor, Tensor]:
    return (_var(ctx, node, xs[0]), _reduce(ctx, node, "mean", xs[0]))


@rule(aten.max.dim, aten.min.dim, align=align_reduction)
def lower_max_dim(ctx: Lowering, node: fx.Node, xs: list[Tensor]) -> tuple[Tensor, None]:
    """The values; the indices (argmax) have no fspyre op and fail if something reads them."""
    return (_reduce(ctx, node, "amax" if node.target is aten.max.dim else "amin", xs[0]), None)


# -- matmul -----------------------------------------------------------------------------------
@rule(aten.mm.default, align=align_mm)
def lower_mm(ctx: Lowering, node: fx.Node, xs: list[Tensor]) -> Tensor:
    a, b = xs
    return ctx.g.matmul(a, b, contract=ctx.red_names(node)[0])


rule(aten.bmm.default, align=align_bmm)(lower_mm)
rule(aten.matmul.default, align=align_matmul_2d)(lower_mm)
rule(aten.mv.default, align=align_mv)(lower_mm)


@rule(aten.addmm.default, align=align_addmm)
def lower_addmm(ctx: Lowering, node: fx.Node, xs: list[Tensor]) -> Tensor:
    p = bind(node)
    *bias, a, b = xs
    g = ctx.g
    out = ctx.dtype(node)
    prod = g.matmul(a, b, contract=ctx.red_names(node)[0])
    if p["alpha"] != 1:
        prod = g.pointwise("mul", prod, _scalar(p["alpha"], node), dtype=_wide(out))
    c = bias[0] if bias else _scalar(p["self"], node)
    if p["beta"] == 0:
        return g.pointwise("copy", prod, dtype=out) if prod.dtype != out else prod
    if p["beta"] != 1:
        c = g.pointwise("mul", c, _scalar(p["beta"], node), dtype=_wide(out)) if bias else c * p["beta"]
    return g.pointwise("add", prod, c, dtype=out)


# -- views ------------------------------------------------------------------------------------
@rule(aten.permute.default, align=align_permute)
def lower_permute(ctx: Lowering, node: fx.Node, xs: list[Tensor]) -> Tensor:
    return ctx.g.permute(xs[0], list(ctx.out_names(node)))


@rule(aten.view.default, aten._unsafe_view.default, aten.reshape.default, align=align_view)
def lower_view(ctx: Lowering, node: fx.Node, xs: list[Tensor]) -> Tensor:
    """A view when the operand is read contiguously (the builder copies it first otherwise).
    Reshapes that keep the shape, or only drop and insert size-1 dims, are views of any
    layout (a squeezed slice or select stays a view)."""
    (x,) = xs
    dims = ctx.dims(node)
    if x.dims == dims:
        return x
    if [d for d in x.dims if d.size != 1] == [d for d in dims if d.size != 1]:
        for d in [d for d in x.dims if d.size == 1]:
            x = ctx.g.squeeze(x, d.name)
        for p, d in enumerate(dims):
            if d.size == 1:
                x = ctx.g.unsqueeze(x, p, d.name)
        return x
    return ctx.g.reshape(x, dims)


rule(aten.squeeze.dims, aten.squeeze.dim, aten.squeeze.default, align=align_squeeze)(lower_view)


@rule(aten.unsqueeze.default, align=align_unsqueeze)
def lower_unsqueeze(ctx: Lowering, node: fx.Node, xs: list[Tensor]) -> Tensor:
    d = _norm(node_args(node)[1], len(shape(node)))
    return ctx.g.unsqueeze(xs[0], d, ctx.out_names(node)[d])


@rule(aten.expand.default, align=align_expand)
def lower_expand(ctx: Lowering, node: fx.Node, xs: list[Tensor]) -> Tensor:
    return ctx.g.expand(xs[0], ctx.dims(node))


@rule(operator.getitem, align=align_getitem)
def lower_getitem(ctx: Lowering, node: fx.Node, xs: list[Tensor]) -> Tensor:
    return xs[0]


@rule(torch.ops.fspyre.name_dims.default, align=align_name_dims)
def lower_name_dims(ctx: Lowering, node: fx.Node, xs: list[Tensor]) -> Tensor:
    return xs[0]  # the operand was already renamed to the user's names


# -- gathering: embedding, index_select, torch.gather ------------------------------------------
# Each is the builder's ``gather`` over one axis of the values, with an iota of that axis as
# the positions; the gathered axis is a reduction axis (it leaves the result).
def _take_args(node: fx.Node) -> tuple[fx.Node, int, fx.Node]:
    """(values, axis, index) of an op that replaces one axis of the values by the index's axes."""
    b = bind(node)
    if node.target is aten.embedding.default:
        return b["weight"], 0, b["indices"]
    x = b["self"]
    return x, _norm(b["dim"], len(shape(x))), b["index"]


def align_take(node: fx.Node) -> Alignment:
    x, d, idx = _take_args(node)
    out = out_keys(node)
    k = ("red", node.name, 0)
    if not shape(x):  # index_select of a 0-d tensor: its one element, at index 0
        return Alignment(uses=(Use(x, ()), Use(idx, (None,) * len(shape(idx)))), outputs=(out,), reduced=((k, 1),))
    n = len(shape(idx))
    return Alignment(uses=(Use(x, out[:d] + (k,) + out[d + n:]), Use(idx, out[d:d + n])), outputs=(out,),
                     reduced=((k, shape(x)[d]),))


def _gather(ctx: Lowering, node: fx.Node, x: Tensor, d: int, idx: Tensor) -> Tensor:
    """``ctx.g.gather`` along axis ``d`` of ``x``; a 0-d ``x`` is gathered along a size-1 dim."""
    k = ctx.red_names(node)[0]
    if not x.dims:
        x = ctx.g.unsqueeze(x, 0, k)
    return ctx.g.gather(x, k, idx, ctx.iota(Dim(k, x.dims[d].size)))


@rule(aten.embedding.default, aten.index_select.default, align=align_take)
def lower_take(ctx: Lowering, node: fx.Node, xs: list[Tensor]) -> Tensor:
    """The builder's gather puts the index's dims first; a permute (a view) moves them to
    where the gathered axis was."""
    x, idx = xs
    _, d, _ = _take_args(node)
    out = _gather(ctx, node, x, d, idx)
    if not x.dims:  # the index's one element selected the one element: drop its size-1 dim
        for dim in out.dims:
            out = ctx.g.squeeze(out, dim.name)
        return out
    n, rank = len(idx.dims), len(out.dims)
    order = list(range(n, n + d)) + list(range(n)) + list(range(n + d, rank))
    return out if order == list(range(rank)) else ctx.g.permute(out, order)


def align_gather(node: fx.Node) -> Alignment:
    """torch.gather: ``out[i][j][k] = x[i][index[i][j][k]][k]`` (dim 1); the index may be
    shorter than ``x`` in the other dims, which then read ``x``'s first elements."""
    b = bind(node)
    x, idx = b["self"], b["index"]
    d = _norm(b["dim"], len(shape(x)))
    out = out_keys(node)
    k = ("red", node.name, 0)
    if not shape(x):
        return Alignment(uses=(Use(x, ()), Use(idx, out)), outputs=(out,), reduced=((k, 1),))
    dst = tuple(k if j == d else (out[j] if shape(x)[j] == shape(idx)[j] else None) for j in range(len(out)))
    return Alignment(uses=(Use(x, dst), Use(idx, out)), outputs=(out,), reduced=((k, shape(x)[d]),))


@rule(aten.gather.default, align=align_gather)
def lower_gather(ctx: Lowering, node: fx.Node, xs: list[Tensor]) -> Tensor:
    x, idx = xs
    d = _norm(bind(node)["dim"], len(x.dims))
    for j, (a, i) in enumerate(zip(x.dims, idx.dims)):
        if j != d and a.size != i.size:  # the index covers x's first i.size elements of this dim
            x = ctx.g.slice(x, a.name, 0, i.size, name=i.name)
    return _gather(ctx, node, x, d, idx)


# -- advanced indexing: x[i, j], x[:, ids], several index tensors broadcast together ----------
@dataclass(frozen=True, slots=True)
class _Arange:
    """An index tensor that is an ``arange(start, start + step * n, step)`` along one axis of
    the broadcast index shape, seen through views (``axis`` is None when ``n`` is 1: every
    element is ``start``)."""

    axis: int | None
    start: int
    step: int
    n: int


@dataclass(frozen=True, slots=True)
class _Indexing:
    """How ``aten.index.Tensor`` reads ``x``. torch's rule: the index tensors broadcast to one
    shape (``rank`` dims); when the indexed axes are adjacent those dims replace them in
    place (at ``front``), otherwise they come first (``front`` 0) and the other axes follow.
    ``ranges`` holds each index that is an arange; when every one is, within ``x``, along its
    own axis, ``view`` is set: the result is a view of ``x`` (slices, selects, an expand) and
    nothing is gathered."""

    x: fx.Node
    axes: tuple[int, ...]
    indices: tuple[fx.Node, ...]
    front: int
    rank: int
    ranges: tuple[_Arange | None, ...]
    view: bool

    def out_axis(self, j: int) -> int:
        """The result axis of ``x``'s axis ``j``, which is not indexed."""
        if self.front == self.axes[0] and j < self.front:
            return j
        return self.rank + j - sum(a < j for a in self.axes)


def _indexing(node: fx.Node) -> _Indexing:
    b = bind(node)
    x, idx = b["self"], b["indices"]
    pairs = [(j, t) for j, t in enumerate(idx) if t is not None]
    if any(val(t).dtype == torch.bool for _, t in pairs):
        raise FrontendError(
            f"{describe_node(node)}: indexing by a bool mask gives a result whose size depends on the data; "
            f"fspyre needs static shapes: use torch.where(mask, x, fill) instead"
        )
    axes = tuple(j for j, _ in pairs)
    indices = tuple(t for _, t in pairs)
    rank = len(torch.broadcast_shapes(*(shape(t) for t in indices)))
    adjacent = axes == tuple(range(axes[0], axes[0] + len(axes)))
    front = axes[0] if adjacent else 0
    ranges = tuple(_arange_of(t, rank) for t in indices)
    size = shape(x)
    view = all(r is not None and 0 <= r.start and r.start + r.step * (r.n - 1) < size[a]
               for r, a in zip(ranges, axes))
    varying = [r.axis for r in ranges if r is not None and r.axis is not None]
    view = view and len(varying) == len(set(varying))  # x[ar, ar] is a diagonal: no view
    return _Indexing(x=x, axes=axes, indices=indices, front=front, rank=rank, ranges=ranges, view=view)


def _arange_of(t: fx.Node, rank: int) -> _Arange | None:
    """``t`` as an arange along one axis of a ``rank``-dim broadcast shape, or None. Follows
    the views masks are built with (unsqueeze, size-1 reshapes, expand, dtype copies)."""
    chain = []
    while t.target not in (aten.arange.start_step, aten.arange.start, aten.arange.default):
        if t.target not in (aten.unsqueeze.default, aten.view.default, aten.reshape.default, aten.expand.default,
                            aten._to_copy.default, aten.clone.default, aten.alias.default):
            return None
        chain.append(t)
        t = node_args(t)[0]
        if not isinstance(t, fx.Node):
            return None
    b = bind(t)
    start = 0 if t.target is aten.arange.default else b["start"]
    step = b.get("step", 1)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (start, step)) or step < 1 or start < 0:
        return None  # a negative index counts from the end: gathered after wrapping
    n = shape(t)[0]
    if n == 1:
        return _Arange(axis=None, start=start, step=step, n=1)
    axis, r = 0, 1  # where the arange varies in the current tensor, and its rank
    for v in reversed(chain):
        out = shape(v)
        if v.target is aten.unsqueeze.default:
            axis += _norm(node_args(v)[1], len(out)) <= axis
        elif v.target in (aten.view.default, aten.reshape.default):
            src = shape(node_args(v)[0])
            if [s for s in src if s != 1] != [s for s in out if s != 1]:
                return None  # a reshape that merges or splits the varying axis
            k = sum(s != 1 for s in src[:axis])
            axis = [j for j, s in enumerate(out) if s != 1][k]
        elif v.target is aten.expand.default:
            axis += len(out) - r
        r = len(out)
    return _Arange(axis=rank - r + axis, start=start, step=step, n=n)


def align_index(node: fx.Node) -> Alignment:
    """A gathered axis is a reduction axis (it leaves the result); in a view an arange's axis
    lines up with the result axis it varies along (when its size is kept)."""
    ix = _indexing(node)
    out = out_keys(node)
    xs = shape(ix.x)
    dst: list[Key | None] = [None if j in ix.axes else out[ix.out_axis(j)] for j in range(len(xs))]
    if ix.view:
        for a, r in zip(ix.axes, ix.ranges):
            assert r is not None
            if r.axis is not None and r.n == xs[a]:
                dst[a] = out[ix.front + r.axis]
        return Alignment(uses=(Use(ix.x, tuple(dst)),), outputs=(out,))
    red = tuple((("red", node.name, k), xs[a]) for k, a in enumerate(ix.axes))
    for (key, _), a in zip(red, ix.axes):
        dst[a] = key
    bcast = out[ix.front:ix.front + ix.rank]
    uses = [Use(ix.x, tuple(dst))] + [Use(t, bcast[ix.rank - len(shape(t)):]) for t in ix.indices]
    return Alignment(uses=tuple(uses), outputs=(out,), reduced=red)


@rule(aten.index.Tensor, align=align_index)
def lower_index(ctx: Lowering, node: fx.Node, xs: list[Tensor]) -> Tensor:
    """A view when every index is an arange (the causal and padding masks transformers builds
    index ``mask[batch_arange, kv_arange]``); otherwise one gather per index tensor, each
    index wrapped (negative from the end) and expanded to the broadcast shape, whose dims the
    later gathers share with their values as batch dims."""
    ix = _indexing(node)
    dims = ctx.dims(node)
    g = ctx.g
    x = xs[0]
    if ix.view:
        names = [x.dims[a].name for a in ix.axes]
        for name, r in zip(names, ix.ranges):
            assert r is not None
            if r.axis is None:
                x = g.select(x, name, r.start)
            elif (r.start, r.step, r.n) != (0, 1, next(d.size for d in x.dims if d.name == name)):
                x = g.slice(x, name, r.start, r.start + r.step * (r.n - 1) + 1, r.step,
                            name=dims[ix.front + r.axis].name)
    else:
        bcast = dims[ix.front:ix.front + ix.rank]
        for k, a, t, r in zip(ctx.red_names(node), ix.axes, xs[1:], ix.ranges):
            n = shape(ix.x)[a]
            if r is None:  # torch counts a negative index from the end; below -n matches nothing
                t = g.pointwise("where", g.lt(t, 0), g.pointwise("add", t, n, dtype="int32"), t, dtype="int32")
            if t.dims != bcast:
                t = g.expand(t, bcast)
            x = g.gather(x, k, t, ctx.iota(Dim(k, n)))
    have = {d.name for d in x.dims}
    x = g.permute(x, [d.name for d in dims if d.name in have])
    for j, d in enumerate(dims):
        if d.name not in have:
            x = g.unsqueeze(x, j, d.name)
    return g.expand(x, dims) if x.dims != dims else x


# -- cumsum ----------------------------------------------------------------------------------
def align_cumsum(node: fx.Node) -> Alignment:
    """``out[..., i, ...] = sum_j x[..., j, ...] * (j <= i)``: x's scanned axis becomes a
    reduction axis j beside the output's i."""
    x = node_args(node)[0]
    d = _norm(bind(node)["dim"], max(len(shape(x)), 1))
    out = out_keys(node)
    k = ("red", node.name, 0)
    return Alignment(uses=(Use(x, out[:d] + (k,) + out[d + 1:]),), outputs=(out,), reduced=((k, shape(x)[d]),))


@rule(aten.cumsum.default, align=align_cumsum)
def lower_cumsum(ctx: Lowering, node: fx.Node, xs: list[Tensor]) -> Tensor:
    """A masked sum over a second copy of the axis (``where(j <= i, x_j, 0)`` summed over j):
    n² work along the axis, which is what masks and position ids (a Llama model's cumsum of
    its attention mask) need; integer sums are exact, float ones are a reduction like any
    other (docs/semantics.md, rule 5). torch's int64 result is int32 here, like every int64."""
    (x,) = xs
    if not x.dims:
        raise FrontendError(f"{describe_node(node)}: fspyre scans along a dim, and this tensor has none")
    dims = ctx.dims(node)
    d = _norm(bind(node)["dim"], len(dims))
    k = ctx.red_names(node)[0]
    out = ctx.dtype(node)
    g = ctx.g
    if x.dtype != out and not (x.dtype == "bool" and out == "int32"):
        x = g.cast(x, out)  # a dtype= argument
    upto = g.le(ctx.iota(Dim(k, dims[d].size)), ctx.iota(dims[d]))
    masked = g.pointwise("where", upto, x, 0, dtype="int32" if out == "int32" else _wide(out))
    total = g.reduce("sum", masked, [k])
    if total.dtype != out:
        total = g.cast(total, out)
    return g.permute(total, [dm.name for dm in dims])


# -- slicing: views with an offset ------------------------------------------------------------
def _slice_range(node: fx.Node) -> tuple[int, int, int, int]:
    """(axis, start, stop, step) of a ``slice.Tensor`` node, normalized like a Python slice."""
    b = bind(node)
    x = shape(node_args(node)[0])
    d = _norm(b["dim"], len(x))
    start, stop, step = slice(b["start"], b["end"], b["step"]).indices(x[d])
    return d, start, stop, step


def _sliced(node: fx.Node, axis: int, index: int = 0) -> Alignment:
    """Every axis but ``axis`` lines up with the operand's; ``axis`` only when its size is kept."""
    out = out_keys(node, index)
    keep = shape(node_args(node)[0])[axis] == shape(node, index)[axis]
    dst = tuple(k if j != axis or keep else None for j, k in enumerate(out))
    return Alignment(uses=(Use(node_args(node)[0], dst),), outputs=(out,))


def align_slice(node: fx.Node) -> Alignment:
    return _sliced(node, _slice_range(node)[0])


@rule(aten.slice.Tensor, align=align_slice)
def lower_slice(ctx: Lowering, node: fx.Node, xs: list[Tensor]) -> Tensor:
    (x,) = xs
    d, start, stop, step = _slice_range(node)
    if (start, stop, step) == (0, x.dims[d].size, 1):
        return x
    return ctx.g.slice(x, x.dims[d].name, start, stop, step, name=ctx.out_names(node)[d])


def align_select(node: fx.Node) -> Alignment:
    out = out_keys(node)
    d = _norm(bind(node)["dim"], len(shape(node_args(node)[0])))
    return Alignment(uses=(Use(node_args(node)[0], out[:d] + (None,) + out[d:]),), outputs=(out,))


@rule(aten.select.int, align=align_select)
def lower_select(ctx: Lowering, node: fx.Node, xs: list[Tensor]) -> Tensor:
    (x,) = xs
    b = bind(node)
    return ctx.g.select(x, x.dims[_norm(b["dim"], len(x.dims))].name, b["index"])


def _split_axis(node: fx.Node) -> int:
    return _norm(bind(node)["dim"], len(shape(node_args(node)[0])))


def align_split(node: fx.Node) -> Alignment:
    """Results share the operand's other axes; each piece's split axis is its own."""
    d = _split_axis(node)
    n = len(val(node))
    first = out_keys(node, 0)
    outs = tuple(first[:d] + (("out", node.name, i, d),) + first[d + 1:] for i in range(n))
    keep = n == 1
    dst = tuple(k if j != d or keep else None for j, k in enumerate(first))
    return Alignment(uses=(Use(node_args(node)[0], dst),), outputs=outs)


@rule(aten.split_with_sizes.default, aten.split.Tensor, align=align_split)
def lower_split(ctx: Lowering, node: fx.Node, xs: list[Tensor]) -> tuple[Tensor, ...]:
    (x,) = xs
    d = _split_axis(node)
    if len(val(node)) == 1:
        return (x,)
    out, start = [], 0
    for i in range(len(val(node))):
        size = shape(node, i)[d]
        out.append(ctx.g.slice(x, x.dims[d].name, start, start + size, name=ctx.out_names(node, i)[d]))
        start += size
    return tuple(out)


# -- concatenation ----------------------------------------------------------------------------
def _cat_axis(node: fx.Node) -> int:
    return _norm(bind(node)["dim"], len(shape(node)))


def align_cat(node: fx.Node) -> Alignment:
    out = out_keys(node)
    d = _cat_axis(node)
    uses = []
    for t in bind(node)["tensors"]:
        keep = shape(t)[d] == shape(node)[d]
        uses.append(Use(t, tuple(k if j != d or keep else None for j, k in enumerate(out))))
    return Alignment(uses=tuple(uses), outputs=(out,))


@rule(aten.cat.default, align=align_cat)
def lower_cat(ctx: Lowering, node: fx.Node, xs: list[Tensor]) -> Tensor:
    """Pieces of equal size n along the axis: a ``where`` chain over ``k`` (an iota of the
    piece count N) selects piece k, giving ``[..., N, n, ...]``, whose contiguous reshape is the
    result. Every load stays in its piece's bounds, which a select by position (``i < n``)
    would not. Pieces of different sizes: one copy each into its region of the result
    (``GraphBuilder.concat``)."""
    if len(xs) == 1:
        return xs[0]
    return _concat(ctx, node, xs, _cat_axis(node))


def _concat(ctx: Lowering, node: fx.Node, xs: Sequence[Tensor], d: int,
            out: Sequence[Dim] | None = None, dtype: str | None = None) -> Tensor:
    """``xs`` (whose other dims carry the result's names) concatenated along axis ``d`` into
    the result of ``node`` (or into dims ``out`` of type ``dtype``: a step of a longer rule).
    Equal pieces select by position in one op over the result; unequal ones are copied each
    into its region, so the graph does not depend on the sizes (a KV cache of ``|L|`` rows
    and one new row is two copies at every length, which a symbolic program needs; cutting
    the pieces into chunks of the sizes' gcd would make ``|L| + 1`` of them)."""
    out = tuple(out) if out is not None else ctx.dims(node)
    g = ctx.g
    dtype = dtype or ctx.dtype(node)
    if len({x.dims[d].size for x in xs}) > 1:
        return g.concat([x if x.dtype == dtype else g.cast(x, dtype) for x in xs], d, out)
    n = xs[0].dims[d].size
    inner = g.dim(f"{out[d].name}_n", n) if n != 1 else Dim(f"{out[d].name}_n", 1)
    k = g.dim(f"{out[d].name}_k", len(xs))
    pieces = [g.unsqueeze(g.rename(x, {x.dims[d].name: inner.name}), d, k.name) for x in xs]
    iota = ctx.iota(k)
    result = pieces[-1]
    for j in range(len(pieces) - 2, -1, -1):
        result = g.pointwise("where", g.eq(iota, j), pieces[j], result, dtype=dtype)
    return g.reshape(result, out)


# -- slice_scatter: what the backward of a slice makes (core ATen decomposes select_scatter) --
def _scatter_range(node: fx.Node) -> tuple[int, int, int, int]:
    """(axis, start, stop, step) of the region of ``self`` that ``src`` replaces."""
    b = bind(node)
    x = shape(b["self"])
    d = _norm(b["dim"], len(x))
    start, stop, step = slice(b["start"], b["end"], b["step"]).indices(x[d])
    return d, start, stop, step


def align_slice_scatter(node: fx.Node) -> Alignment:
    b = bind(node)
    out = out_keys(node)
    d = _scatter_range(node)[0]
    keep = shape(b["src"])[d] == shape(node)[d]
    dst = tuple(k if j != d or keep else None for j, k in enumerate(out))
    return Alignment(uses=(Use(b["self"], out), Use(b["src"], dst)), outputs=(out,))


@rule(aten.slice_scatter.default, align=align_slice_scatter)
def lower_slice_scatter(ctx: Lowering, node: fx.Node, xs: list[Tensor]) -> Tensor:
    """``self`` with ``src`` in its slice ``start:stop``: the concatenation of ``self``'s part
    before it, ``src`` and the part after (slices are views; the cat selects, so the values
    are exact). A strided slice (step > 1) interleaves ``src`` with ``self``: not lowered."""
    base, src = xs
    d, start, stop, step = _scatter_range(node)
    if step != 1:
        raise FrontendError(
            f"{describe_node(node)}: fspyre writes into a slice of step 1 only (this one has step {step})")
    g = ctx.g
    name, size = base.dims[d].name, base.dims[d].size
    pieces = ([g.slice(base, name, 0, start, name=f"{name}_0_{start}")] if start > 0 else []) + [src] + (
        [g.slice(base, name, stop, size, name=f"{name}_{stop}_end")] if stop < size else [])
    if len(pieces) == 1:
        return src if src.dtype == ctx.dtype(node) else g.cast(src, ctx.dtype(node))
    return _concat(ctx, node, pieces, d)


# -- repeat: a broadcast of the operand, made contiguous ------------------------------------------
def align_repeat(node: fx.Node) -> Alignment:
    """An operand axis lines up with its result axis when it is repeated once; the result's
    leading axes (repeats beyond the operand's rank) and the repeated axes are new."""
    out = out_keys(node)
    reps = bind(node)["repeats"]
    rank = len(shape(node_args(node)[0]))
    lead = len(reps) - rank
    return Alignment(uses=(Use(node_args(node)[0], tuple(out[lead + j] if reps[lead + j] == 1 else None
                                                          for j in range(rank))),), outputs=(out,))


@rule(aten.repeat.default, align=align_repeat)
def lower_repeat(ctx: Lowering, node: fx.Node, xs: list[Tensor]) -> Tensor:
    """``x.repeat(r0, ..., rk)``: each axis a of size n repeated r times is the size-1 axis
    before it stretched to r, ``[r, n]``, which a row-major reshape merges into ``r * n``
    (the builder copies the broadcast first: the result is r copies side by side)."""
    (x,) = xs
    g = ctx.g
    reps = [int(r) for r in bind(node)["repeats"]]
    out = ctx.dims(node)
    lead = len(reps) - len(x.dims)
    wide: list[Dim] = []  # the broadcast's dims: [r_i, n_i] per axis (n_i absent for a new leading axis)
    cur = x
    for i, r in enumerate(reps):
        if i < lead or r != 1:
            rep = f"{out[i].name}_rep"
            cur = g.unsqueeze(cur, len(wide), rep)
            if r != 1:
                g.dim(rep, r)
            wide.append(Dim(rep, r))
        if i >= lead:
            wide.append(x.dims[i - lead])
    return g.reshape(g.expand(cur, wide), out)


# -- constant_pad_nd: a concatenation with constant pieces ----------------------------------------
def _pads(node: fx.Node) -> list[tuple[int, int]]:
    """(before, after) per axis of the operand (torch lists the last axis's pair first)."""
    pad = [int(p) for p in bind(node)["pad"]]
    rank = len(shape(node_args(node)[0]))
    out = [(0, 0)] * rank
    for i in range(len(pad) // 2):
        out[rank - 1 - i] = (pad[2 * i], pad[2 * i + 1])
    return out


def align_pad(node: fx.Node) -> Alignment:
    out = out_keys(node)
    return Alignment(uses=(Use(node_args(node)[0], tuple(k if p == (0, 0) else None
                                                          for k, p in zip(out, _pads(node)))),), outputs=(out,))


def _pad_axis(ctx: Lowering, node: fx.Node, x: Tensor, d: int, before: int, after: int, value: Any,
              name: str) -> Tensor:
    """``x`` with ``before`` and ``after`` elements of ``value`` around axis ``d``, which
    becomes dim ``name``; a negative count cuts elements off instead (a slice)."""
    g = ctx.g
    size = x.dims[d].size
    if before < 0 or after < 0:
        lo, hi = max(-before, 0), size - max(-after, 0)
        if lo >= hi:
            raise FrontendError(f"{describe_node(node)}: cropping {-before}, {-after} leaves nothing of dim {d}")
        x = g.slice(x, x.dims[d].name, lo, hi, name=f"{name}_crop" if (lo, hi) != (0, size) else None)
        before, after = max(before, 0), max(after, 0)
    out = x.dims[:d] + (Dim(name, x.dims[d].size + before + after),) + x.dims[d + 1:]
    if before == after == 0:
        return ctx.rename(x, [e.name for e in out])
    pieces = []
    for n, at in ((before, "before"), (after, "after")):
        if n:
            edge = Dim(f"{name}_{at}", n)
            if n != 1:
                g.dim(edge.name, n)
            pieces.append(g.constant(value, x.dtype, x.dims[:d] + (edge,) + x.dims[d + 1:]))
    if before:
        pieces.insert(1, x)
    else:
        pieces.insert(0, x)
    if out[d].size != 1:
        g.dim(name, out[d].size)
    return _concat(ctx, node, pieces, d, out=out, dtype=x.dtype)


@rule(aten.constant_pad_nd.default, align=align_pad)
def lower_constant_pad_nd(ctx: Lowering, node: fx.Node, xs: list[Tensor]) -> Tensor:
    """Each padded axis in turn: the concatenation of a constant piece, the operand and a
    constant piece (exact: copies into the result's regions)."""
    (x,) = xs
    value = _scalar(bind(node)["value"], node)
    out = ctx.dims(node)
    for d, (before, after) in enumerate(_pads(node)):
        if (before, after) != (0, 0):
            x = _pad_axis(ctx, node, x, d, before, after, value, out[d].name)
    return x


# -- batch norm in eval mode: pointwise over the channel axis -------------------------------------
def align_batch_norm(node: fx.Node) -> Alignment:
    out = out_keys(node, 0)
    b = bind(node)
    uses = [Use(b["input"], out)]
    for k in ("weight", "bias", "running_mean", "running_var"):
        if is_tensor_node(b.get(k)):
            uses.append(Use(b[k], (out[1],)))
    n = len(val(node))
    return Alignment(uses=tuple(uses), outputs=(out,) + tuple(out_keys(node, i) for i in range(1, n)))


@rule(aten._native_batch_norm_legit_no_training.default, aten.native_batch_norm.default, align=align_batch_norm)
def lower_batch_norm(ctx: Lowering, node: fx.Node, xs: list[Tensor]) -> tuple[Tensor | None, ...]:
    """Eval mode, torch's definition: ``(x - mean) * rsqrt(var + eps) * weight + bias`` over
    axis 1 with the running statistics. The saved statistics (empty in eval) are not computed."""
    b = bind(node)
    if b.get("training"):
        raise FrontendError(f"{describe_node(node)}: batch norm in training mode (batch statistics and "
                            f"running-stat updates) is not lowered; call model.eval()")
    it = iter(xs[1:])
    w, bias, mean, var = (next(it) if is_tensor_node(b.get(k)) else None
                          for k in ("weight", "bias", "running_mean", "running_var"))
    if mean is None or var is None:
        raise FrontendError(f"{describe_node(node)}: batch norm without running statistics is training mode; "
                            f"fspyre lowers eval mode only")
    g = ctx.g
    dtype = ctx.dtype(node)
    wide = _wide(dtype)
    y = g.pointwise("mul", g.pointwise("sub", xs[0], mean, dtype=wide),
                    g.pointwise("rsqrt", g.pointwise("add", var, float(b["eps"]), dtype=wide), dtype=wide), dtype=wide)
    if w is not None:
        y = g.pointwise("mul", y, w, dtype=wide)
    if bias is not None:
        y = g.pointwise("add", y, bias, dtype=wide)
    if y.dtype != dtype:
        y = g.cast(y, dtype)
    return (y,) + (None,) * (len(val(node)) - 1)


# -- topk: k rounds of a maximum and the first position holding it -------------------------------
def align_topk(node: fx.Node) -> Alignment:
    """Values and indices share their axes; the searched axis is reduced, and the result's
    axis there is the k picks."""
    x = node_args(node)[0]
    xs = shape(x)
    d = _norm(bind(node)["dim"], len(xs))
    out = out_keys(node)
    red = (("red", node.name, 0), xs[d]) if xs else None  # a 0-d operand has nothing to search
    dst = tuple(red[0] if j == d and red else out[j] for j in range(len(xs)))
    return Alignment(uses=(Use(x, dst),), outputs=(out, out), reduced=(red,) if red else ())


@rule(aten.topk.default, align=align_topk)
def lower_topk(ctx: Lowering, node: fx.Node, xs: list[Tensor]) -> tuple[Tensor, Tensor]:
    """Round i takes the largest value not taken yet (``amax``) and the first position that
    holds it (``amin`` of the positions where it is, n elsewhere), then marks that position
    taken: values in descending order, ties in position order, NaN counting as the largest
    (as torch's topk). k rounds of two reductions over the axis: O(k n) per row, for the
    small k of routers and samplers. The picks are concatenated along the result's axis."""
    (x,) = xs
    b = bind(node)
    k = int(b["k"])
    if not b["largest"]:
        raise FrontendError(f"{describe_node(node)}: topk(largest=False) is not lowered; negate the operand "
                            f"and take the largest")
    if not is_float(x.dtype):
        raise FrontendError(f"{describe_node(node)}: fspyre's topk searches a float tensor, this one is {x.dtype}")
    g = ctx.g
    if not x.dims:  # a 0-d tensor is its own top-1, at position 0
        return g.pointwise("copy", x), g.constant(0, ctx.dtype(node, 1))
    d = _norm(b["dim"], len(x.dims))
    r = ctx.red_names(node)[0]
    n = x.dims[[e.name for e in x.dims].index(r)].size
    iota = ctx.iota(Dim(r, n))
    out = ctx.dims(node)
    vals, idxs = [], []
    taken = None
    for _ in range(k):
        cand = x if taken is None else g.where(taken, float("-inf"), x)
        m = g.reduce("amax", cand, [r])
        # NaN is the largest: where the maximum is NaN, the first NaN not taken is picked
        hit = _either(g, g.eq(cand, m), _both(g, g.ne(m, m), g.ne(cand, cand)))
        if taken is not None:
            hit = _both(g, hit, g.logical_not(taken))
        i = g.reduce("amin", g.where(hit, iota, n), [r])
        now = g.eq(iota, i)
        taken = now if taken is None else _either(g, taken, now)
        vals.append(m)
        idxs.append(i)
    pick = out[d].name
    cat = []
    for res, dtype in ((vals, ctx.dtype(node, 0)), (idxs, ctx.dtype(node, 1))):
        pieces = [g.unsqueeze(v, d, f"{pick}_1") for v in res]
        t = pieces[0] if k == 1 else _concat(ctx, node, pieces, d, out=out, dtype=dtype)
        if k == 1:
            t = ctx.rename(t, [e.name for e in out])
        cat.append(t if t.dtype == dtype else g.cast(t, dtype))
    return cat[0], cat[1]


def _both(g: Any, a: Tensor, b: Tensor) -> Tensor:
    """``a & b`` of bool tensors: their minimum."""
    return g.pointwise("minimum", a, b, dtype="bool")


def _either(g: Any, a: Tensor, b: Tensor) -> Tensor:
    """``a | b`` of bool tensors: their maximum."""
    return g.pointwise("maximum", a, b, dtype="bool")


# -- convolution: im2col windows (a view) and one matmul ------------------------------------------
def align_convolution(node: fx.Node) -> Alignment:
    """The batch axis and the output channels (of the weight and the bias) line up with the
    result's; channels in, taps and spatial axes are rebuilt by the rule."""
    b = bind(node)
    out = out_keys(node)
    rank = len(shape(b["input"]))
    uses = [Use(b["input"], (out[0],) + (None,) * (rank - 1)), Use(b["weight"], (out[1],) + (None,) * (rank - 1))]
    if is_tensor_node(b["bias"]):
        uses.append(Use(b["bias"], (out[1],)))
    return Alignment(uses=tuple(uses), outputs=(out,))


@rule(aten.convolution.default, align=align_convolution)
def lower_convolution(ctx: Lowering, node: fx.Node, xs: list[Tensor]) -> Tensor:
    """1-d and 2-d convolution (stride, padding, dilation, groups) as im2col and a matmul:
    the input, padded (``constant_pad_nd``'s concatenation), is viewed as windows along each
    spatial axis (``GraphBuilder.unfold``: ``out * stride + tap * dilation``, overlapping), whose
    ``[channels/groups, taps...]`` are copied into one contraction dim R; the weight, reshaped
    to ``[groups, out/groups, R]`` (a view), contracts with it per group in one matmul. The
    copy holds each input element once per window it falls in (the im2col buffer), so the work
    is the convolution's own, O(output * R); the matmul sums R products in float32."""
    b = bind(node)
    if b["transposed"]:
        raise FrontendError(f"{describe_node(node)}: transposed convolution is not lowered")
    x, w = xs[0], xs[1]
    bias = xs[2] if len(xs) > 2 else None
    spatial = len(x.dims) - 2
    if spatial not in (1, 2) or x.dims[0].size == 0:
        raise FrontendError(f"{describe_node(node)}: fspyre lowers 1-d and 2-d convolutions, this one is {spatial}-d")
    stride, padding, dilation = ([int(v) for v in b[k]] * (spatial if len(b[k]) == 1 else 1)
                                 for k in ("stride", "padding", "dilation"))
    groups = int(b["groups"])
    g = ctx.g
    out = ctx.dims(node)
    dtype = ctx.dtype(node)
    n = node.name
    for j in range(spatial):  # zero padding of each spatial axis
        if padding[j]:
            x = _pad_axis(ctx, node, x, 2 + j, padding[j], padding[j], 0.0, f"{n}_pad{j}")
    cin, cout = x.dims[1].size, out[1].size
    cg, og = cin // groups, cout // groups
    ksize = w.shape[2:]

    def dim(name: str, size: int) -> Dim:
        return g.dim(name, size) if size != 1 else Dim(name, 1)

    grp, cgd, ogd = dim(f"{n}_g", groups), dim(f"{n}_cg", cg), dim(f"{n}_og", og)
    x = g.reshape(x, [x.dims[0], grp, cgd] + list(x.dims[2:]))
    # [batch, groups, spatial..., R]: one spatial axis at a time, its taps join R (channels
    # first, then the taps in order: the weight's row-major [channels/groups, taps...]), so
    # no copy has more than 6 dims (the device layout's limit)
    cols = g.permute(x, [d.name for d in x.dims if d.name != cgd.name] + [cgd.name])
    size = cg
    for j in range(spatial):
        at = 2 + j
        cols = g.unfold(cols, cols.dims[at].name, ksize[j], stride[j], out[2 + j].name, f"{n}_k{j}", dilation[j])
        tap = cols.dims[at + 1]
        size *= ksize[j]
        rest = [d for d in cols.dims if d.name != tap.name]
        cols = g.reshape(g.permute(cols, [d.name for d in rest] + [tap.name]), rest[:-1] + [dim(f"{n}_r{j}", size)])
    r = cols.dims[-1]
    rows = list(cols.dims[:-1])
    wk = g.reshape(w, [grp, ogd, r])
    y = g.matmul(cols, wk, r.name, dtype=_wide(dtype) if bias is not None else None)
    # [groups, batch, spatial..., og] -> [batch, groups * og, spatial...]
    y = g.permute(y, [out[0].name, grp.name, ogd.name] + [d.name for d in rows[2:]])
    y = g.reshape(y, out)
    if bias is not None:
        y = g.pointwise("add", y, bias, dtype=dtype)
    elif y.dtype != dtype:
        y = g.cast(y, dtype)
    return y


# -- copy and select_scatter: what functionalizing an in-place write makes ------------------------
@rule(aten.copy.default, align=align_pointwise)
def lower_copy_into(ctx: Lowering, node: fx.Node, xs: list[Tensor]) -> Tensor:
    """``self.copy_(src)`` functionalized: ``src`` broadcast to ``self``'s shape in ``self``'s
    dtype (``self``'s values are not read). BART's ``shift_tokens_right`` writes this way."""
    src = xs[-1]
    out = ctx.dims(node)
    if src.dims != out:
        src = ctx.g.expand(src, out)
    return src if src.dtype == ctx.dtype(node) else ctx.g.cast(src, ctx.dtype(node))


def align_select_scatter(node: fx.Node) -> Alignment:
    b = bind(node)
    out = out_keys(node)
    d = _norm(b["dim"], len(out))
    return Alignment(uses=(Use(b["self"], out), Use(b["src"], out[:d] + out[d + 1:])), outputs=(out,))


@rule(aten.select_scatter.default, align=align_select_scatter)
def lower_select_scatter(ctx: Lowering, node: fx.Node, xs: list[Tensor]) -> Tensor:
    """``self`` with ``src`` at position ``index`` of ``dim``: the concatenation of ``self``'s
    part before it, ``src`` as a size-1 piece, and the part after (as slice_scatter)."""
    base, src = xs
    b = bind(node)
    d = _norm(b["dim"], len(base.dims))
    name, size = base.dims[d].name, base.dims[d].size
    i = int(b["index"]) % size
    g = ctx.g
    piece = g.unsqueeze(src, d, f"{name}_at")
    pieces = ([g.slice(base, name, 0, i, name=f"{name}_0_{i}")] if i > 0 else []) + [piece] + (
        [g.slice(base, name, i + 1, size, name=f"{name}_{i + 1}_end")] if i + 1 < size else [])
    if len(pieces) == 1:
        return ctx.rename(piece if piece.dtype == ctx.dtype(node) else g.cast(piece, ctx.dtype(node)),
                          [e.name for e in ctx.dims(node)])
    return _concat(ctx, node, pieces, d)


# -- max pooling: the maximum over windows (a view) -------------------------------------------------
def align_max_pool(node: fx.Node) -> Alignment:
    out = out_keys(node, 0)
    x = node_args(node)[0]
    rank = len(shape(x))
    return Alignment(uses=(Use(x, out[:rank - 2] + (None,) * 2),), outputs=(out, out_keys(node, 1)))


@rule(aten.max_pool2d_with_indices.default, align=align_max_pool)
def lower_max_pool2d(ctx: Lowering, node: fx.Node, xs: list[Tensor]) -> tuple[Tensor, None]:
    """The values of ``max_pool2d``: the input padded with -inf, each spatial dim viewed as
    windows (``GraphBuilder.unfold``, as convolution), and ``amax`` over the two tap dims:
    exact. The indices (argmax) are not computed; ``ceil_mode`` is refused."""
    b = bind(node)
    (x,) = xs
    if b["ceil_mode"]:
        raise FrontendError(f"{describe_node(node)}: max_pool2d(ceil_mode=True) is not lowered")
    k = [int(v) for v in b["kernel_size"]] * (2 if len(b["kernel_size"]) == 1 else 1)
    stride = [int(v) for v in (b["stride"] or k)] * (2 if len(b["stride"] or k) == 1 else 1)
    padding, dilation = ([int(v) for v in b[n]] * (2 if len(b[n]) == 1 else 1) for n in ("padding", "dilation"))
    g = ctx.g
    out = ctx.dims(node)
    lead = len(x.dims) - 2
    taps: list[str] = []
    for j in range(2):
        at = lead + j + len(taps)  # spatial dim j: the earlier one's windows and taps come before it
        if padding[j]:
            x = _pad_axis(ctx, node, x, at, padding[j], padding[j], float("-inf"), f"{node.name}_pad{j}")
        x = g.unfold(x, x.dims[at].name, k[j], stride[j], out[lead + j].name, f"{node.name}_k{j}", dilation[j])
        taps.append(x.dims[at + 1].name)
    return g.reduce("amax", x, taps), None
