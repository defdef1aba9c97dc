"""The mistral_large3 family: Mistral Large 3 (MistralLarge3ForCausalLM) and its EAGLE head.

Facts (vLLM's mistral_large_3.py / mistral_large_3_eagle.py and
transformers_utils/configs/mistral.py):

- Mistral Large 3 is a DeepSeek-V3 architecture (MLA attention, MoE with shared
  experts); vLLM's MistralLarge3ForCausalLM *is* its DeepseekV3ForCausalLM with a table
  from Mistral-native tensor names. Its params.json becomes a ``deepseek_v3`` config
  with ``architectures: ["MistralLarge3ForCausalLM"]`` (see checkpoints/mistral_native.py).
  So the target and the layers are the deepseek family's; only the names differ.
- Native names: ``layers.N.attention.{wq_a, q_a_norm, wq_b, wkv_a_with_mqa, kv_a_norm,
  wkv_b, wo}``, ``attention_norm``, ``ffn_norm``, ``feed_forward.{w1,w2,w3}`` (gate, down,
  up), ``gate`` (router), ``shared_experts.{w1,w2,w3}``, ``experts.E.{w1,w2,w3}``,
  ``norm``, ``tok_embeddings``, ``output`` (lm_head), ``eagle_linear`` (the EAGLE fc).
  MLA's rope rows are already in DeepSeek's interleaved layout: no reordering (unlike
  Mistral's wq / wk).
- EAGLE head (EagleMistralLarge3ForCausalLM): h = fc(cat([embed(ids), hidden])) with no
  bias and *no* enorm / hnorm; then full DeepSeek-V2 decoder layers (input norm kept);
  then the final norm. The model returns norm(h) both for the logits and as the feature
  fed back (norm_output). Embeddings and lm_head come from the target.
- Layer numbering: vLLM numbers head layers after the target's (layer index
  L_target + i) and raises first_k_dense_replace by L_target too, so a head layer i is
  MoE exactly when the *head's own* config says so for index i (a dense params.json
  gets first_k_dense_replace = n_layers: every head layer dense). This differs from the
  DeepSeek EAGLE head (always MoE when the config has experts).
"""
from __future__ import annotations

from ..hookspecs import hookimpl
from ..specs import FamilySpec, WeightMapping
from .deepseek import (
    DeepseekDecoderLayer,
    DeepseekEagleHead,
    DeepseekForCausalLM,
    _deepseek_config,
    deepseek_mapping,
)
from .heads import EagleHead
from .mistral import MISTRAL_NATIVE_COMMON_RENAMES

# Native names -> the HF DeepSeek names the deepseek table then fuses. Renames run in
# order, each once; names are matched with their dots. The router and experts are
# ``layers.N.gate`` natively but ``layers.N.mlp.gate`` in HF names: HF spellings are
# first brought to the native form, so the one ``.gate.`` -> ``.mlp.gate.`` rename
# serves both.
MISTRAL_LARGE3_NATIVE_RENAMES = (
    (".mlp.gate.", ".gate."),
    (".mlp.shared_experts.", ".shared_experts."),
    (".mlp.experts.", ".experts."),
) + MISTRAL_NATIVE_COMMON_RENAMES + (
    (".wq_a.", ".q_a_proj."),
    (".q_a_norm.", ".q_a_layernorm."),
    (".wq_b.", ".q_b_proj."),
    (".wkv_a_with_mqa.", ".kv_a_proj_with_mqa."),
    (".kv_a_norm.", ".kv_a_layernorm."),
    (".wkv_b.", ".kv_b_proj."),
    (".wo.", ".o_proj."),
    (".feed_forward.", ".mlp."),
    (".gate.", ".mlp.gate."),  # the router: layers.N.gate.weight
    (".shared_experts.", ".mlp.shared_experts."),
    (".experts.", ".mlp.experts."),  # not shared_experts: that one has no dot before
    (".w1.", ".gate_proj."),
    (".w2.", ".down_proj."),
    (".w3.", ".up_proj."),
)
MISTRAL_LARGE3_MAPPING = WeightMapping(renames=MISTRAL_LARGE3_NATIVE_RENAMES)


def mistral_large3_mapping(config, mtp_after=None) -> WeightMapping:
    """Native renames first, then the deepseek table of this config (HF names load too)."""
    ds = deepseek_mapping(config, mtp_after)
    return WeightMapping(renames=MISTRAL_LARGE3_NATIVE_RENAMES + ds.renames, stacked=ds.stacked, ignored=ds.ignored)


class MistralLarge3ForCausalLM(DeepseekForCausalLM):
    """Target model: the DeepSeek-V3 target loading native or HF names."""

    weight_mapping = MISTRAL_LARGE3_MAPPING

    def __init__(self, config):
        super().__init__(config)
        self.weight_mapping = mistral_large3_mapping(config, mtp_after=config.num_hidden_layers)


class MistralLarge3EagleDecoderLayer(DeepseekDecoderLayer):
    """MoE as the head's own config says for its index (see the module docstring);
    DeepseekDecoderLayer.is_moe is already that rule."""


class MistralLarge3EagleHead(DeepseekEagleHead):
    decoder_layer_cls = MistralLarge3EagleDecoderLayer
    pre_fc_norms = False  # no enorm / hnorm, unlike the DeepSeek EAGLE head
    weight_mapping = MISTRAL_LARGE3_MAPPING

    def __init__(self, config):
        EagleHead.__init__(self, config)
        self.weight_mapping = mistral_large3_mapping(config)
    # forward (returns norm(h)) and compute_logits (lm_head only) are DeepseekEagleHead's.


@hookimpl
def register_families(register):
    register(FamilySpec(
        name="mistral_large3",
        architectures=("MistralLarge3ForCausalLM",),
        model_types=(),  # its configs say deepseek_v3, which the deepseek family serves
        target_model=MistralLarge3ForCausalLM,
        eagle_head=MistralLarge3EagleHead,
        eagle3_head=None,
        weight_mapping=MISTRAL_LARGE3_MAPPING,
        config_class=_deepseek_config,
    ))
