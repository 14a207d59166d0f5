"""A careless user of the public API: every wrong call is a one-line FspyreError naming the
culprit (never AttributeError, KeyError, IndexError or a numpy exception), and numpy integers
are accepted wherever a size or count is expected."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import fspyre
from fspyre.errors import (
    ExecutionError,
    FspyreError,
    GraphError,
    HintError,
    MachineError,
    TilingError,
    WorkDivisionError,
)
from fspyre.pipeline import resume


def builder():
    g = fspyre.GraphBuilder("t")
    A, B = g.dim("A", 4), g.dim("B", 64)
    return g, g.input("x", (A, B), "float32")


def graph() -> fspyre.Graph:
    g, x = builder()
    g.output("y", g.exp(x))
    return g.build()


def int_graph() -> fspyre.Graph:
    g = fspyre.GraphBuilder("ints")
    g.output("y", g.neg(g.input("i", (g.dim("A", 4),), "int32")))
    return g.build()


def unbuilt() -> fspyre.GraphBuilder:
    g, x = builder()
    g.output("y", g.exp(x))
    return g


def from_other_builder(use):
    g, _ = builder()
    _, foreign = builder()
    return use(g, foreign)


def in_hint(**kwargs):
    g, x = builder()
    with g.hint(**kwargs):
        g.output("y", g.exp(x))
    return g.build()


def x_of(call):
    g, x = builder()
    return call(g, x)


X = np.ones((4, 64), np.float32)

MISUSE = [
    ("compile a builder", lambda: fspyre.compile(unbuilt()), GraphError, ["GraphBuilder 't'", ".build()"]),
    ("check a builder", lambda: fspyre.check(unbuilt()), GraphError, [".build()"]),
    ("evaluate a builder", lambda: fspyre.evaluate(unbuilt(), {"x": X}), GraphError, [".build()"]),
    ("run a builder", lambda: fspyre.run(unbuilt(), {"x": X}), ExecutionError, [".build()"]),
    ("run a graph", lambda: fspyre.run(graph(), {"x": X}), ExecutionError, ["fspyre.compile", "evaluate"]),
    ("run a string", lambda: fspyre.run("prog", {"x": X}), ExecutionError, ["str"]),
    ("compile None", lambda: fspyre.compile(None), GraphError, ["NoneType"]),
    ("machine as a string", lambda: fspyre.compile(graph(), machine="spyre"), MachineError, ["'spyre'", "spyre(cores"]),
    ("machine as an int", lambda: fspyre.compile(graph(), machine=32), MachineError, ["machine=32"]),
    ("evaluate machine", lambda: fspyre.evaluate(graph(), {"x": X}, "m"), MachineError, ["machine='m'"]),
    ("check seed", lambda: fspyre.check(graph(), seed="a"), ExecutionError, ["seed='a'"]),
    ("check comp", lambda: fspyre.check(graph(), comp="c"), ExecutionError, ["comp="]),
    ("inputs as a list", lambda: fspyre.run(fspyre.compile(graph()), [X]), ExecutionError, ["dict", "list"]),
    ("inputs None", lambda: fspyre.evaluate(graph(), None), ExecutionError, ["NoneType"]),
    ("ragged input", lambda: fspyre.evaluate(graph(), {"x": [[1, 2], [3]]}), ExecutionError, ["input x"]),
    ("int64 input out of int32 range",
     lambda: fspyre.evaluate(int_graph(), {"i": np.array([1, 2, 3, 2**40])}), ExecutionError,
     ["input i", str(2**40), "int32"]),
    ("tensor of another builder", lambda: from_other_builder(lambda g, t: g.add(t, 1.0)), GraphError,
     ["tensor x", "another GraphBuilder"]),
    ("output of another builder", lambda: from_other_builder(lambda g, t: g.output("y", t)), GraphError,
     ["output y", "another GraphBuilder"]),
    ("matmul of another builder", lambda: from_other_builder(lambda g, t: g.matmul(t, t, "B")), GraphError,
     ["matmul", "another GraphBuilder"]),
    ("view of another builder", lambda: from_other_builder(lambda g, t: g.permute(t, (1, 0))), GraphError,
     ["permute", "another GraphBuilder"]),
    ("ndarray as an operand", lambda: x_of(lambda g, x: g.add(x, X)), GraphError, ["numpy array [4, 64]", "g.input"]),
    ("ndarray as the only operand", lambda: x_of(lambda g, x: g.exp(X)), GraphError, ["exp", "numpy array"]),
    ("ndarray as an output", lambda: x_of(lambda g, x: g.output("y", X)), GraphError, ["output y", "numpy array"]),
    ("string operand", lambda: x_of(lambda g, x: g.mul(x, "2")), GraphError, ["str", "'2'"]),
    ("None operand", lambda: x_of(lambda g, x: g.sub(x, None)), GraphError, ["NoneType"]),
    ("number as an output", lambda: x_of(lambda g, x: g.output("y", 3)), GraphError, ["output y", "3"]),
    ("permute axis out of range", lambda: x_of(lambda g, x: g.permute(x, (0, 5))), GraphError,
     ["permute", "axis 5", "2 dims"]),
    ("permute repeated axis", lambda: x_of(lambda g, x: g.permute(x, (0, 0))), GraphError, ["permute", "exactly once"]),
    ("permute too few axes", lambda: x_of(lambda g, x: g.permute(x, (1,))), GraphError, ["1 given, 2 needed"]),
    ("permute float axis", lambda: x_of(lambda g, x: g.permute(x, (1.0, 0))), GraphError, ["1.0", "integer"]),
    ("permute a string", lambda: x_of(lambda g, x: g.permute(x, "BA")), GraphError, ["'BA'", "list"]),
    ("unsqueeze out of range", lambda: x_of(lambda g, x: g.unsqueeze(x, 7, "C")), GraphError, ["position 7", "-3..2"]),
    ("rename with a list", lambda: x_of(lambda g, x: g.rename(x, ["A"])), GraphError, ["rename", "dict"]),
    ("reshape to sizes", lambda: x_of(lambda g, x: g.reshape(x, (256,))), GraphError, ["dim 256", "g.dim"]),
    ("expand to sizes", lambda: x_of(lambda g, x: g.expand(x, (4, 64))), GraphError, ["dim 4", "g.dim"]),
    ("input dims as a string", lambda: fspyre.GraphBuilder("t").input("x", "AB", "float32"), GraphError,
     ["'AB'", "list"]),
    ("input name not an identifier", lambda: x_of(lambda g, x: g.input("a b", ("A",), "float32")), GraphError,
     ["'a b'"]),
    ("numpy dtype object", lambda: x_of(lambda g, x: g.input("z", ("A",), np.float32)), GraphError,
     ["unknown dtype", "float32"]),
    ("pointwise dtype", lambda: x_of(lambda g, x: g.pointwise("exp", x, dtype="float64")), GraphError, ["'float64'"]),
    ("matmul contract int", lambda: x_of(lambda g, x: g.matmul(x, x, 1)), GraphError, ["contract=1"]),
    ("output name", lambda: x_of(lambda g, x: g.output(3, x)), GraphError, ["output name 3"]),
    ("graph name", lambda: fspyre.GraphBuilder(3), GraphError, ["graph name 3"]),
    ("int32 scalar out of range", lambda: x_of(lambda g, _: g.add(g.input("i", ("A",), "int32"), 2**40)), GraphError,
     ["add", str(2**40), "int32"]),
    ("int32 constant out of range", lambda: x_of(lambda g, _: g.constant(2**31, "int32")), GraphError,
     ["constant", str(2**31)]),
    ("inf int32 constant", lambda: x_of(lambda g, _: g.constant(float("inf"), "int32")), GraphError,
     ["constant", "inf", "int32"]),
    ("slices as a list", lambda: in_hint(slices=["A", 2]), HintError, ["slices=['A', 2]", "dict"]),
    ("work_div as a string", lambda: in_hint(work_div="A"), HintError, ["work_div='A'"]),
    ("float hint count", lambda: in_hint(slices={"A": 2.0}), HintError, ["2.0", "integer"]),
    ("negative hint count", lambda: in_hint(work_div={"B": -2}), HintError, ["-2", ">= 1"]),
    ("bool hint count", lambda: in_hint(slices={"A": True}), HintError, ["True"]),
    ("unknown hint dim", lambda: in_hint(slices={"Q": 2}), HintError, ["'Q'", "['A', 'B']"]),
    ("hint dim not a name", lambda: in_hint(slices={3: 2}), HintError, ["unknown dim 3"]),
    # resume takes compile's options and checks them in the same place
    ("resume residency", lambda: resume(saved_stages(), residency="no"), GraphError, ["resume: residency='no'"]),
    ("resume fuse", lambda: resume(saved_stages(), fuse="all"), TilingError, ["resume: fuse='all'"]),
    ("resume callback", lambda: resume(saved_stages(), callback=5), GraphError, ["resume: callback", "int 5"]),
    ("resume tiling", lambda: resume(saved_stages(), tiling="some"), TilingError, ["resume: tiling='some'"]),
    ("resume unknown option", lambda: resume(saved_stages(), prove=True), GraphError, ["unknown option 'prove'"]),
    ("resume split options", lambda: resume(saved_stages(), split_options={}), WorkDivisionError,
     ["resume: argument split_options must be a SplitOptions"]),
    ("resume a list", lambda: resume([graph()]), GraphError, ["resume: stages must be a mapping", "list"]),
]


def saved_stages() -> dict:
    """The stages of a compile up to its loop tree: resume places, divides and emits."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        stages = dict(fspyre.compile(graph(), tiling="hints").stages)
    return {k: stages[k] for k in ("graph", "tiling_plan", "loop_tree")}


