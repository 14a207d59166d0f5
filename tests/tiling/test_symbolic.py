"""Symbolic sizes (issue 13, docs/tiling.md "Symbolic sizes"): a graph over ``g.dim("S")``
compiles once to a program whose counts, sizes and addresses are expressions in ``|S|``,
records what it assumes about ``|S|``, and runs at any size satisfying the assumptions equal
to the untiled graph at that size and to numpy computing it from its definition."""

from __future__ import annotations

import numpy as np
import pytest
import sympy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fspyre
import fspyre.lower.sdsc
from fspyre.check import compare
from fspyre.errors import ExecutionError, FspyreError, HintError
from fspyre.ir.program import LoopSpec, op_specs, walk_specs
from fspyre.ir.serialize import dumps, loads
from fspyre.ir.symbolic import SymbolicSizes, size_symbol
from fspyre.machine.memcheck import check_memory
from fspyre.machine.reference import evaluate_with_bounds
from fspyre.pretty import pretty
from fspyre.stages.symbolic import SymbolicError, instantiate, specialize
from fspyre.testing import examples
from fspyre.testing import numpy_ref as R

pytestmark = pytest.mark.filterwarnings("ignore::fspyre.FspyreWarning")
MACHINE = fspyre.machine.spyre(cores=8)
H, I = 64, 128  # noqa: E741 (the MLP's dims, named as in the graph)


