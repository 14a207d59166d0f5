"""Hypothesis strategies for random fspyre graphs, built only through ``GraphBuilder``.

    from fspyre.testing import graphs, programs, inputs_for

    @given(graphs(max_ops=6, kinds=("pointwise",)))
    def test_something(graph): ...

``programs()`` draws a ``GraphProgram``: the built ``Graph`` plus ``source``, Python that
rebuilds it with the builder. Its repr is that source, so a falsifying example prints as a
ready-to-run reproduction. ``graphs()`` is ``programs()`` mapped to the graph.

What a drawn graph holds
------------------------
A DAG (every operand is picked among *all* earlier values, not only the last one) over one
to four named base dims, made of: graph inputs (a subset of the base dims in any order, some
dims size 1 so they broadcast); pointwise unary, binary (with a Python scalar on either side),
comparison and ``where`` ops, broadcasting by dim name; filled constants; casts; reductions
(sum, amax, amin, mean, prod, var; one or more dims; keepdim); matmuls, with batch dims
when both operands share more than the contracted dim (a size-1 batch dim on one side is
expanded first, since matmul does not broadcast); views (permute, unsqueeze, expand of size-1
dims and new leading dims, contiguous reshape that merges adjacent dims or splits a merged
dim back); and one or more outputs (the last value always, others at random, possibly an
input or a view, possibly the same value twice). ``kinds`` chooses among the op families
"pointwise", "reduction" and "matmul"; inputs and views are always drawn.

Sizes
-----
The structure is drawn first, sizes last, so shrinking simplifies the program and the sizes
independently (sizes shrink towards 1). A base dim is one or (sometimes) two *atoms*, each with
a drawn size, so a reshape can also split an input dim or cut a merged dim inside one of the
dims it merged. Each base dim's size is at most ``max_size`` (200)
and comes half the time from stick-relevant sizes (63, 64, 65, 128, 129, 192, ...: whole,
partial and multiple sticks of 64 half-precision or 32 single-precision elements). The
sizes are drawn so that every tensor and every op's iteration space holds at most
``max_elements`` (65,536) elements: a base dim appearing k times in one iteration space (a
merged dim next to one of its factors) counts k times in that budget.

Keeping comparisons meaningful
------------------------------
Random programs easily overflow to inf/NaN everywhere or amplify rounding noise; both sides
then "agree" about nothing useful, or disagree about noise. Guards, inserted as ordinary
builder ops (so ``source`` shows them), keep values bounded and finite:

- ``log``, ``sqrt``, ``rsqrt``, ``reciprocal`` read ``abs(x) + 1``; ``div`` divides by
  ``abs(b) + 1`` (a scalar divisor ``s`` becomes ``abs(s) + 1``); ``pow`` raises ``abs(a) + 1``.
- Each value carries a bound on its magnitude (inputs: floats 2, ints 8, bools 1; see
  ``fspyre.machine.hostio.random_inputs``). ``exp`` of a float input whose bound exceeds 8,
  a float ``pow`` exponent bounded above 3, a ``mul``/``matmul`` whose product bound would
  exceed 1e4 and a ``pow`` result bound above 1e4 first pass the offending float operand
  through ``tanh``. Integer values are not guarded: their overflow wraps identically in the
  evaluator and the interpreter, so it stays comparable.
- ``prod`` of a float ``x`` over n elements reads ``exp(tanh(x) * (1/n))``, so the product
  lies in [1/e, e] whatever n is. ``var`` uses correction 1, or 0 when it reduces one element.

Reductions and matmuls may legally sum in a different order on the device, so their float
results are *inexact*: they agree with the reference only within ``fspyre.check``'s
tolerance (a couple of units in the last place of the output format). Discontinuous or
error-amplifying ops would turn that noise into arbitrary differences, so inexact values
never feed comparisons, ``where`` conditions, int/bool casts, ``logical_not``, ``exp``,
``log``, ``pow``, ``div``, ``sum``/``mean``/``var``/``prod``/``matmul``, nor any op whose
result format is finer than theirs (float16 noise cannot be judged at float32 tolerance).
They do feed neg, abs, relu, copy, maximum, minimum, ``where`` branches, amax, amin and casts
to the same or a coarser float, and at most one rounding op (add, sub or mul with an exact
operand, tanh, sigmoid, a cast to a coarser float) after the reduction. Integer reductions
are exact (wrapping integer sums do not depend on order).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import reject
from hypothesis import strategies as st

from fspyre.errors import GraphError
from fspyre.ir.builder import GraphBuilder, Tensor
from fspyre.ir.dtypes import DTYPES, is_float, promote, promote_scalar
from fspyre.ir.frozen import FrozenMap
from fspyre.ir.graph import UNARY, Dim, Graph, Reduction, iteration_dims
from fspyre.machine.hostio import random_inputs

KINDS: tuple[str, ...] = ("pointwise", "reduction", "matmul")
# Default base dim names: several clash with sympy names (N, E, S, I, Q, O, beta, gamma), so
# every drawn graph also checks that dims are plain symbols everywhere, JSON included.
DIM_NAMES: tuple[str, ...] = ("M", "N", "K", "E", "S", "I", "beta", "gamma", "Q", "O")
# Whole, partial and multiple sticks (64 elements of fp16/bf16, 32 of fp32/int32). Small first:
# sampled_from shrinks towards the front.
STICK_SIZES: tuple[int, ...] = (1, 2, 3, 32, 33, 63, 64, 65, 96, 127, 128, 129, 192, 200)
MAX_RANK = 5  # tensors stay within the device layout's host rank limit (6) with a margin

_UNARY_FNS = tuple(f for f in UNARY if f != "cast")
_BINARY_FNS = ("add", "mul", "sub", "maximum", "minimum", "div", "pow")
_COMPARE_FNS = ("gt", "lt", "ge", "le", "eq", "ne")
_REDUCE_FNS = ("sum", "amax", "amin", "mean", "prod", "var")
_SCALARS: tuple[float | int | bool, ...] = (2, -1, 0.5, 3, -1.5, 0.25, 1, True, 0)
_POSITIVE_READS = ("log", "sqrt", "rsqrt", "reciprocal", "log1p")
_LIMIT = 1e4  # magnitude bound beyond which a float operand is squashed with tanh
_INPUT_BOUND = {"float16": 2.0, "bfloat16": 2.0, "float32": 2.0, "int32": 8.0, "bool": 1.0}

# Inexact values: which ops may read them (see the module docstring).
_NO_ROUND = frozenset({
    "neg", "abs", "relu", "copy", "maximum", "minimum", "where", "amax", "amin", "cast",
    "permute", "unsqueeze", "expand", "reshape",  # views: the same values
})
_ONE_ROUND = frozenset({"add", "sub", "mul", "tanh", "sigmoid"})
_INEXACT_REDUCTIONS = frozenset({"sum", "mean", "var", "prod", "matmul"})
_COARSENESS = {"float32": 0, "float16": 1, "bfloat16": 2}  # fewer fraction bits -> coarser
_MAX_ROUNDS = 2


# ---------------------------------------------------------------------------------------------
# the drawn program


@dataclass(frozen=True, slots=True, kw_only=True)
class GraphProgram:
    """A drawn graph and the builder source that rebuilds it (``exec`` it; it binds ``graph``)."""

    graph: Graph
    source: str
    sizes: FrozenMap[str, int]  # base dim name -> size

    def __repr__(self) -> str:
        return f"GraphProgram(source=\n{self.source})"

    def _repr_pretty_(self, p, cycle) -> None:  # hypothesis prints falsifying examples this way
        p.text(repr(self))


def inputs_for(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """Deterministic random inputs for ``graph`` (``fspyre.machine.hostio.random_inputs``)."""
    table = graph.buffer_table()
    return random_inputs({n: table[n].type for n in graph.inputs}, seed)


def has_reduction(graph: Graph) -> bool:
    """True when some op reduces: then equality is within tolerance, not bit-exact."""
    return any(isinstance(op, Reduction) for op in graph.ops)


# ---------------------------------------------------------------------------------------------
# sizes and dims


def dim_sizes(max_size: int = 200) -> st.SearchStrategy[int]:
    """A dim size in 1..max_size, half the time a stick-relevant one."""
    if max_size < 1:
        raise ValueError(f"dim_sizes: max_size {max_size} must be >= 1")
    special = [s for s in STICK_SIZES if s <= max_size]
    return st.one_of(st.sampled_from(special), st.integers(1, max_size))


@st.composite
def dims(
    draw, names: Sequence[str] = DIM_NAMES, *, min_rank: int = 1, max_rank: int = 3,
    max_size: int = 200, max_elements: int = 65536,
) -> tuple[Dim, ...]:
    """Distinct named dims (names from ``names``) whose sizes multiply to at most ``max_elements``."""
    rank = draw(st.integers(min_rank, min(max_rank, len(names))))
    chosen = draw(st.lists(st.sampled_from(tuple(names)), min_size=rank, max_size=rank, unique=True))
    out, used = [], 1
    for name in chosen:
        cap = max(1, min(max_size, max_elements // used))
        size = draw(dim_sizes(cap))
        used *= size
        out.append(Dim(name, size))
    return tuple(out)


# ---------------------------------------------------------------------------------------------
# program steps: what was drawn, independent of sizes


@dataclass(frozen=True, slots=True)
class _Lit:
    value: float | int | bool


@dataclass(frozen=True, slots=True)
class _Step:
    """One drawn step. ``args`` are value indices or ``_Lit`` scalars; ``dims`` are
    ``(name, is_size_one)`` pairs; the other fields depend on ``kind``."""

    kind: str
    fn: str = ""
    args: tuple[int | _Lit, ...] = ()
    dims: tuple[tuple[str, bool], ...] = ()
    names: tuple[str, ...] = ()
    dtype: str = ""
    flag: bool = False
    pos: int = 0


@dataclass(frozen=True, slots=True)
class _Fact:
    """What the planner knows about a value without sizes."""

    dtype: str
    inexact: bool = False
    rounds: int = 0  # roundings since the reduction that made it inexact


def _follow(fn: str, ins: Sequence[_Fact], out_dtype: str) -> _Fact | None:
    """The fact of ``fn``'s result, or None when an inexact operand may not feed it."""
    noisy = [f for f in ins if f.inexact]
    if not noisy:
        return _Fact(out_dtype)
    if out_dtype not in _COARSENESS or any(_COARSENESS[out_dtype] < _COARSENESS[f.dtype] for f in noisy):
        return None
    rounds = max(f.rounds for f in noisy)
    if fn in _ONE_ROUND:
        if len(noisy) > 1:
            return None
        rounds += 1
    elif fn not in _NO_ROUND:
        return None
    elif any(_COARSENESS[out_dtype] > _COARSENESS[f.dtype] for f in noisy):
        rounds += 1  # the store re-rounds into the coarser format
    return _Fact(out_dtype, True, rounds) if rounds <= _MAX_ROUNDS else None