@pytest.mark.parametrize("call, cls, words", [c[1:] for c in MISUSE], ids=[c[0] for c in MISUSE])
def test_misuse_is_a_one_line_fspyre_error(call, cls, words):
    with pytest.raises(FspyreError) as info:
        call()
    assert type(info.value) is cls, f"{type(info.value).__name__}: {info.value}"
    msg = str(info.value)
    assert "\n" not in msg, msg
    for w in words:
        assert w in msg, f"{msg!r} does not name {w!r}"


def test_numpy_integers_are_accepted_as_sizes_counts_and_axes():
    g = fspyre.GraphBuilder("np_ints")
    A, B = g.dim("A", np.int64(128)), g.dim("B", np.int32(64))  # A is the permuted result's stick dim
    assert type(A.size) is int and type(B.size) is int
    x = g.input("x", (A, B), "float32")
    with g.hint(slices={"A": np.int64(2)}, work_div={"B": np.int32(2)}) as scope:
        y = g.exp(g.permute(x, (np.int64(1), np.int64(0))))
    y = g.add(y, np.float32(1.5))
    g.output("y", y)
    assert dict(scope.slices) == {"A": 2} and type(scope.slices["A"]) is int
    assert type(scope.work_div["B"]) is int
    graph = g.build()
    machine = fspyre.machine.spyre(cores=np.int64(4))
    assert machine.cores == 4 and type(machine.cores) is int
    assert fspyre.check(graph, machine=machine).equal


