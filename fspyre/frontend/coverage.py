"""Front-end coverage against PyTorch's own OpInfo database.

For every op the front end claims, a bounded, deterministic set of OpInfo sample inputs
(float16 and float32, shapes that fit) is captured with ``from_torch``, evaluated with the
reference semantics, and compared with PyTorch eager; a subset is also compiled and run on the
machine model. The reference each result is held to:

- float32 samples: eager float32, with ``torch.testing.assert_close``'s float32 tolerances
  (rtol 1.3e-6, atol 1e-5).
- float16 samples: fspyre stores float16 as DLFloat16, so the inputs it computes on are the
  samples rounded to DLFloat16 and each result is rounded once more. The reference is eager
  float32 on those rounded inputs, rounded to DLFloat16: a correct lowering is then within one
  DLFloat16 rounding of it (rtol 2^-9, atol 1e-5). Comparing with eager float16 instead would
  measure the format, not the lowering (exp(9) moves 1% when its input moves by 2^-10).
- bool and int32 results: equal. The int64 index tensors of embedding, index_select and gather
  are drawn as OpInfo draws them; fspyre holds them as int32.

    python -m fspyre.frontend.coverage [--samples N] [--ops add,exp] [--run K] [-v]
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fspyre.errors import FspyreError

# OpInfo names (``name`` or ``name.variant``) the front end claims. Not claimed, and why
# (``--ops NAME -v`` shows each refusal):
# - log2, exp2, erf, div.floor_rounding, div.trunc_rounding: no fspyre op, and composing
#   log2/exp2 from log/exp loses the precision torch keeps; softplus, elu, mish, xlogy,
#   nan_to_num, fmax, fmin, norm and normalize decompose into such ops (expm1, isnan, ...);
# - max.reduction_with_dim, min.reduction_with_dim, argmax, argmin: fspyre computes no argmax
#   indices; arange: its OpInfo samples have no tensor input, which the harness needs;
# - float_power, softmax.with_dtype, log_softmax.with_dtype: float64;
# - narrow_copy (aten.narrow_copy has no lowering yet); einsum (a repeated index is a diagonal:
#   no strided view in the builder);
# - slice_scatter (lowered: the backward of a slice): every OpInfo sample is 8,000 elements,
#   past the table's size limit; tests/frontend/test_training.py checks it;
# - addmm, baddbmm, nn.functional.linear: the builder's matmul stores its product in the
#   operands' dtype, so with a bias float16 rounds twice (product, then sum) where torch rounds
#   once; fails one float16 sample in four. Needs a float32 product (GraphBuilder.matmul(dtype=)).
CLAIMED: tuple[str, ...] = (
    # elementwise unary
    "neg", "abs", "exp", "log", "sqrt", "rsqrt", "reciprocal", "sigmoid", "tanh", "square", "logical_not",
    "positive", "logit", "sin", "cos", "sign", "nn.functional.relu", "nn.functional.gelu", "nn.functional.silu",
    "nn.functional.hardtanh", "nn.functional.leaky_relu", "nn.functional.relu6", "nn.functional.hardsigmoid",
    "nn.functional.hardswish", "nn.functional.threshold", "nn.functional.glu", "clamp", "clamp_min", "clamp_max",
    # elementwise binary and ternary
    "add", "sub", "rsub", "mul", "div.no_rounding_mode", "true_divide", "maximum", "minimum", "max.binary",
    "min.binary", "pow", "eq", "ne", "lt", "le", "gt", "ge", "where", "masked_fill", "addcmul", "addcdiv", "lerp",
    "logical_and", "logical_or", "logical_xor",
    # reductions
    "sum", "mean", "amax", "amin", "prod", "var", "var.unbiased", "std", "std.unbiased", "var_mean", "std_mean",
    "any", "all", "max.reduction_no_dim", "min.reduction_no_dim", "logsumexp", "softmax", "log_softmax",
    "nn.functional.softmin", "nn.functional.layer_norm", "nn.functional.rms_norm", "nn.functional.mse_loss",
    # contractions
    "mm", "bmm", "mv", "matmul",
    # views with an offset
    "narrow", "select", "split", "split.list_args", "split_with_sizes", "unbind", "chunk", "tensor_split",
    "hsplit", "vsplit", "dsplit",
    # concatenation
    "cat", "stack", "hstack", "vstack", "dstack", "column_stack", "select_scatter",
    # gathering (take_along_dim: its negative-index wrap is aten.remainder, which fspyre lacks)
    "nn.functional.embedding", "index_select", "gather", "__getitem__",
    # issue 23: convolution (im2col windows and a matmul), top-k, tiling (a copy). Lowered but
    # not claimed: constant_pad_nd (a sample crops a dim to size 0, an empty result fspyre
    # refuses) and nn.functional.batch_norm (training-mode samples; eval mode is lowered):
    # tests/frontend/test_new_ops.py checks both
    "nn.functional.conv1d", "nn.functional.conv2d", "topk", "repeat", "log1p", "fmod",
)

DTYPES = (torch.float16, torch.float32)
FP32_TOL = (1.3e-6, 1e-5)  # (rtol, atol) of torch.testing.assert_close for float32
DLF16_TOL = (2.0**-9, 1e-5)  # one DLFloat16 rounding of a float32-accurate result


@dataclass(frozen=True, slots=True, kw_only=True)
class OpCoverage:
    """One op's tally. ``unsupported`` samples were refused by the front end with a
    FrontendError (e.g. an int64 result); ``failing`` ones were captured but disagree."""

    op: str
    passing: int
    failing: int
    unsupported: int
    ran: int  # samples also compiled and run on the machine model
    failures: tuple[str, ...] = ()
    refusals: tuple[str, ...] = ()

    @property
    def total(self) -> int:
        return self.passing + self.failing + self.unsupported


def coverage_table(ops: Sequence[str] = CLAIMED, *, samples: int = 4, run: int = 1, max_numel: int = 2048,
                   dtypes: Sequence[torch.dtype] = DTYPES, grad: bool = False) -> tuple[OpCoverage, ...]:
    """Tally ``samples`` eligible OpInfo reference samples per op and dtype (spread evenly over
    the first ``4 * samples`` eligible ones under a fixed seed, so the choice is deterministic),
    running the first ``run`` of each op through ``fspyre.compile`` + ``fspyre.run`` as well.
    With ``grad``, the gradients instead (float32 only, ops that torch differentiates): every
    sample runs its forward and backward graphs on the machine model through aot_autograd."""
    infos = _op_infos()
    missing = [o for o in ops if o not in infos]
    if missing:
        raise ValueError(f"not OpInfo names: {missing}")
    if grad:
        return tuple(_cover(infos[o], o, samples, 0, max_numel, (torch.float32,), grad=True) for o in ops
                     if infos[o].supports_autograd)
    return tuple(_cover(infos[o], o, samples, run, max_numel, dtypes) for o in ops)


def format_table(rows: Iterable[OpCoverage], verbose: bool = False) -> str:
    rows = list(rows)
    width = max([len(r.op) for r in rows] + [2])
    lines = [f"{'op':<{width}}  passing  failing  unsupported  machine-run"]
    for r in rows:
        lines.append(f"{r.op:<{width}}  {r.passing:7d}  {r.failing:7d}  {r.unsupported:11d}  {r.ran:11d}")
        if verbose:
            lines += [f"    FAIL {f}" for f in r.failures] + [f"    UNSUPPORTED {f}" for f in r.refusals]
    tot = [sum(getattr(r, k) for r in rows) for k in ("passing", "failing", "unsupported", "ran")]
    lines.append(f"{'total':<{width}}  {tot[0]:7d}  {tot[1]:7d}  {tot[2]:11d}  {tot[3]:11d}   ({len(rows)} ops)")
    return "\n".join(lines)


def _count(least: int):
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            n = None
        if n is None or n < least:
            raise argparse.ArgumentTypeError(f"{text!r}: give a whole number >= {least}")
        return n

    return parse


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="fspyre coverage", description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", default=",".join(CLAIMED), help="comma-separated OpInfo names (default: the claimed set)")
    p.add_argument("--samples", type=_count(1), default=4, help="samples per op and dtype (default 4)")
    p.add_argument("--run", type=_count(0), default=1,
                   help="samples per op also run on the machine model (default 1)")
    p.add_argument("--grad", action="store_true",
                   help="check gradients: forward and backward graphs through aot_autograd, on the machine model")
    p.add_argument("-v", "--verbose", action="store_true", help="list each failing and unsupported sample")
    args = p.parse_args(list(argv) if argv is not None else None)
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    start = time.perf_counter()
    try:
        rows = coverage_table(ops, samples=args.samples, run=args.run, grad=args.grad)
    except ValueError as e:
        print(f"fspyre coverage: {e}", file=sys.stderr)
        return 2
    print(format_table(rows, verbose=args.verbose))
    print(f"({time.perf_counter() - start:.1f}s)")
    return 0 if all(r.failing == 0 for r in rows) else 1


# -- running samples -------------------------------------------------------------------------
def _op_infos() -> dict[str, Any]:
    from torch.testing._internal.common_methods_invocations import op_db

    return {o.name + (f".{o.variant_test_name}" if o.variant_test_name else ""): o for o in op_db}


@dataclass(frozen=True, slots=True)
class _Sample:
    """An OpInfo sample as a function of its tensors only (the other arguments are baked in)."""

    op: Callable
    sample: Any
    tensors: tuple[torch.Tensor, ...]

    def __call__(self, *tensors: torch.Tensor) -> Any:
        it = iter(tensors)
        s = self.sample
        swap = lambda x: next(it) if isinstance(x, torch.Tensor) else x  # noqa: E731
        inp = torch.utils._pytree.tree_map(swap, s.input)
        args = torch.utils._pytree.tree_map(swap, tuple(s.args))
        kwargs = torch.utils._pytree.tree_map(swap, dict(s.kwargs))
        return self.op(inp, *args, **kwargs)


def _leaves(sample: Any) -> list[Any]:
    return torch.utils._pytree.tree_leaves((sample.input, tuple(sample.args), dict(sample.kwargs)))


# Ops whose OpInfo samples carry int64 index tensors fspyre takes (as int32). Other ops' int64
# tensors are positions or sizes held in a tensor (tensor_split), which are data-dependent.
INDEX_OPS = frozenset({"nn.functional.embedding", "index_select", "gather", "__getitem__"})


def _eligible(sample: Any, dtype: torch.dtype, max_numel: int, indices: bool = False) -> bool:
    leaves = _leaves(sample)
    tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
    if any(isinstance(x, complex) for x in leaves):
        return False
    kinds = (dtype, torch.bool, torch.int64) if indices else (dtype, torch.bool)
    return bool(tensors) and all(
        t.dtype in kinds and 0 < t.numel() <= max_numel and t.layout == torch.strided for t in tensors
    )


def _pick(candidates: list[Any], n: int) -> list[Any]:
    if len(candidates) <= n:
        return candidates
    step = len(candidates) / n
    return [candidates[int(i * step)] for i in range(n)]


def _cover(info: Any, name: str, samples: int, run: int, max_numel: int,
           dtypes: Sequence[torch.dtype], grad: bool = False) -> OpCoverage:
    passing = failing = unsupported = ran = 0
    failures: list[str] = []
    refusals: list[str] = []
    for dtype in dtypes:
        if dtype not in info.supported_dtypes("cpu"):
            continue
        with torch.random.fork_rng():
            torch.manual_seed(0)
            every = info.reference_inputs("cpu", dtype, requires_grad=False)
            eligible = (s for s in every if _eligible(s, dtype, max_numel, name in INDEX_OPS))
            pool = list(itertools.islice(eligible, 4 * samples))  # the first few, then spread the pick over them
        for s in _pick(pool, samples):
            sample = _Sample(info.op, s, tuple(x for x in _leaves(s) if isinstance(x, torch.Tensor)))
            if grad:
                verdict, detail, did_run = _check_gradient(sample)
            else:
                verdict, detail, did_run = _check_sample(sample, dtype, machine=ran < run)
            ran += did_run
            label = f"{str(dtype).removeprefix('torch.')} {_describe(sample)}: {detail}"
            if verdict == "pass":
                passing += 1
            elif verdict == "fail":
                failing += 1
                failures.append(label)
            else:
                unsupported += 1
                refusals.append(label)
    return OpCoverage(op=name, passing=passing, failing=failing, unsupported=unsupported, ran=ran,
                      failures=tuple(failures), refusals=tuple(refusals))


def _describe(sample: _Sample) -> str:
    shapes = ", ".join(f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}" for t in sample.tensors)
    others = [x for x in _leaves(sample.sample) if not isinstance(x, torch.Tensor)]
    return f"({shapes}{', ' if others else ''}{', '.join(map(repr, others))})"


def _check_sample(sample: _Sample, dtype: torch.dtype, machine: bool) -> tuple[str, str, int]:
    import fspyre
    from fspyre.frontend.capture import capture

    try:
        with torch.no_grad():
            reference = _reference(sample, dtype)
    except Exception as e:  # noqa: BLE001 -- a sample eager itself rejects is not ours to count
        return "unsupported", f"eager raised {type(e).__name__}", 0
    try:
        cap = capture(sample, sample.tensors, name="sample")
        with np.errstate(over="ignore"):  # DLFloat16 values beyond float16's range come back as inf
            got = fspyre.evaluate(cap.graph, cap.inputs(*sample.tensors))
    except FspyreError as e:
        return "unsupported", str(e).splitlines()[0][:200], 0
    if len(reference) != len(cap.output_names):
        return "fail", f"{len(cap.output_names)} outputs, eager has {len(reference)}", 0
    why = _compare(cap.output_names, got, reference, dtype)
    if why or not machine:
        return ("fail", why, 0) if why else ("pass", "", 0)
    try:
        comp = fspyre.compile(cap.graph, machine=fspyre.machine.spyre(cores=4), tiling="none")
        with np.errstate(over="ignore"):
            why = _compare(cap.output_names, fspyre.run(comp, cap.inputs(*sample.tensors)), reference, dtype)
    except FspyreError as e:
        why = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    return ("fail", f"machine model: {why}", 1) if why else ("pass", "", 1)


def _check_gradient(sample: _Sample) -> tuple[str, str, int]:
    """The float32 gradients of the sample's float outputs, each weighted by a seeded random
    cotangent, with respect to its float inputs: aot_autograd with fspyre's forward and
    backward compilers (both graphs compiled and run on the machine model) against float64
    eager, within ``assert_close``'s float32 tolerance plus twice torch's own float32 error
    (its largest finite one over the gradient), or equal to torch's float32 result. Backward
    graphs sum in other orders than torch's fused kernels, and degenerate samples (a layer
    norm over one element) leave torch's float32 rounding noise where the exact gradient is
    0. An op that falls back to eager in either graph makes the sample unsupported, naming it."""
    import warnings

    from torch._functorch.aot_autograd import aot_function

    from fspyre.frontend.dynamo import BackendOptions, aot_compilers

    wrt = [i for i, t in enumerate(sample.tensors) if t.dtype == torch.float32]
    if not wrt:
        return "unsupported", "no float input to differentiate", 0

    def grads(fn: Callable, dtype: torch.dtype) -> list[np.ndarray]:
        leaves = [(t.detach().to(dtype) if i in wrt else t).requires_grad_(i in wrt)
                  for i, t in enumerate(sample.tensors)]
        outs = [o for o in torch.utils._pytree.tree_leaves(fn(*leaves))
                if isinstance(o, torch.Tensor) and o.dtype == dtype and o.requires_grad]
        gen = torch.Generator().manual_seed(0)
        cot = [torch.randn(o.shape, generator=gen).to(dtype) for o in outs]
        got = torch.autograd.grad(outs, [leaves[i] for i in wrt], cot, allow_unused=True)
        return [np.zeros(leaves[i].shape) if g is None else g.double().numpy() for i, g in zip(wrt, got)]

    try:
        exact, theirs = grads(sample, torch.float64), grads(sample, torch.float32)
    except Exception as e:  # noqa: BLE001 -- a sample eager itself cannot differentiate is not ours to count
        return "unsupported", f"eager raised {type(e).__name__}", 0
    reports: list[Any] = []
    options = BackendOptions(tiling="none", cores=4, on_report=reports.append)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ours = grads(aot_function(sample, **aot_compilers(options)), torch.float32)
    except FspyreError as e:
        return "unsupported", str(e).splitlines()[0][:200], 0
    eager = [r.summary() for r in reports if r.eager]
    if eager:
        return "unsupported", "; ".join(eager)[:300], 1
    rtol, atol = FP32_TOL
    for i, x, t, o in zip(wrt, exact, theirs, ours):
        with np.errstate(invalid="ignore"):  # inf - inf where a gradient is infinite
            torch_error = np.abs(t - x)
            slack = atol + 2 * float(torch_error[np.isfinite(torch_error)].max(initial=0))
            # equal to float64 (infinities too) or to torch's own float32 result (an overflow
            # to inf that float64 does not have), NaN where float64 has NaN
            same = (o == x) | (o == t) | (np.isnan(o) & np.isnan(x))
            off = ~same & ~(np.abs(o - x) <= slack + rtol * np.abs(x))  # a NaN difference is off
        if off.any():
            j = int(np.argmax(off.ravel()))
            return ("fail", f"grad of input {i}: {int(off.sum())} of {x.size} values off, e.g. {o.ravel()[j]!r} "
                            f"vs {x.ravel()[j]!r} (float64), torch float32 {t.ravel()[j]!r}", 1)
    return "pass", "", 1


def _reference(sample: _Sample, dtype: torch.dtype) -> list[np.ndarray]:
    """Eager results as host arrays of the dtypes fspyre returns (see the module docstring)."""
    from fspyre.frontend.capture import to_numpy
    from fspyre.machine import formats

    if dtype == torch.float16:
        dl16 = formats.FORMATS["SEN169_FP16"]
        def device(t: torch.Tensor) -> torch.Tensor:
            v = np.asarray(formats.round_to(t.float().numpy(), dl16), dtype=np.float32).reshape(t.shape)
            return torch.from_numpy(v)

        wide = [device(t) if t.dtype == torch.float16 else t for t in sample.tensors]
        outs = torch.utils._pytree.tree_leaves(sample(*wide))
        res = []
        for o, o16 in zip(outs, torch.utils._pytree.tree_leaves(sample(*sample.tensors))):
            if o16.dtype == torch.float16:
                rounded = np.asarray(formats.round_to(o.float().numpy(), dl16), dtype=np.float32).reshape(o.shape)
                with np.errstate(over="ignore"):  # beyond float16's range is inf on the host, as fspyre returns
                    res.append(rounded.astype(np.float16))
            else:
                res.append(to_numpy(o).astype(to_numpy(o16).dtype))
        return res
    return [to_numpy(o) for o in torch.utils._pytree.tree_leaves(sample(*sample.tensors))]


def _compare(names: Sequence[str], got: dict[str, np.ndarray], want: Sequence[np.ndarray], dtype: torch.dtype) -> str:
    rtol, atol = DLF16_TOL if dtype == torch.float16 else FP32_TOL
    for name, w in zip(names, want):
        g = np.asarray(got[name])
        if g.shape != w.shape:
            return f"{name}: shape {list(g.shape)}, eager {list(w.shape)}"
        if w.dtype.kind in "biu":
            if not np.array_equal(g, w):
                return f"{name}: {int((g != w).sum())} of {w.size} values differ"
            continue
        a, b = g.astype(np.float64), w.astype(np.float64)
        close = np.isclose(a, b, rtol=rtol, atol=atol, equal_nan=True)
        if not close.all():
            i = int(np.argmin(close.ravel()))
            return (f"{name}: {int((~close).sum())} of {w.size} values off, e.g. {a.ravel()[i]!r} vs eager "
                    f"{b.ravel()[i]!r} (rtol {rtol:.3g}, atol {atol:.3g})")
    return ""


if __name__ == "__main__":
    sys.exit(main())