def _reduced(dtype: str) -> _Fact:
    """A sum-like reduction's result: inexact when it is a float (order may differ)."""
    return _Fact(dtype, True, 1) if is_float(dtype) else _Fact(dtype)


def _power(base: float, exponent: float) -> float:
    """``base ** exponent`` for bounds, inf instead of OverflowError."""
    if base <= 1:
        return 1.0
    return math.exp(min(exponent * math.log(base), 700.0))


# ---------------------------------------------------------------------------------------------
# realizing steps on a GraphBuilder (also records the source)


class _Realizer:
    """Replays steps on a GraphBuilder at given sizes, inserting the guards of the module
    docstring, and records the equivalent Python source."""

    def __init__(self, name: str, factors: Mapping[str, tuple[str, ...]], sizes: Mapping[str, int],
                 facts: Sequence[_Fact]) -> None:
        self.g = GraphBuilder(name)
        self.factors = factors
        self.sizes = sizes
        self.facts = facts
        self.lines = ["import fspyre", "from fspyre import Dim", "", f"g = fspyre.GraphBuilder({name!r})"]
        self.values: list[Tensor] = []
        self._var: dict[int, str] = {}
        self._bound: dict[int, float] = {}
        self._keep: list[Tensor] = []  # keeps every handle alive so id() stays unique
        self._declared: set[str] = set()
        self._inputs = 0
        self._outputs = 0

    # -- source recording ---------------------------------------------------------------------
    def _fmt(self, x) -> str:
        if isinstance(x, Tensor):
            return self._var[id(x)]
        if isinstance(x, Dim):
            return f"Dim({x.name!r}, {x.size})"
        if isinstance(x, (list, tuple)):
            return "(" + ", ".join(self._fmt(v) for v in x) + ("," if len(x) == 1 else "") + ")"
        return repr(x)

    def call(self, method: str, *args, bound: float, **kwargs) -> Tensor:
        t = getattr(self.g, method)(*args, **kwargs)
        var = f"v{len(self._var)}"
        parts = [self._fmt(a) for a in args] + [f"{k}={self._fmt(v)}" for k, v in kwargs.items()]
        self.lines.append(f"{var} = g.{method}({', '.join(parts)})")
        self._var[id(t)] = var
        self._bound[id(t)] = bound
        self._keep.append(t)
        return t

    def bound(self, x: Tensor | _Lit) -> float:
        return abs(float(x.value)) if isinstance(x, _Lit) else self._bound[id(x)]

    # -- dims -------------------------------------------------------------------------------------
    def size(self, name: str) -> int:
        return math.prod(self.sizes[f] for f in self.factors[name])

    def dim(self, name: str, one: bool) -> Dim | str:
        if one or name not in self.factors:
            return Dim(name, 1)
        if name not in self._declared:
            self._declared.add(name)
            size = self.size(name)
            self.g.dim(name, size)
            self.lines.append(f"g.dim({name!r}, {size})")
        return name

    # -- guards ---------------------------------------------------------------------------------
    def squash(self, x: Tensor) -> Tensor:
        return self.call("tanh", x, bound=1.0)

    def positive(self, x: Tensor | _Lit) -> Tensor | float | int:
        """``abs(x) + 1``: at least 1, so log/sqrt/rsqrt/reciprocal/div/pow stay finite."""
        if isinstance(x, _Lit):
            return abs(x.value) + 1
        return self.call("add", self.call("abs", x, bound=self.bound(x)), 1, bound=self.bound(x) + 1)

    def squashable(self, x: Tensor | _Lit, index: int | _Lit) -> bool:
        return isinstance(x, Tensor) and is_float(x.dtype) and not (
            isinstance(index, int) and self.facts[index].inexact
        )

    # -- steps ----------------------------------------------------------------------------------
    def operand(self, a: int | _Lit) -> Tensor | _Lit:
        return a if isinstance(a, _Lit) else self.values[a]

    @staticmethod
    def raw(x: Tensor | _Lit):
        return x.value if isinstance(x, _Lit) else x

    def apply(self, step: _Step) -> Tensor | None:
        fn, k = step.fn, step.kind
        xs: list[Any] = [self.operand(a) for a in step.args]
        if k == "input":
            name = f"x{self._inputs}"
            self._inputs += 1
            dims = [self.dim(n, one) for n, one in step.dims]
            return self.call("input", name, dims, step.dtype, bound=_INPUT_BOUND[step.dtype])
        if k == "output":
            self.g.output(f"out{self._outputs}", xs[0])
            self.lines.append(f"g.output('out{self._outputs}', {self._fmt(xs[0])})")
            self._outputs += 1
            return None
        if k == "unary":
            return self.unary(fn, xs[0], step.args[0])
        if k == "cast":
            return self.call("cast", xs[0], step.dtype, bound=1.0 if step.dtype == "bool" else self.bound(xs[0]))
        if k == "binary":
            return self.binary(fn, xs, step.args)
        if k == "compare":
            return self.call(fn, *map(self.raw, xs), bound=1.0)
        if k == "where":
            return self.call("where", *map(self.raw, xs), bound=max(self.bound(xs[1]), self.bound(xs[2])))
        if k == "constant":
            dims = [self.dim(n, one) for n, one in step.dims]
            return self.call("constant", xs[0].value, step.dtype, dims, bound=self.bound(xs[0]))
        if k == "reduce":
            return self.reduce(fn, xs[0], step.names, step.flag)
        if k == "matmul":
            a, b = xs
            for i, v in enumerate((a, b)):
                if self.squashable(v, step.args[i]) and self.bound(v) > 4:
                    a, b = (self.squash(v), b) if i == 0 else (a, self.squash(v))
            ksize = self.size(step.names[0])
            return self.call("matmul", a, b, contract=step.names[0], bound=ksize * self.bound(a) * self.bound(b))
        if k == "permute":
            return self.call("permute", xs[0], tuple(step.names), bound=self.bound(xs[0]))
        if k == "unsqueeze":
            return self.call("unsqueeze", xs[0], step.pos, step.names[0], bound=self.bound(xs[0]))
        if k in ("expand", "reshape"):
            dims = [self.dim(n, one) for n, one in step.dims]
            return self.call(k, xs[0], dims, bound=self.bound(xs[0]))
        raise AssertionError(f"unknown step kind {k}")

    def unary(self, fn: str, x: Tensor, index: int | _Lit) -> Tensor:
        b = self.bound(x)
        if fn in _POSITIVE_READS:
            y = self.positive(x)
            out = {"log": math.log1p(b), "sqrt": math.sqrt(b + 1)}.get(fn, 1.0)
            return self.call(fn, y, bound=out)
        if fn == "exp":
            if b > 8 and self.squashable(x, index):
                x, b = self.squash(x), 1.0
            return self.call("exp", x, bound=math.exp(min(b, 700)))
        bounds = {"sigmoid": 1.0, "tanh": 1.0, "logical_not": 1.0}
        return self.call(fn, x, bound=bounds.get(fn, b))

    def binary(self, fn: str, xs: list, idx: Sequence[int | _Lit]) -> Tensor:
        a, b = xs
        if fn == "div":
            return self.call("div", self.raw(a), self.positive(b), bound=self.bound(a))
        if fn == "pow":
            if self.squashable(b, idx[1]) and self.bound(b) > 3:
                b = self.squash(b)
            eb = self.bound(b)
            if _power(self.bound(a) + 1, eb) > _LIMIT and self.squashable(a, idx[0]):
                a = self.squash(a)
            bound = _power(self.bound(a) + 1, eb)
            return self.call("pow", self.positive(a), self.raw(b), bound=bound)
        if fn == "mul":
            for i in sorted((0, 1), key=lambda i: -self.bound(xs[i]) if isinstance(xs[i], Tensor) else 0):
                if self.bound(a) * self.bound(b) <= _LIMIT:
                    break
                if self.squashable(xs[i], idx[i]) and self.bound(xs[i]) > 1:
                    a, b = (self.squash(a), b) if i == 0 else (a, self.squash(b))
            return self.call("mul", self.raw(a), self.raw(b), bound=self.bound(a) * self.bound(b))
        if fn in ("add", "sub"):
            return self.call(fn, self.raw(a), self.raw(b), bound=self.bound(a) + self.bound(b))
        return self.call(fn, self.raw(a), self.raw(b), bound=max(self.bound(a), self.bound(b)))

    def reduce(self, fn: str, x: Tensor, names: tuple[str, ...], keepdim: bool) -> Tensor:
        n = math.prod(d.size for d in x.dims if d.name in names)
        b = self.bound(x)
        if fn == "prod":
            if is_float(x.dtype):
                y = self.call("mul", self.squash(x), 1.0 / n, bound=1.0 / n)
                return self.call("prod", self.call("exp", y, bound=math.e), list(names), keepdim=keepdim, bound=math.e)
            return self.call("prod", x, list(names), keepdim=keepdim, bound=min(_power(b, n), 2.0**31))
        if fn == "var":
            correction = 1 if n > 1 else 0
            return self.call("var", x, list(names), keepdim=keepdim, correction=correction, bound=2 * b * b)
        out = {"sum": n * b}.get(fn, b)
        return self.call(fn, x, list(names), keepdim=keepdim, bound=out)

    def source(self) -> str:
        return "\n".join(self.lines + ["graph = g.build()", ""])