def test_a_hint_dim_may_be_given_as_a_dim():
    g = fspyre.GraphBuilder("t")
    A = g.dim("A", 4)
    with g.hint(slices={A: 2}) as scope:
        pass
    assert dict(scope.slices) == {"A": 2}


def test_a_single_reduced_dim_name_is_one_name():
    g = fspyre.GraphBuilder("t")
    g.dim("AB", 4), g.dim("C", 8)
    s = g.sum(g.input("x", ("AB", "C"), "float32"), "AB")
    assert s.type.names == ("C",)


def test_int32_arithmetic_wraps_like_torch_everywhere():
    """docs/semantics.md: int32 arithmetic wraps modulo 2**32 (as torch and two's complement
    hardware do); the reference and the machine model agree and nothing warns."""
    import torch

    g = fspyre.GraphBuilder("wrap")
    A = g.dim("A", 64)
    x = g.input("x", (A,), "int32")
    g.output("sq", g.mul(x, x))
    g.output("total", g.sum(x, ["A"]))
    graph = g.build()
    x_host = np.arange(2**30 - 32, 2**30 + 32, dtype=np.int32)
    tx = torch.from_numpy(x_host)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ref = fspyre.evaluate(graph, {"x": x_host})
        got = fspyre.run(fspyre.compile(graph, fspyre.machine.spyre(cores=4)), {"x": x_host})
    np.testing.assert_array_equal(ref["sq"], (tx * tx).numpy())
    assert int(ref["total"]) == int(tx.sum(dtype=torch.int32))
    np.testing.assert_array_equal(got["sq"], ref["sq"])
    np.testing.assert_array_equal(got["total"], ref["total"])


