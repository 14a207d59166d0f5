"""LayerNorm(768) over [T, 768] float16 tokens, tiled over tokens (T:4). torch computes the
statistics in float32 and so does the captured graph (the decomposition's upcasts survive)."""

import torch

from fspyre.frontend import declare_tensor_dim, name_tensor_dims, spyre_hint

D = 768


class LayerNormBlock(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(D)
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():  # not the trivial weight=1, bias=0 of a fresh LayerNorm
            self.norm.weight.copy_(1 + 0.1 * torch.randn(D, generator=gen))
            self.norm.bias.copy_(0.1 * torch.randn(D, generator=gen))

    def forward(self, x):
        with spyre_hint(slices={"T": 4}):
            return self.norm(x)


model = LayerNormBlock().to(torch.float16)
name_tensor_dims(model.norm.weight, ["D"])
name_tensor_dims(model.norm.bias, ["D"])


def example_inputs(tokens: int = 256, seed: int = 0):
    declare_tensor_dim("T", tokens)
    declare_tensor_dim("D", D)
    x = torch.randn(tokens, D, generator=torch.Generator().manual_seed(seed), dtype=torch.float16)
    return (name_tensor_dims(x, ["T", "D"]),)
