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
from eagle_zoo.config.eagle_config import EagleConfig
from eagle_zoo.models import parallel_state as ps
from eagle_zoo.models.attention import AttentionContext, use_context
from eagle_zoo.models.cohere import COHERE_MAPPING, CohereEagleHead, CohereForCausalLM, register_families
from eagle_zoo.models.loader import map_name
from eagle_zoo.specs import FamilySpec

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


def randomize(module: nn.Module, seed: int) -> nn.Module:
    """Random weights everywhere, norms included (transformers initialises them to 1)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3 + (1.0 if p.dim() == 1 else 0.0))
    return module.eval()


def reference_target(kind, config, seed=0):
    ref = randomize(hf_module(kind, "ForCausalLM")(config), seed)
    if config.tie_word_embeddings:
        ref.tie_weights()
    return ref


def ids_and_positions(seed=1, offset=0, t=T):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (B, t), generator=g), (torch.arange(t) + offset).expand(B, t), g


def additive(t: int, window=None) -> torch.Tensor:
    i, j = torch.arange(t)[:, None], torch.arange(t)[None]
    seen = (j <= i) & ((i - j < window) if window else True)
    return torch.zeros(t, t).masked_fill(~seen, float("-inf"))[None, None]


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
    with torch.no_grad():
        out = ref(ids, position_ids=positions, output_hidden_states=True)
        hidden, aux = model(ids, positions, aux_layer_ids=(2, 0, 3))
        logits = model.compute_logits(hidden)
    torch.testing.assert_close(logits, out.logits, atol=1e-5, rtol=1e-5)
    for got, i in zip(aux, (2, 0, 3)):
        torch.testing.assert_close(got, out.hidden_states[i], atol=1e-5, rtol=1e-5)


def test_target_tied_checkpoint_without_lm_head():
    config = tiny_config("cohere")
    ref = reference_target("cohere", config, seed=2)
    weights = {k: v for k, v in ref.state_dict().items() if k != "lm_head.weight"}
    model = CohereForCausalLM(config)
    model.load_weights(weights, "model.safetensors")
    ids, positions, _ = ids_and_positions(offset=4)
    with torch.no_grad():
        torch.testing.assert_close(model.compute_logits(model(ids, positions)[0]),
                                   ref(ids, position_ids=positions).logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["cohere", "cohere2"])
def test_cached_prefill_and_decode_match_full_forward(kind):
    """Through the KV cache: sliding layers see the last WINDOW keys, global ones all."""
    config = tiny_config(kind)
    ref = reference_target(kind, config, seed=3)
    model = CohereForCausalLM(config)
    model.load_weights(ref.state_dict(), "m")
    ids, positions, _ = ids_and_positions(seed=4)
    with torch.no_grad():
        expected = ref(ids, position_ids=positions).logits
    caches = [(torch.zeros(2, 12, 2, 8), torch.zeros(2, 12, 2, 8)) for _ in model.layers]
    slots, prompt = torch.tensor([1, 0]), 4
    with torch.no_grad(), use_context(AttentionContext(caches, slots, positions[:, :prompt], kv_len=prompt)):
        got = [model.compute_logits(model(ids[:, :prompt], positions[:, :prompt])[0])]
    for t in range(prompt, T):
        with torch.no_grad(), use_context(AttentionContext(caches, slots, positions[:, t:t + 1], kv_len=t + 1)):
            got.append(model.compute_logits(model(ids[:, t:t + 1], positions[:, t:t + 1])[0]))
    torch.testing.assert_close(torch.cat(got, 1), expected, atol=1e-5, rtol=1e-5)


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
        expected = ref(ids, positions, hidden)
        h = head(ids, positions, hidden)
        torch.testing.assert_close(h, expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(head.compute_logits(h), ref.logits(expected), atol=1e-5, rtol=1e-5)


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
        expected = ref(ids, positions, hidden)
        h = loaded.head(ids, positions, hidden)
        torch.testing.assert_close(h, expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(loaded.head.compute_logits(h), ref.logits(expected), atol=1e-5, rtol=1e-5)


# -- the mapping table and registration ----------------------------------------------------------


def test_every_mapping_entry_is_used_by_a_published_name():
    state = reference_target("cohere", tiny_config("cohere")).state_dict()
    keys = list(state) + ["model.rotary_emb.inv_freq"]
    for old, _ in COHERE_MAPPING.renames:
        assert any(k.startswith(old[1:]) if old.startswith("^") else old in k for k in keys), old
    for _, part, _ in COHERE_MAPPING.stacked:
        assert any(part in k for k in keys), part
    for part in COHERE_MAPPING.ignored:
        assert any(part in k for k in keys) and all(map_name(k, COHERE_MAPPING)[0] == "" for k in keys if part in k)
    model = CohereForCausalLM(tiny_config("cohere"))
    assert model.load_weights({**state, "model.rotary_emb.inv_freq": torch.zeros(4)}, "m")


def test_registers_cohere_family():
    got = []
    register_families(register=got.append)
    (spec,) = got
    assert isinstance(spec, FamilySpec) and spec.name == "cohere"
    assert spec.architectures == ("CohereForCausalLM", "Cohere2ForCausalLM")
    assert spec.model_types == ("cohere", "cohere2")
    assert spec.target_model is CohereForCausalLM
    assert spec.head_class("eagle") is CohereEagleHead and spec.head_class("eagle3") is None
    assert spec.weight_mapping is COHERE_MAPPING
    assert type(spec.config_class(hidden_size=64, num_attention_heads=4)) is CohereConfig
    assert type(spec.config_class(model_type="cohere2", hidden_size=64, num_attention_heads=4)) is Cohere2Config


def test_registry_maps_cohere_head_architectures(reset_plugin_host):
    registry = reset_plugin_host.get_registry()
    for arch in ("EagleCohereForCausalLM", "EagleCohere2ForCausalLM"):
        family, method = registry.head_for_architecture(arch)
        assert (family.name, method) == ("cohere", "eagle")
    assert registry.family_for_config({"model_type": "cohere2"}).name == "cohere"