def test_infinities_and_nans_raise_no_numpy_warnings():
    """docs/semantics.md: inf/nan follow IEEE; a DLFloat16 value past float16's range comes
    back as inf. None of that is a RuntimeWarning for the user."""
    g = fspyre.GraphBuilder("infs")
    A, B = g.dim("A", 8), g.dim("B", 64)
    x = g.input("x", (A, B), "float16")
    big = g.exp(g.mul(x, 100.0))
    g.output("e", big)
    g.output("l", g.log(x))
    g.output("s", g.sum(big, ["B"]))
    graph = g.build()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for fmt in ("SEN169_FP16", "IEEE_FP16"):
            report = fspyre.check(graph, machine=fspyre.machine.spyre(fp16_format=fmt))
            assert report.equal, report
            assert report.outputs[0].max_abs_diff == 0.0


# -- hint warnings ---------------------------------------------------------------------------


def warned(build):
    with pytest.warns(fspyre.FspyreWarning) as record:
        comp = fspyre.compile(build(), fspyre.machine.spyre(cores=4))
    return comp, [str(w.message) for w in record]


def test_fspyre_warning_is_a_user_warning():
    assert issubclass(fspyre.FspyreWarning, UserWarning)
    assert not issubclass(fspyre.FspyreWarning, FspyreError)


def _one_scope(**hint):
    def build():
        g = fspyre.GraphBuilder("w")
        A, B = g.dim("A", 64), g.dim("B", 128)
        g.dim("C", 8)
        x = g.input("x", (A, B), "float16")
        with g.hint(**hint):
            y = g.neg(x)
        g.output("y", y)
        return g.build()

    return build


@pytest.mark.parametrize("hint, match", [
    ({"slices": {"C": 2}}, r"w: hint scope 0 slices=\{'C': 2\}: no op of \[buf0\] iterates dim C; hint ignored "
                           r"\(remove it, or build the ops that iterate C inside the scope\)"),
    ({"slices": {"A": 1}}, r"hint scope 0 slices=\{'A': 1\}: count 1 makes no loop; .*give a count >= 2"),
    ({"work_div": {"C": 2}}, r"hint scope 0 work_div=\{'C': 2\}: no op of \[buf0\] iterates dim C; hint ignored"),
    ({"work_div": {"A": 8}}, r"op buf0: work_div hint \{'A': 8\}: skipped, 1 x 8 cores exceed the budget of 4.*"
                             r"hint a count of at most 4"),
])
def test_a_hint_without_effect_warns_and_says_what_to_change(hint, match):
    comp, messages = warned(_one_scope(**hint))
    assert any(__import__("re").search(match, m) for m in messages), messages
    assert comp.warnings and all(m.split(": ", 1)[1] in comp.warnings for m in messages)
    report = fspyre.check(comp.graph, comp=comp)
    assert report.warnings == comp.warnings
    assert f"  warning: {comp.warnings[0]}" in str(report)


