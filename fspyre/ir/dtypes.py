"""Host dtypes fspyre accepts and the rules for mixing them.

Host arrays are numpy arrays. numpy has no bfloat16, so bfloat16 tensors travel as float32
arrays whose values are bfloat16-representable (docs/semantics.md).
"""

from __future__ import annotations

import numpy as np

from fspyre.errors import GraphError

DTYPES: tuple[str, ...] = ("float16", "bfloat16", "float32", "int32", "bool")
FLOAT_DTYPES = frozenset({"float16", "bfloat16", "float32"})

# The numpy dtype a host array of each fspyre dtype has.
HOST_NUMPY: dict[str, np.dtype] = {
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(np.float32),
    "float32": np.dtype(np.float32),
    "int32": np.dtype(np.int32),
    "bool": np.dtype(np.bool_),
}

# Rank used by promotion: a wider float wins; bfloat16 with float16 gives float32 (as torch does).
_FLOAT_RANK = {"float16": 1, "bfloat16": 1, "float32": 2}


def check_dtype(dtype: str, where: str) -> str:
    if dtype not in DTYPES:
        raise GraphError(
            f"{where}: unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}"
        )
    return dtype


def is_float(dtype: str) -> bool:
    return dtype in FLOAT_DTYPES


def promote(a: str, b: str) -> str:
    """Result dtype of a binary op on two tensors (torch's category-then-width rule)."""
    if a == b:
        return a
    fa, fb = is_float(a), is_float(b)
    if fa and fb:
        if _FLOAT_RANK[a] != _FLOAT_RANK[b]:
            return a if _FLOAT_RANK[a] > _FLOAT_RANK[b] else b
        return "float32"  # float16 with bfloat16
    if fa:
        return a
    if fb:
        return b
    return "int32"  # int32 with bool


def promote_scalar(tensor: str, value: float | int | bool) -> str:
    """A Python scalar only changes the category: int tensor + float scalar -> float32."""
    if isinstance(value, bool):
        return tensor
    if isinstance(value, float) and not is_float(tensor):
        return "float32"
    if isinstance(value, int) and tensor == "bool":
        return "int32"
    return tensor
