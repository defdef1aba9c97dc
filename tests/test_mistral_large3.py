"""Mistral Large 3 EAGLE head (EagleMistralLarge3ForCausalLM) in the Mistral-native layout.

References: the checkpoint layout vLLM reads (params.json with MLA keys, consolidated
safetensors, native names from vLLM's mistral_large_3.py remapping table, written out
by hand here), and transformers' DeepseekV3 decoder layer / RMSNorm / rotary (and
Mistral4's attention for the llama-4 query scaling) with the same weights, fp32.
"""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file
from torch import nn
from transformers import DeepseekV3Config
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as hf3

import eagle_zoo
import reference_models as rm
from eagle_zoo.checkpoints.formats import detect_format
from eagle_zoo.models.mistral_large3 import MistralLarge3EagleHead

V, H, B, T = 96, 32, 2, 6
ORIG = 16  # yarn's and llama-4 scaling's original context
PARAMS = {  # a tiny params.json in Mistral's spelling
    "dim": H, "n_layers": 1, "n_heads": 4, "n_kv_heads": 4, "hidden_dim": 48, "vocab_size": V,
    "norm_eps": 1e-5, "rope_theta": 10000.0, "q_lora_rank": 24, "kv_lora_rank": 16,
    "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 12, "max_position_embeddings": 64,
    "yarn": {"factor": 4.0, "original_max_position_embeddings": ORIG, "beta": 32.0, "alpha": 1.0},
    "llama_4_scaling": {"original_max_position_embeddings": ORIG, "beta": 0.1},
}
# HF DeepSeek name -> Mistral-native name (vLLM's MistralLarge3ForCausalLM table, reversed).
NATIVE = {
    "input_layernorm": "attention_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_a_proj": "attention.wq_a", "self_attn.q_a_layernorm": "attention.q_a_norm",
    "self_attn.q_b_proj": "attention.wq_b", "self_attn.kv_a_proj_with_mqa": "attention.wkv_a_with_mqa",
    "self_attn.kv_a_layernorm": "attention.kv_a_norm", "self_attn.kv_b_proj": "attention.wkv_b",
    "self_attn.o_proj": "attention.wo", "mlp.gate_proj": "feed_forward.w1",
    "mlp.down_proj": "feed_forward.w2", "mlp.up_proj": "feed_forward.w3",
}


def hf_config():
    """The same model as transformers' DeepseekV3Config (dense layer: first_k_dense_replace 1)."""
    rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": ORIG,
            "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}
    return DeepseekV3Config(vocab_size=V, hidden_size=H, intermediate_size=48, num_hidden_layers=1,
                            num_attention_heads=4, num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=16,
                            qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=12, rms_norm_eps=1e-5,
                            max_position_embeddings=64, first_k_dense_replace=1, n_routed_experts=1,
                            rope_parameters=rope, attn_implementation="eager")


randomize = rm.randomize


class RefHead(nn.Module):
    """vLLM's EagleMistralLarge3 head from transformers' modules: fc(cat[embed, hidden])
    (no enorm / hnorm, no bias) -> DeepSeek-V3 decoder layer (input norm kept) -> norm."""

    def __init__(self, config):
        super().__init__()
        self.embed = nn.Embedding(V, H)
        self.fc = nn.Linear(2 * H, H, bias=False)
        self.layer = hf3.DeepseekV3DecoderLayer(config, 0)
        assert isinstance(self.layer.mlp, hf3.DeepseekV3MLP)
        self.norm = hf3.DeepseekV3RMSNorm(H, config.rms_norm_eps)
        self.lm_head = nn.Linear(H, V, bias=False)
        self.rotary = hf3.DeepseekV3RotaryEmbedding(config)

    def forward(self, ids, positions, hidden):
        h = self.fc(torch.cat([self.embed(ids), hidden], -1))
        h = self.layer(h, attention_mask=rm.causal_mask(h.shape[1]), position_embeddings=self.rotary(h, positions),
                       position_ids=positions)
        return self.norm(h)

    def native_checkpoint(self) -> dict:
        sd = {"eagle_linear.weight": self.fc.weight, "norm.weight": self.norm.weight}
        for name, t in self.layer.state_dict().items():
            module, leaf = name.rsplit(".", 1)
            sd[f"layers.0.{NATIVE[module]}.{leaf}"] = t
        return {k: v.detach().clone().contiguous() for k, v in sd.items()}


class Target(nn.Module):
    """Only what the head takes from the target: config, embed_tokens, lm_head."""

    def __init__(self, ref: RefHead):
        super().__init__()
        self.config = {"architectures": ["MistralLarge3ForCausalLM"], "hidden_size": H, "vocab_size": V}
        self.embed_tokens, self.lm_head = ref.embed, ref.lm_head


def write_native(directory, weights: dict, params: dict = PARAMS):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "params.json").write_text(json.dumps(params))
    save_file(weights, str(directory / "consolidated.safetensors"))
    return directory


