"""The model zoo: layers from HuggingFace ``transformers`` and ``torch.nn`` as their authors
wrote them, built from small configs with random weights (nothing is downloaded).

Each case is a ``Case``: a module taking float hidden states ``[B, S, D]`` (and the inputs
the layer's own model would hand it), and a factory of example inputs. Layers that return a
tuple are wrapped to return the hidden states only.

``FAMILIES`` are whole one-layer models; ``fspyre zoo`` verifies them against eager
(``fspyre.testing.zoo.report``). This package needs torch and transformers (``fspyre[dev]``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

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


# -- the families of issue 23: whole tiny models (and three MoE blocks), one per family ------------
# Each is built from its config with one layer, hidden 64 and 4 heads where the family has them
# (vision models: 32x32 images), random weights, eval mode; it returns its first output (the
# hidden states). ``fspyre zoo`` runs every family both ways and prints the table the README
# shows; tests/models/test_zoo.py runs a few by default and the rest with --heavy.
ZH, ZHEADS, ZFF, ZV, ZS = 64, 4, 128, 128, 16


@dataclass(frozen=True)
class Family:
    name: str
    build: Callable[[], torch.nn.Module]
    inputs: Callable[[], tuple[torch.Tensor, ...]]
    why: str = ""  # what the family exercises that others do not


def _ids() -> tuple[torch.Tensor, ...]:
    return (torch.randint(0, ZV, (1, ZS), generator=torch.Generator().manual_seed(3)),)


def _pixels() -> tuple[torch.Tensor, ...]:
    return (torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(4)),)


def _zhidden() -> tuple[torch.Tensor, ...]:
    return (torch.randn(1, ZS, ZH, generator=torch.Generator().manual_seed(1)),)


class Hidden(torch.nn.Module):
    """The model's first output (``last_hidden_state``, or the logits)."""

    def __init__(self, model: torch.nn.Module, seq2seq: bool = False) -> None:
        super().__init__()
        self.model, self.seq2seq = model, seq2seq

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.model(x, decoder_input_ids=x) if self.seq2seq else self.model(x)
        return out[0]


def _auto(model_type: str, seq2seq: bool = False, **config) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        from transformers import AutoConfig, AutoModel

        torch.manual_seed(0)
        cfg = AutoConfig.for_model(model_type, **config)
        cfg._attn_implementation = "eager"
        return Hidden(AutoModel.from_config(cfg), seq2seq).eval()
    return build


def _block(module: str, cls: str, model_type: str, **config) -> Callable[[], torch.nn.Module]:
    """A sparse-MoE block (router with top-k, experts) on hidden states."""
    def build() -> torch.nn.Module:
        import importlib

        from transformers import AutoConfig

        torch.manual_seed(0)
        cfg = AutoConfig.for_model(model_type, **config)
        block = getattr(importlib.import_module(module), cls)(cfg)
        # the experts' weights are torch.empty until a model's _init_weights runs: initialize
        # every parameter as the model would (normal, std 0.02) so no garbage or NaN gets in
        with torch.no_grad():
            for p in block.parameters():
                p.normal_(0.0, 0.02)
        return FirstOutput(block).eval()
    return build


def _whisper() -> torch.nn.Module:
    from transformers import WhisperConfig, WhisperModel

    torch.manual_seed(0)
    cfg = WhisperConfig(d_model=ZH, encoder_layers=1, decoder_layers=1, encoder_attention_heads=ZHEADS,
                        decoder_attention_heads=ZHEADS, encoder_ffn_dim=ZFF, decoder_ffn_dim=ZFF, num_mel_bins=16,
                        max_source_positions=16, vocab_size=ZV, pad_token_id=0, decoder_start_token_id=1)
    cfg._attn_implementation = "eager"
    return Hidden(WhisperModel(cfg).get_encoder()).eval()


def _mel() -> tuple[torch.Tensor, ...]:
    return (torch.randn(1, 16, 32, generator=torch.Generator().manual_seed(5)),)


class _CausalLM(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(0)
        cfg = LlamaConfig(**_LM, num_key_value_heads=2, tie_word_embeddings=False)
        cfg._attn_implementation = "eager"
        self.lm = LlamaForCausalLM(cfg).eval()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids=ids, use_cache=False).logits


_LM: dict[str, Any] = dict(hidden_size=ZH, num_attention_heads=ZHEADS, num_hidden_layers=1, intermediate_size=ZFF,
                           vocab_size=ZV, max_position_embeddings=64, use_cache=False)
_MOE: dict[str, Any] = dict(hidden_size=ZH, intermediate_size=ZFF, num_local_experts=4, num_experts=4,
                            num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32,
                            num_attention_heads=ZHEADS)
_VISION: dict[str, Any] = dict(hidden_size=ZH, num_attention_heads=ZHEADS, num_hidden_layers=1, intermediate_size=ZFF,
                               image_size=32, patch_size=8)

