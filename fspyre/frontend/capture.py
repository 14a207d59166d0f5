"""``from_torch``: a torch function or module, traced by ``torch.export`` and decomposed to core
ATen, becomes an fspyre Graph.

Parameters, buffers and lifted constants become named graph inputs (``ln.weight`` ->
``ln_weight``); their values travel in the ``TorchCapture`` record next to the graph, so
``capture(...).inputs(*args)`` is everything ``fspyre.evaluate`` needs.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import keyword
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.export.graph_signature import InputKind, OutputKind

from fspyre.errors import FrontendError
from fspyre.frontend.annotations import preserve_hints, tensor_dim_names
from fspyre.frontend.dimnames import Placeholder
from fspyre.frontend.lowering import FxProgram, fspyre_dtype, lower_with_constants
from fspyre.frontend.ops import source_line
from fspyre.ir.graph import Graph

aten = torch.ops.aten


def decompositions() -> dict[Any, Callable]:
    """Core ATen, plus softmax / log_softmax / layer_norm as primitives; minus the ops fspyre
    has a primitive for (silu), which core ATen would otherwise break up."""
    return dict(_decompositions())


@functools.cache
def _decompositions() -> dict[Any, Callable]:
    from torch._decomp import core_aten_decompositions, get_decompositions

    table = dict(core_aten_decompositions())  # materializing it costs ~0.5 s: done once
    table.update(get_decompositions([aten._softmax, aten._log_softmax, aten.native_layer_norm]))
    table[aten._transformer_encoder_layer_fwd.default] = _encoder_layer
    table[aten.gelu_backward.default] = _gelu_backward
    table[aten.full_like.default] = _full_like
    for keep in (aten.silu.default,):
        table.pop(keep, None)
    return table


def _full_like(x, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    """A filled tensor of ``x``'s shape: ``x``'s values are not read, and with this ``x`` is
    no longer an operand, so an uninitialised ``empty_permuted`` made only for its shape
    (addcdiv's and lerp's backwards) is dead code and goes."""
    return torch.full(x.shape, fill_value, dtype=dtype or x.dtype, device=x.device)


def _gelu_backward(grad, x, approximate="none"):
    """gelu's derivative ``Phi(x) + x phi(x)``. torch's decomposition computes the normal CDF
    Phi with erf, which fspyre has no op for; here Phi(x) is ``gelu(x) / x`` (gelu is
    ``x Phi(x)`` and an fspyre op), 1/2 at 0. The tanh form needs no erf: torch's own."""
    from torch._decomp.decompositions import gelu_backward

    if approximate != "none":
        return gelu_backward(grad, x, approximate)
    cdf = torch.where(x == 0, 0.5, torch.nn.functional.gelu(x) / x)
    pdf = torch.exp(x * x * -0.5) * 0.3989422804014327  # 1 / sqrt(2 pi)
    return grad * (cdf + x * pdf)