# ---------------------------------------------------------------------------------------------
# the planner: draws steps against a builder at placeholder sizes


# Distinct, and whole sticks for every dtype, so a size-dependent builder rule (say, on stick
# alignment) does not refuse the structure before the real sizes are drawn.
_PLACEHOLDER_SIZES = (64, 128, 192, 256, 320, 384, 448, 512)


class _Planner:
    def __init__(self, draw, base: Sequence[str], dtypes: Sequence[str], kinds: Sequence[str]) -> None:
        self.draw = draw
        self.base = tuple(base)
        self.dtypes = tuple(dtypes)
        self.kinds = tuple(kinds)
        # A dim's size is the product of its atoms' sizes. A base dim of two atoms can be split
        # between them, and a merged dim anywhere along its atoms: inside an original dim too.
        self.factors: dict[str, tuple[str, ...]] = {
            n: tuple(f"{n}#{i}" for i in range(2 if self.rare() else 1)) for n in self.base
        }
        self.atoms = tuple(a for n in self.base for a in self.factors[n])
        self.steps: list[_Step] = []
        self.value_steps: list[_Step] = []  # the step that made each value
        self.facts: list[_Fact] = []
        self.fresh = 0
        sizes = dict(zip(self.atoms, _PLACEHOLDER_SIZES))
        self.r = _Realizer("plan", self.factors, sizes, self.facts)

    # -- helpers --------------------------------------------------------------------------------
    @property
    def n(self) -> int:
        return len(self.r.values)

    def t(self, i: int) -> Tensor:
        return self.r.values[i]

    def rare(self) -> bool:
        return self.draw(st.integers(0, 3)) == 3

    def pick(self, cands: Sequence[int]) -> int:
        return self.draw(st.sampled_from(tuple(cands)))

    def exact(self) -> list[int]:
        return [i for i in range(self.n) if not self.facts[i].inexact]

    def refs(self, t: Tensor) -> tuple[tuple[str, bool], ...]:
        return tuple((d.name, d.size == 1) for d in t.dims)

    def full(self, name: str, one: bool) -> bool:
        """A dim with its full size (not a size-1 copy, not an unsqueezed fresh name)."""
        return not one and name in self.factors

    def new_name(self, prefix: str) -> str:
        self.fresh += 1
        return f"{prefix}{self.fresh}"

    def push(self, step: _Step, fact: _Fact | None = None, *, reduced: bool = False) -> int:
        """Apply ``step`` at placeholder sizes. The result's fact is ``fact``, or that of a
        sum-like reduction when ``reduced``, or else follows from the operands."""
        t = self.r.apply(step)
        self.steps.append(step)
        if t is None:  # an output
            return -1
        self.value_steps.append(step)
        if reduced:
            fact = _reduced(t.dtype)
        if fact is None:
            ins = [self.facts[a] for a in step.args if isinstance(a, int)]
            fact = _follow(step.fn or step.kind, ins, t.dtype)
            assert fact is not None, f"planner let an inexact value into {step}"
        self.facts.append(fact)
        self.r.values.append(t)
        return self.n - 1

    def new_input(self, must: Sequence[str] = (), extra: bool = False) -> int:
        """An input over a random subset of base dims (always including ``must``)."""
        order = self.draw(st.permutations(self.base))
        rank = self.draw(st.integers(0, min(len(order), MAX_RANK)))
        names = list(dict.fromkeys([*must, *order[:rank]]))
        if extra and len(names) == len(must):  # a matmul operand needs a dim besides the contracted one
            names += [n for n in order if n not in names][:1]
        names = self.draw(st.permutations(names)) if len(names) > 1 else names
        dims = tuple((n, n not in must and self.rare()) for n in names[:MAX_RANK])
        dtype = self.draw(st.sampled_from(self.dtypes))
        return self.push(_Step("input", dims=dims, dtype=dtype), _Fact(dtype))

    def operand_or_scalar(self, cands: Sequence[int]) -> int | _Lit:
        if not cands or self.rare():
            return _Lit(self.draw(st.sampled_from(_SCALARS)))
        return self.pick(cands)

    def fits(self, *xs: int | _Lit) -> bool:
        names: list[str] = []
        for x in xs:
            if isinstance(x, int):
                names += [n for n in self.t(x).type.names if n not in names]
        return len(names) <= MAX_RANK

    # -- step kinds -----------------------------------------------------------------------------
    def step(self, kind: str) -> None:
        try:
            done = getattr(self, f"_{kind}")()
        except GraphError:
            done = False  # the builder refused the step (push records only steps that built)
        if not done:
            self.new_input()

    def _unary(self) -> bool:
        fn = self.draw(st.sampled_from(_UNARY_FNS))
        ok = fn in _NO_ROUND or fn in _ONE_ROUND
        cands = [i for i in range(self.n) if not self.facts[i].inexact
                 or (ok and _follow(fn, [self.facts[i]], self.facts[i].dtype) is not None)]
        self.push(_Step("unary", fn, (self.pick(cands),)))
        return True

    def _binary_dtype(self, a: int | _Lit, b: int | _Lit) -> str:
        """The builder's result dtype of a binary op (fspyre.ir.dtypes rules)."""
        if isinstance(a, _Lit):
            a, b = b, a
        assert isinstance(a, int), "a binary op has a tensor operand"
        if isinstance(b, _Lit):
            return promote_scalar(self.t(a).dtype, b.value)
        return promote(self.t(a).dtype, self.t(b).dtype)

    def _pair(self, fn: str, a_cands: Sequence[int], b_cands: Sequence[int],
              out_dtype) -> tuple[int | _Lit, int | _Lit] | None:
        """Operands ``(a, b)`` for ``fn`` with a tensor ``a``; b may be a scalar; maybe swapped."""
        a = self.pick(a_cands)
        bs = [b for b in b_cands if self.fits(a, b)]
        bs = [b for b in bs if _follow(fn, [self.facts[a], self.facts[b]], out_dtype(a, b)) is not None]
        b = self.operand_or_scalar(bs)
        if isinstance(b, _Lit) and _follow(fn, [self.facts[a]], out_dtype(a, b)) is None:
            return None
        return (b, a) if self.draw(st.booleans()) else (a, b)

    def _binary(self) -> bool:
        fn = self.draw(st.sampled_from(_BINARY_FNS))
        if fn in _NO_ROUND or fn in _ONE_ROUND:
            pair = self._pair(fn, range(self.n), range(self.n), self._binary_dtype)
        else:
            pair = None
        if pair is None:
            pair = self._pair(fn, self.exact(), self.exact(), self._binary_dtype)
        if pair is None:
            return False
        self.push(_Step("binary", fn, pair))
        return True

    def _compare(self) -> bool:
        fn = self.draw(st.sampled_from(_COMPARE_FNS))
        pair = self._pair(fn, self.exact(), self.exact(), lambda a, b: "bool")
        if pair is None:
            return False
        self.push(_Step("compare", fn, pair))
        return True

    def _where(self) -> bool:
        cond = self.pick(self.exact())
        cands = [i for i in range(self.n) if self.fits(cond, i)]
        a = self.pick(cands)
        rest = [b for b in cands if self.fits(cond, a, b) and _follow(
            "where", [self.facts[a], self.facts[b]], self._binary_dtype(a, b)) is not None]
        b = self.operand_or_scalar(rest)
        if _follow("where", [self.facts[x] for x in (a, b) if isinstance(x, int)], self._binary_dtype(a, b)) is None:
            return False
        branches = (b, a) if self.draw(st.booleans()) else (a, b)
        self.push(_Step("where", "where", (cond, *branches)))
        return True

    def _constant(self) -> bool:
        order = self.draw(st.permutations(self.base))
        rank = self.draw(st.integers(0, min(len(order), MAX_RANK)))
        value = self.draw(st.sampled_from(_SCALARS))
        dtype = self.draw(st.sampled_from(self.dtypes))
        dims = tuple((n, False) for n in order[:rank])
        self.push(_Step("constant", "full", (_Lit(value),), dims=dims, dtype=dtype), _Fact(dtype))
        return True

    def _cast(self) -> bool:
        dtype = self.draw(st.sampled_from(self.dtypes))
        cands = [i for i in range(self.n) if _follow("cast", [self.facts[i]], dtype) is not None]
        self.push(_Step("cast", "cast", (self.pick(cands),), dtype=dtype))
        return True

    def _reduce(self) -> bool:
        fn = self.draw(st.sampled_from(_REDUCE_FNS))
        cands = [i for i in range(self.n) if self.t(i).dims and (
            not self.facts[i].inexact or fn in ("amax", "amin"))]
        if not cands:
            return False
        x = self.pick(cands)
        names = self.t(x).type.names
        over = self.draw(st.lists(st.sampled_from(names), min_size=1, max_size=len(names), unique=True))
        keepdim = self.rare()
        self.push(_Step("reduce", fn, (x,), names=tuple(over), flag=keepdim), reduced=fn in _INEXACT_REDUCTIONS)
        return True

    def _matmul(self) -> bool:
        cands = [i for i in self.exact() if any(self.full(n, one) for n, one in self.refs(self.t(i)))]
        if not cands:
            return False
        a = self.pick(cands)
        ta = self.t(a)
        k = self.draw(st.sampled_from([n for n, one in self.refs(ta) if self.full(n, one)]))
        others = [i for i in self.exact() if (k, False) in self.refs(self.t(i))]
        if not others or self.draw(st.booleans()):
            b = self.new_input(must=(k,), extra=True)
        else:
            b = self.pick(others)
        # matmul does not broadcast batch dims: stretch a size-1 side to the other's size
        for side in (0, 1):
            x, y = (a, b) if side == 0 else (b, a)
            ry = dict(self.refs(self.t(y)))
            stretch = [n for n, one in self.refs(self.t(x)) if one and n in ry and not ry[n] and n in self.factors]
            if stretch:
                dims = tuple((n, one and n not in stretch) for n, one in self.refs(self.t(x)))
                x = self.push(_Step("expand", "expand", (x,), dims=dims))
                a, b = (x, b) if side == 0 else (a, x)
        na, nb = self.t(a).type.names, self.t(b).type.names
        out = [n for n in na if n != k] + [n for n in nb if n != k and n not in na]
        if not out or len(out) > MAX_RANK:
            return False
        self.push(_Step("matmul", "matmul", (a, b), names=(k,)), reduced=True)
        return True

    def _view(self) -> bool:
        kinds = ["permute", "unsqueeze", "expand", "flatten", "split"]
        kind = self.draw(st.sampled_from(kinds))
        return getattr(self, f"_view_{kind}")()

    def _view_permute(self) -> bool:
        cands = [i for i in range(self.n) if len(self.t(i).dims) >= 2]
        if not cands:
            return False
        x = self.pick(cands)
        order = self.draw(st.permutations(self.t(x).type.names))
        self.push(_Step("permute", "permute", (x,), names=tuple(order)))
        return True

    def _view_unsqueeze(self) -> bool:
        cands = [i for i in range(self.n) if len(self.t(i).dims) < MAX_RANK]
        if not cands:
            return False
        x = self.pick(cands)
        names = self.t(x).type.names
        missing = [n for n in self.factors if n not in names]
        name = self.draw(st.sampled_from(missing)) if missing and not self.rare() else self.new_name("U")
        pos = self.draw(st.integers(0, len(names)))
        self.push(_Step("unsqueeze", "unsqueeze", (x,), names=(name,), pos=pos))
        return True

    def _view_expand(self) -> bool:
        def options(i: int) -> tuple[list[str], list[str]]:
            refs = self.refs(self.t(i))
            stretch = [n for n, one in refs if one and n in self.factors]
            lead = [n for n in self.base if n not in dict(refs)] if len(refs) < MAX_RANK else []
            return stretch, lead

        cands = [i for i in range(self.n) if any(options(i))]
        if not cands:
            return False
        x = self.pick(cands)
        stretch, lead = options(x)
        chosen = [n for n in stretch if not self.rare()] if stretch else []
        new = [self.draw(st.sampled_from(lead))] if lead and (not chosen or self.draw(st.booleans())) else []
        if not chosen and not new:
            chosen = stretch[:1]
        dims = tuple((n, False) for n in new) + tuple(
            (n, one and n not in chosen) for n, one in self.refs(self.t(x)))
        self.push(_Step("expand", "expand", (x,), dims=dims))
        return True

    def _view_flatten(self) -> bool:
        cands = [i for i in range(self.n) if len(self.t(i).dims) >= 2]
        if not cands:
            return False
        x = self.pick(cands)
        refs = self.refs(self.t(x))
        start = self.draw(st.integers(0, len(refs) - 2))
        stop = self.draw(st.integers(start + 2, len(refs)))
        merged = refs[start:stop]
        factors = tuple(f for n, one in merged if self.full(n, one) for f in self.factors[n])
        name = self.new_name("F")
        self.factors[name] = factors
        new = (name, not factors)
        self.push(_Step("reshape", "reshape", (x,), dims=refs[:start] + (new,) + refs[stop:]))
        return True

    def _view_split(self) -> bool:
        def splittable(i: int) -> list[int]:
            refs = self.refs(self.t(i))
            if len(refs) >= MAX_RANK:
                return []
            return [j for j, (n, one) in enumerate(refs) if self.full(n, one) and len(self.factors[n]) >= 2]

        cands = [i for i in range(self.n) if splittable(i)]
        if not cands:
            return False
        x = self.pick(cands)
        j = self.draw(st.sampled_from(splittable(x)))
        refs = self.refs(self.t(x))
        parts = self.factors[refs[j][0]]
        cut = self.draw(st.integers(1, len(parts) - 1))
        left, right = self.new_name("P"), self.new_name("P")
        self.factors[left], self.factors[right] = parts[:cut], parts[cut:]
        dims = refs[:j] + ((left, False), (right, False)) + refs[j + 1:]
        self.push(_Step("reshape", "reshape", (x,), dims=dims))
        return True

    def _input(self) -> bool:
        self.new_input()
        return True

    # -- outputs and sizes ------------------------------------------------------------------------
    def outputs(self) -> None:
        """Every computed value nothing reads (so no op goes unchecked), plus a few drawn ones."""
        read = {a for s in self.steps for a in s.args if isinstance(a, int)}
        sinks = [i for i, s in enumerate(self.value_steps) if s.kind != "input" and i not in read]
        extra = self.draw(st.lists(st.integers(0, self.n - 1), max_size=2))
        for i in list(dict.fromkeys(sinks + [self.n - 1])) + extra:
            self.push(_Step("output", "output", (i,)))

    def multiplicity(self) -> dict[str, int]:
        """Per atom, the most times it appears in one tensor or iteration space."""
        graph = self.r.g.build()
        spaces = [iteration_dims(op) for op in graph.ops] + [b.type.dims for b in graph.buffers]
        most = {a: 0 for a in self.atoms}
        for dims_ in spaces:
            count: dict[str, int] = {}
            for d in dims_:
                if d.size > 1:
                    for f in self.factors.get(d.name, ()):
                        count[f] = count.get(f, 0) + 1
            for f, c in count.items():
                most[f] = max(most[f], c)
        return most


