"""Single-head attention, softmax(q k^T / sqrt(d)) v, float16, tiled over query rows (Sq:4):
each tile computes its rows of the scores, their softmax and their share of the output,
reading all of k and v."""

import math

import torch

from fspyre.frontend import declare_tensor_dim, name_tensor_dims, spyre_hint


def model(q, k, v):
    with spyre_hint(slices={"Sq": 4}):
        scores = (q @ k.transpose(0, 1)) * (1.0 / math.sqrt(q.shape[-1]))
        return torch.softmax(scores, dim=-1) @ v


def example_inputs(queries: int = 256, keys: int = 256, head_dim: int = 64, seed: int = 0):
    declare_tensor_dim("Sq", queries)
    declare_tensor_dim("Sk", keys)
    declare_tensor_dim("E", head_dim)
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(queries, head_dim, generator=gen, dtype=torch.float16)
    k = torch.randn(keys, head_dim, generator=gen, dtype=torch.float16)
    v = torch.randn(keys, head_dim, generator=gen, dtype=torch.float16)
    name_tensor_dims(q, ["Sq", "E"])
    name_tensor_dims(k, ["Sk", "E"])
    name_tensor_dims(v, ["Sk", "E"])
    return q, k, v