def _encoder_layer(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, use_gelu, norm_first,
                   eps, norm_weight_1, norm_bias_1, norm_weight_2, norm_bias_2, ffn_weight_1, ffn_bias_1,
                   ffn_weight_2, ffn_bias_2, mask=None, mask_type=None):
    """``nn.TransformerEncoderLayer``'s inference fast path (one fused ATen op with no
    decomposition of its own, taken under ``torch.no_grad()`` in eval mode) as the layer's
    slow path computes it. ``mask`` is the merged mask of ``MultiheadAttention.merge_masks``:
    type 0 is [L, L], 1 a key padding mask [B, L], 2 [B, H, L, L]; additive when float,
    True = masked out when bool (the fused kernel's convention)."""
    import torch.nn.functional as F

    B, L, _ = src.shape

    def heads(t):
        return t.reshape(B, L, num_heads, embed_dim // num_heads).transpose(1, 2)

    attn_mask = None
    if mask is not None:
        attn_mask = {0: (1, 1, L, L), 1: (B, 1, 1, L), 2: (B, num_heads, L, L)}[mask_type]
        attn_mask = mask.reshape(attn_mask)
        if attn_mask.dtype == torch.bool:  # SDPA's bool mask says which keys take part
            attn_mask = ~attn_mask

    def self_attention(x):
        q, k, v = F.linear(x, qkv_weight, qkv_bias).chunk(3, -1)
        o = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), attn_mask=attn_mask)
        return F.linear(o.transpose(1, 2).reshape(B, L, embed_dim), proj_weight, proj_bias)

    def feed_forward(x):
        h = F.linear(x, ffn_weight_1, ffn_bias_1)
        return F.linear(F.gelu(h) if use_gelu else F.relu(h), ffn_weight_2, ffn_bias_2)

    def norm1(x):
        return F.layer_norm(x, (embed_dim,), norm_weight_1, norm_bias_1, eps)

    def norm2(x):
        return F.layer_norm(x, (embed_dim,), norm_weight_2, norm_bias_2, eps)

    if norm_first:
        x = src + self_attention(norm1(src))
        return x + feed_forward(norm2(x))
    x = norm1(src + self_attention(src))
    return norm2(x + feed_forward(x))


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class TorchCapture:
    """A captured program: the graph, which graph input each example argument feeds, and the
    values of the inputs that came from the module (parameters, buffers, constants)."""

    graph: Graph
    arg_names: tuple[str, ...]
    params: Mapping[str, np.ndarray]
    output_names: tuple[str, ...]
    out_spec: Any  # torch pytree spec of the module's outputs

    def inputs(self, *args: Any) -> dict[str, np.ndarray]:
        """The ``{input name: host array}`` dict for ``fspyre.evaluate`` / ``fspyre.run``."""
        if len(args) != len(self.arg_names):
            raise FrontendError(
                f"{self.graph.name}: {len(args)} arguments given, the program takes {len(self.arg_names)}"
            )
        out = dict(self.params)
        out.update({n: to_numpy(a) for n, a in zip(self.arg_names, args)})
        return out

    def unflatten(self, outputs: Mapping[str, Any]) -> Any:
        """Put flat outputs back into the structure the torch program returns."""
        return torch.utils._pytree.tree_unflatten([outputs[n] for n in self.output_names], self.out_spec)


def to_numpy(x: Any) -> np.ndarray:
    """A host array for fspyre: bfloat16 as float32 holding bfloat16 values (numpy has no bf16)."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        return (x.float() if x.dtype == torch.bfloat16 else x).contiguous().numpy()
    return np.asarray(x)


def from_torch(fn_or_module: Callable | torch.nn.Module, example_inputs: Sequence[Any]) -> Graph:
    """Capture ``fn_or_module(*example_inputs)`` as an fspyre Graph."""
    return capture(fn_or_module, example_inputs).graph


def capture(fn_or_module: Callable | torch.nn.Module, example_inputs: Sequence[Any], *,
            name: str | None = None) -> TorchCapture:
    module, arg_names = _as_module(fn_or_module, example_inputs)
    gname = _identifier(name or getattr(fn_or_module, "__name__", None) or type(fn_or_module).__name__)
    args = tuple(example_inputs)
    ep, graph = export(module, args, gname)
    sig = ep.graph_signature
    renamed = dict(zip((n.name for n in ep.graph.nodes if n.op == "placeholder"),
                       (n.name for n in graph.nodes if n.op == "placeholder")))
    used: set[str] = set()
    placeholders: list[Placeholder] = []
    params: dict[str, np.ndarray] = {}
    user: list[str] = []
    state = {**ep.state_dict, **ep.constants}
    for spec in sig.input_specs:
        node = renamed[spec.arg.name]
        if spec.kind == InputKind.USER_INPUT:
            i = len(user)
            nm = _unique(arg_names[i] if i < len(arg_names) else f"arg{i}", used)
            arg = args[i] if i < len(args) else None
            dims = tensor_dim_names(arg) if isinstance(arg, torch.Tensor) else None
            user.append(nm)
            placeholders.append(Placeholder(node=node, name=nm, dims=dims))
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            value = state[spec.target]
            nm = _unique(_identifier(spec.target), used)
            dims = tensor_dim_names(_original(module, spec.target, value))
            placeholders.append(Placeholder(node=node, name=nm, dims=dims))
            params[nm] = to_numpy(value)
        else:
            raise FrontendError(f"{gname}: input {spec.arg.name} is a {spec.kind.name}; fspyre takes tensors only")
    names = {p.node: p.name for p in placeholders}
    for node in graph.nodes:  # functionalization writes a mutated input back with copy_
        if node.target is aten.copy_.default and node.args[0].op == "placeholder":
            raise FrontendError(
                f"{gname}: the program writes {names.get(node.args[0].name)} in place{source_line(node)}; "
                f"fspyre graphs are pure: return the new value instead"
            )
    if any(spec.kind != OutputKind.USER_OUTPUT for spec in sig.output_specs):
        raise FrontendError(f"{gname}: the program has outputs other than its results: {sig.output_specs}")
    n_out = len(sig.output_specs)
    output_names = ("out",) if n_out == 1 else tuple(f"out{i}" for i in range(n_out))
    program = FxProgram(name=gname, graph=graph, placeholders=tuple(placeholders), output_names=output_names)
    lowered, constants = lower_with_constants(program)
    params.update(constants)
    return TorchCapture(graph=lowered, arg_names=tuple(user), params=params, output_names=output_names,
                        out_spec=ep.call_spec.out_spec)


def export(module: torch.nn.Module, args: tuple, name: str) -> tuple[torch.export.ExportedProgram, torch.fx.Graph]:
    """``torch.export``, then core-ATen decompositions, keeping ``spyre_hint`` metadata.
    Returns the exported program (signature, parameters, output structure) and the decomposed
    graph, whose placeholders are the program's, in the same order."""
    for i, a in enumerate(args):
        if not isinstance(a, torch.Tensor):
            raise FrontendError(f"{name}: example input {i} is a {type(a).__name__}; pass torch tensors")
        fspyre_dtype(a.dtype, f"{name}: example input {i}")
    try:
        with torch.no_grad(), preserve_hints(), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch's own pytree deprecation noise
            ep = torch.export.export(module, args)
            gm = ep.graph_module
            return ep, decompose(gm, [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]).graph
    except FrontendError:
        raise
    except Exception as e:  # torch's tracing errors are the user's program, not fspyre
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise FrontendError(
            f"{name}: torch.export could not trace the program ({type(e).__name__}: {first}). fspyre needs a "
            f"program torch.export can trace with static shapes: no data-dependent control flow"
        ) from e


