"""Loading a torch program file for ``fspyre compile FILE.py`` / ``fspyre check FILE.py``.

A file defines ``model`` (a function or ``torch.nn.Module``) and ``example_inputs()`` (a
tuple of tensors; it may take keyword arguments with defaults, e.g. sizes). It may call
``declare_tensor_dim`` / ``name_tensor_dims`` and use ``spyre_hint`` scopes, and may set
``tolerance = (atol, rtol)`` to override the derived one.

The derived tolerance follows the formats: every store of a float16 value keeps a DLFloat16
(9 fraction bits: up to 2^-9 relative per rounding, eager's own fp16 rounding included),
bfloat16 keeps 7 fraction bits (2^-7), float32 differs only by evaluation order (2^-20).
``rtol`` is the largest sum of those over the stores on a chain from an input to an output
(a 16-bit input counts once, for its rounding to the device format), and
``atol = rtol * max(1, max |eager output|)``: values are compared on the scale of the
computation, since cancellation leaves small outputs with absolute, not relative, error.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fspyre.errors import FrontendError
from fspyre.frontend.annotations import clear_dim_names
from fspyre.frontend.capture import TorchCapture, capture, to_numpy
from fspyre.ir.graph import Graph

# Relative error one rounding store may add, per stored dtype.
ROUNDING_EPS: Mapping[str, float] = {"float16": 2.0**-9, "bfloat16": 2.0**-7, "float32": 2.0**-20,
                                     "int32": 0.0, "bool": 0.0}


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class TorchProgram:
    """A loaded torch file: the captured graph, every graph input as a host array (example
    inputs and parameters), PyTorch eager's outputs by graph output name, and the tolerance
    ``|fspyre - eager| <= atol + rtol * |eager|`` that the check applies."""

    path: Path
    graph: Graph
    inputs: Mapping[str, np.ndarray]
    expected: Mapping[str, np.ndarray]
    atol: float
    rtol: float
    capture: TorchCapture


def load_torch_file(path: str | Path, **example_args: Any) -> TorchProgram:
    """Run FILE.py, capture ``model`` on ``example_inputs(**example_args)``, run it eagerly."""
    path = Path(path)
    module = _run_file(path)
    model = getattr(module, "model", None)
    make_inputs = getattr(module, "example_inputs", None)
    if model is None or not callable(model):
        raise FrontendError(f"{path}: define `model`, a function or torch.nn.Module")
    if make_inputs is None or not callable(make_inputs):
        raise FrontendError(f"{path}: define `example_inputs()` returning a tuple of torch tensors")
    try:
        args = make_inputs(**example_args)
    except FrontendError:
        raise
    except SystemExit as stop:
        raise FrontendError(_exit_message(path, "example_inputs()", stop)) from None
    except Exception as e:
        raise FrontendError(f"{path}: example_inputs() raised {type(e).__name__}: {e}") from e
    args = (args,) if isinstance(args, torch.Tensor) else tuple(args)
    cap = capture(model, args, name=path.stem)
    try:
        with torch.no_grad():
            eager = model(*args)
    except SystemExit as stop:
        raise FrontendError(_exit_message(path, "running `model`", stop)) from None
    except Exception as e:
        raise FrontendError(f"{path}: running `model` eagerly raised {type(e).__name__}: {e}") from e
    flat = torch.utils._pytree.tree_leaves(eager)
    expected = {n: to_numpy(t) for n, t in zip(cap.output_names, flat)}
    override = getattr(module, "tolerance", None)
    if override is not None:
        atol, rtol = _tolerance(path, override)
    else:
        rtol = rounding_error(cap.graph)
        # The scale of the finite outputs: an inf or NaN in eager's result must not make atol one.
        finite = [np.abs(v[np.isfinite(v)]) for v in expected.values()]
        scale = max((float(f.max()) for f in finite if f.size), default=1.0)
        atol = rtol * max(1.0, scale)
    return TorchProgram(path=path, graph=cap.graph, inputs=cap.inputs(*args), expected=expected,
                        atol=atol, rtol=rtol, capture=cap)


def _tolerance(path: Path, override: object) -> tuple[float, float]:
    """The file's ``tolerance = (atol, rtol)``: two finite numbers >= 0."""
    values = tuple(override) if isinstance(override, (tuple, list)) else ()
    ok = len(values) == 2 and all(
        isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) and math.isfinite(v)
        and v >= 0 for v in values)
    if not ok:
        raise FrontendError(
            f"{path}: tolerance = {override!r:.80} must be a pair of numbers (atol, rtol), both finite and >= 0, "
            f"e.g. tolerance = (1e-3, 1e-2)"
        )
    return float(values[0]), float(values[1])


def _exit_message(path: Path, what: str, stop: SystemExit) -> str:
    return (f"{path}: {what} called sys.exit({stop.code!r}); fspyre loads the file as a module, so guard "
            f"script code with `if __name__ == \"__main__\":`")


def rounding_error(graph: Graph) -> float:
    """Relative error bound: the largest sum of ``ROUNDING_EPS`` over the stores on a chain from
    an input to an output. A 16-bit float input counts once (the host value is rounded to
    the device format), and so does every op, by the dtype it stores."""
    buffers = graph.buffer_table()
    err = {n: ROUNDING_EPS[buffers[n].type.dtype] if buffers[n].type.dtype in ("float16", "bfloat16") else 0.0
           for n in graph.inputs}
    for op in graph.ops:
        before = max((err[ld.buffer] for ld in op.loads), default=0.0)
        err[op.store.buffer] = before + ROUNDING_EPS[buffers[op.store.buffer].type.dtype]
    return max((err[o.buffer] for o in graph.outputs), default=0.0)


def _run_file(path: Path) -> Any:
    if not path.is_file():
        raise FrontendError(f"{path}: no such file")
    clear_dim_names()  # names belong to the file that declares them
    name = f"fspyre_torch_file_{abs(hash(path.resolve()))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise FrontendError(f"{path}: cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    # Modules beside the file are importable while it runs, as under `python FILE.py`.
    here = str(path.parent.resolve())
    sys.path.insert(0, here)
    try:
        spec.loader.exec_module(module)
    except FrontendError:
        raise
    except SystemExit as stop:
        raise FrontendError(_exit_message(path, "running the file", stop)) from None
    except Exception as e:
        raise FrontendError(f"{path}: running the file raised {type(e).__name__}: {e}") from e
    finally:
        sys.modules.pop(name, None)
        if here in sys.path:
            sys.path.remove(here)
    return module
