"""Checked stage arguments: what every public stage function does before it works.

A stage may be called alone (an embedder's own pipeline, an artifact loaded from JSON), so
it cannot trust its caller: each argument is checked for its type first (a one-line error
naming the stage, the argument and what it got), then each artifact by its whole-artifact
verifier (``verify_graph``, ``verify_loop_tree``, ...). The verifiers are linear but not
free, and ``compile`` (or the tiling search, or ``keep_resident`` judging its candidates)
hands one artifact to several stages, so an artifact that passed a verifier is remembered by
identity: artifacts are immutable, so each is verified once however many stages read it."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from fspyre.errors import (
    AllocationError,
    ExecutionError,
    FspyreError,
    GraphError,
    MachineError,
    TilingError,
    WorkDivisionError,
)

T = TypeVar("T")

# How to get the expected artifact when a common wrong one was passed: (expected, got) -> advice
_ADVICE = {
    ("Graph", "GraphBuilder"): "call .build() on it first",
    ("LoopTree", "Graph"): "tile(graph, plan) makes the loop tree",
    ("TilingPlan", "str"): "plan_tiling(graph, TilingOptions(mode=...)) makes a plan",
    ("LoopTree", "TilingPlan"): "tile(graph, plan) makes the loop tree",
    ("SplitPlan", "LoopTree"): "check the argument order",
    ("LoopTree", "SplitPlan"): "check the argument order",
    ("Allocation", "SplitPlan"): "check the argument order",
    ("Machine", "NoneType"): "pass fspyre.machine.spyre(cores=...)",
    ("Machine", "int"): "pass fspyre.machine.spyre(cores=...)",
}


def short(value: object, width: int = 40) -> str:
    """A one-line glimpse of a value for an error message."""
    name = getattr(value, "name", None)
    text = repr(value)
    if text.startswith("<") and isinstance(name, str):  # an object without a useful repr: its name
        text = repr(name)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


# The error an artifact of each kind is refused with (its stage's own error class)
_ERRORS: dict[str, type[FspyreError]] = {
    "Graph": GraphError, "TilingPlan": TilingError, "LoopTree": TilingError, "SplitPlan": WorkDivisionError,
    "Allocation": AllocationError, "Machine": MachineError, "Program": ExecutionError,
    "TilingOptions": TilingError, "OnlineOptions": TilingError, "SearchOptions": TilingError,
    "ResidencyOptions": TilingError, "SplitOptions": WorkDivisionError, "AllocationOptions": AllocationError,
}


def require(value: object, cls: type[T], where: str, arg: str, error: type[FspyreError] | None = None) -> T:
    """``value`` if it is a ``cls``; otherwise ``error`` (by default the error of that kind of
    artifact) naming the stage, the argument and what came."""
    if isinstance(value, cls):
        return value
    error = error or _ERRORS.get(cls.__name__, FspyreError)
    got = type(value).__name__
    advice = _ADVICE.get((cls.__name__, got))
    if advice is None and cls.__name__.endswith("Options"):
        advice = f"pass {cls.__name__}(...)"
    raise error(f"{where}: argument {arg} must be a {cls.__name__}, got {got} {short(value)}"
                + (f"; {advice}" if advice else ""))


def require_callable(value: object, where: str, arg: str, error: type[FspyreError]) -> None:
    if value is not None and not callable(value):
        raise error(f"{where}: {arg} must be a function (stage name, artifact) or None, got "
                    f"{type(value).__name__} {short(value)}")


def require_graph(graph: object, where: str, machine: Any = None) -> Any:
    """``graph`` if it is a verified Graph (see ``verified``) whose tensors fit ``machine``
    (by default a Spyre card)."""
    from fspyre.ir.graph import Graph, verify_graph

    require(graph, Graph, where, "graph", GraphError)
    verified(verify_graph, graph)
    return verified(fits_device, graph, _default_machine() if machine is None else require_machine(machine, where))


def require_tree(tree: object, where: str, machine: Any) -> Any:
    """``tree`` if it is a verified LoopTree whose tensors fit ``machine``."""
    from fspyre.ir.looptree import LoopTree
    from fspyre.stages.loop_tree import verify_loop_tree

    require(tree, LoopTree, where, "tree", TilingError)
    verified(verify_loop_tree, tree)
    return verified(fits_device, tree, machine)


def fits_device(artifact: Any, machine: Any) -> Any:
    """Every tensor of a Graph or LoopTree fits the machine's device memory, and so do its
    kernel arguments together: checked before any stage does work sized by a tensor (a dim of
    2^40 or 2^70 elements is refused here, in one line, not by a MemoryError or an overflow
    deep in a stage). The allocator plans the exact, stick-padded bytes later."""
    from fspyre.machine.formats import FORMATS

    args = {*artifact.inputs, *(o.buffer for o in artifact.outputs)}
    total = 0
    for b in artifact.buffers:
        numel = 1
        for d in b.type.dims:
            numel *= d.size if type(d.size) is int else 1  # a symbolic dim is checked at its witness sizes
        nbytes = numel * FORMATS[machine.device_format(b.type.dtype)].nbytes
        if nbytes > machine.hbm_bytes:
            raise MachineError(
                f"{artifact.name}: tensor {b.name} {b.type} takes {nbytes} bytes of device memory, more than the "
                f"machine's {machine.hbm_bytes}; split the work into smaller tensors"
            )
        total += nbytes if b.name in args else 0
    if total > machine.hbm_bytes:
        raise MachineError(
            f"{artifact.name}: its inputs and outputs take {total} bytes of device memory together, more than the "
            f"machine's {machine.hbm_bytes}; split the work into smaller graphs"
        )
    return artifact


def require_machine(machine: object, where: str) -> Any:
    """``machine``, or the default card for None."""
    from fspyre.machine.spyre import Machine, spyre

    if machine is None:
        return spyre()
    if not isinstance(machine, Machine):
        raise MachineError(f"{where}: machine={short(machine)} is a {type(machine).__name__}; "
                           f"pass fspyre.machine.spyre(cores=...)")
    return machine


@functools.cache
def _default_machine() -> Any:
    from fspyre.machine.spyre import spyre

    return spyre()


# id(verifier), id(artifact), ... -> the artifacts, held so their ids cannot be reused while
# remembered; the oldest entry goes first. Bounded: a long search makes many trees.
_TRUSTED: dict[tuple[int, ...], tuple[object, ...]] = {}
_TRUSTED_LIMIT = 256
_LOCK = threading.Lock()


def verified(verifier: Callable[..., Any], *artifacts: Any) -> Any:
    """The first artifact, after ``verifier(*artifacts)`` passed on these very objects (now or
    before, while remembered)."""
    key = (id(verifier), *map(id, artifacts))
    with _LOCK:
        known = _TRUSTED.get(key)
    if known is None or any(a is not b for a, b in zip(known, artifacts)):
        verifier(*artifacts)
        with _LOCK:
            if len(_TRUSTED) >= _TRUSTED_LIMIT:
                del _TRUSTED[next(iter(_TRUSTED))]
            _TRUSTED[key] = artifacts
    return artifacts[0]