def decompose(gm: torch.fx.GraphModule, example_values: Sequence[Any]) -> torch.fx.GraphModule:
    """The functional core-ATen graph of ``gm`` called on ``example_values`` (fake tensors, or
    the ints Dynamo passes for symbolic sizes, which the trace specialises on). For an exported
    graph this is what ``ExportedProgram.run_decompositions(decompositions())`` computes for
    fspyre's programs (capture refuses an input written in place), by re-tracing the
    graph through ``make_fx`` with the decomposition table. run_decompositions re-enumerates
    every CompositeImplicit op of every namespace on each call, about 1 s against 0.1 s for
    the trace itself; that cost would dominate capture. ``fx.Interpreter`` under
    ``preserve_node_meta`` copies each node's metadata (hints, stack trace) onto the nodes
    its decomposition makes, as run_decompositions does."""
    from torch.fx.experimental.proxy_tensor import make_fx

    vals = list(example_values)
    fake_mode = next((v.fake_mode for v in vals if hasattr(v, "fake_mode")), None)
    with fake_mode if fake_mode is not None else contextlib.nullcontext():
        # Decompose, then functionalize: the exported graph may write in place, and so may
        # some decompositions (rms_norm's adds its epsilon in place).
        decomposed = make_fx(torch.fx.Interpreter(gm).run, decomposition_table=decompositions(),
                             tracing_mode="real", record_stack_traces=True)(*vals)
        functional = torch.func.functionalize(torch.fx.Interpreter(decomposed).run, remove="mutations")
        out = make_fx(functional, tracing_mode="real", record_stack_traces=True)(*vals)
    graph = out.graph
    # `.to(dtype)`, `.float()`, `.type()` leave a metadata assertion on the traced input: it
    # computes nothing, and torch has already checked it on the example inputs.
    for node in list(graph.nodes):
        if node.target is aten._assert_tensor_metadata.default and not node.users:
            graph.erase_node(node)
    graph.eliminate_dead_code()
    _drop_empty_pieces(graph)
    _unflatten_matmuls(graph)
    out.recompile()
    return out


def _drop_empty_pieces(graph: torch.fx.Graph) -> None:
    """A zero-size tensor is a legal torch value with no elements; fspyre has none (every
    buffer holds at least one element), so it is removed where it contributes nothing:
    a ``cat`` drops its empty pieces (Phi-3 and GPT-J cut the head dim into a rotary part
    and a pass-through part ``x[..., rot:]``, empty when the rotary part is the whole dim,
    and cat them back), and what then computes only empty values is dead. An empty tensor
    still read by an op that needs its values stays, and the lowering refuses it by name."""
    def empty(n: Any) -> bool:
        v = n.meta.get("val") if isinstance(n, torch.fx.Node) else None
        return isinstance(v, torch.Tensor) and v.numel() == 0

    for node in list(graph.nodes):
        if node.target is not aten.cat.default or empty(node):
            continue
        pieces = list(node.args[0])  # type: ignore[arg-type]
        kept = [p for p in pieces if not empty(p)]
        if len(kept) == len(pieces):
            continue
        if len(kept) == 1:  # the cat is its one non-empty piece
            node.replace_all_uses_with(kept[0])
        else:
            node.args = (kept,) + tuple(node.args[1:])
    graph.eliminate_dead_code()


