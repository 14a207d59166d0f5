"""The model zoo: layers from HuggingFace ``transformers`` and ``torch.nn`` as their authors
wrote them, built from small configs with random weights (nothing is downloaded).

Each case is a ``Case``: a module taking float hidden states ``[B, S, D]`` (and the inputs
the layer's own model would hand it), and a factory of example inputs. Layers that return a
tuple are wrapped to return the hidden states only."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

B, S, D, HEADS, FF = 2, 16, 64, 4, 128


@dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[], torch.nn.Module]  # float32, eval mode, seeded
    inputs: Callable[[], tuple[torch.Tensor, ...]]  # float32


class FirstOutput(torch.nn.Module):
    """``layer(x)[0]`` for layers that return (hidden_states, ...)."""

    def __init__(self, layer: torch.nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.layer(x)
        return out[0] if isinstance(out, tuple) else out


def _seeded(make: Callable[[], torch.nn.Module]) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        torch.manual_seed(0)
        return make().eval()
    return build


def _hidden() -> tuple[torch.Tensor, ...]:
    return (torch.randn(B, S, D, generator=torch.Generator().manual_seed(1)),)


def _gpt2() -> torch.nn.Module:
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    cfg = GPT2Config(n_embd=D, n_head=HEADS, n_layer=1, n_positions=S, vocab_size=128, bos_token_id=0,
                     eos_token_id=0, attn_implementation="eager")
    return FirstOutput(GPT2Block(cfg, 0))


def _bert() -> torch.nn.Module:
    from transformers import BertConfig
    from transformers.models.bert.modeling_bert import BertLayer

    cfg = BertConfig(hidden_size=D, intermediate_size=FF, num_attention_heads=HEADS, num_hidden_layers=1,
                     attn_implementation="eager")
    return FirstOutput(BertLayer(cfg))


class _MHA(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = torch.nn.MultiheadAttention(D, HEADS, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attn(x, x, x, need_weights=False)[0]


class _Llama(torch.nn.Module):
    """LlamaDecoderLayer (grouped-query attention: 4 query heads, 2 key/value heads) as
    LlamaModel calls it: rotary embeddings of positions 0..S-1 and a causal mask built from
    them."""

    def __init__(self) -> None:
        super().__init__()
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

        cfg = LlamaConfig(hidden_size=D, intermediate_size=FF, num_attention_heads=HEADS, num_key_value_heads=2,
                          num_hidden_layers=1, vocab_size=128, max_position_embeddings=4 * S,
                          attn_implementation="eager")
        self.layer = LlamaDecoderLayer(cfg, 0)
        self.rotary = LlamaRotaryEmbedding(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(x.shape[1])
        causal = torch.where(positions[None, :] > positions[:, None], float("-inf"), 0.0).to(x.dtype)
        out = self.layer(x, attention_mask=causal[None, None], position_embeddings=self.rotary(x, positions[None]))
        return out[0] if isinstance(out, tuple) else out


def _t5() -> torch.nn.Module:
    """T5Block (encoder) with its relative-position bias: buckets of position differences
    (int64 arithmetic, log, a float-to-int conversion) looked up in an embedding."""
    from transformers import T5Config
    from transformers.models.t5.modeling_t5 import T5Block

    cfg = T5Config(d_model=D, d_ff=FF, num_heads=HEADS, d_kv=D // HEADS, num_layers=1, is_decoder=False,
                   dropout_rate=0.0)
    return FirstOutput(T5Block(cfg, has_relative_attention_bias=True))


def _encoder() -> torch.nn.Module:
    return torch.nn.TransformerEncoderLayer(D, HEADS, FF, dropout=0.0, batch_first=True)


CASES = {c.name: c for c in (
    Case("gpt2_block", _seeded(_gpt2), _hidden),
    Case("bert_layer", _seeded(_bert), _hidden),
    Case("llama_decoder_layer", _seeded(_Llama), _hidden),
    Case("t5_block", _seeded(_t5), _hidden),
    Case("nn_multihead_attention", _seeded(_MHA), _hidden),
    Case("nn_transformer_encoder_layer", _seeded(_encoder), _hidden),
)}


class TinyCausalLM(torch.nn.Module):
    """LlamaForCausalLM with 2 decoder layers, from ``input_ids`` and a 2-d padding mask to
    logits. transformers builds the 4-d causal mask itself (``create_causal_mask``): its
    padding term indexes the padding mask by two arange grids at once."""

    def __init__(self) -> None:
        super().__init__()
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(0)
        cfg = LlamaConfig(hidden_size=D, intermediate_size=FF, num_attention_heads=HEADS, num_key_value_heads=2,
                          num_hidden_layers=2, vocab_size=256, max_position_embeddings=4 * S,
                          attn_implementation="eager", use_cache=False)
        self.lm = LlamaForCausalLM(cfg).eval()

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids=ids, attention_mask=attention_mask, use_cache=False).logits


def token_ids() -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids [B, S] and their padding mask: the first sequence's last 3 tokens are
    padding (right padding: every query still sees key 0, so no row is fully masked)."""
    ids = torch.randint(0, 256, (B, S), generator=torch.Generator().manual_seed(3))
    mask = torch.ones(B, S, dtype=torch.int64)
    mask[0, -3:] = 0
    return ids, mask
