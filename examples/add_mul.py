"""The seed's example: y = a + b; z = y * c over [1024, 4096] float16, tiled A:2 outside and
B:4 inside, so each inner iteration works on a 512 x 1024 tile and y can stay in scratchpad.

    fspyre check examples/add_mul.py
"""

import torch

from fspyre.frontend import declare_tensor_dim, name_tensor_dims, spyre_hint


def model(a, b, c):
    with spyre_hint(slices={"A": 2}):  # outer loop: 2 iterations over rows
        with spyre_hint(slices={"B": 4}):  # inner loop: 4 iterations over columns
            y = a + b
            z = y * c
    return z


def example_inputs(rows: int = 1024, cols: int = 4096, seed: int = 0):
    declare_tensor_dim("A", rows)
    declare_tensor_dim("B", cols)
    gen = torch.Generator().manual_seed(seed)
    tensors = tuple(torch.randn(rows, cols, generator=gen, dtype=torch.float16) for _ in range(3))
    for t in tensors:
        name_tensor_dims(t, ["A", "B"])
    return tensors