def _unflatten_matmuls(graph: torch.fx.Graph) -> None:
    """``nn.Linear`` on ``[B, S, K]`` decomposes to view ``[B*S, K]``, mm (or addmm), view
    ``[B, S, N]``. The merged dim has no name of its own, so a hint on S would find no op that
    iterates S. Each such chain becomes ``matmul(x, w)`` (plus the bias) on the unflattened
    operand, which iterates B and S themselves. Only whole chains are rewritten: the merge is
    of every leading dim, each view has the next node as its only user, and addmm has
    alpha = beta = 1 (the builder's matmul stores in the operands' dtype, so the bias add
    rounds as the addmm lowering's does). Runs on the graph ``decompose`` just built."""
    for mm in list(graph.nodes):
        if mm.target not in (aten.mm.default, aten.addmm.default):
            continue
        args = dict(zip(("self", "mat1", "mat2", "beta", "alpha"), mm.args)) | dict(mm.kwargs)
        if mm.target is aten.addmm.default and (args.get("beta", 1) != 1 or args.get("alpha", 1) != 1):
            continue
        merged, weight = (args["mat1"], args["mat2"]) if mm.target is aten.addmm.default else mm.args[:2]
        if (not isinstance(merged, torch.fx.Node) or merged.target not in _VIEWS or len(merged.users) != 1
                or len(mm.users) != 1):
            continue
        (split,) = mm.users
        x = merged.args[0]
        if not isinstance(x, torch.fx.Node):
            continue
        lead = tuple(x.meta["val"].shape[:-1])
        if (split.target not in _VIEWS or len(lead) < 2
                or tuple(split.meta["val"].shape) != lead + (mm.meta["val"].shape[-1],)):
            continue
        with graph.inserting_before(split):
            product = graph.call_function(aten.matmul.default, (x, weight))
            product.meta = dict(mm.meta, val=split.meta["val"])
            result = product
            if mm.target is aten.addmm.default:
                result = graph.call_function(aten.add.Tensor, (product, args["self"]))
                result.meta = dict(mm.meta, val=split.meta["val"])
        split.replace_all_uses_with(result)
        for node in (split, mm, merged):
            graph.erase_node(node)


_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)


class _Function(torch.nn.Module):
    def __init__(self, fn: Callable) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: Any) -> Any:
        return self.fn(*args)


def _as_module(fn: Any, example_inputs: Sequence[Any]) -> tuple[torch.nn.Module, list[str]]:
    if isinstance(fn, torch.nn.Module):
        target = fn.forward
        module = fn
    elif callable(fn):
        target = fn
        module = _Function(fn)
        # torch.export keeps only `forward` frames in node stack traces, unless a function is
        # registered as an anchor (what torch.fx.traceback.annotate_fn does); errors then
        # point at the user's line, not at the wrapper.
        anchor = getattr(torch.fx.proxy, "_register_stack_trace_anchor", None)
        if anchor is not None:
            anchor(fn)
    else:
        raise FrontendError(f"from_torch: expected a function or torch.nn.Module, got {type(fn).__name__}")
    try:
        params = [p for p in inspect.signature(target).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    names = [_identifier(p.name) for p in params][: len(example_inputs)]
    return module, names + [f"arg{i}" for i in range(len(names), len(example_inputs))]


def _original(module: torch.nn.Module, fqn: str, value: torch.Tensor) -> torch.Tensor:
    """The module's own parameter/buffer object (name_tensor_dims keys on tensor identity)."""
    try:
        return module.get_parameter(fqn)
    except (AttributeError, TypeError):
        pass
    try:
        return module.get_buffer(fqn)
    except (AttributeError, TypeError):
        return value


def _identifier(s: str) -> str:
    out = re.sub(r"\W", "_", str(s)).strip("_") or "x"
    if out[0].isdigit():  # nn.Sequential's "0.weight"
        out = f"p{out}"
    return f"{out}_" if keyword.iskeyword(out) else out


def _unique(name: str, used: set[str]) -> str:
    out, k = name, 2
    while out in used:
        out = f"{name}_{k}"
        k += 1
    used.add(out)
    return out