_STEP_KINDS = {
    "pointwise": ("unary", "binary", "compare", "where", "constant", "cast"),
    "reduction": ("reduce",),
    "matmul": ("matmul",),
}


@st.composite
def programs(
    draw, *, max_ops: int = 8, dtypes: Sequence[str] = DTYPES, kinds: Sequence[str] = KINDS,
    max_size: int = 200, max_elements: int = 65536, dim_names: Sequence[str] = DIM_NAMES,
    max_base_dims: int = 4,
) -> GraphProgram:
    """A random graph and its builder source. ``max_ops`` counts drawn steps (views included);
    guards and the builder's output copies add ops beyond it."""
    for d in dtypes:
        if d not in DTYPES:
            raise ValueError(f"programs: unknown dtype {d!r}; use some of {DTYPES}")
    for k in kinds:
        if k not in KINDS:
            raise ValueError(f"programs: unknown kind {k!r}; use some of {KINDS}")
    nbase = draw(st.integers(1, min(max_base_dims, len(dim_names), len(_PLACEHOLDER_SIZES) // 2)))
    base = draw(st.lists(st.sampled_from(tuple(dim_names)), min_size=nbase, max_size=nbase, unique=True))
    plan = _Planner(draw, base, dtypes, kinds)
    plan.new_input()
    step_kinds = tuple(s for k in kinds for s in _STEP_KINDS[k])
    step_kinds = step_kinds[:2] + ("view",) + step_kinds[2:] + ("input",)
    for _ in range(draw(st.integers(1, max_ops))):
        plan.step(draw(st.sampled_from(step_kinds)))
    plan.outputs()

    # sizes last: each atom's cap keeps every iteration space within max_elements and every base
    # dim within max_size
    mult = plan.multiplicity()
    sizes: dict[str, int] = {}
    used = 1
    for name in base:
        dim_size = 1
        for atom in plan.factors[name]:
            m = mult[atom]
            if m == 0:
                sizes[atom] = 1
                continue
            cap = max_size // dim_size
            while cap > 1 and used * cap**m > max_elements:
                cap = min(cap - 1, int((max_elements / used) ** (1 / m)))
            sizes[atom] = draw(dim_sizes(max(cap, 1)))
            used *= sizes[atom] ** m
            dim_size *= sizes[atom]

    real = _Realizer("random", plan.factors, sizes, plan.facts)
    try:
        for name in base:
            if any(mult[a] for a in plan.factors[name]):
                real.dim(name, False)
        for step in plan.steps:
            t = real.apply(step)
            if t is not None:
                want = plan.t(len(real.values))
                assert t.dtype == want.dtype and t.type.names == want.type.names, (step, t, want)
                real.values.append(t)
        graph = real.g.build()
    except GraphError:
        # The builder refuses this structure at these sizes (a size-dependent rule): not a graph.
        reject()
    return GraphProgram(graph=graph, source=real.source(), sizes=FrozenMap((n, real.size(n)) for n in base))


def graphs(**kwargs) -> st.SearchStrategy[Graph]:
    """Random graphs; the keywords are those of ``programs``."""
    return programs(**kwargs).map(lambda p: p.graph)
