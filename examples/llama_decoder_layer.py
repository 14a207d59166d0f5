"""transformers' LlamaDecoderLayer as its authors wrote it (grouped-query attention with 4
query and 2 key/value heads, rotary embeddings, a causal mask, RMSNorm, the gated MLP), small
config, random weights, float16 [B, S, D] hidden states. One hint around the whole layer tiles
it by the sequence dim S (S:4): nn.Linear flattens [B, S, D] to [B*S, D], and the front end
keeps S iterable through it. The ops that read an S-tiled result out of step (the rotary
embedding through the reshape that merges its halves, the mask along another dim) run in
S loops after their producers' (loop fission); an op no S loop could hold would be moved out
with a warning naming it and its line (docs/deviations.md, "Hint scopes around module code").
At this small S, three ops whose sticks hold more than a quarter of S warn that they run in
fewer, whole-stick tiles. Needs the `dev` extra (transformers)."""

import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

from fspyre.frontend import declare_tensor_dim, name_tensor_dims, spyre_hint

D, HEADS, KV_HEADS, FF = 64, 4, 2, 128


class DecoderLayer(torch.nn.Module):
    """The layer as LlamaModel calls it: rotary embeddings of positions 0..S-1 and the
    additive causal mask built from them (any size: benchmarks/proof_time.py builds the
    real one)."""

    def __init__(self, hidden: int = D, ff: int = FF, heads: int = HEADS, kv_heads: int = KV_HEADS,
                 max_positions: int = 1024) -> None:
        super().__init__()
        torch.manual_seed(0)
        cfg = LlamaConfig(hidden_size=hidden, intermediate_size=ff, num_attention_heads=heads,
                          num_key_value_heads=kv_heads, num_hidden_layers=1, vocab_size=128,
                          max_position_embeddings=max_positions, attn_implementation="eager")
        self.layer = LlamaDecoderLayer(cfg, 0)
        self.rotary = LlamaRotaryEmbedding(cfg)

    def forward(self, x):
        with spyre_hint(slices={"S": 4}):
            positions = torch.arange(x.shape[1])
            causal = torch.where(positions[None, :] > positions[:, None], float("-inf"), 0.0).to(x.dtype)
            out = self.layer(x, attention_mask=causal[None, None],
                             position_embeddings=self.rotary(x, positions[None]))
            return out[0] if isinstance(out, tuple) else out


model = DecoderLayer().eval().to(torch.float16)


def example_inputs(batch: int = 2, seq: int = 64, seed: int = 0):
    declare_tensor_dim("S", seq)
    x = torch.randn(batch, seq, D, generator=torch.Generator().manual_seed(seed), dtype=torch.float16)
    return (name_tensor_dims(x, ["B", "S", "D"]),)
