"""Row softmax over [S, N] float16, tiled over rows (S:4): each tile holds whole rows, so the
max and the sum of a row never cross a tile boundary."""

import torch

from fspyre.frontend import declare_tensor_dim, name_tensor_dims, spyre_hint


def model(x):
    with spyre_hint(slices={"S": 4}):
        return torch.softmax(x, dim=-1)


def example_inputs(rows: int = 512, cols: int = 1024, seed: int = 0):
    declare_tensor_dim("S", rows)
    declare_tensor_dim("N", cols)
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed), dtype=torch.float16)
    return (name_tensor_dims(x, ["S", "N"]),)