def test_an_empty_hint_scope_warns():
    def build():
        g = fspyre.GraphBuilder("w")
        A = g.dim("A", 64)
        x = g.input("x", (A,), "float32")
        with g.hint(slices={"A": 2}, work_div={"A": 2}):
            pass
        g.output("y", g.neg(x))
        return g.build()

    _, messages = warned(build)
    assert any("slices={'A': 2}: no op was built inside it" in m for m in messages), messages
    assert any("work_div={'A': 2}: no op was built inside it" in m for m in messages), messages


def test_warnings_are_data_in_the_stage_outputs():
    """A stage called alone reports through its output, without a Python warning."""
    from fspyre.stages.loop_tree import tile
    from fspyre.stages.split_plan import divide_work
    from fspyre.stages.tiling_plan import plan_tiling

    graph = _one_scope(slices={"C": 2}, work_div={"A": 64})()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan = plan_tiling(graph)
        split = divide_work(tile(graph, plan), fspyre.machine.spyre(cores=4))
    assert any("iterates dim C" in w for w in plan.warnings)
    assert any("skipped" in w for w in split.warnings)


def test_a_useful_hint_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        comp = fspyre.compile(_one_scope(slices={"A": 2}, work_div={"B": 2})(), fspyre.machine.spyre(cores=4))
    assert comp.warnings == ()


def test_declare_tensor_dim_with_a_conflicting_size_is_an_error():
    from fspyre.errors import FrontendError
    from fspyre.frontend import clear_dim_names, declare_tensor_dim

    clear_dim_names()
    try:
        declare_tensor_dim("A", 8)
        declare_tensor_dim("A", np.int64(8))  # the same size again is harmless
        with pytest.raises(FrontendError, match=r"declare_tensor_dim\('A', 16\): 'A' is already declared with "
                                                r"size 8"):
            declare_tensor_dim("A", 16)
    finally:
        clear_dim_names()


# -- every public stage function and option record, called alone with each argument wrong ------
def _stage_calls():
    """(name, function, the right arguments): each stage of the pipeline, called alone."""
    from fspyre.stages.allocation import AllocationOptions, allocate, verify_allocation
    from fspyre.stages.loop_tree import tile, verify_loop_tree
    from fspyre.stages.online_softmax import OnlineOptions
    from fspyre.stages.program import emit_program, verify_program
    from fspyre.stages.residency import ResidencyOptions, keep_resident, place_copies
    from fspyre.stages.split_plan import SplitOptions, divide_work, verify_split_plan
    from fspyre.stages.tiling_plan import TilingOptions, plan_groups, plan_tiling, verify_plan

    G, M = graph(), fspyre.machine.spyre(cores=4)
    plan = plan_tiling(G)
    tree = tile(G, plan)
    split = divide_work(tree, M)
    alloc = allocate(tree, split, M)
    program = emit_program(tree, split, alloc, M)
    return [
        ("plan_tiling", plan_tiling, (G, TilingOptions())),
        ("plan_groups", plan_groups, (G, [(["buf0"], 2, ["A"])], OnlineOptions())),
        ("verify_plan", verify_plan, (G, plan)),
        ("tile", tile, (G, plan, OnlineOptions())),
        ("verify_loop_tree", verify_loop_tree, (tree,)),
        ("keep_resident", keep_resident, (tree, M, ResidencyOptions())),
        ("place_copies", place_copies, (tree, M, ResidencyOptions())),
        ("divide_work", divide_work, (tree, M, SplitOptions())),
        ("verify_split_plan", verify_split_plan, (tree, split, M)),
        ("allocate", allocate, (tree, split, M, AllocationOptions())),
        ("verify_allocation", verify_allocation, (tree, split, alloc, M)),
        ("emit_program", emit_program, (tree, split, alloc, M)),
        ("verify_program", verify_program, (program,)),
        ("compile", fspyre.compile, (G, M)),
        ("evaluate", fspyre.evaluate, (G, {"x": X})),
        ("run", fspyre.run, (program, {"x": X})),
        ("check", fspyre.check, (G,)),
    ]