FAMILIES = {f.name: f for f in (
    Family("gpt2", _auto("gpt2", n_embd=ZH, n_head=ZHEADS, n_layer=1, vocab_size=ZV, n_positions=64,
                         use_cache=False), _ids),
    Family("bert", _auto("bert", **_LM), _ids),
    Family("llama", _auto("llama", num_key_value_heads=2, **_LM), _ids),
    Family("llama_causal_lm", _CausalLM, _ids, "the LM head over the vocabulary"),
    Family("gemma", _auto("gemma", head_dim=16, num_key_value_heads=2, **_LM), _ids),
    Family("gemma2", _auto("gemma2", head_dim=16, num_key_value_heads=2, **_LM), _ids, "logit soft-capping"),
    Family("gemma3", _auto("gemma3_text", head_dim=16, num_key_value_heads=2, **_LM), _ids, "q/k norms"),
    Family("mistral", _auto("mistral", num_key_value_heads=2, **_LM), _ids),
    Family("qwen2", _auto("qwen2", num_key_value_heads=2, **_LM), _ids),
    Family("qwen3", _auto("qwen3", head_dim=16, num_key_value_heads=2, **_LM), _ids),
    Family("olmo", _auto("olmo", num_key_value_heads=4, **_LM), _ids),
    Family("stablelm", _auto("stablelm", num_key_value_heads=4, **_LM), _ids, "partial rotary"),
    Family("phi", _auto("phi", **_LM), _ids, "Phi-2: partial rotary"),
    Family("phi3", _auto("phi3", num_key_value_heads=4, pad_token_id=0, **_LM), _ids,
           "full rotary: an empty pass-through slice"),
    Family("cohere", _auto("cohere", num_key_value_heads=4, **_LM), _ids, "interleaved rotary (x[..., ::2])"),
    Family("gptj", _auto("gptj", n_embd=ZH, n_head=ZHEADS, n_layer=1, vocab_size=ZV, n_positions=64, rotary_dim=16,
                         use_cache=False), _ids, "interleaved rotary over the whole head dim"),
    Family("codegen", _auto("codegen", n_embd=ZH, n_head=ZHEADS, n_layer=1, vocab_size=ZV, n_positions=64,
                            rotary_dim=8, use_cache=False), _ids, "interleaved partial rotary"),
    Family("gpt_neox", _auto("gpt_neox", **_LM), _ids),
    Family("falcon", _auto("falcon", hidden_size=ZH, num_attention_heads=ZHEADS, num_hidden_layers=1, vocab_size=ZV,
                           use_cache=False), _ids),
    Family("bloom", _auto("bloom", hidden_size=ZH, n_head=ZHEADS, n_layer=1, vocab_size=ZV, use_cache=False), _ids,
           "alibi"),
    Family("mpt", _auto("mpt", d_model=ZH, n_heads=ZHEADS, n_layers=1, vocab_size=ZV, max_seq_len=64,
                        use_cache=False), _ids, "alibi"),
    Family("opt", _auto("opt", hidden_size=ZH, num_attention_heads=ZHEADS, num_hidden_layers=1, ffn_dim=ZFF,
                        vocab_size=ZV, max_position_embeddings=64, word_embed_proj_dim=ZH, use_cache=False), _ids),
    Family("distilbert", _auto("distilbert", dim=ZH, n_heads=ZHEADS, n_layers=1, hidden_dim=ZFF, vocab_size=ZV,
                               max_position_embeddings=64), _ids),
    Family("roberta", _auto("roberta", pad_token_id=1, **_LM), _ids),
    Family("albert", _auto("albert", embedding_size=32, **_LM), _ids),
    Family("electra", _auto("electra", embedding_size=32, **_LM), _ids),
    Family("bart", _auto("bart", d_model=ZH, encoder_layers=1, decoder_layers=1, encoder_attention_heads=ZHEADS,
                         decoder_attention_heads=ZHEADS, encoder_ffn_dim=ZFF, decoder_ffn_dim=ZFF, vocab_size=ZV,
                         max_position_embeddings=64, use_cache=False), _ids, "decoder with cross-attention"),
    Family("t5", _auto("t5", seq2seq=True, d_model=ZH, d_ff=ZFF, num_heads=ZHEADS, d_kv=16, num_layers=1,
                       num_decoder_layers=1, vocab_size=ZV, use_cache=False), _ids, "decoder with cross-attention"),
    Family("whisper_encoder", _whisper, _mel, "conv1d stem"),
    Family("clip_text", _auto("clip_text_model", hidden_size=ZH, num_attention_heads=ZHEADS, num_hidden_layers=1,
                              intermediate_size=ZFF, vocab_size=ZV, max_position_embeddings=64), _ids),
    Family("clip_vision", _auto("clip_vision_model", **_VISION), _pixels, "conv patch embedding"),
    Family("vit", _auto("vit", **_VISION), _pixels, "conv patch embedding"),
    Family("swin", _auto("swin", embed_dim=16, depths=[1, 1], num_heads=[2, 2], image_size=32, patch_size=4,
                         window_size=4), _pixels, "windows, patch merging"),
    Family("convnext", _auto("convnext", hidden_sizes=[16, 32], depths=[1, 1], num_stages=2, image_size=32), _pixels,
           "depthwise 7x7 conv"),
    Family("resnet", _auto("resnet", embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic"),
           _pixels, "conv + batch norm, max pool"),
    Family("mamba", _auto("mamba", hidden_size=ZH, state_size=8, num_hidden_layers=1, vocab_size=ZV,
                          intermediate_size=ZFF, use_cache=False), _ids, "causal depthwise conv1d, selective scan"),
    Family("mixtral_moe", _block("transformers.models.mixtral.modeling_mixtral", "MixtralSparseMoeBlock", "mixtral",
                                 **_MOE), _zhidden, "top-k router, per-expert loop"),
    Family("qwen2_moe", _block("transformers.models.qwen2_moe.modeling_qwen2_moe", "Qwen2MoeSparseMoeBlock",
                               "qwen2_moe", **_MOE), _zhidden, "top-k router, shared expert"),
    Family("olmoe", _block("transformers.models.olmoe.modeling_olmoe", "OlmoeSparseMoeBlock", "olmoe", **_MOE),
           _zhidden, "top-k router"),
)}
