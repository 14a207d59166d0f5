"""A transformer MLP block, linear(768 -> 3072) -> gelu -> linear(3072 -> 768), over [T, 768]
float16 tokens. Tiled over tokens (T:4); within a tile the 3072-wide hidden activation is
produced and consumed, which is what lets it live in scratchpad."""

import torch
import torch.nn.functional as F

from fspyre.frontend import declare_tensor_dim, name_tensor_dims, spyre_hint

D, H = 768, 3072


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(1)
        self.up = torch.nn.Linear(D, H)
        self.down = torch.nn.Linear(H, D)
        with torch.no_grad():  # a scale that keeps activations O(1) in float16
            for lin in (self.up, self.down):
                lin.weight.copy_(torch.randn(lin.weight.shape, generator=gen) / lin.in_features**0.5)
                lin.bias.copy_(0.1 * torch.randn(lin.bias.shape, generator=gen))

    def forward(self, x):
        with spyre_hint(slices={"T": 4}):
            return self.down(F.gelu(self.up(x)))


model = MLP().to(torch.float16)
name_tensor_dims(model.up.weight, ["H", "D"])
name_tensor_dims(model.down.weight, ["D", "H"])


def example_inputs(tokens: int = 128, seed: int = 0):
    declare_tensor_dim("T", tokens)
    declare_tensor_dim("D", D)
    declare_tensor_dim("H", H)
    x = torch.randn(tokens, D, generator=torch.Generator().manual_seed(seed), dtype=torch.float16)
    return (name_tensor_dims(x, ["T", "D"]),)
