"""One exception hierarchy: every bad input to the public API raises an FspyreError subclass
whose one-line message names the culprit (never a bare ValueError, KeyError or TypeError)."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import fspyre
from fspyre import errors
from fspyre.errors import (
    ExecutionError,
    FspyreError,
    GraphError,
    HintError,
    MachineError,
    SerializationError,
    TilingError,
)
from fspyre.ir.serialize import FORMAT, loads
from fspyre.machine.spyre import spyre


def test_every_error_class_is_an_fspyre_error():
    classes = [c for _, c in inspect.getmembers(errors, inspect.isclass)
               if c.__module__ == errors.__name__ and not issubclass(c, Warning)]
    assert len(classes) >= 10
    for cls in classes:
        assert issubclass(cls, FspyreError) and issubclass(cls, Exception), cls
    assert fspyre.FspyreError is FspyreError


def small_graph() -> fspyre.Graph:
    g = fspyre.GraphBuilder("small")
    A, B = g.dim("A", 4), g.dim("B", 64)
    g.output("y", g.exp(g.input("x", (A, B), "float16")))
    return g.build()


def _builder(*dims):
    g = fspyre.GraphBuilder("b")
    for name, size in dims:
        g.dim(name, size)
    return g


def _enter_hint(**kwargs):
    g = _builder(("A", 4))
    with g.hint(**kwargs):
        pass


BAD_CALLS = [
    ("unknown dtype", lambda: _builder(("A", 4)).input("x", ("A",), "float64"), GraphError, ["'float64'", "input x"]),
    ("dim size 0", lambda: _builder(("A", 0)), GraphError, ["'A'", "0"]),
    ("negative dim size", lambda: fspyre.Dim("B", -2), GraphError, ["'B'", "-2"]),
    ("dim redeclared", lambda: _builder(("A", 4), ("A", 5)), GraphError, ["A", "4", "5"]),
    ("dim-name mismatch in matmul",
     lambda: (lambda g: g.matmul(g.input("a", ("A",), "float32"), g.input("b", ("B",), "float32")))(
         _builder(("A", 4), ("B", 4))), GraphError, ["matmul", "'A'"]),
    ("shape mismatch in reshape",
     lambda: (lambda g: g.reshape(g.input("a", ("A",), "float32"), ("B",)))(_builder(("A", 4), ("B", 5))),
     GraphError, ["reshape", "4", "5"]),
    ("unknown dim in a hint", lambda: _enter_hint(slices={"Q": 2}), HintError, ["'Q'"]),
    ("zero hint count", lambda: _enter_hint(work_div={"A": 0}), HintError, ["'A'", "0"]),
    ("zero cores", lambda: spyre(cores=0), MachineError, ["cores=0", "1..32"]),
    ("33 cores", lambda: spyre(cores=33), MachineError, ["cores=33", "1..32"]),
    ("bad LX size", lambda: spyre(lx_bytes=100), MachineError, ["lx_bytes=100", "128"]),
    ("bad fp16 format", lambda: spyre(fp16_format="E5M2"), MachineError, ["'E5M2'"]),
    ("unknown tiling mode", lambda: fspyre.compile(small_graph(), tiling="magic"), TilingError, ["'magic'"]),
    ("missing input", lambda: fspyre.run(fspyre.compile(small_graph(), tiling="none"), {}), ExecutionError,
     ["missing", "'x'"]),
    ("wrong input shape", lambda: fspyre.evaluate(small_graph(), {"x": np.zeros((64, 4), np.float16)}),
     ExecutionError, ["input x", "[64, 4]", "[4, 64]"]),
    ("wrong input dtype", lambda: fspyre.check(small_graph(), {"x": np.zeros((4, 64), np.complex64)}, tiling="none"),
     ExecutionError, ["input x", "complex64"]),
    ("not JSON", lambda: loads("{nope"), SerializationError, ["not JSON"]),
    ("unknown artifact", lambda: loads('{"_format": %d, "_type": "Tensor"}' % FORMAT), SerializationError,
     ["'Tensor'"]),
]


@pytest.mark.parametrize("call, cls, words", [c[1:] for c in BAD_CALLS], ids=[c[0] for c in BAD_CALLS])
def test_bad_input_raises_an_fspyre_error_naming_the_culprit(call, cls, words):
    with pytest.raises(FspyreError) as info:
        call()
    assert isinstance(info.value, cls), f"{type(info.value).__name__}: {info.value}"
    msg = str(info.value)
    assert "\n" not in msg, f"not one line: {msg!r}"
    for w in words:
        assert w in msg, f"{msg!r} does not name {w!r}"
