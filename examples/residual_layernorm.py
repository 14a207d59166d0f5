"""The residual add and LayerNorm(768) that close a transformer sub-block, float16, tiled over
tokens (T:4): the sum x + residual is made and normalised tile by tile."""

import torch

from fspyre.frontend import declare_tensor_dim, name_tensor_dims, spyre_hint

D = 768


class ResidualLayerNorm(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(D)
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():
            self.norm.weight.copy_(1 + 0.1 * torch.randn(D, generator=gen))
            self.norm.bias.copy_(0.1 * torch.randn(D, generator=gen))

    def forward(self, x, residual):
        with spyre_hint(slices={"T": 4}):
            return self.norm(x + residual)


model = ResidualLayerNorm().to(torch.float16)


def example_inputs(tokens: int = 256, seed: int = 0):
    declare_tensor_dim("T", tokens)
    declare_tensor_dim("D", D)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, D, generator=gen, dtype=torch.float16)
    residual = torch.randn(tokens, D, generator=gen, dtype=torch.float16)
    return name_tensor_dims(x, ["T", "D"]), name_tensor_dims(residual, ["T", "D"])