@pytest.fixture
def builtin_plugins(monkeypatch, reset_plugin_host):
    monkeypatch.setenv(reset_plugin_host.DISABLE_AUTOLOAD_ENV, "1")
    return reset_plugin_host


def _inputs(offset):
    ids, positions, g = rm.token_inputs(V, B, T, seed=1, offset=offset)
    return ids, positions, torch.randn(B, T, H, generator=g)


def test_native_checkpoint_loads_and_matches_transformers(tmp_path, builtin_plugins):
    ref = randomize(RefHead(hf_config()), seed=0)
    weights = ref.native_checkpoint()
    assert "layers.0.attention.wkv_a_with_mqa.weight" in weights and "eagle_linear.weight" in weights
    path = write_native(tmp_path / "head", weights)
    assert not (path / "config.json").exists()
    assert detect_format(path).name == "mistral-eagle"

    loaded = eagle_zoo.load(path, target=Target(ref))
    assert (loaded.format, loaded.method, loaded.family) == ("mistral-eagle", "eagle", "mistral_large3")
    assert loaded.config.architectures == ["EagleMistralLarge3ForCausalLM"]
    head = loaded.head
    assert isinstance(head, MistralLarge3EagleHead) and loaded.shared == ["embed_tokens", "lm_head"]
    assert not hasattr(head, "enorm") and head.fc.bias is None
    ids, positions, hidden = _inputs(offset=3)  # below ORIG: llama-4 scaling is 1
    _, expected, logits = rm.eagle_step(head, ref, ids, positions, hidden, tol=1e-5)
    with torch.no_grad():
        torch.testing.assert_close(logits, ref.lm_head(expected), atol=1e-5, rtol=1e-5)


def test_llama4_query_scaling_matches_transformers_mistral4():
    """Past original_max_position_embeddings the queries are scaled (transformers'
    Mistral4Attention does the same with llama_4_scaling_beta)."""
    from transformers import Mistral4Config
    from transformers.models.mistral4 import modeling_mistral4 as m4

    from eagle_zoo.checkpoints.mistral_native import hf_config_dict
    from eagle_zoo.config.eagle_config import EagleConfig
    from eagle_zoo.models.deepseek import DeepseekMLAAttention

    rope = dict(hf_config().rope_parameters, llama_4_scaling_beta=0.1)
    m4_config = Mistral4Config(vocab_size=V, hidden_size=H, num_attention_heads=4, num_key_value_heads=4,
                               q_lora_rank=24, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
                               v_head_dim=12, rms_norm_eps=1e-5, max_position_embeddings=64,
                               rope_parameters=rope, attn_implementation="eager")
    ref = randomize(m4.Mistral4Attention(m4_config, 0), seed=2)
    rotary = m4.Mistral4RotaryEmbedding(m4_config)
    config = EagleConfig.from_dict(hf_config_dict(PARAMS, "params.json"), method="eagle")
    attn = DeepseekMLAAttention(config)
    sd = ref.state_dict()
    from eagle_zoo.models.loader import load_weights
    from eagle_zoo.models.mistral_large3 import mistral_large3_mapping
    load_weights(nn.ModuleDict({"self_attn": attn}), {f"self_attn.{k}": v for k, v in sd.items()},
                 mistral_large3_mapping(config), "attention")
    _, positions, x = _inputs(offset=30)  # floor(pos / 16) >= 1: scaled queries
    with torch.no_grad():
        want, _ = ref(x, position_embeddings=rotary(x, positions), attention_mask=rm.causal_mask(T),
                      position_ids=positions)
        torch.testing.assert_close(attn(positions, x), want, atol=1e-5, rtol=1e-5)


def test_fp8_weights_are_dequantized(tmp_path, builtin_plugins):
    ref = randomize(RefHead(hf_config()), seed=3)
    weights = ref.native_checkpoint()
    w = weights["eagle_linear.weight"]
    scale = w.abs().max() / 448.0
    weights["eagle_linear.weight"] = (w / scale).to(torch.float8_e4m3fn)
    weights["eagle_linear.qscale_weight"] = scale.reshape(())
    weights["eagle_linear.qscale_act"] = torch.tensor(1.0)
    raw = detect_format(write_native(tmp_path / "h", weights)).read(tmp_path / "h")
    fc = raw.weights["eagle_linear.weight"]
    assert fc.dtype == torch.bfloat16 and "eagle_linear.qscale_weight" not in raw.weights
    torch.testing.assert_close(fc.float(), w, atol=0, rtol=0.07)  # fp8 e4m3 + bf16 rounding


def test_params_json_without_mla_is_rejected(tmp_path, builtin_plugins):
    params = {k: v for k, v in PARAMS.items() if k != "qk_nope_head_dim"}
    path = write_native(tmp_path / "h", RefHead(hf_config()).native_checkpoint(), params)
    with pytest.raises(Exception, match="qk_nope_head_dim"):
        eagle_zoo.load(path)
