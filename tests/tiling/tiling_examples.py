"""The tiling examples of issue 3, shared by the example and golden tests."""

from __future__ import annotations

import fspyre
from fspyre.ir.graph import Graph


def canonical(rows: int = 1024, cols: int = 4096) -> Graph:
    """The seed's canonical example: y = a + b; z = y * c, A: 2 outer, B: 4 inner."""
    g = fspyre.GraphBuilder("add_mul")
    A, B = g.dim("A", rows), g.dim("B", cols)
    a, b, c = (g.input(n, (A, B), "float16") for n in "abc")
    with g.hint(slices={"A": 2}):
        with g.hint(slices={"B": 4}):
            y = g.add(a, b)
            z = g.mul(y, c)
    g.output("z", z)
    return g.build()


def softmax_rows() -> Graph:
    """amax, sub, exp, sum, div over the columns, tiled over the rows."""
    g = fspyre.GraphBuilder("softmax_rows")
    g.dim("R", 256)
    g.dim("C", 512)
    x = g.input("x", ["R", "C"], "float16")
    with g.hint(slices={"R": 4}):
        m = g.amax(x, ["C"], keepdim=True)
        e = g.exp(g.sub(x, m))
        y = g.div(e, g.sum(e, ["C"], keepdim=True))
    g.output("y", y)
    return g.build()


def two_groups() -> Graph:
    """Rows in 2 tiles, then columns in 4; y is read inside its loop and after it."""
    g = fspyre.GraphBuilder("two_groups")
    g.dim("A", 256)
    g.dim("B", 256)
    a = g.input("a", ["A", "B"], "float16")
    b = g.input("b", ["A", "B"], "float16")
    with g.hint(slices={"A": 2}):
        y = g.add(a, b)
        z = g.mul(y, y)
    with g.hint(slices={"B": 4}):
        w = g.sub(z, y)
    g.output("w", w)
    return g.build()


def nested_reduction() -> Graph:
    """Row sums: rows outer (an output level), the reduced dim K inner (a reduction level)."""
    g = fspyre.GraphBuilder("nested_reduction")
    g.dim("A", 128)
    g.dim("K", 1024)
    x = g.input("x", ["A", "K"], "float16")
    with g.hint(slices={"A": 2}):
        with g.hint(slices={"K": 4}):
            r = g.sum(g.mul(x, 0.5), ["K"])
    g.output("r", r)
    return g.build()


def matmul(slices: dict[str, int], name: str) -> Graph:
    g = fspyre.GraphBuilder(name)
    g.dim("M", 128)
    g.dim("K", 256)
    g.dim("N", 128)
    a = g.input("a", ["M", "K"], "float16")
    b = g.input("b", ["K", "N"], "float16")
    with g.hint(slices=slices):
        c = g.matmul(a, b)
    g.output("c", c)
    return g.build()


def matmul_m() -> Graph:
    return matmul({"M": 4}, "matmul_m")


def matmul_k() -> Graph:
    return matmul({"K": 4}, "matmul_k")


def softmax_over_its_row() -> Graph:
    """Softmax tiled over the reduced columns (C:4): an online softmax in two loops (three
    loop nests by loop fission with compile(online=False), tests/tiling/test_fission.py)."""
    g = fspyre.GraphBuilder("softmax_over_its_row")
    g.dim("R", 64)
    g.dim("C", 512)
    x = g.input("x", ["R", "C"], "float16")
    with g.hint(slices={"C": 4}):
        m = g.amax(x, ["C"], keepdim=True)
        e = g.exp(g.sub(x, m))
        y = g.div(e, g.sum(e, ["C"], keepdim=True))
    g.output("y", y)
    return g.build()


def softmax_over(rows: int, cols: int, count: int, kind: str = "softmax", dtype: str = "float16",
                 outer: int = 1) -> Graph:
    """softmax or log_softmax over C as the torch front end emits it (a float16 input cast to
    float32 and the result back), tiled over C itself (inside ``outer`` tiles of the rows): an
    online softmax in two loops."""
    g = fspyre.GraphBuilder(f"{kind}_columns")
    B, C = g.dim("B", rows), g.dim("C", cols)
    x = g.input("x", (B, C), dtype)
    with g.hint(slices={"B": outer, "C": count} if outer > 1 else {"C": count}):
        s = g.cast(x, "float32") if dtype != "float32" else x
        d = g.sub(s, g.amax(s, ["C"], keepdim=True))
        e = g.exp(d)
        total = g.sum(e, ["C"], keepdim=True)
        y = g.div(e, total) if kind == "softmax" else g.sub(d, g.log(total))
        if dtype != "float32":
            y = g.cast(y, dtype)
    g.output("y", y)
    return g.build()


