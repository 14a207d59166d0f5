"""Tiling-friendly random graphs: the shapes coarse tiling is for.

``fspyre.testing.graphs`` draws sizes such as 63, 129 or 200 on purpose, which few loop counts
divide, so most of its graphs end up untiled. These graphs keep every size a product of small
powers of two (stick multiples where a dim is a stick dim) and build the chains tiling meets
in models: pointwise chains, broadcasts of row and column vectors, keepdim reductions
broadcast back (softmax- and norm-shaped), plain reductions and matmuls.

Values stay comparable the way ``fspyre.testing.graphs`` keeps them: a float reduction's
result (its order may change) only feeds ops that do not amplify rounding noise.
"""

from __future__ import annotations

from hypothesis import strategies as st

from fspyre.ir.builder import GraphBuilder, Tensor
from fspyre.ir.graph import Dim, Graph

_UNARY = ("neg", "abs", "relu", "exp", "sigmoid", "tanh", "copy")
_QUIET_UNARY = ("neg", "abs", "relu", "copy")  # may read a value whose low bits may differ
_BINARY = ("add", "sub", "mul", "maximum", "minimum")
_REDUCE = ("sum", "amax", "amin", "mean", "prod", "var")
_INEXACT = ("sum", "mean", "prod", "var", "matmul")


@st.composite
def tiling_graphs(draw, *, max_steps: int = 6) -> Graph:
    rows = draw(st.sampled_from((8, 16, 32, 64)))
    cols = draw(st.sampled_from((64, 128, 256)))
    batch = draw(st.sampled_from((1, 1, 2, 4)))
    dtype = draw(st.sampled_from(("float16", "float16", "float32", "bfloat16")))
    g = GraphBuilder("tiled")
    dims = (["N"] if batch > 1 else []) + ["A", "B"]
    if batch > 1:
        g.dim("N", batch)
    g.dim("A", rows)
    g.dim("B", cols)
    g.dim("C", 64)
    inputs = 0

    def new_input(names, dt=dtype) -> Tensor:
        nonlocal inputs
        inputs += 1
        return g.input(f"in{inputs}", names, dt)

    # each value: (tensor, exact?)
    values: list[tuple[Tensor, bool]] = [(new_input(dims), True)]
    for _ in range(draw(st.integers(1, max_steps))):
        x, exact = values[draw(st.integers(0, len(values) - 1))]
        kind = draw(st.sampled_from(
            ("unary", "binary", "broadcast", "permuted", "reduce", "reduce", "keepdim", "matmul")))
        names = list(x.type.names)
        if kind == "unary":
            fn = draw(st.sampled_from(_UNARY if exact else _QUIET_UNARY))
            values.append((g.pointwise(fn, x), exact))
        elif kind == "binary":
            fn = draw(st.sampled_from(_BINARY if exact else ("maximum", "minimum")))
            others = [v for v in values if v[0].type.names == x.type.names and (v[1] or not exact)]
            y = draw(st.sampled_from(others))[0] if others and draw(st.booleans()) else new_input(names)
            values.append((g.pointwise(fn, x, y), exact))
        elif kind == "broadcast" and len(names) >= 2:
            # a row vector over the last dim, or a column over the others (keepdim shaped)
            if draw(st.booleans()):
                v = new_input([names[-1]])
            else:
                v = new_input([*names[:-1], Dim(names[-1], 1)])
            fn = draw(st.sampled_from(_BINARY if exact else ("maximum", "minimum")))
            values.append((g.pointwise(fn, x, v), exact))
        elif kind == "permuted" and len(names) >= 2 and exact:
            t = new_input(list(reversed(names)))
            values.append((g.add(x, g.permute(t, names)), True))
        elif kind in ("reduce", "keepdim") and len(names) >= 1 and (exact or kind == "reduce"):
            fn = draw(st.sampled_from(_REDUCE if exact else ("amax", "amin")))
            over = draw(st.sampled_from(names))
            if fn == "prod":  # bounded factors near 1, like fspyre.testing.graphs
                size = x.type.dims[names.index(over)].size
                x = g.exp(g.mul(g.tanh(x), 1.0 / size))
            if kind == "keepdim" and len(names) >= 2:
                r = g.reduce(fn, x, [over], keepdim=True, correction=1 if fn == "var" else 0)
                if fn in _INEXACT:
                    values.append((r, False))
                else:
                    values.append((g.sub(x, r), True))
            else:
                r = g.reduce(fn, x, [over], correction=1 if fn == "var" else 0)
                values.append((r, fn not in _INEXACT and exact))
        elif kind == "matmul" and exact and len(names) >= 2:
            w = new_input([names[-1], "C"])
            values.append((g.matmul(g.tanh(x), w), False))
        else:
            values.append((g.pointwise("neg", x), exact))
    g.output("out", values[-1][0])
    extra = draw(st.lists(st.integers(0, len(values) - 2), max_size=2, unique=True)) if len(values) > 1 else []
    for i, k in enumerate(extra):
        g.output(f"extra{i}", values[k][0])
    return g.build()
