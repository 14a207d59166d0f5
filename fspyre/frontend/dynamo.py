"""``torch.compile(f, backend="fspyre")``: Dynamo hands over an FX graph, AOTAutograd turns it
into core ATen (the same decompositions as ``from_torch``), fspyre lowers and compiles it, and
the compiled program runs on the machine-model interpreter, returning torch tensors.

Options: ``torch.compile(f, backend="fspyre", options={"tiling": "none", "cores": 8})``;
``tiling`` defaults to ``"auto"`` and ``cores`` to 32; ``on_graph`` is called with each
captured fspyre Graph before it is compiled (printing, tests). Inference only: a graph that
needs a backward pass is refused (call it under ``torch.no_grad()``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from fspyre.errors import FrontendError
from fspyre.frontend.annotations import tensor_dim_names
from fspyre.frontend.capture import decompositions, to_numpy
from fspyre.frontend.dimnames import Placeholder
from fspyre.frontend.lowering import FxProgram, lower_with_constants

BACKEND_NAME = "fspyre"
_OPTIONS = ("tiling", "cores", "on_graph")


def register_backend() -> None:
    """Make ``backend="fspyre"`` known to ``torch.compile`` (idempotent). Installing fspyre also
    registers it through the ``torch_dynamo_backends`` entry point."""
    from torch._dynamo.backends.registry import _BACKENDS, _COMPILER_FNS
    from torch._dynamo.backends.registry import register_backend as register

    # Once torch has discovered the entry point it registers the function itself after
    # loading it, and refuses a second registration under the same name. Loading the entry
    # point imports this package, so registering here at that moment would make torch's own
    # registration fail.
    if BACKEND_NAME not in _COMPILER_FNS and BACKEND_NAME not in _BACKENDS:
        register(compiler_fn=fspyre_backend, name=BACKEND_NAME)


def fspyre_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *,
                   options: Mapping[str, Any] | None = None, mode: str | None = None) -> Callable:
    """The Dynamo backend (``mode`` is accepted and ignored: fspyre has one)."""
    from torch._dynamo.backends.common import aot_autograd

    options = dict(options or {})
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise FrontendError(
            f"torch.compile(backend='fspyre'): unknown options {unknown}; fspyre takes {list(_OPTIONS)}"
        )
    # Dynamo's inputs are the real tensors (parameters included), in graph-input order:
    # name_tensor_dims names are looked up on them before AOTAutograd fakes them.
    dims = [tensor_dim_names(x) if isinstance(x, torch.Tensor) else None for x in example_inputs]
    name = "torch_compiled"

    def forward(fx_gm: torch.fx.GraphModule, fake_inputs: Sequence[Any]) -> Callable:
        return _compile_forward(fx_gm, dims, name, options)

    def backward(fx_gm: torch.fx.GraphModule, fake_inputs: Sequence[Any]) -> Callable:
        raise FrontendError(
            f"{name}: fspyre compiles inference only, and this call needs gradients; "
            f"run it under torch.no_grad() or torch.inference_mode()"
        )

    return aot_autograd(fw_compiler=forward, bw_compiler=backward, decompositions=decompositions())(gm, example_inputs)


def _compile_forward(fx_gm: torch.fx.GraphModule, dims: Sequence[tuple[str, ...] | None], name: str,
                     options: Mapping[str, Any]) -> Callable:
    import fspyre
    from fspyre.machine.spyre import spyre

    inputs = [n for n in fx_gm.graph.nodes if n.op == "placeholder"]
    placeholders = tuple(
        Placeholder(node=n.name, name=f"in{i}", dims=dims[i] if len(dims) == len(inputs) else None)
        for i, n in enumerate(inputs)
    )
    out_node = next(n for n in fx_gm.graph.nodes if n.op == "output")
    outs = out_node.args[0] if isinstance(out_node.args[0], (tuple, list)) else (out_node.args[0],)
    output_names = tuple(f"out{i}" for i in range(len(outs)))
    graph, constants = lower_with_constants(
        FxProgram(name=name, graph=fx_gm.graph, placeholders=placeholders, output_names=output_names))
    if options.get("on_graph") is not None:
        options["on_graph"](graph)
    comp = fspyre.compile(graph, machine=spyre(cores=int(options.get("cores", 32))),
                          tiling=str(options.get("tiling", "auto")))
    kinds = [out.meta["val"] for out in outs]

    def run(*args: Any) -> list[torch.Tensor]:
        host = {p.name: to_numpy(a) for p, a in zip(placeholders, args)} | constants
        got = fspyre.run(comp, host)
        return [_to_torch(got[n], v) for n, v in zip(output_names, kinds)]

    return run


def _to_torch(values: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(values))
    return t.to(like.dtype).reshape(like.shape)
