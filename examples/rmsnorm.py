"""RMSNorm(768) over [T, 768] float16 tokens, tiled over tokens (T:4)."""

import torch

from fspyre.frontend import declare_tensor_dim, name_tensor_dims, spyre_hint

D = 768


class RMSNormBlock(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.RMSNorm(D, eps=1e-6)
        with torch.no_grad():
            self.norm.weight.copy_(1 + 0.1 * torch.randn(D, generator=torch.Generator().manual_seed(1)))

    def forward(self, x):
        with spyre_hint(slices={"T": 4}):
            return self.norm(x)


model = RMSNormBlock().to(torch.float16)


def example_inputs(tokens: int = 256, seed: int = 0):
    declare_tensor_dim("T", tokens)
    declare_tensor_dim("D", D)
    x = torch.randn(tokens, D, generator=torch.Generator().manual_seed(seed), dtype=torch.float16)
    return (name_tensor_dims(x, ["T", "D"]),)