def _wrong_values():
    g, _ = builder()
    return [None, 5, "hints", {}, [], 2.5, True, g, np.ones(3), fspyre.machine.spyre(cores=2), object()]


def _wrong_calls():
    calls = _stage_calls()
    artifacts = [a for _, _, args in calls for a in args]
    out = []
    for name, fn, args in calls:
        for i in range(len(args)):
            # every other argument in this slot: wrong types, other artifacts (swapped arguments)
            for j, wrong in enumerate(_wrong_values() + artifacts):
                if type(wrong) is type(args[i]) or (i == 1 and name == "compile" and wrong is None):
                    continue  # the right type (another valid value), or compile's default machine
                out.append((f"{name}-arg{i}-{j}", fn, args[:i] + (wrong,) + args[i + 1:]))
    return out


WRONG_CALLS = _wrong_calls()


@pytest.mark.parametrize("fn, args", [c[1:] for c in WRONG_CALLS], ids=[c[0] for c in WRONG_CALLS])
def test_a_stage_called_with_a_wrong_argument_is_a_one_line_fspyre_error(fn, args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(FspyreError) as info:
            fn(*args)
    msg = str(info.value)
    assert msg and "\n" not in msg, msg


def _option_records():
    from fspyre.machine.interpreter import RunOptions
    from fspyre.stages.allocation import AllocationOptions
    from fspyre.stages.online_softmax import OnlineOptions
    from fspyre.stages.residency import ResidencyOptions
    from fspyre.stages.split_plan import SplitOptions
    from fspyre.stages.tiling_plan import TilingOptions

    return [TilingOptions, OnlineOptions, ResidencyOptions, SplitOptions, AllocationOptions, RunOptions]


def _wrong_options():
    import dataclasses

    out = []
    for cls in _option_records():
        for f in dataclasses.fields(cls):
            default = getattr(cls(), f.name)
            for j, wrong in enumerate(["no", 1.5, [], {}, object(), -1 if isinstance(default, bool) else None]):
                if wrong is None and f.name == "max_cores":
                    continue  # None is a valid max_cores
                if type(wrong) is type(default):
                    continue
                out.append((f"{cls.__name__}.{f.name}-{j}", cls, f.name, wrong))
    return out


WRONG_OPTIONS = _wrong_options()


@pytest.mark.parametrize("cls, field, value", [c[1:] for c in WRONG_OPTIONS], ids=[c[0] for c in WRONG_OPTIONS])
def test_an_option_record_refuses_a_wrong_field(cls, field, value):
    with pytest.raises(FspyreError) as info:
        cls(**{field: value})
    msg = str(info.value)
    assert field in msg and "\n" not in msg, msg


def test_the_systematic_misuse_cases_number_over_four_hundred():
    assert len(WRONG_CALLS) + len(WRONG_OPTIONS) > 400


@pytest.mark.parametrize("fraction", [-0.01, 1.01, float("nan"), "0.2", True])
def test_lx_window_refuses_a_fraction_outside_0_1(fraction):
    from fspyre.machine.spyre import lx_window

    with pytest.raises(MachineError, match="backend_fraction"):
        lx_window(fraction)


def test_lx_window_stays_within_what_the_allocator_tracks():
    from fspyre.machine.spyre import lx_window

    assert lx_window(0.0) == 2_031_616 and lx_window(1.0) == 0 and lx_window() == 1_625_344
