"""What published Qwen2 EAGLE heads do that a plain transformers Qwen2 config does not say.

yuhuili/EAGLE-Qwen2-7B-Instruct (config.json at commit 8095867, pytorch_model.bin of
1,651,546,428 bytes, bfloat16) and yuhuili/EAGLE-Qwen2-72B-Instruct:

1. ``"qkv_bias": true``: a key transformers' Qwen2Config does not define. The official
   EAGLE draft code builds q/k/v *without* bias unless this key is present, whereas
   transformers' Qwen2 attention always has one. Here: the key decides when present,
   else the family default (bias on), see ``qkv_bias``.
2. ``fc.bias`` is in the weights with no config key announcing it (the official code
   defaults the fc bias to on). eagle-zoo's yuhuili-eagle reader already sets
   ``eagle_fc_bias`` from the weights, so nothing to do here.
3. ``num_key_value_heads: 28`` (plain multi-head attention) where the target
   Qwen2-7B-Instruct has 4: the head keeps its own KV cache shape (eagle-zoo sizes each
   model's cache from its own attention layers), so it need not match the target.
   The 72B head's file size (4.75 GB bf16) fits the same multi-head layout.
4. ``max_position_embeddings: 2048`` and ``sliding_window: 131072`` with
   ``use_sliding_window: false``: the head's rope is the default one (no length
   dependence) and transformers turns the window off, so neither limits the head.
"""
from __future__ import annotations

from typing import Any

QKV_BIAS_KEY = "qkv_bias"
QWEN2_QKV_BIAS_DEFAULT = True  # transformers' Qwen2Attention: q/k/v bias on, o_proj off


def qkv_bias(config: Any) -> bool:
    """Whether the q/k/v projections of a Qwen2 attention layer carry a bias."""
    value = getattr(config, QKV_BIAS_KEY, None)
    if value is None:
        return QWEN2_QKV_BIAS_DEFAULT
    if not isinstance(value, bool):
        raise ValueError(
            f"config key {QKV_BIAS_KEY!r} must be true or false (the yuhuili EAGLE-Qwen2 heads write "
            f"true), got {value!r}; fix config.json"
        )
    return value
