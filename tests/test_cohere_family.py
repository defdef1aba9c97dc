"""The cohere family against transformers' own Cohere / Cohere2 modules (same weights, fp32).

Tiny configs: Cohere (parallel block, LayerNorm without bias, interleaved rope,
logit_scale, tied embeddings; optionally per-head q/k LayerNorms) and Cohere2 (sliding
window layers with rope, global layers without; sequences longer than the window).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn
from transformers import Cohere2Config, CohereConfig
from transformers.models.cohere import modeling_cohere as hf1
from transformers.models.cohere2 import modeling_cohere2 as hf2

import eagle_zoo
import reference_models as rm
from eagle_zoo.config.eagle_config import EagleConfig
from eagle_zoo.models import parallel_state as ps
from eagle_zoo.models.cohere import COHERE_MAPPING, CohereEagleHead, CohereForCausalLM, register_families

V, H, B, T, WINDOW, SCALE = 96, 32, 2, 9, 3, 0.5
COMMON = dict(vocab_size=V, hidden_size=H, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128, layer_norm_eps=1e-5, logit_scale=SCALE,
              pad_token_id=0, bos_token_id=1, eos_token_id=2, attn_implementation="eager")
KINDS = {"cohere": (CohereConfig, hf1), "cohere2": (Cohere2Config, hf2)}


def tiny_config(kind="cohere", **kw):
    if kind == "cohere2":
        kw = {"sliding_window": WINDOW, "sliding_window_pattern": 2, **kw}
    return KINDS[kind][0](**{**COMMON, **kw})


def hf_module(kind, name):
    prefix = "Cohere2" if kind == "cohere2" else "Cohere"
    return getattr(KINDS[kind][1], prefix + name)


randomize, additive = rm.randomize, rm.causal_mask


def reference_target(kind, config, seed=0):
    return rm.reference_target(hf_module(kind, "ForCausalLM"), config, seed)


def ids_and_positions(seed=1, offset=0, t=T):
    return rm.token_inputs(V, B, t, seed, offset)


# -- target model -------------------------------------------------------------------


TARGET_CASES = {
    "cohere": ("cohere", {}),
    "cohere-qk-norm-untied": ("cohere", dict(use_qk_norm=True, tie_word_embeddings=False)),
    "cohere2": ("cohere2", {}),
    "cohere2-untied-theta": ("cohere2", dict(tie_word_embeddings=False, rope_parameters={"rope_type": "default",
                                                                                        "rope_theta": 500.0})),
}


@pytest.mark.parametrize("case", TARGET_CASES)
def test_target_matches_transformers(case):
    kind, change = TARGET_CASES[case]
    config = tiny_config(kind, **change)
    ref = reference_target(kind, config)
    model = CohereForCausalLM(config)
    loaded = model.load_weights(ref.state_dict(), "model.safetensors")
    assert "layers.3.self_attn.qkv_proj.weight" in loaded and "layers.0.mlp.gate_up_proj.weight" in loaded
    assert (model.lm_head.weight is model.embed_tokens.weight) == config.tie_word_embeddings
    if kind == "cohere2":
        windows = [layer.self_attn.attn.sliding_window for layer in model.layers]
        ropes = [layer.self_attn.rotary_emb is not None for layer in model.layers]
        assert windows == [WINDOW, None, WINDOW, None] and ropes == [True, False, True, False]
    ids, positions, _ = ids_and_positions(offset=0)
    rm.assert_target_matches(model, ref, ids, positions, aux_layer_ids=(2, 0, 3), tol=1e-5)


def test_target_tied_checkpoint_without_lm_head():
    config = tiny_config("cohere")
    ref = reference_target("cohere", config, seed=2)
    ids, positions, _ = ids_and_positions(offset=4)
    rm.assert_tied_checkpoint_matches(CohereForCausalLM(config), ref, ids, positions, tol=1e-5)


@pytest.mark.parametrize("kind", ["cohere", "cohere2"])
def test_cached_prefill_and_decode_match_full_forward(kind):
    """Through the KV cache: sliding layers see the last WINDOW keys, global ones all."""
    config = tiny_config(kind)
    ref = reference_target(kind, config, seed=3)
    model = rm.load_reference(CohereForCausalLM(config), ref, "m")
    ids, positions, _ = ids_and_positions(seed=4)
    caches = rm.zero_caches(model, (2, 12, 2, 8))
    rm.assert_cached_decode_matches(model, ref, ids, positions, caches, torch.tensor([1, 0]), prompt=4, tol=1e-5)


def test_tensor_parallel_qk_norm_slices():
    """Rank 1 of 2 holds the second half of the q heads' norm rows and its kv head's row."""
    config = tiny_config("cohere", use_qk_norm=True)
    state = reference_target("cohere", config, seed=5).state_dict()
    with ps.fake(1, 2):
        model = CohereForCausalLM(config)
        model.load_weights(state, "m")
    attn = model.layers[2].self_attn
    assert torch.equal(attn.q_norm.weight.data, state["model.layers.2.self_attn.q_norm.weight"][2:])
    assert torch.equal(attn.k_norm.weight.data, state["model.layers.2.self_attn.k_norm.weight"][1:])


# -- EAGLE-1 head ------------------------------------------------------------------------------


class RefCohereEagle(nn.Module):
    """vLLM's EagleCohereForCausalLM from transformers' modules: fc(cat[embed, hidden]) with a
    bias -> Cohere decoder layer (input norm kept) -> LayerNorm -> lm_head * logit_scale.
    State-dict names are the checkpoint's (without vLLM's ``model.``)."""

    def __init__(self, kind, config):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, H)
        self.fc = nn.Linear(2 * H, H, bias=True)
        self.layers = nn.ModuleList([hf_module(kind, "DecoderLayer")(config, 0)])
        self.norm = hf_module(kind, "LayerNorm")(H, eps=config.layer_norm_eps)
        self.lm_head = nn.Linear(H, config.vocab_size, bias=False)
        self.rotary = hf_module(kind, "RotaryEmbedding")(config)
        self.window = WINDOW if kind == "cohere2" else None
        self.scale = config.logit_scale

    def layer(self, x, positions):
        return self.layers[0](x, attention_mask=additive(x.shape[1], self.window),
                              position_embeddings=self.rotary(x, positions))

    def forward(self, ids, positions, hidden):
        """-> the fed-back feature norm(h) (vLLM returns it for logits and the next step)."""
        return self.norm(self.layer(self.fc(torch.cat([self.embed_tokens(ids), hidden], -1)), positions))

    def logits(self, feature):
        return self.lm_head(feature) * self.scale


@pytest.mark.parametrize("kind", ["cohere", "cohere2"])
def test_eagle_head_matches_reference(kind):
    inner = tiny_config(kind, num_hidden_layers=1)
    config = EagleConfig(model=inner, method="eagle")
    ref = randomize(RefCohereEagle(kind, inner), seed=6)
    head = CohereEagleHead(config)
    assert head.fc.bias is not None and head.logit_scale == SCALE
    if kind == "cohere2":  # the draft layer follows the draft config's layer_types[0]
        assert head.layers[0].self_attn.attn.sliding_window == WINDOW
    loaded = head.load_weights({k: v.clone() for k, v in ref.state_dict().items()}, "model.safetensors")
    assert {"fc.bias", "norm.weight", "layers.0.input_layernorm.weight", "lm_head.weight"} <= loaded

    ids, positions, g = ids_and_positions(seed=7, offset=3)
    hidden, x = torch.randn(B, T, H, generator=g), torch.randn(B, T, H, generator=g)
    with torch.no_grad():
        torch.testing.assert_close(head.layers[0](positions, x), ref.layer(x, positions), atol=1e-5, rtol=1e-5)
        _, expected, logits = rm.eagle_step(head, ref, ids, positions, hidden, tol=1e-5)
        torch.testing.assert_close(logits, ref.logits(expected), atol=1e-5, rtol=1e-5)


# -- published layout through eagle_zoo.load ------------------------------------------------------


def write_cohere_eagle(directory: Path, kind="cohere", architecture=None, prefix="model.", seed=8):
    """An EAGLE-1 head as vLLM's EagleCohereForCausalLM loads it: config.json a Cohere /
    Cohere2 config with num_hidden_layers 1; model.safetensors with fc (weight and bias),
    layers.0.* and norm under vLLM's module tree (``model.``), no embed_tokens / lm_head
    (tied: the target's are used). No public checkpoint exists to copy the layout from."""
    inner = tiny_config(kind, num_hidden_layers=1)
    arch = architecture or ("Cohere2ForCausalLM" if kind == "cohere2" else "CohereForCausalLM")
    ref = randomize(RefCohereEagle(kind, inner), seed)
    weights = {f"{prefix}{k}": v.clone() for k, v in ref.state_dict().items()
               if not k.startswith(("embed_tokens.", "lm_head."))}
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps({**inner.to_dict(), "architectures": [arch]}, indent=2))
    save_file(weights, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return ref, weights


LAYOUTS = {
    "cohere-vllm-tree": dict(kind="cohere"),
    "cohere2-eagle-arch-bare-keys": dict(kind="cohere2", architecture="EagleCohere2ForCausalLM", prefix=""),
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_published_layout_loads(tmp_path, layout):
    kw = LAYOUTS[layout]
    kind = kw["kind"]
    config = tiny_config(kind)
    target = CohereForCausalLM(config)
    target.load_weights(reference_target(kind, config, seed=9).state_dict(), "target")
    ref, weights = write_cohere_eagle(tmp_path / "head", **kw)
    loaded = eagle_zoo.load(str(tmp_path / "head"), target=target)
    assert (loaded.family, loaded.method, loaded.format) == ("cohere", "eagle", "yuhuili-eagle")
    assert isinstance(loaded.head, CohereEagleHead)
    assert loaded.shared == ["embed_tokens", "lm_head"]
    ref.embed_tokens.weight.data.copy_(target.embed_tokens.weight)
    ref.lm_head.weight.data.copy_(target.lm_head.weight)
    ids, positions, g = ids_and_positions(seed=10, offset=2)
    hidden = torch.randn(B, T, H, generator=g)
    with torch.no_grad():
        _, expected, logits = rm.eagle_step(loaded.head, ref, ids, positions, hidden, tol=1e-5)
        torch.testing.assert_close(logits, ref.logits(expected), atol=1e-5, rtol=1e-5)


# -- the mapping table and registration ----------------------------------------------------------


def test_every_mapping_entry_is_used_by_a_published_name():
    state = reference_target("cohere", tiny_config("cohere")).state_dict()
    keys = list(state) + ["model.rotary_emb.inv_freq"]
    rm.assert_mapping_entries_used(COHERE_MAPPING, keys)
    model = CohereForCausalLM(tiny_config("cohere"))
    assert model.load_weights({**state, "model.rotary_emb.inv_freq": torch.zeros(4)}, "m")


def test_registers_cohere_family():
    spec = rm.registered_spec(register_families, name="cohere",
                              architectures=("CohereForCausalLM", "Cohere2ForCausalLM"),
                              model_types=("cohere", "cohere2"), target_model=CohereForCausalLM,
                              weight_mapping=COHERE_MAPPING, heads={"eagle": CohereEagleHead, "eagle3": None})
    assert type(spec.config_class(hidden_size=64, num_attention_heads=4)) is CohereConfig
    assert type(spec.config_class(model_type="cohere2", hidden_size=64, num_attention_heads=4)) is Cohere2Config


def test_registry_maps_cohere_head_architectures(reset_plugin_host):
    registry = reset_plugin_host.get_registry()
    for arch in ("EagleCohereForCausalLM", "EagleCohere2ForCausalLM"):
        family, method = registry.head_for_architecture(arch)
        assert (family.name, method) == ("cohere", "eagle")
    assert registry.family_for_config({"model_type": "cohere2"}).name == "cohere"
