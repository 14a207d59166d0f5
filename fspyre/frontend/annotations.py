"""The seed's annotation API, with the anchor's names: ``declare_tensor_dim``,
``name_tensor_dims`` and ``with spyre_hint(...)``.

Like the anchor (torch-spyre ``propagate_named_dims`` / ``propagate_hints``), names live in a
small registry keyed by tensor identity, and a hint is a ``torch.fx.traceback.annotate`` scope:
every FX node traced inside it carries ``meta["custom"]["fspyre_hint_<id>"] = {...}``. Ids
grow with the order the scopes are opened, so an outer scope always has the smaller id. Capture
(``fspyre.frontend.capture``) reads both back; nothing here knows about graphs.

Inside traced code (``torch.export`` or ``torch.compile``) ``name_tensor_dims`` cannot key a
registry by a fake tensor, so it becomes the identity custom op ``fspyre::name_dims`` that the
front end lowers to a renaming view. Use its return value there: ``y = name_tensor_dims(y, ...)``.
"""

from __future__ import annotations

import itertools
import numbers
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
import torch.fx.traceback as fx_traceback
from torch.utils.weak import WeakTensorKeyDictionary

from fspyre.errors import FrontendError
from fspyre.ir.frozen import FrozenMap

HINT_KEY = re.compile(r"^fspyre_hint_(\d+)$")

_declared: dict[str, int] = {}
_tensor_names: WeakTensorKeyDictionary = WeakTensorKeyDictionary()
_hint_ids = itertools.count()


def declare_tensor_dim(name: str, size: int) -> None:
    """Declare a named dimension and its size. Declaring a name again with the same size is
    harmless; with another size it is an error (the anchor lets the later one win, which
    silently renames the earlier tensors' dims). Each torch file starts with no declarations
    (``load_torch_file`` calls ``clear_dim_names``), so a file can be re-run with other sizes."""
    _check_name(name, "declare_tensor_dim")
    integral = isinstance(size, numbers.Integral) and not isinstance(size, (bool, np.bool_))
    if not integral or size < 1:
        raise FrontendError(f"declare_tensor_dim({name!r}, {size!r}): the size must be an integer >= 1")
    size = int(size)
    have = _declared.get(name)
    if have is not None and have != size:
        raise FrontendError(
            f"declare_tensor_dim({name!r}, {size}): {name!r} is already declared with size {have}; use one size "
            f"per name, another name for the other dim, or clear_dim_names() to start over"
        )
    _declared[name] = size


def declared_dims() -> Mapping[str, int]:
    return FrozenMap(dict(_declared))


def name_tensor_dims(tensor: torch.Tensor, names: Sequence[str]) -> torch.Tensor:
    """Name each dim of ``tensor`` (an input, a parameter, or a value inside traced code)."""
    if not isinstance(tensor, torch.Tensor):
        raise FrontendError(f"name_tensor_dims: expected a torch.Tensor, got {type(tensor).__name__}")
    names = tuple(names)
    for n in names:
        _check_name(n, "name_tensor_dims")
    if len(names) != tensor.dim():
        raise FrontendError(
            f"name_tensor_dims: {len(names)} names {list(names)} for a tensor with {tensor.dim()} dims "
            f"{list(tensor.shape)}; give one name per dim"
        )
    if len(set(names)) != len(names):
        raise FrontendError(f"name_tensor_dims: names {list(names)} repeat a name; each dim needs its own")
    for n, size in zip(names, tensor.shape):
        want = _declared.get(n)
        if want is not None and size != 1 and want != size:
            raise FrontendError(
                f"name_tensor_dims: dim {n!r} has size {size} in this tensor {list(tensor.shape)} but was "
                f"declared with size {want} (declare_tensor_dim({n!r}, {want}))"
            )
    if torch.compiler.is_compiling():
        return torch.ops.fspyre.name_dims(tensor, ",".join(names))
    _tensor_names[tensor] = names
    return tensor


def tensor_dim_names(tensor: torch.Tensor) -> tuple[str, ...] | None:
    """The names given to ``tensor`` by ``name_tensor_dims``, if any."""
    return _tensor_names.get(tensor)


def clear_dim_names() -> None:
    """Forget every declaration and tensor name (tests, and files loaded one after another)."""
    _declared.clear()
    _tensor_names.clear()