def mlp(tile: int | None = 64, count: int | None = None, name: str = "mlp"):
    """A Llama MLP over a symbolic sequence dim: y = (silu(x w1) * (x w2)) w3."""
    g = fspyre.GraphBuilder(name)
    S = g.dim("S")
    g.dim("H", H)
    g.dim("I", I)
    x = g.input("x", ["S", "H"], "float16")
    w1, w2 = g.input("w1", ["H", "I"], "float16"), g.input("w2", ["H", "I"], "float16")
    w3 = g.input("w3", ["I", "H"], "float16")
    slices = {} if tile is None and count is None else {"S": S.size // tile if tile else count}
    with g.hint(slices=slices):
        h = g.mul(g.silu(g.matmul(x, w1)), g.matmul(x, w2))
        y = g.matmul(h, w3)
    g.output("y", y)
    return g.build()


def quarters(rng, shape, scale=1.0):
    return ((rng.integers(-8, 8, shape) / 4) * scale).astype(np.float16)


def mlp_inputs(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return {"x": quarters(rng, (n, H)), "w1": quarters(rng, (H, I), 0.125), "w2": quarters(rng, (H, I), 0.125),
            "w3": quarters(rng, (I, H), 0.125)}


def mlp_numpy(inputs, fmt: str) -> R.Ref:
    n = inputs["x"].shape[0]
    x = R.exact(["S", "H"], inputs["x"], "float16")
    w1, w2 = R.exact(["H", "I"], inputs["w1"], "float16"), R.exact(["H", "I"], inputs["w2"], "float16")
    w3 = R.exact(["I", "H"], inputs["w3"], "float16")
    a = R.matmul(x, w1, "H", ["S", "I"], "float16", fmt)
    b = R.matmul(x, w2, "H", ["S", "I"], "float16", fmt)
    h = R.pointwise("mul", [R.pointwise("silu", [a], ["S", "I"], (n, I), "float16", fmt), b], ["S", "I"], (n, I),
                    "float16", fmt)
    return R.matmul(h, w3, "I", ["S", "H"], "float16", fmt)


@pytest.fixture(scope="module")
def compiled():
    return fspyre.compile(mlp(), MACHINE)


def run_and_compare(comp, graph, n: int, seed: int = 0) -> None:
    inputs = mlp_inputs(n, seed)
    got = fspyre.run(comp, inputs)
    ref, bounds = evaluate_with_bounds(graph, inputs, MACHINE)  # untiled, at this size
    report = compare(specialize(graph, {"S": n}), got, ref, bounds)
    assert report.equal, str(report)
    assert got["y"].shape == (n, H)
    assert R.accept(got["y"], mlp_numpy(inputs, MACHINE.fp16_format)).all()


# --- the graph -------------------------------------------------------------------------------
def test_a_dim_without_size_is_symbolic_and_round_trips():
    graph = mlp()
    assert graph.symbolic
    x = graph.buffer_table()["x"].type
    assert x.shape == (size_symbol("S"), H)
    assert graph.hints[0].slices["S"] == size_symbol("S") / 64
    assert loads(dumps(graph)) == graph
    assert "|S|" in pretty(graph)


def test_symbolic_count_hint_must_be_a_tile_of_the_dim():
    g = fspyre.GraphBuilder("g")
    S = g.dim("S")
    g.dim("A", 8)
    with pytest.raises(HintError, match="integer tile"):
        with g.hint(slices={"S": S.size * 2}):
            pass
    with pytest.raises(HintError, match="fixed size 8"):
        with g.hint(slices={"A": S.size // 4}):
            pass


# --- compiling once, running at many sizes -----------------------------------------------------
def test_one_program_runs_equal_to_untiled_at_64_128_4096(compiled):
    graph = compiled.graph
    for n in (64, 128, 4096):
        run_and_compare(compiled, graph, n)


def test_the_program_holds_expressions_in_S(compiled):
    p = compiled.program
    s = size_symbol("S")
    loops = [spec for spec, _ in walk_specs(p.body) if isinstance(spec, LoopSpec)]
    assert [sp.count for sp in loops] == [s / 64]
    assert p.hbm_bytes.free_symbols == {s}
    x = next(a for a in p.kernel_args if a.name == "x")
    assert x.host_shape == (s, H)
    # the output's address follows the inputs', whose sizes grow with |S|
    y = next(a for a in op_specs(p)[-1].args if a.name == "buf4")
    assert y.address.free_symbols == {s}
    assert y.tile_advance == (64 * H * 2,)


def test_assumptions_are_recorded_printed_and_round_trip(compiled):
    record = compiled.program.symbolic
    assert isinstance(record, SymbolicSizes)
    kinds = {a.kind: a.value for a in record.assumptions}
    assert kinds["divisible"] == 64 and kinds["at_least"] == 64
    # the HBM bound is the size at which the program's HBM bytes reach the machine's
    bound = kinds["at_most"]
    hbm = compiled.program.hbm_bytes
    assert hbm.subs(size_symbol("S"), bound) <= MACHINE.hbm_bytes < hbm.subs(size_symbol("S"), bound + 1)
    text = pretty(compiled.program)
    assert "|S| % 64 == 0" in text and "|S| >= 64" in text and f"|S| <= {bound}" in text
    assert loads(dumps(compiled.program)) == compiled.program
    assert loads(dumps(record)) == record


@pytest.mark.parametrize("n, what", [(100, "% 64 == 0"), (32, ">= 64")])
def test_a_violated_assumption_is_an_error_naming_the_dim(compiled, n, what):
    with pytest.raises(ExecutionError, match=rf"symbolic dim S = {n} violates .*{what}"):
        fspyre.run(compiled, mlp_inputs(n))


def test_inputs_that_disagree_on_S_are_refused():
    g = fspyre.GraphBuilder("add")
    S = g.dim("S")
    g.dim("A", 64)
    a, b = g.input("a", ["S", "A"], "float16"), g.input("b", ["S", "A"], "float16")
    with g.hint(slices={"S": S.size // 64}):
        y = g.add(a, b)
    g.output("y", y)
    comp = fspyre.compile(g.build(), MACHINE)
    ones = np.ones((128, 64), np.float16)
    assert (fspyre.run(comp, {"a": ones, "b": ones})["y"] == 2).all()
    with pytest.raises(ExecutionError, match=r"symbolic dim S is 128 in input a and 64 in input b"):
        fspyre.run(comp, {"a": ones, "b": ones[:64]})


def test_the_instantiated_program_is_memory_safe(compiled):
    for n in (64, 192, 1024):
        assert check_memory(instantiate(compiled.program, {"S": n})).clean


def test_check_runs_a_symbolic_graph(compiled):
    report = fspyre.check(compiled.graph, machine=MACHINE, comp=compiled)
    assert report.equal, str(report)


@settings(max_examples=examples(12), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(k=st.integers(1, 80), seed=st.integers(0, 2**16))
def test_property_any_size_satisfying_the_assumptions_runs_equal(compiled, k, seed):
    n = 64 * k
    assert not compiled.program.symbolic.violated({"S": n})
    run_and_compare(compiled, compiled.graph, n, seed)


def test_count_form_fixes_the_loop_count(count_form):
    comp = count_form
    loops = [spec for spec, _ in walk_specs(comp.program.body) if isinstance(spec, LoopSpec)]
    assert [sp.count for sp in loops] == [2]
    assert comp.program.symbolic.dims[0].form == "count"
    for n in (128, 256, 1024):
        run_and_compare(comp, comp.graph, n)


def test_no_hint_gives_a_default_tile_and_warns():
    with pytest.warns(fspyre.FspyreWarning, match="fixed tiles of 64"):
        comp = fspyre.compile(mlp(tile=None), MACHINE)
    run_and_compare(comp, comp.graph, 192)


# --- tiles of one element: |S| = 1 is one tile --------------------------------------------------
def rows(tile: int = 1):
    """``sum(x * w, K)`` over ``[B, S, K]``: S between two fixed dims, tiled by ``tile``."""
    g = fspyre.GraphBuilder("rows")
    S = g.dim("S")
    g.dim("B", 3)
    g.dim("K", 96)
    x, w = g.input("x", ["B", "S", "K"], "float16"), g.input("w", ["B", "S", "K"], "float16")
    with g.hint(slices={"S": S.size // tile}):
        y = g.sum(g.mul(x, w), ["K"], keepdim=True)
    g.output("y", y)
    return g.build()


def run_rows(comp, n: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    inputs = {"x": quarters(rng, (3, n, 96)), "w": quarters(rng, (3, n, 96))}
    got = fspyre.run(comp, inputs)
    ref, bounds = evaluate_with_bounds(comp.graph, inputs, MACHINE)
    report = compare(specialize(comp.graph, {"S": n}), got, ref, bounds)
    assert report.equal, str(report)
    fmt = MACHINE.fp16_format
    x, w = (R.exact(["B", "S", "K"], inputs[k], "float16") for k in "xw")
    want = R.reduce("sum", R.pointwise("mul", [x, w], ["B", "S", "K"], (3, n, 96), "float16", fmt), ["K"],
                    ["B", "S", "K"], True, "float16", fmt)
    assert got["y"].shape == (3, n, 1)
    assert R.accept(got["y"], want).all()


@pytest.fixture(scope="module")
def tile_of_one():
    return {"mlp": fspyre.compile(mlp(tile=1), MACHINE), "rows": fspyre.compile(rows(), MACHINE)}


def test_a_tile_of_one_element_assumes_nothing_that_excludes_one(tile_of_one):
    for comp in tile_of_one.values():
        kinds = {a.kind: a.value for a in comp.program.symbolic.assumptions}
        assert kinds["at_least"] == 1 and kinds["divisible"] == 1
        assert not comp.program.symbolic.violated({"S": 1})


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_a_tile_of_one_element_runs_equal_from_one_element(tile_of_one, n):
    """At |S| = 1 a host dim of one element has no stride in the stick layout (-1), where the
    program fitted at |S| >= 2 carries the stride it has at every larger size: the run refused
    the kernel argument though the program is correct there."""
    run_and_compare(tile_of_one["mlp"], tile_of_one["mlp"].graph, n)
    run_rows(tile_of_one["rows"], n)


@settings(max_examples=examples(8), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 9), seed=st.integers(0, 2**16))
def test_property_the_instantiated_kernel_args_are_the_stick_layout(tile_of_one, n, seed):
    from fspyre.machine.formats import FORMATS
    from fspyre.machine.layout import stick_layout

    for comp in tile_of_one.values():
        for arg in instantiate(comp.program, {"S": n}).kernel_args:
            layout = stick_layout(arg.host_shape, FORMATS[arg.device_dtype].elems_per_stick)
            assert (arg.device_size, arg.stride_map) == (layout.device_size, layout.stride_map), arg.name
    run_rows(tile_of_one["rows"], n, seed)


# --- what cannot be symbolic -------------------------------------------------------------------
def test_slicing_a_symbolic_dim_a_reduction_holds_whole_is_refused():
    g = fspyre.GraphBuilder("red")
    S = g.dim("S")
    g.dim("A", 64)
    x = g.input("x", ["A", "S"], "float16")
    with g.hint(slices={"S": S.size // 64}):
        y = g.reduce("sum", x, ["S"])
    g.output("y", y)
    with pytest.raises(SymbolicError, match=r"op \w+: hint scope 0 slices dims \['S'\] of symbolic size \|S\|, "
                                            r"which is held whole \(sum op \w+ reduces over S\); drop the slices"):
        fspyre.compile(g.build(), MACHINE)


def test_two_symbolic_dims_are_refused():
    g = fspyre.GraphBuilder("two")
    g.dim("S")
    g.dim("T")
    x = g.input("x", ["S", "T"], "float16")
    g.output("y", g.exp(x))
    with pytest.raises(SymbolicError, match="one symbolic dim"):
        fspyre.compile(g.build(), MACHINE)


def test_work_div_on_a_symbolic_dim_is_refused():
    g = fspyre.GraphBuilder("wd")
    S = g.dim("S")
    g.dim("A", 64)
    x = g.input("x", ["S", "A"], "float16")
    with g.hint(slices={"S": S.size // 64}, work_div={"S": 4}):
        y = g.exp(x)
    g.output("y", y)
    with pytest.raises(SymbolicError, match="work_div"):
        fspyre.compile(g.build(), MACHINE)


def test_a_symbolic_graph_refuses_an_explicit_plan():
    from fspyre.stages.tiling_plan import TilingOptions, plan_tiling

    graph = mlp()
    plan = plan_tiling(specialize(graph, {"S": 128}), TilingOptions(mode="hints"))
    with pytest.raises(FspyreError, match="symbolic dim"):
        fspyre.compile(graph, MACHINE, tiling=plan)


# --- bundle.mlir and the per-op JSON ----------------------------------------------------------
def test_bundle_takes_S_as_an_index_argument_and_bounds_the_loop_with_it(compiled):
    text = compiled.bundle_mlir
    head = next(line for line in text.splitlines() if "func.func @sdsc_bundle" in line)
    assert head.rstrip().endswith("%S: index) {")
    assert "%loop_bound_0 = arith.divui %S, %loop_bound_0_c0 : index" in text
    assert "scf.for %i_0 = %c0 to %loop_bound_0 step %c1 {" in text


@pytest.fixture(scope="module")
def count_form():
    return fspyre.compile(mlp(tile=None, count=2), MACHINE)


def test_count_form_records_an_LX_bound_and_strides_in_S(count_form):
    record = count_form.program.symbolic
    lx = [a for a in record.assumptions if a.kind == "at_most" and "LX" in a.reason]
    assert lx, "the count form's tiles grow with |S|: their LX must be bounded"
    big = (lx[0].value // 128 + 1) * 128
    with pytest.raises(ExecutionError, match=rf"S = {big} violates .*\|S\| <= {lx[0].value}"):
        instantiate(count_form.program, {"S": big})
    text = count_form.bundle_mlir
    assert "%stride_64S = arith.muli %S, %stride_64S_c0 : index" in text
    assert "%addr_0_step0 = arith.muli %i_0, %stride_64S : index" in text
    assert "%addr_0 = arith.addi %arg_0, %addr_0_step0 : index" in text


@pytest.mark.parametrize("form", ["compiled", "count_form", "probabilities"])
def test_generic_bundle_parses_with_xdsl(form, request):
    compiled = request.getfixturevalue(form)
    pytest.importorskip("xdsl")
    from xdsl.context import Context
    from xdsl.dialects.affine import Affine
    from xdsl.dialects.arith import Arith
    from xdsl.dialects.builtin import Builtin
    from xdsl.dialects.func import Func
    from xdsl.dialects.scf import Scf
    from xdsl.parser import Parser

    ctx = Context(allow_unregistered=True)
    for dialect in (Builtin, Func, Arith, Scf, Affine):
        ctx.load_dialect(dialect)
    module = Parser(ctx, compiled.mlir_generic).parse_module()
    module.verify()
    func = next(op for op in module.walk() if op.name == "func.func")
    assert str(func.body.blocks[0].args[-1].type) == "index"
    size = func.body.blocks[0].args[-1]
    assert any(op.name.startswith("arith.") and size in op.operands for op in module.walk())


def test_sdsc_json_carries_the_expressions(compiled):
    import json

    files = compiled.sdsc
    json.dumps(files)  # strict JSON: expressions are text
    last = files[max(files, key=lambda f: int(f[5:-5]))]
    assert last["loops"][0]["count"] == "|S|/64"
    out = next(t for t in last["tensors"] if t["role"] == "output")
    assert out["device_size"][1] == "|S|" and "|S|" in out["allocation"]["hbm"]
    # at a size, the JSON of the instantiated program has the numbers the expressions give
    concrete = fspyre.lower.sdsc.sdsc_json(instantiate(compiled.program, {"S": 256}))
    got = concrete[max(files, key=lambda f: int(f[5:-5]))]
    assert got["loops"][0]["count"] == 4
    n = sympy.Symbol("n")
    at = sympy.sympify(out["allocation"]["hbm"].replace("|S|", "n"), locals={"n": n}).subs(n, 256)
    assert got["tensors"][-1]["allocation"]["hbm"] == int(at)


# --- printed forms ----------------------------------------------------------------------------
@pytest.mark.parametrize("form", ["compiled", "count_form"])
def test_golden_printed_forms(form, request, golden):
    """Journal: tests/golden/test_symbolic.txt (the symbolic graph, the program with its
    assumptions, bundle.mlir and one op's SDSC JSON)."""
    import json

    comp = request.getfixturevalue(form)
    golden.check(f"{form}.graph", pretty(comp.graph))
    golden.check(f"{form}.program", pretty(comp.program))
    golden.check(f"{form}.program.detailed", pretty(comp.program, detailed=True))
    golden.check(f"{form}.bundle", comp.bundle_mlir)
    files = comp.sdsc
    golden.check(f"{form}.sdsc.last", json.dumps(files[f"sdsc_{len(files) - 1}.json"], indent=1))


def test_count_form_records_the_span_limit_its_growing_tiles_reach(count_form):
    spans = [a for a in count_form.program.symbolic.assumptions if "span limit" in a.reason]
    assert spans and spans[0].kind == "at_most"
    assert spans[0].value * 128 <= MACHINE.span_limit < (spans[0].value + 1) * 128


def test_without_tiling_the_whole_dim_is_one_tile_of_symbolic_size():
    comp = fspyre.compile(mlp(tile=None), MACHINE, tiling="none")
    record = comp.program.symbolic
    assert (record.dims[0].form, record.dims[0].fixed) == ("count", 1)
    assert not [s for s, _ in walk_specs(comp.program.body) if isinstance(s, LoopSpec)]
    assert any("LX" in a.reason for a in record.assumptions if a.kind == "at_most")
    for n in (64, 448):
        run_and_compare(comp, comp.graph, n)


# --- reductions over a symbolic dim: the whole form --------------------------------------------
HEADS, HEAD_DIM = 2, 64


def decode_attention(dtype: str = "float16"):
    """One decode step's attention over a KV cache of symbolic length L: the scores q.k over
    D, their softmax over L and the probabilities times v over L -- three reductions over L."""
    g = fspyre.GraphBuilder("decode_attention")
    g.dim("L")
    g.dim("H", HEADS)
    g.dim("D", HEAD_DIM)
    q = g.input("q", ["H", "D"], dtype)
    k, v = g.input("k", ["H", "L", "D"], dtype), g.input("v", ["H", "L", "D"], dtype)
    s = g.matmul(q, k, "D")
    e = g.exp(g.sub(s, g.amax(s, ["L"], keepdim=True)))
    g.output("o", g.matmul(g.div(e, g.sum(e, ["L"], keepdim=True)), v, "L"))
    return g.build()


def attention_inputs(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return {"q": quarters(rng, (HEADS, HEAD_DIM)), "k": quarters(rng, (HEADS, n, HEAD_DIM), 0.25),
            "v": quarters(rng, (HEADS, n, HEAD_DIM))}


def attention_numpy(inputs, fmt: str) -> R.Ref:
    n = inputs["k"].shape[1]
    q = R.exact(["H", "D"], inputs["q"], "float16")
    k, v = (R.exact(["H", "L", "D"], inputs[x], "float16") for x in "kv")
    s = R.matmul(q, k, "D", ["H", "L"], "float16", fmt)
    m = R.reduce("amax", s, ["L"], ["H", "L"], True, "float16", fmt)
    e = R.pointwise("exp", [R.pointwise("sub", [s, m], ["H", "L"], (HEADS, n), "float16", fmt)], ["H", "L"],
                    (HEADS, n), "float16", fmt)
    l_ = R.reduce("sum", e, ["L"], ["H", "L"], True, "float16", fmt)
    p = R.pointwise("div", [e, l_], ["H", "L"], (HEADS, n), "float16", fmt)
    return R.matmul(p, v, "L", ["H", "D"], "float16", fmt)


@pytest.fixture(scope="module")
def attention():
    return fspyre.compile(decode_attention(), MACHINE, tiling="none")


def run_attention(comp, n: int, seed: int = 0) -> None:
    inputs = attention_inputs(n, seed)
    got = fspyre.run(comp, inputs)
    ref, bounds = evaluate_with_bounds(comp.graph, inputs, MACHINE)
    report = compare(specialize(comp.graph, {"L": n}), got, ref, bounds)
    assert report.equal, str(report)
    assert got["o"].shape == (HEADS, HEAD_DIM)
    assert R.accept(got["o"], attention_numpy(inputs, MACHINE.fp16_format)).all()


def test_reductions_over_a_symbolic_dim_take_the_whole_form(attention):
    record = attention.program.symbolic
    ((dim, form),) = [(d.name, d.form) for d in record.dims]
    assert (dim, form) == ("L", "whole")
    # no loop over L, no multiple of a tile: at least one element, at most what HBM / LX hold
    assert not [spec for spec, _ in walk_specs(attention.program.body) if isinstance(spec, LoopSpec)]
    kinds = sorted(a.kind for a in record.assumptions)
    assert "divisible" not in kinds and [a.value for a in record.assumptions if a.kind == "at_least"] == [1]
    # the scores' stick count steps every 64 elements: a basis of 1, |L| and ceiling(|L|/64)
    # needs three witnesses and two more check it
    assert len(record.witnesses) == 5
    s = size_symbol("L")
    assert any(e.has(sympy.ceiling(s / 64)) for e in _numbers(attention.program))
    assert loads(dumps(attention.program)) == attention.program


def _numbers(program):
    from fspyre.stages.symbolic import _expressions

    return list(_expressions(program))


@pytest.mark.parametrize("n", [1, 2, 3, 63, 64, 65, 128, 129, 1000])
def test_whole_form_runs_equal_at_sizes_on_each_side_of_a_stick(attention, n):
    run_attention(attention, n)


@settings(max_examples=examples(12), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 400), seed=st.integers(0, 2**16))
def test_property_whole_form_runs_equal_to_untiled_and_numpy_at_any_size(attention, n, seed):
    run_attention(attention, n, seed)


def test_whole_form_is_memory_safe_at_its_smallest_sizes_and_a_large_one(attention):
    record = attention.program.symbolic
    least = next(a.value for a in record.assumptions if a.kind == "at_least")
    for n in (least, least + 1, 64, 65, 4096, 100_000):
        assert check_memory(instantiate(attention.program, {"L": n})).clean
    most = min(a.value for a in record.assumptions if a.kind == "at_most")
    with pytest.raises(ExecutionError, match=rf"symbolic dim L = {most + 1} violates the compiled assumption "
                                             rf"\|L\| <= {most} "):
        instantiate(attention.program, {"L": most + 1})


def test_whole_form_under_auto_tiling_runs_equal():
    comp = fspyre.compile(decode_attention(), MACHINE)  # tiling="auto"
    assert comp.program.symbolic.dims[0].form == "whole"
    for n in (5, 70):
        run_attention(comp, n)


def test_a_dim_that_follows_the_symbolic_size_and_a_mean_over_it():
    """A dim of size |L| + 1 (a cache after one more token) beside L: the whole form, |L| bound
    from either input, and a mean whose divisor is |L| + 1."""
    g = fspyre.GraphBuilder("follows")
    L = g.dim("L")
    g.dim("M", L.size + 1)
    g.dim("A", 8)
    x, y = g.input("x", ["A", "M"], "float16"), g.input("y", ["A", "L"], "float16")
    g.output("o", g.add(g.mean(x, ["M"]), g.amax(y, ["L"])))
    comp = fspyre.compile(g.build(), MACHINE, tiling="none")
    assert comp.program.symbolic.dims[0].form == "whole"
    rng = np.random.default_rng(1)
    for n in (1, 2, 40, 64, 200):
        inputs = {"x": quarters(rng, (8, n + 1)), "y": quarters(rng, (8, n))}
        got = fspyre.run(comp, inputs)
        ref, bounds = evaluate_with_bounds(comp.graph, inputs, MACHINE)
        report = compare(specialize(comp.graph, {"L": n}), got, ref, bounds)
        assert report.equal, str(report)
        fmt = MACHINE.fp16_format
        want = R.pointwise("add", [R.reduce("mean", R.exact(["A", "M"], inputs["x"], "float16"), ["M"], ["A"], False,
                                            "float16", fmt),
                                   R.reduce("amax", R.exact(["A", "L"], inputs["y"], "float16"), ["L"], ["A"], False,
                                            "float16", fmt)], ["A"], (8,), "float16", fmt)
        assert R.accept(got["o"], want).all()
    with pytest.raises(ExecutionError, match=r"symbolic dim L is 40 in input x and 41 in input y"):
        fspyre.run(comp, {"x": quarters(rng, (8, 41)), "y": quarters(rng, (8, 41))})


@pytest.fixture(scope="module")
def probabilities():
    """A softmax over L whose probabilities the program keeps: their buffer holds
    ceiling(|L|/64) sticks a head, so LX addresses step with the stick count."""
    g = fspyre.GraphBuilder("probabilities")
    g.dim("L")
    g.dim("H", HEADS)
    g.dim("D", HEAD_DIM)
    q, k = g.input("q", ["H", "D"], "float16"), g.input("k", ["H", "L", "D"], "float16")
    s = g.matmul(q, k, "D")
    e = g.exp(g.sub(s, g.amax(s, ["L"], keepdim=True)))
    g.output("p", g.mul(g.div(e, g.sum(e, ["L"], keepdim=True)), 2.0))
    return fspyre.compile(g.build(), MACHINE, tiling="none")


def test_whole_form_bundle_computes_stick_counts_from_the_size(probabilities):
    text = probabilities.bundle_mlir
    head = next(line for line in text.splitlines() if "func.func @sdsc_bundle" in line)
    assert head.rstrip().endswith("%L: index) {")
    # ceiling(|L|/64) is (|L| + 63) / 64
    sixty_three = next(line for line in text.splitlines() if "arith.constant 63 : index" in line)
    count = sixty_three.split("=")[0].strip().removesuffix("_c0")
    assert f"{count}_addi1 = arith.addi %L, {count}_c0 : index" in text
    assert f"{count} = arith.divui {count}_addi1, {count}_c2 : index" in text
    rng = np.random.default_rng(3)
    for n in (2, 64, 65, 130):
        inputs = {"q": quarters(rng, (HEADS, HEAD_DIM)), "k": quarters(rng, (HEADS, n, HEAD_DIM), 0.25)}
        got = fspyre.run(probabilities, inputs)
        ref, bounds = evaluate_with_bounds(probabilities.graph, inputs, MACHINE)
        assert compare(specialize(probabilities.graph, {"L": n}), got, ref, bounds).equal


def test_the_traffic_report_of_a_symbolic_program_is_refused_with_the_call_that_gives_it(compiled):
    # its bytes are expressions in S: the report is of one size (a raw sympy TypeError before)
    from fspyre.machine.report import traffic_report

    with pytest.raises(ExecutionError, match=r"symbolic in S; report it at one size: .*instantiate"):
        traffic_report(compiled.program)
    at = instantiate(compiled.program, {"S": 256})
    report = traffic_report(at)
    assert report.hbm_bytes > 0 and report.time_ns > 0