def attention(queries: int, keys: int, head: int, slices: dict[str, int] | None, dtype: str = "float16") -> Graph:
    """softmax(q k^T / sqrt(head)) v with the casts of examples/attention.py; ``slices={"Sk": n}``
    tiles the keys: an online softmax carrying its max, sum and value product."""
    g = fspyre.GraphBuilder("attention_keys")
    Sq, Sk, E = g.dim("Sq", queries), g.dim("Sk", keys), g.dim("E", head)
    q, k, v = g.input("q", (Sq, E), dtype), g.input("k", (Sk, E), dtype), g.input("v", (Sk, E), dtype)
    with g.hint(slices=slices or {}):
        s = g.cast(g.mul(g.matmul(q, k, "E"), 1.0 / head ** 0.5), "float32")
        e = g.exp(g.sub(s, g.amax(s, ["Sk"], keepdim=True)))
        p = g.cast(g.div(e, g.sum(e, ["Sk"], keepdim=True)), dtype)
        o = g.matmul(p, v, "Sk")
    g.output("o", o)
    return g.build()


def softmax_columns() -> Graph:
    return softmax_over(64, 1024, 4)


def log_softmax_columns() -> Graph:
    return softmax_over(64, 512, 4, "log_softmax", "float32")


def attention_keys() -> Graph:
    return attention(64, 512, 64, {"Sk": 4})


def var_tiled() -> Graph:
    """var over K tiled K:4 inside a row level: a mean nest, then squared deviations."""
    g = fspyre.GraphBuilder("var_tiled")
    g.dim("A", 128)
    g.dim("K", 1024)
    x = g.input("x", ["A", "K"], "float16")
    with g.hint(slices={"A": 2}):
        with g.hint(slices={"K": 4}):
            v = g.reduce("var", x, ["K"], correction=1)
    g.output("v", v)
    return g.build()


def rows_inside_k() -> Graph:
    """Row sums with the reduced dim K outer and the rows inside it: an accumulator spanning
    the row tiles."""
    g = fspyre.GraphBuilder("rows_inside_k")
    g.dim("A", 256)
    g.dim("K", 512)
    x = g.input("x", ["A", "K"], "float16")
    with g.hint(slices={"K": 4}):
        with g.hint(slices={"A": 2}):
            r = g.sum(x, ["K"])
    g.output("r", r)
    return g.build()


def peeled() -> Graph:
    """Tails on both levels (docs/tiling.md, "Tails"): A: 3 on 100 rows takes tiles of 34, a
    loop of 2 and a tail of 32 rows; B: 2 on 200 fp16 columns takes tiles of 128 (100 is not
    whole 64-element sticks, rounded up), a loop of 1 run in place and a tail of 72."""
    g = fspyre.GraphBuilder("peeled")
    g.dim("A", 100)
    g.dim("B", 200)
    a = g.input("a", ["A", "B"], "float16")
    b = g.input("b", ["A", "B"], "float16")
    with g.hint(slices={"A": 3}):
        with g.hint(slices={"B": 2}):
            y = g.add(a, b)
            z = g.mul(y, a)
    g.output("z", z)
    return g.build()


def peeled_reduction() -> Graph:
    """Row sums with tails on the output level (A: 2 on 100: tiles of 50 rounded up to 64, whole
    sticks of the [A] result, run in place, and a tail of 36) and on the reduction level (K: 3
    on 320 fp16 columns: tiles of 107 rounded up to 128, a loop of 2 and a tail of 64)."""
    g = fspyre.GraphBuilder("peeled_reduction")
    g.dim("A", 100)
    g.dim("K", 320)
    x = g.input("x", ["A", "K"], "float16")
    with g.hint(slices={"A": 2}):
        with g.hint(slices={"K": 3}):
            r = g.sum(g.mul(x, 0.5), ["K"])
    g.output("r", r)
    return g.build()


EXAMPLES = {
    "canonical": canonical,
    "softmax_rows": softmax_rows,
    "two_groups": two_groups,
    "nested_reduction": nested_reduction,
    "matmul_m": matmul_m,
    "matmul_k": matmul_k,
    "softmax_over_its_row": softmax_over_its_row,
    "var_tiled": var_tiled,
    "rows_inside_k": rows_inside_k,
    "softmax_columns": softmax_columns,
    "log_softmax_columns": log_softmax_columns,
    "attention_keys": attention_keys,
    "peeled": peeled,
    "peeled_reduction": peeled_reduction,
}