def spyre_hint(
    *,
    slices: Mapping[str, int] | None = None,
    num_tiles_per_dim: Mapping[str, int] | None = None,
    tiles: Mapping[str, int] | None = None,
    work_div: Mapping[str, int] | None = None,
):
    """``with spyre_hint(slices={"A": 2}):`` tiles dim A into a counted loop of 2 iterations for
    the ops traced inside; ``work_div={"B": 8}`` fixes how many cores split dim B.
    ``num_tiles_per_dim=`` (the anchor's current name) and ``tiles=`` are aliases of ``slices=``."""
    given = [(k, v) for k, v in (("slices", slices), ("num_tiles_per_dim", num_tiles_per_dim), ("tiles", tiles))
             if v is not None]
    if len(given) > 1:
        raise FrontendError(
            f"spyre_hint: {' and '.join(k for k, _ in given)} are aliases; pass only one of them"
        )
    spec = {
        "slices": _counts(given[0][1] if given else {}, given[0][0] if given else "slices"),
        "work_div": _counts(work_div or {}, "work_div"),
    }
    if not spec["slices"] and not spec["work_div"]:
        raise FrontendError("spyre_hint: give slices={dim: count} (or num_tiles_per_dim=) and/or work_div={dim: cores}")
    return fx_traceback.annotate({f"fspyre_hint_{_next_hint_id()}": spec})


# Dynamo would otherwise guard on the counter's state, and every call, which opens a scope and
# moves the counter, would fail the guard and recompile (until Dynamo's recompile limit, after
# which it stops calling the backend). A constant result needs no guard: one compiled graph
# serves every call, its scopes keep the ids they had when it was traced, and eager calls still
# take a fresh id each time.
@torch.compiler.assume_constant_result
def _next_hint_id() -> int:
    return next(_hint_ids)


@dataclass(frozen=True, slots=True)
class HintSpec:
    """One captured ``spyre_hint`` scope: its id (opening order) and its counts."""

    id: int
    slices: FrozenMap[str, int]
    work_div: FrozenMap[str, int]


def node_hints(meta: Mapping[str, object]) -> tuple[HintSpec, ...]:
    """The hint scopes an FX node was traced in, outermost first."""
    custom = meta.get("custom")  # FX's dict of user annotations, absent on most nodes
    if not isinstance(custom, Mapping):
        return ()
    out = []
    for key, spec in custom.items():
        m = HINT_KEY.match(key)
        if m:
            out.append(HintSpec(id=int(m.group(1)), slices=FrozenMap(spec["slices"]),
                                work_div=FrozenMap(spec["work_div"])))
    return tuple(sorted(out, key=lambda h: h.id))


@contextmanager
def preserve_hints() -> Iterator[None]:
    """Tracing inside this keeps ``spyre_hint`` metadata on the FX nodes it creates."""
    with fx_traceback.preserve_node_meta():
        yield


def _check_name(name: object, where: str) -> None:
    if not isinstance(name, str) or not name.isidentifier():
        raise FrontendError(f"{where}: dim name {name!r} must be a Python identifier, like 'A' or 'seq'")


def _counts(m: Mapping[str, int], kind: str) -> dict[str, int]:
    if not isinstance(m, Mapping):
        raise FrontendError(f"spyre_hint: {kind}= takes a dict {{dim name: count}}, got {m!r}")
    out = {}
    for name, count in m.items():
        _check_name(name, f"spyre_hint({kind}=...)")
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise FrontendError(f"spyre_hint({kind}={{{name!r}: {count!r}}}): the count must be an integer >= 1")
        out[name] = count
    return out


# The identity op name_tensor_dims becomes inside traced code; ``names`` is comma-separated
# (custom op schemas have no list of strings). It returns a fresh tensor, as custom ops may
# not alias their inputs; fspyre lowers it to a view, so nothing is copied.
@torch.library.custom_op("fspyre::name_dims", mutates_args=())
def _name_dims(x: torch.Tensor, names: str) -> torch.Tensor:
    return x.clone()


@_name_dims.register_fake
def _name_dims_fake(x: torch.Tensor, names: str) -> torch.Tensor:
    return torch.empty_like(x)
