"""The plugin's Qwen2 modules against transformers' own Qwen2 (same weights, fp32)."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers.models.qwen2 import modeling_qwen2 as hf

from eagle_zoo.config.eagle_config import EagleConfig
from eagle_zoo_qwen2.mapping import QWEN2_MAPPING
from eagle_zoo_qwen2.modeling import Qwen2Eagle3Head, Qwen2EagleHead, Qwen2ForCausalLM
from qwen2_fixtures import TINY, causal_mask, hf_config, randomize

V, H, B, T = TINY["vocab_size"], TINY["hidden_size"], 2, 7
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16}


def inputs(seed=1, offset=3):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (B, T), generator=g)
    positions = (torch.arange(T) + offset).expand(B, T)  # not starting at 0: exercises rope
    return ids, positions, g


# -- target -------------------------------------------------------------------------------
@pytest.mark.parametrize("case", ["plain", "tied", "sliding", "yarn"])
def test_target_matches_transformers(case):
    kw = {
        "plain": {},
        "tied": {"tie_word_embeddings": True},
        # layers 2 and 3 attend over a window of 3, shorter than the 7 tokens
        "sliding": {"use_sliding_window": True, "sliding_window": 3, "max_window_layers": 2},
        "yarn": {"rope_parameters": YARN},
    }[case]
    config = hf_config(**kw)
    if case == "sliding":
        assert config.layer_types == ["full_attention"] * 2 + ["sliding_attention"] * 2
    ref = randomize(hf.Qwen2ForCausalLM(config), seed=0)
    if case == "tied":
        ref.tie_weights()
    state = ref.state_dict()
    assert "model.layers.0.self_attn.q_proj.bias" in state and "model.layers.0.self_attn.o_proj.bias" not in state
    model = Qwen2ForCausalLM(config)
    loaded = model.load_weights(state, "model.safetensors")
    assert {"layers.3.self_attn.qkv_proj.weight", "layers.3.self_attn.qkv_proj.bias"} <= loaded
    assert model.layers[0].self_attn.o_proj.bias is None
    if case == "tied":
        assert model.lm_head.weight is model.embed_tokens.weight
    windows = [layer.self_attn.attn.sliding_window for layer in model.layers]
    assert windows == ([None, None, 3, 3] if case == "sliding" else [None] * 4)
    ids, positions, _ = inputs()
    with torch.no_grad():
        out = ref(ids, position_ids=positions, output_hidden_states=True)
        hidden, aux = model(ids, positions, aux_layer_ids=(3, 0, 2))
        logits = model.compute_logits(hidden)
    torch.testing.assert_close(logits, out.logits, atol=1e-5, rtol=1e-5)
    for got, i in zip(aux, (3, 0, 2)):
        torch.testing.assert_close(got, out.hidden_states[i], atol=1e-5, rtol=1e-5)


def test_target_bias_is_not_optional():
    """A Qwen2 checkpoint without the q/k/v biases is incomplete: the loader names them."""
    from eagle_zoo.models.loader import WeightLoadError

    config = hf_config(num_hidden_layers=1)
    state = {k: v for k, v in randomize(hf.Qwen2ForCausalLM(config), 0).state_dict().items()
             if not k.endswith("_proj.bias")}
    with pytest.raises(WeightLoadError, match=r"model.safetensors: missing weights for 'layers.0.self_attn.qkv_proj.bias'"):
        Qwen2ForCausalLM(config).load_weights(state, "model.safetensors")


# -- EAGLE-1 head ---------------------------------------------------------------------------
class RefEagle(nn.Module):
    """EAGLE-1 from transformers' Qwen2 modules: fc(cat[embed, hidden]) (with bias) ->
    Qwen2DecoderLayer whose input norm is Identity."""

    def __init__(self, config):
        super().__init__()
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.fc = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=True)
        self.layer = hf.Qwen2DecoderLayer(config, 0)
        self.layer.input_layernorm = nn.Identity()
        self.rotary = hf.Qwen2RotaryEmbedding(config)

    def forward(self, ids, positions, hidden):
        h = self.fc(torch.cat([self.embed(ids), hidden], -1))
        return self.layer(h, attention_mask=causal_mask(h.shape[1]),
                          position_embeddings=self.rotary(h, positions), position_ids=positions)

    def checkpoint(self):
        sd = {"embed_tokens.weight": self.embed.weight, "fc.weight": self.fc.weight, "fc.bias": self.fc.bias}
        sd.update({f"layers.0.{k}": v for k, v in self.layer.state_dict().items()})
        return {k: v.detach().clone() for k, v in sd.items()}


def test_eagle_head_matches_reference():
    # a multi-head head (4 kv heads) over a grouped-query target (2), as published
    head_cfg = hf_config(num_hidden_layers=1, num_key_value_heads=4, rope_theta=1e6)
    ref = randomize(RefEagle(head_cfg), seed=5)
    target = Qwen2ForCausalLM(hf_config())
    target.load_weights(randomize(hf.Qwen2ForCausalLM(hf_config()), seed=6).state_dict(), "target")
    config = EagleConfig(model=head_cfg, method="eagle", eagle_fc_bias=True, qkv_bias=True)
    head = Qwen2EagleHead(config)
    assert head.fc.bias is not None and head.layers[0].self_attn.qkv_proj.bias is not None
    assert head.layers[0].self_attn.attn.num_kv_heads == 4 != target.layers[0].self_attn.attn.num_kv_heads
    loaded = head.load_weights(ref.checkpoint(), "pytorch_model.bin")
    assert "layers.0.self_attn.qkv_proj.bias" in loaded and "fc.bias" in loaded
    assert head.share_from_target(target) == ["lm_head"]

    ids, positions, g = inputs()
    hidden = torch.randn(B, T, H, generator=g)
    with torch.no_grad():
        expected = ref(ids, positions, hidden)
        h = head(ids, positions, hidden)
        torch.testing.assert_close(h, expected, atol=1e-5, rtol=1e-5)
        # logits reach |x| ~ 10: fp32 rounding, CPU to CPU, is relative to that scale
        want = target.compute_logits(expected)
        torch.testing.assert_close(head.compute_logits(h), want, rtol=1e-5, atol=1e-5 * max(1.0, float(want.abs().max())))


# -- EAGLE-3 head ---------------------------------------------------------------------------
class RefEagle3(nn.Module):
    """EAGLE-3 layer 0 from transformers' Qwen2Attention with q/k/v widened to read 2H
    (bias kept), Qwen2MLP and Qwen2RMSNorm, written from the published description."""

    def __init__(self, config, draft_vocab, norm_before_residual):
        super().__init__()
        eps = config.rms_norm_eps
        self.nbr = norm_before_residual
        self.embed = nn.Embedding(config.vocab_size, H)
        self.fc = nn.Linear(3 * H, H, bias=False)
        self.attn = hf.Qwen2Attention(config, 0)
        for name in ("q_proj", "k_proj", "v_proj"):
            old = getattr(self.attn, name)
            setattr(self.attn, name, nn.Linear(2 * H, old.out_features, bias=True))
        self.mlp = hf.Qwen2MLP(config)
        self.hidden_norm, self.input_layernorm = hf.Qwen2RMSNorm(H, eps), hf.Qwen2RMSNorm(H, eps)
        self.post_attention_layernorm, self.norm = hf.Qwen2RMSNorm(H, eps), hf.Qwen2RMSNorm(H, eps)
        self.lm_head = nn.Linear(H, draft_vocab, bias=False)
        self.rotary = hf.Qwen2RotaryEmbedding(config)

    def forward(self, ids, positions, hidden):
        if self.nbr:
            hidden = self.hidden_norm(hidden)
            residual = hidden
        else:
            residual, hidden = hidden, self.hidden_norm(hidden)
        x = torch.cat([self.input_layernorm(self.embed(ids)), hidden], -1)
        attn, _ = self.attn(x, position_embeddings=self.rotary(x, positions), attention_mask=causal_mask(x.shape[1]))
        h = residual + attn
        return h + self.mlp(self.post_attention_layernorm(h))

    def checkpoint(self, d2t):
        """speculators-style names (layers.0.*, what the format readers hand the head)."""
        sd = {"embed_tokens.weight": self.embed.weight, "fc.weight": self.fc.weight,
              "norm.weight": self.norm.weight, "lm_head.weight": self.lm_head.weight, "d2t": d2t}
        for prefix, mod in (("self_attn", self.attn), ("mlp", self.mlp), ("hidden_norm", self.hidden_norm),
                            ("input_layernorm", self.input_layernorm),
                            ("post_attention_layernorm", self.post_attention_layernorm)):
            sd.update({f"layers.0.{prefix}.{k}": v for k, v in mod.state_dict().items()})
        return {k: v.detach().clone() for k, v in sd.items()}


@pytest.mark.parametrize("norm_before_residual", [False, True])
def test_eagle3_head_matches_reference(norm_before_residual):
    draft_vocab = 40
    head_cfg = hf_config(num_hidden_layers=1)
    ref = randomize(RefEagle3(head_cfg, draft_vocab, norm_before_residual), seed=7)
    g = torch.Generator().manual_seed(8)
    draft_ids = torch.randperm(V, generator=g)[:draft_vocab].sort().values
    config = EagleConfig(model=head_cfg, method="eagle3", draft_vocab_size=draft_vocab,
                         norm_before_residual=norm_before_residual)
    head = Qwen2Eagle3Head(config)
    assert head.layers[0].self_attn.qkv_proj.weight.shape[1] == 2 * H
    loaded = head.load_weights(ref.checkpoint(draft_ids - torch.arange(draft_vocab)), "model.safetensors")
    assert "layers.0.self_attn.qkv_proj.bias" in loaded

    ids, positions, g = inputs(seed=9)
    aux_cat = torch.randn(B, T, 3 * H, generator=g)
    with torch.no_grad():
        hidden = head.combine_hidden_states(aux_cat)
        torch.testing.assert_close(hidden, ref.fc(aux_cat), atol=1e-5, rtol=1e-5)
        h = head(ids, positions, hidden)
        expected = ref(ids, positions, hidden)
        torch.testing.assert_close(h, expected, atol=1e-5, rtol=1e-5)
        draft_logits = ref.lm_head(ref.norm(expected))
        logits = head.compute_logits(h)
    torch.testing.assert_close(logits[..., draft_ids], draft_logits, atol=1e-5, rtol=1e-5)
    assert torch.equal(logits.argmax(-1), draft_ids[draft_logits.argmax(-1)])


def test_mapping_table_is_data():
    """The table a reader scans: strip model., fuse q/k/v (weights and biases) and gate/up."""
    from eagle_zoo.models.loader import map_name

    assert map_name("model.layers.5.self_attn.k_proj.bias", QWEN2_MAPPING) == ("layers.5.self_attn.qkv_proj.bias", "k")
    assert map_name("layers.0.mlp.up_proj.weight", QWEN2_MAPPING) == ("layers.0.mlp.gate_up_proj.weight", 1)
    assert map_name("lm_head.weight", QWEN2_MAPPING) == ("lm_head.weight", None)
    assert map_name("model.layers.0.self_attn.rotary_emb.inv_freq", QWEN2_MAPPING) == ("", None)
