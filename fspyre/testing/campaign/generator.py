"""A seeded random-program generator, independent of ``fspyre.testing``'s strategies.

``generate(seed)`` draws, from ``random.Random(seed)`` alone, a graph through the public
``GraphBuilder`` API, its inputs, a machine, compile options and, beside every builder call,
the same computation on numpy values (``fspyre.testing.numpy_ref``), so each output has an
independent reference with an error bound. One integer reproduces everything.

What it draws: 1-3 named base dims with sizes among 1, 3, 5, 32, 48, 64, 96, 100, 128, 160,
320 (whole and partial sticks); inputs over subsets of them in any order, some dims size 1
(broadcast by name); float16 / float32 / bfloat16 / int32 / bool values; pointwise unary,
binary (tensor or exact scalar operand), comparison, ``where``, cast and constant ops
(including a ``-inf`` constant under ``maximum``); reductions (sum, amax, amin, mean, prod,
var) over any dims, keepdim or not; matmul (with batch dims when the operands share more
than the contracted dim); views (permute, expand of size-1 dims, unsqueeze + expand, squeeze,
reshape that splits a dim or merges two adjacent dims); several outputs. Hint scopes open and
close at random around runs of ops, nested up to three deep, with ``slices`` over output and
reduction dims (mostly divisors, sometimes odd counts that do not divide or a count of 1)
and ``work_div``. Machines have 1..32 cores, default or small LX capacities, DLFloat16 or
IEEE fp16; allocation draws LX planning on/off, each LX solver and HBM reuse on/off.

Values are kept well-conditioned from the data the generator holds: ``log``/``sqrt``/
``rsqrt`` read ``abs(x) + 1`` unless x is already ≥ 0.5, ``reciprocal``/``div`` read
``abs(b) + 0.5`` unless |b| ≥ 0.5, ``pow`` raises ``abs(a) + 0.5`` to an exponent in
[-2, 2], ``exp`` reads ``tanh(x)·4`` when |x| > 4, ``prod`` over n elements reads
``exp(tanh(x)/n)``, and any value above 1e3 in magnitude is scaled by a power of two.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np

import fspyre
from fspyre.ir.builder import GraphBuilder, Tensor
from fspyre.ir.graph import Dim
from fspyre.ir.kinds import Fp16Format
from fspyre.stages.allocation import AllocationOptions
from fspyre.stages.split_plan import SplitOptions
from fspyre.testing import numpy_ref as R

SIZES = (1, 3, 5, 32, 48, 64, 96, 100, 128, 160, 320)
MAX_ELEMS = 12_288  # per tensor / iteration space: a program runs well under a second
UNARY_FLOAT = ("exp", "log", "sqrt", "rsqrt", "reciprocal", "sigmoid", "tanh", "gelu", "silu")
UNARY_ANY = ("neg", "abs", "relu", "copy")
BINARY = ("add", "sub", "mul", "div", "maximum", "minimum", "pow")
COMPARE = ("eq", "ne", "lt", "le", "gt", "ge")
HOST = {"float16": np.float16, "float32": np.float32, "bfloat16": np.float32, "int32": np.int32, "bool": np.bool_}


@dataclass
class Val:
    t: Tensor
    ref: R.Ref

    @property
    def names(self) -> tuple[str, ...]:
        return self.t.type.names


@dataclass
class Generated:
    seed: int
    graph: fspyre.Graph
    inputs: dict[str, np.ndarray]
    refs: dict[str, R.Ref]  # output name -> reference (axes in the output's dim order)
    machine: fspyre.machine.Machine
    split_options: SplitOptions
    allocation_options: AllocationOptions
    hinted: bool  # some slices hint with count > 1 covers an op
    legal: bool  # every slices count divides its dim's remaining range; work_div <= cores
    features: frozenset[str] = field(default_factory=frozenset)
    source: list[str] = field(default_factory=list)  # builder calls, for the reproducer


class _Gen:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.nprng = np.random.default_rng(self.rng.getrandbits(63))
        self.seed = seed
        self.g = GraphBuilder(f"fuzz{seed}")
        self.fmt: Fp16Format = "SEN169_FP16" if self.rng.random() < 0.75 else "IEEE_FP16"
        self.dims: dict[str, int] = {}
        self.pool: list[Val] = []
        self.inputs: dict[str, np.ndarray] = {}
        self.features: set[str] = set()
        self.src: list[str] = []
        self.scopes: list = []  # open hint context managers
        self.scope_slices: list[dict[str, int]] = []
        self.hinted_scope: list[bool] = []
        self.hinted = False
        self.legal = True
        self.counter = 0

    # ---- helpers ------------------------------------------------------------------------
    def fresh(self, p: str) -> str:
        self.counter += 1
        return f"{p}{self.counter}"

    def dim(self, size: int, prefix: str = "D") -> Dim:
        name = self.fresh(prefix)
        self.dims[name] = size
        return self.g.dim(name, size)

    def add(self, t: Tensor, ref: R.Ref, pool: bool = True) -> Val:
        assert tuple(ref.names) == t.type.names and ref.value.shape == t.type.shape, (ref.names, t.type)
        v = Val(t, ref)
        if pool:
            self.pool.append(v)
        return v

    def numel(self, names) -> int:
        return int(np.prod([self.dims.get(n, 1) for n in names]))

    def input(self, dims: list[Dim], dtype: str) -> Val:
        name = f"in{len(self.inputs)}"
        shape = tuple(d.size for d in dims)
        if dtype == "int32":
            a = self.nprng.integers(-8, 8, size=shape).astype(np.int32)
        elif dtype == "bool":
            a = self.nprng.integers(0, 2, size=shape).astype(bool)
        else:  # multiples of 1/64 in [-2, 2): exact in DLFloat16, IEEE fp16, bfloat16 and fp32
            lo = 0 if self.rng.random() < 0.2 else -128
            a = (self.nprng.integers(lo, 128, size=shape) / 64.0).astype(HOST[dtype])
        self.inputs[name] = a
        t = self.g.input(name, dims, dtype)
        self.src.append(f"{name} = g.input({name!r}, {[(d.name, d.size) for d in dims]}, {dtype!r})")
        return self.add(t, R.exact([d.name for d in dims], a.astype(np.float64), dtype))

    def op(self, fn: str, *xs, dtype: str | None = None) -> Val:
        args = [x.t if isinstance(x, Val) else x for x in xs]
        if fn == "cast":
            if dtype is None:
                raise ValueError("a cast needs its dtype")
            t = self.g.cast(args[0], dtype)
        elif fn in COMPARE:
            t = self.g.compare(fn, *args)
        elif fn == "where":
            t = self.g.where(*args)
        else:
            t = getattr(self.g, fn)(*args)
        refs = [x.ref if isinstance(x, Val) else x for x in xs]
        if t.dtype == "bool" and fn not in COMPARE + ("logical_not",) and any(
                not np.isin(r.value if isinstance(r, R.Ref) else r, (0, 1)).all() for r in refs
                if not (fn == "where" and r is refs[0])):
            self.features.add("bool_raw")  # a bool buffer written with values other than 0/1
        ref = R.pointwise(fn, refs, t.type.names, t.type.shape, t.dtype, self.fmt)
        self.features.add(fn)
        self.src.append(f"{t.buffer} = g.{fn}({', '.join(_show(x) for x in xs)}{', ' + repr(dtype) if dtype else ''})")
        return self.add(t, ref)

    def is_float(self, v: Val) -> bool:
        return v.t.dtype in ("float16", "float32", "bfloat16")

    def maxabs(self, v: Val) -> float:
        return float(np.max(np.abs(v.ref.value))) if v.ref.value.size else 0.0

    def tame(self, v: Val, limit: float = 1e3) -> Val:
        """Scale a large float value down by a power of two (exact)."""
        m = self.maxabs(v)
        if self.is_float(v) and m > limit:
            return self.op("mul", v, 2.0 ** -int(np.ceil(np.log2(m / 4))))
        return v

    def pick(self, pred=lambda v: True) -> Val | None:
        cands = [v for v in self.pool if pred(v)]
        if not cands:
            return None
        # prefer recent values: longer chains
        return cands[-1] if self.rng.random() < 0.4 else self.rng.choice(cands)

    # ---- hints ----------------------------------------------------------------------------
    def maybe_scope(self) -> None:
        r = self.rng.random()
        if self.scopes and r < 0.2:
            cm = self.scopes.pop()
            self.scope_slices.pop()
            self.hinted_scope.pop()
            cm.__exit__(None, None, None)
            self.src.append("# end hint")
            return
        if len(self.scopes) >= 3 or r > 0.45:
            return
        names = [n for n, s in self.dims.items() if s > 1]
        if not names:
            return
        slices, work_div = {}, {}
        for n in self.rng.sample(names, k=min(len(names), self.rng.choice((1, 1, 1, 2)))):
            size = self.dims[n]
            used = int(np.prod([s.get(n, 1) for s in self.scope_slices]))
            left = size // used if size % used == 0 else size
            divs = [c for c in range(2, left + 1) if left % c == 0 and c <= 16]
            x = self.rng.random()
            if divs and x < 0.8:
                c = self.rng.choice(divs)
            elif x < 0.9:
                c = self.rng.choice((3, 5, 7))
            else:
                c = 1
            slices[n] = c
        if self.rng.random() < 0.25:
            n = self.rng.choice(names)
            cs = [c for c in (2, 3, 4, 8, 16, 32) if self.dims[n] % c == 0] or [2]
            work_div[n] = self.rng.choice(cs)
        if self.rng.random() < 0.1:
            slices = {}
        if not slices and not work_div:
            return
        for n, c in slices.items():
            used = int(np.prod([s.get(n, 1) for s in self.scope_slices]))
            if self.dims[n] % (used * c):
                self.legal = False
        for n, c in work_div.items():
            if self.dims[n] % c or c > self.cores:
                self.legal = False
        cm = self.g.hint(slices=slices or None, work_div=work_div or None)
        cm.__enter__()
        self.scopes.append(cm)
        self.scope_slices.append(slices)
        self.hinted_scope.append(any(c > 1 for c in slices.values()))
        self.features.add("hint")
        if len(self.scopes) > 1:
            self.features.add("nested_hint")
        self.src.append(f"with g.hint(slices={slices}, work_div={work_div}):  # depth {len(self.scopes)}")

    def note_op(self) -> None:
        if any(self.hinted_scope):
            self.hinted = True

    # ---- steps ----------------------------------------------------------------------------
    def step(self) -> None:
        kind = self.rng.choices(
            ("unary", "binary", "compare", "cast", "reduce", "matmul", "view", "const", "input"),
            weights=(18, 22, 5, 5, 14, 8, 12, 3, 4))[0]
        getattr(self, "s_" + kind)()

    def s_input(self) -> None:
        base = [n for n in self.dims if not n.startswith("R")]  # reshape products stay apart
        k = self.rng.randint(1, min(3, len(base)))
        names = self.rng.sample(base, k)
        dims = [Dim(n, 1) if self.rng.random() < 0.15 else Dim(n, self.dims[n]) for n in names]
        if self.numel([d.name for d in dims]) > MAX_ELEMS:
            return
        self.input(dims, self.dtype())

    def dtype(self) -> str:
        return self.rng.choices(("float16", "float32", "bfloat16", "int32", "bool"), weights=(55, 25, 8, 8, 4))[0]

    def s_unary(self) -> None:
        x = self.pick(lambda v: v.t.dtype != "bool")
        if x is None:
            return
        fn = self.rng.choice(UNARY_FLOAT + UNARY_ANY if self.is_float(x) else UNARY_ANY + ("exp", "sqrt"))
        if fn in ("log", "sqrt", "rsqrt") and float(np.min(x.ref.value - 2 * x.ref.err, initial=1)) < 0.5:
            x = self.op("add", self.op("abs", x), 1)
        if fn == "reciprocal" and float(np.min(np.abs(x.ref.value) - 2 * x.ref.err, initial=1)) < 0.5:
            x = self.op("add", self.op("abs", x), 0.5)
        if fn == "exp" and self.maxabs(x) > 4:
            x = self.op("mul", self.op("tanh", x), 4)
        self.note_op()
        self.op(fn, x)

    def compatible(self, a: Val):
        def ok(b: Val) -> bool:
            if b is a:
                return True
            names = list(dict.fromkeys(list(a.names) + list(b.names)))
            sizes: dict[str, int] = {}
            for v in (a, b):
                for d in v.t.dims:
                    if sizes.get(d.name, 1) not in (1, d.size) and d.size != 1:
                        return False
                    sizes[d.name] = max(sizes.get(d.name, 1), d.size)
            return int(np.prod([sizes[n] for n in names])) <= MAX_ELEMS
        return ok

    def s_binary(self) -> None:
        a = self.pick(lambda v: v.t.dtype != "bool")
        if a is None:
            return
        fn = self.rng.choice(BINARY)
        b: Val | float | int | None
        if self.rng.random() < 0.3:
            b = self.rng.choice((0.5, 2, -1.5, 3, 0.125)) if self.is_float(a) or fn in ("div", "pow") else \
                self.rng.choice((2, -3, 1))
        else:
            b = self.pick(lambda v: v.t.dtype != "bool" and self.compatible(a)(v))
        if fn == "pow":
            a = self.op("add", self.op("abs", a), 0.5) if self.is_float(a) or True else a
            if isinstance(b, Val):
                b = self.op("mul", self.op("tanh", b), 2) if self.is_float(b) else self.op("minimum", self.op(
                    "maximum", b, -2), 2)
            else:
                b = self.rng.choice((0.5, 2, -1, 1.5))
        if fn == "div":
            if isinstance(b, Val) and float(np.min(np.abs(b.ref.value) - 2 * b.ref.err, initial=1)) < 0.5:
                b = self.op("add", self.op("abs", b), 0.5)
        if fn == "mul" and isinstance(b, Val) and self.maxabs(a) * self.maxabs(b) > 1e4:
            a, b = self.tame(a, 30), self.tame(b, 30)
        if a.t.dtype == "int32" and fn in ("mul",) and isinstance(b, Val) and b.t.dtype == "int32":
            if self.maxabs(a) * self.maxabs(b) > 2**20:
                return
        self.note_op()
        # operands swap sides sometimes, but never the guarded divisor or exponent
        swap = self.rng.random() >= 0.8 and isinstance(b, Val) and fn not in ("div", "pow")
        r = self.op(fn, b, a) if swap else self.op(fn, a, b)
        if fn in ("div", "pow") and not np.all(np.isfinite(r.ref.err)):
            self.pool.remove(r)
            return
        self.tame(r)

    def s_compare(self) -> None:
        a = self.pick(lambda v: v.t.dtype != "bool")
        if a is None:
            return
        fn = self.rng.choice(COMPARE)
        # an int tensor meets an int scalar: docs/semantics.md converts a scalar to the compute
        # type (int32 here), so 0.25 would compare as 0 (torch compares as float; reported apart)
        b = self.pick(self.compatible(a)) if self.rng.random() < 0.6 else (0.25 if self.is_float(a) else 1)
        if isinstance(b, Val) and b.t.dtype == "bool":
            b = 0.25 if self.is_float(a) else 1
        self.note_op()
        c = self.op(fn, a, b)
        if self.rng.random() < 0.6:
            x = self.pick(lambda v: v.t.dtype != "bool" and self.compatible(c)(v))
            y = self.pick(lambda v: v.t.dtype != "bool" and self.compatible(c)(v) and (x is None or
                                                                                    self.compatible(x)(v)))
            if x is not None and y is not None and self.numel(set(c.names) | set(x.names) | set(y.names)) <= MAX_ELEMS:
                self.op("where", c, x, y)

    def s_cast(self) -> None:
        x = self.pick()
        if x is None:
            return
        to = self.rng.choice(("float16", "float32", "bfloat16", "int32", "bool"))
        if to == x.t.dtype:
            return
        if to == "int32" and self.maxabs(x) > 1e6:
            return
        self.features.add(f"cast_{to}")
        self.note_op()
        self.op("cast", x, dtype=to)

    def s_const(self) -> None:
        x = self.pick(lambda v: self.is_float(v))
        if x is None:
            return
        self.note_op()
        if self.rng.random() < 0.3:  # -inf under maximum: a running-max initial value
            ds = [d for d in x.t.dims if d.size > 1][:1]
            c = self.g.constant(float("-inf"), x.t.dtype, ds)
            cref = R.exact([d.name for d in ds], np.full([d.size for d in ds], -np.inf), x.t.dtype)
            self.src.append(f"{c.buffer} = g.constant(-inf, {x.t.dtype!r}, {[d.name for d in ds]})")
            self.features.add("const_neg_inf")
            self.op("maximum", x, Val(c, cref))
            return
        value = self.rng.choice((0.0, 1.0, -0.75, 3.5))
        ds = self.rng.sample([d for d in x.t.dims], k=self.rng.randint(0, len(x.t.dims)))
        c = self.g.constant(value, x.t.dtype, ds)
        self.src.append(f"{c.buffer} = g.constant({value}, {x.t.dtype!r}, {[d.name for d in ds]})")
        self.features.add("full")
        cv = self.add(c, R.exact([d.name for d in ds], np.full([d.size for d in ds], value), x.t.dtype))
        self.op(self.rng.choice(("add", "mul", "sub")), x, cv)

    def s_reduce(self) -> None:
        x = self.pick(lambda v: any(d.size > 1 for d in v.t.dims) and v.t.dtype != "bool")
        if x is None:
            return
        fn = self.rng.choice(("sum", "amax", "amin", "mean", "prod", "var"))
        if x.t.dtype == "int32" and fn in ("prod", "var", "mean"):
            fn = "sum"
        cand = [d.name for d in x.t.dims if d.size > 1]
        over = self.rng.sample(cand, k=1 if len(cand) == 1 or self.rng.random() < 0.7 else 2)
        n = self.numel(over)
        if fn == "prod":
            x = self.op("exp", self.op("mul", self.op("tanh", x), 1.0 / 2 ** int(np.ceil(np.log2(n)))))
        keep = self.rng.random() < 0.3
        self.note_op()
        if fn == "var":
            corr = 1 if n > 1 else 0
            t = self.g.var(x.t, over, keepdim=keep, correction=corr)
        else:
            corr = 0
            t = self.g.reduce(fn, x.t, over, keepdim=keep)
        ref = R.reduce(fn, x.ref, over, t.type.names, keep, t.dtype, self.fmt, corr)
        self.features.add(fn)
        if keep:
            self.features.add("keepdim")
        self.src.append(f"{t.buffer} = g.{fn}({x.t.buffer}, {over}, keepdim={keep})")
        self.tame(self.add(t, ref))

    def s_matmul(self) -> None:
        a = self.pick(lambda v: self.is_float(v) and any(d.size > 1 for d in v.t.dims))
        if a is None:
            return
        k = self.rng.choice([d for d in a.t.dims if d.size > 1])
        kname = k.name
        b = self.pick(lambda v: v is not a and self.is_float(v) and any(
            d.name == kname and d.size == k.size for d in v.t.dims) and all(
            d.size == e.size for d in v.t.dims for e in a.t.dims if d.name == e.name))
        if b is None or self.rng.random() < 0.5:
            n = self.dim(self.rng.choice((1, 3, 32, 48, 64, 100)), "N")
            if self.numel(list(a.names) + [n.name]) > MAX_ELEMS:
                return
            b = self.input([Dim(kname, k.size), n], self.rng.choice(("float16", "float32", a.t.dtype)))
        space = set(a.names) | set(b.names)
        if self.numel(space) > 4 * MAX_ELEMS:
            return
        if not (set(a.names) | set(b.names)) - {kname}:
            return
        a, b = self.tame(a, 30), self.tame(b, 30)
        self.note_op()
        dtype = self.rng.choice((None, None, "float32"))
        t = self.g.matmul(a.t, b.t, kname, dtype=dtype)
        ref = R.matmul(a.ref, b.ref, kname, t.type.names, t.dtype, self.fmt)
        self.features.add("matmul")
        if (set(a.names) & set(b.names)) - {kname}:
            self.features.add("batch_matmul")
        self.src.append(f"{t.buffer} = g.matmul({a.t.buffer}, {b.t.buffer}, {kname!r}, dtype={dtype!r})")
        self.tame(self.add(t, ref))

    def s_view(self) -> None:
        x = self.pick()
        if x is None:
            return
        kind = self.rng.choice(("permute", "expand", "unsqueeze", "squeeze", "split", "merge"))
        dims = list(x.t.dims)
        if kind == "permute" and len(dims) > 1:
            order = self.rng.sample(list(x.names), len(dims))
            t = self.g.permute(x.t, order)
            ref = R.permute(x.ref, order)
        elif kind == "expand" and any(d.size == 1 and self.dims.get(d.name, 1) > 1 for d in dims):
            target = [Dim(d.name, self.dims.get(d.name, 1)) for d in dims]
            if self.numel([d.name for d in target]) > MAX_ELEMS:
                return
            t = self.g.expand(x.t, target)
            ref = R.expand(x.ref, t.type.names, t.type.shape)
        elif kind == "unsqueeze" and len(dims) < 3:
            n = self.rng.choice([m for m in self.dims if m not in x.names] or [None])
            if n is None or self.numel(list(x.names) + [n]) > MAX_ELEMS:
                return
            u = self.g.unsqueeze(x.t, 0, n)
            t = self.g.expand(u, [Dim(n, self.dims[n])] + dims)
            ref = R.expand(x.ref, t.type.names, t.type.shape)
        elif kind == "squeeze" and any(d.size == 1 for d in dims) and len(dims) > 1:
            n = self.rng.choice([d.name for d in dims if d.size == 1])
            t = self.g.squeeze(x.t, n)
            ref = R.squeeze(x.ref, n)
        elif kind == "split":
            cands = [(i, d) for i, d in enumerate(dims) if d.size > 1 and _factor(d.size)]
            if not cands:
                return
            i, d = self.rng.choice(cands)
            f = self.rng.choice(_factor(d.size))
            new = [self.dim(f, "R"), self.dim(d.size // f, "R")]
            target = dims[:i] + new + dims[i + 1:]
            t = self.g.reshape(x.t, target)
            ref = R.reshape(_ordered(x), t.type.names, t.type.shape)
        elif kind == "merge" and len(dims) > 1:
            i = self.rng.randrange(len(dims) - 1)
            m = self.dim(dims[i].size * dims[i + 1].size, "R")
            target = dims[:i] + [m] + dims[i + 2:]
            t = self.g.reshape(x.t, target)
            ref = R.reshape(_ordered(x), t.type.names, t.type.shape)
        else:
            return
        self.features.add(kind)
        self.src.append(f"{t.buffer}~view = g.{kind}({x.t.buffer}) -> {t.type}")
        v = self.add(t, ref)
        if self.rng.random() < 0.5:  # read the view at once: a permuted or reshaped load inside a loop nest
            self.note_op()
            self.op("copy" if v.t.dtype == "bool" else self.rng.choice(("neg", "abs", "relu", "copy")), v)

    # ---- the program ----------------------------------------------------------------------
    def build(self) -> Generated:
        rng = self.rng
        self.cores = rng.choice((1, 1, 2, 3, 4, 5, 7, 8, 16, 31, 32, 32))
        lx = rng.choice((None, None, None, 0, 8192, 65536, 262144))
        machine = fspyre.machine.spyre(cores=self.cores, lx_bytes=lx, fp16_format=self.fmt)
        alloc = AllocationOptions(lx_planning=rng.random() < 0.8, lx_solver=rng.choice(("greedy", "firstfit",
                                                                                          "bestfit")),
                                  hbm_reuse=rng.random() < 0.8)
        split = SplitOptions(max_cores=rng.choice((None, None, None, max(1, self.cores // 2))))
        for _ in range(rng.randint(1, 3)):
            self.dim(rng.choice(SIZES), "D")
        nin = rng.randint(1, 2)
        for _ in range(nin):
            self.s_input()
        if not self.pool:
            self.input([Dim(n, s) for n, s in list(self.dims.items())[:1]], "float16")
        for _ in range(rng.randint(1, 8)):
            self.maybe_scope()
            self.step()
        while self.scopes:
            self.scopes.pop().__exit__(None, None, None)
        produced = [v for v in self.pool if v.t.buffer not in self.inputs] or self.pool
        outs = [produced[-1]] + rng.sample(self.pool, k=min(len(self.pool), rng.randint(0, 2)))
        refs = {}
        for i, v in enumerate(outs):
            name = f"out{i}"
            self.g.output(name, v.t)
            refs[name] = v.ref
            self.src.append(f"g.output({name!r}, {v.t.buffer})")
        if len(outs) > 1:
            self.features.add("multi_output")
        graph = self.g.build()
        return Generated(seed=self.seed, graph=graph, inputs=self.inputs, refs=refs, machine=machine,
                         split_options=split, allocation_options=alloc, hinted=self.hinted,
                         legal=self.legal, features=frozenset(self.features), source=self.src)


def _factor(n: int) -> list[int]:
    return [f for f in (2, 3, 4, 5, 8, 16, 32) if n % f == 0 and n // f > 1]


def _ordered(x: Val) -> R.Ref:
    """The reference in the handle's dim order (reshape is row-major over that order)."""
    return R.permute(x.ref, list(x.names))


def _show(x) -> str:
    return x.t.buffer if isinstance(x, Val) else repr(x)


def generate(seed: int) -> Generated:
    return _Gen(seed).build()
