"""The PyTorch front end: capture torch functions and modules as fspyre graphs.

``from_torch(fn_or_module, example_inputs) -> Graph``; ``capture(...)`` also returns the
parameter values and the input names. Annotations use the seed's names:
``declare_tensor_dim``, ``name_tensor_dims`` and ``with spyre_hint(slices=...)``.
``explain(fn, example_inputs)`` prints what ``torch.compile(fn, backend="fspyre")`` runs on
fspyre and what falls back to eager.
"""

from fspyre.frontend.annotations import (
    clear_dim_names,
    declare_tensor_dim,
    name_tensor_dims,
    spyre_hint,
)
from fspyre.frontend.capture import TorchCapture, capture, from_torch, to_numpy
from fspyre.frontend.dynamo import explain

__all__ = [
    "TorchCapture",
    "capture",
    "clear_dim_names",
    "declare_tensor_dim",
    "explain",
    "from_torch",
    "name_tensor_dims",
    "spyre_hint",
    "to_numpy",
]
