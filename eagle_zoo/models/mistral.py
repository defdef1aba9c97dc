"""The mistral family: target model, EAGLE-1 / EAGLE-3 heads and the mapping table.

Mistral is Llama-shaped (RMSNorm, silu MLP, GQA, no biases, head_dim from the config)
with a sliding window on every layer (``config.sliding_window``, None: full
attention): the Llama modules serve it as they are, since LlamaAttention reads
``sliding_window`` from the config.

Checkpoint names come in two spellings, both loaded by one table (MISTRAL_MAPPING):
HF names (``model.layers.N.self_attn.q_proj.weight``) and Mistral-native names as in
``consolidated.safetensors`` (``layers.N.attention.wq.weight``,
``layers.N.feed_forward.w1.weight``, ``attention_norm``, ``ffn_norm``,
``tok_embeddings``, ``norm``, ``output`` for the lm_head, ``eagle_linear`` for the
EAGLE fc). Native wq / wk rows are in the original interleaved rotary layout; they
are reordered to the HF half-split layout as they load (ROPE_PERMUTED_PARTS), so both
spellings fill the same parameters with the same values.

EAGLE-1 head (vLLM's EagleMistralForCausalLM): fc(cat([embed, hidden])) with no bias
(unless the config / file has one), full Mistral decoder layers that keep their input
norm, and a final ``norm`` whose output is both the logits' input and the feature fed
back at the next step (norm_output); lm_head / embeddings come from the target when
the checkpoint has none. EAGLE-3 (Eagle3MistralForCausalLM): the generic head over
Mistral attention with the window.

EagleMistralLarge3ForCausalLM is not served here: Mistral Large 3 is a DeepSeek-V3
architecture (MLA attention, MoE) and vLLM builds that head from DeepseekV2 decoder
layers (fc without enorm / hnorm, final norm, Mistral-native ``eagle_linear``). It is
served by the mistral_large3 family (models/mistral_large3.py, on DeepSeek's MLA
layers), with the Mistral-native params.json format in checkpoints/mistral_native.py.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Iterator

import torch

from ..hookspecs import hookimpl
from ..specs import FamilySpec, WeightMapping
from .heads import Eagle3Head, EagleHead, Weights, cfg
from .llama import LLAMA_MAPPING, LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM, LlamaMLP

# Mistral-native names -> the HF names LLAMA_MAPPING then fuses. Renames run in order:
# attention_norm before the bare ``.attention.``; names are matched with their dots so
# no HF name is touched. Fused parts use ``.qkv_proj.`` / ``.gate_up_proj.`` (with the
# trailing dot) so each spelling stays a separate group of the stacked table.
# The names every Mistral-native checkpoint shares (Mistral Large 3 adds its own).
MISTRAL_NATIVE_COMMON_RENAMES = (
    ("^tok_embeddings.", "embed_tokens."),
    ("^output.", "lm_head."),
    ("^eagle_linear.", "fc."),
    (".attention_norm.", ".input_layernorm."),
    (".ffn_norm.", ".post_attention_layernorm."),
    (".attention.", ".self_attn."),
)
MISTRAL_NATIVE_MAPPING = WeightMapping(
    renames=MISTRAL_NATIVE_COMMON_RENAMES + (
        (".feed_forward.", ".mlp."),
        (".wo.", ".o_proj."),
        (".w2.", ".down_proj."),
    ),
    stacked=(
        (".qkv_proj.", ".wq.", "q"),
        (".qkv_proj.", ".wk.", "k"),
        (".qkv_proj.", ".wv.", "v"),
        (".gate_up_proj.", ".w1.", 0),
        (".gate_up_proj.", ".w3.", 1),
    ),
)
# ``norm`` (the final norm) is spelled the same in both; HF names come first.
MISTRAL_MAPPING: WeightMapping = LLAMA_MAPPING.merged(MISTRAL_NATIVE_MAPPING)

# Native key part -> the config key giving the number of heads in its rows.
ROPE_PERMUTED_PARTS = {".wq.": "num_attention_heads", ".wk.": "num_key_value_heads"}


def interleaved_to_half(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Rows of each head from rotary pairs (2i, 2i+1) to pairs (i, i + d/2).

    Within a head, row 2i goes to row i and row 2i+1 to row i + d/2; columns (and a
    1-D bias) are untouched.
    """
    d = w.shape[0] // n_heads
    return w.reshape(n_heads, d // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def native_rope_rows_to_hf(weights: Weights, config: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's (key, tensor) pairs with native wq / wk rows reordered.

    A tensor whose rows do not split into the configured heads is passed on as it is,
    so the loader reports its shape against the parameter (file, key, shapes).
    """
    items = weights.items() if isinstance(weights, Mapping) else weights
    for key, tensor in items:
        part = next((p for p in ROPE_PERMUTED_PARTS if p in key), None)
        if part is not None:
            heads = cfg(config, ROPE_PERMUTED_PARTS[part]) or config.num_attention_heads
            rows = tensor.shape[0] if tensor.dim() else 0
            if rows and rows % heads == 0 and (rows // heads) % 2 == 0:
                tensor = interleaved_to_half(tensor, heads)
        yield key, tensor


class MistralNativeWeights:
    """Mixin for every mistral module that loads a checkpoint: reorders native wq / wk
    rows, then the class's own load_weights applies MISTRAL_MAPPING."""

    def load_weights(self, weights: Weights, source: str) -> set[str]:
        return super().load_weights(native_rope_rows_to_hf(weights, self.config), source)


class MistralForCausalLM(MistralNativeWeights, LlamaForCausalLM):
    """Target model; Llama's modules with the config's sliding window."""

    weight_mapping = MISTRAL_MAPPING


class MistralEagleHead(MistralNativeWeights, EagleHead):
    decoder_layer_cls = LlamaDecoderLayer
    weight_mapping = MISTRAL_MAPPING
    input_norm_identity = False  # Mistral-format heads keep attention_norm
    final_norm = True
    norm_output = True  # vLLM's model returns norm(h) for the logits and the next step


class MistralEagle3Head(MistralNativeWeights, Eagle3Head):
    attention_cls = LlamaAttention
    mlp_cls = LlamaMLP
    decoder_layer_cls = LlamaDecoderLayer
    weight_mapping = MISTRAL_MAPPING


def _mistral_config(*args, **kwargs):
    from transformers import MistralConfig  # imported on use: plugin discovery stays quick

    return MistralConfig(*args, **kwargs)


@hookimpl
def register_families(register):
    register(FamilySpec(
        name="mistral",
        architectures=("MistralForCausalLM",),
        model_types=("mistral",),
        target_model=MistralForCausalLM,
        eagle_head=MistralEagleHead,
        eagle3_head=MistralEagle3Head,
        weight_mapping=MISTRAL_MAPPING,
        config_class=_mistral_config,
    ))
