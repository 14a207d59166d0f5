"""Row softmax over [S, N] float16, tiled over its reduction dim (N:4): a tile holds a quarter
of each row, so the row's max and sum are complete only after the loop over N. fspyre compiles
the hint by loop fission into three passes over N (max; exp and its sum; normalise), each
re-reading what it needs (docs/tiling.md, "Loop fission")."""

import torch

from fspyre.frontend import declare_tensor_dim, name_tensor_dims, spyre_hint


def model(x):
    with spyre_hint(slices={"N": 4}):
        return torch.softmax(x, dim=-1)


def example_inputs(rows: int = 64, cols: int = 8192, seed: int = 0):
    declare_tensor_dim("S", rows)
    declare_tensor_dim("N", cols)
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed), dtype=torch.float16)
    return (name_tensor_dims(x, ["S", "N"]),)
