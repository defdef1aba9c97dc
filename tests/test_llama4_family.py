"""The llama4 family against transformers' own Llama 4 modules (same weights, fp32).

Tiny text configs with every Llama 4 feature switched on: interleaved MoE layers (shared
expert + sigmoid-routed experts), NoPE layers with attention temperature tuning, chunked
local attention on the rope layers (sequences span three chunks), L2 q/k norm, llama3 rope
scaling. Checkpoints are written as transformers (fused experts) and vLLM / FP8 releases
(per-expert linears) lay them out, and as Llama4ForConditionalGeneration nests them.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn
from transformers import Llama4Config, Llama4TextConfig
from transformers.models.llama4 import modeling_llama4 as hf

import checkpoint_factory as cf
import eagle_zoo
import reference_models as rm
from eagle_zoo.config.eagle_config import EagleConfig
from eagle_zoo.models import parallel_state as ps
from eagle_zoo.models.llama import LlamaEagle3Head
from eagle_zoo.models.llama4 import (
    LLAMA4_MAPPING,
    Llama4EagleHead,
    Llama4ForCausalLM,
    Llama4MoE,
    llama4_mapping,
    register_families,
)
from eagle_zoo.models.loader import WeightLoadError

V, H, B, T, CHUNK = 96, 32, 2, 11, 4
E, I_EXPERT = 3, 48
SCOUT_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 1.0, "original_max_position_embeddings": 16}  # Scout's shape, tiny context


def tiny_config(**kw) -> Llama4TextConfig:
    base = dict(vocab_size=V, hidden_size=H, intermediate_size=I_EXPERT, intermediate_size_mlp=64, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=E, num_experts_per_tok=1,
                interleave_moe_layer_step=2, no_rope_layer_interval=2, attention_chunk_size=CHUNK,
                attn_temperature_tuning=True, floor_scale=3, attn_scale=0.5, use_qk_norm=True, rms_norm_eps=1e-5,
                max_position_embeddings=128, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                attn_implementation="eager")
    base.update(kw)
    return Llama4TextConfig(**base)


randomize, additive = rm.randomize, rm.additive_mask


def reference_target(config, seed=0):
    return rm.reference_target(hf.Llama4ForCausalLM, config, seed)


def visibility(t: int, chunk=None) -> torch.Tensor:
    i, j = torch.arange(t)[:, None], torch.arange(t)[None]
    seen = j <= i
    return seen & (i // chunk == j // chunk) if chunk else seen


def per_expert(state: dict) -> dict:
    """transformers' fused experts -> one nn.Linear weight per expert (vLLM / FP8 layout)."""
    out = {}
    for key, t in state.items():
        if key.endswith("experts.gate_up_proj"):
            base = key[: -len("gate_up_proj")]
            gate, up = t.split(t.shape[-1] // 2, -1)
            for e in range(t.shape[0]):
                out[f"{base}{e}.gate_proj.weight"] = gate[e].t().contiguous()
                out[f"{base}{e}.up_proj.weight"] = up[e].t().contiguous()
        elif key.endswith("experts.down_proj"):
            base = key[: -len("down_proj")]
            for e in range(t.shape[0]):
                out[f"{base}{e}.down_proj.weight"] = t[e].t().contiguous()
        else:
            out[key] = t
    return out


def ids_and_positions(seed=1, offset=0, t=T):
    return rm.token_inputs(V, B, t, seed, offset)


# -- target model -------------------------------------------------------------------


TARGET_CASES = {
    "default": {},
    "scout-rope-top2": dict(rope_parameters=SCOUT_ROPE, num_experts_per_tok=2),
    "plain-attention": dict(use_qk_norm=False, attn_temperature_tuning=False, attention_chunk_size=None),
    "tied-all-moe": dict(tie_word_embeddings=True, interleave_moe_layer_step=1, no_rope_layer_interval=4),
}


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("case", TARGET_CASES)
def test_target_matches_transformers(case):
    config = tiny_config(**TARGET_CASES[case])
    ref = reference_target(config)
    model = Llama4ForCausalLM(config)
    loaded = model.load_weights(ref.state_dict(), "model.safetensors")
    moe = [i for i, layer in enumerate(model.layers) if isinstance(layer.feed_forward, Llama4MoE)]
    assert moe == config.moe_layers
    assert {f"layers.{moe[0]}.feed_forward.experts.gate_up_proj", "layers.0.self_attn.qkv_proj.weight"} <= loaded
    if config.tie_word_embeddings:
        assert model.lm_head.weight is model.embed_tokens.weight
    ids, positions, _ = ids_and_positions()
    rm.assert_target_matches(model, ref, ids, positions, aux_layer_ids=(1, 3, 0), tol=1e-4)


def test_the_features_are_live():
    """Each Llama 4 feature changes the output (so the parity test above can fail)."""
    config = tiny_config()
    ref = reference_target(config)
    ids, positions, _ = ids_and_positions()
    with torch.no_grad():
        base = ref(ids, position_ids=positions).logits
    for change in (dict(attention_chunk_size=None), dict(attn_temperature_tuning=False), dict(use_qk_norm=False)):
        model = Llama4ForCausalLM(tiny_config(**change))
        model.load_weights(ref.state_dict(), "m")
        with torch.no_grad():
            assert not torch.allclose(model.compute_logits(model(ids, positions)[0]), base, atol=1e-3), change


def test_per_expert_checkpoint_matches_fused():
    config = tiny_config(num_experts_per_tok=2)
    ref = reference_target(config, seed=3)
    state = per_expert(ref.state_dict())
    assert "model.layers.1.feed_forward.experts.2.down_proj.weight" in state
    assert not any(k.endswith("experts.gate_up_proj") for k in state)
    model = Llama4ForCausalLM(config)
    loaded = model.load_weights(state, "model.safetensors")
    assert "layers.3.feed_forward.experts.gate_up_proj" in loaded
    ids, positions, _ = ids_and_positions()
    rm.assert_target_matches(model, ref, ids, positions, tol=1e-4)


def test_missing_expert_is_named():
    config = tiny_config()
    state = per_expert(reference_target(config).state_dict())
    del state["model.layers.1.feed_forward.experts.1.up_proj.weight"]
    with pytest.raises(WeightLoadError, match=r"layers.1.feed_forward.experts.gate_up_proj.*\('up', 1\)"):
        Llama4ForCausalLM(config).load_weights(state, "model.safetensors")


def test_bad_expert_shape_is_named():
    config = tiny_config()
    state = reference_target(config).state_dict()
    state["model.layers.1.feed_forward.experts.down_proj"] = torch.zeros(E, H, I_EXPERT)
    with pytest.raises(WeightLoadError, match=r"experts.down_proj.*expected shape \(3, 48, 32\), got \(3, 32, 48\)"):
        Llama4ForCausalLM(config).load_weights(state, "model.safetensors")


def test_conditional_generation_checkpoint():
    """Llama4ForConditionalGeneration: Llama4Config with text_config; the text model's
    weights under language_model., the vision tower and projector beside it."""
    text = tiny_config()
    ref = reference_target(text, seed=4)
    state = {f"language_model.{k}": v for k, v in ref.state_dict().items()}
    state["vision_model.patch_embedding.linear.weight"] = torch.zeros(8, 12)
    state["multi_modal_projector.linear_1.weight"] = torch.zeros(H, 8)
    state["language_model.model.rotary_emb.inv_freq"] = torch.zeros(4)  # old transformers saved it
    config = Llama4Config(text_config=text.to_dict(), vision_config={"hidden_size": 8, "num_hidden_layers": 1})
    model = Llama4ForCausalLM(config)
    assert model.config.hidden_size == H
    model.load_weights(state, "model-00001-of-00002.safetensors")
    ids, positions, _ = ids_and_positions()
    rm.assert_target_matches(model, ref, ids, positions, tol=1e-4)


def test_cached_prefill_and_decode_match_full_forward():
    """Through the KV cache: the chunk mask and the temperature come from cache / rope
    positions; decoding across two chunk boundaries equals the full forward."""
    config = tiny_config()
    ref = reference_target(config, seed=5)
    model = rm.load_reference(Llama4ForCausalLM(config), ref, "m")
    ids, positions, _ = ids_and_positions(seed=6)
    caches = rm.zero_caches(model, (3, 16, 2, 8))
    rm.assert_cached_decode_matches(model, ref, ids, positions, caches, torch.tensor([2, 0]), prompt=5, tol=1e-4)


def test_tensor_parallel_expert_slices():
    """Rank 1 of 2 holds the second half of every expert's intermediate features, from
    either checkpoint spelling."""
    config = tiny_config()
    state = reference_target(config, seed=7).state_dict()
    gate_up = state["model.layers.1.feed_forward.experts.gate_up_proj"]
    down = state["model.layers.1.feed_forward.experts.down_proj"]
    half = I_EXPERT // 2
    want_gate_up = torch.cat([gate_up[..., half:I_EXPERT], gate_up[..., I_EXPERT + half:]], -1)
    for weights in (state, per_expert(state)):
        with ps.fake(1, 2):
            model = Llama4ForCausalLM(config)
            model.load_weights(weights, "m")
        experts = model.layers[1].feed_forward.experts
        assert torch.equal(experts.gate_up_proj.data, want_gate_up)
        assert torch.equal(experts.down_proj.data, down[:, half:])


# -- EAGLE-1 head ------------------------------------------------------------------------------


class RefLlama4Eagle(nn.Module):
    """vLLM's EagleLlama4ForCausalLM from transformers' modules: fc(cat[embed, hidden]) ->
    a dense Llama4TextDecoderLayer (input norm kept) -> RMSNorm -> lm_head. State-dict
    names are the checkpoint's."""

    def __init__(self, config, draft_vocab):
        super().__init__()
        dense = copy.deepcopy(config)
        dense.moe_layers = []  # the head's layer is dense whatever moe_layers says
        self.embed_tokens = nn.Embedding(config.vocab_size, H)
        self.fc = nn.Linear(2 * H, H, bias=False)
        self.layers = nn.ModuleList([hf.Llama4TextDecoderLayer(dense, 0)])
        self.norm = hf.Llama4TextRMSNorm(H, config.rms_norm_eps)
        self.lm_head = nn.Linear(H, draft_vocab, bias=False)
        self.rotary = hf.Llama4TextRotaryEmbedding(config)
        self.chunk = config.attention_chunk_size if config.layer_types[0] == "chunked_attention" else None

    def layer(self, x, positions):
        return self.layers[0](x, attention_mask=additive(visibility(x.shape[1], self.chunk)),
                              position_embeddings=self.rotary(x, positions))

    def forward(self, ids, positions, hidden):
        """-> the fed-back feature norm(h) (vLLM returns it for logits and the next step)."""
        return self.norm(self.layer(self.fc(torch.cat([self.embed_tokens(ids), hidden], -1)), positions))


HEAD_CASES = {  # (config changes, rope position offset)
    "rope-chunked": (dict(no_rope_layers=[1]), 3),
    # transformers' temperature tuning counts positions from the cache start: offset 0
    "nope-tuned": (dict(no_rope_layers=[0]), 0),
}


@pytest.mark.parametrize("case", HEAD_CASES)
def test_eagle_head_matches_reference(case):
    change, offset = HEAD_CASES[case]
    draft_vocab = 64
    inner = tiny_config(num_hidden_layers=1, interleave_moe_layer_step=1, **change)
    assert inner.moe_layers == [0]
    config = EagleConfig(model=inner, method="eagle", truncated_vocab_size=draft_vocab)
    ref = randomize(RefLlama4Eagle(inner, draft_vocab), seed=8)
    head = Llama4EagleHead(config)
    assert head.fc.bias is None and not hasattr(head.layers[0].feed_forward, "experts")
    loaded = head.load_weights({k: v.clone() for k, v in ref.state_dict().items()}, "model.safetensors")
    assert {"lm_head.weight", "norm.weight", "layers.0.input_layernorm.weight"} <= loaded

    ids, positions, g = ids_and_positions(seed=9, offset=offset)
    hidden, x = torch.randn(B, T, H, generator=g), torch.randn(B, T, H, generator=g)
    with torch.no_grad():
        torch.testing.assert_close(head.layers[0](positions, x), ref.layer(x, positions), atol=1e-5, rtol=1e-5)
    _, expected, logits = rm.eagle_step(head, ref, ids, positions, hidden, tol=1e-5)
    assert logits.shape == (B, T, V)
    torch.testing.assert_close(logits[..., :draft_vocab], ref.lm_head(expected), atol=1e-5, rtol=1e-5)
    assert torch.isneginf(logits[..., draft_vocab:]).all()


# -- published layouts through eagle_zoo.load -------------------------------------------------


def write_llama4_eagle(directory: Path, architecture="EagleLlama4ForCausalLM", nested=False, truncated=None,
                       own_embed=True, own_lm_head=True, seed=10):
    """An EAGLE-1 head as vLLM's EagleLlama4ForCausalLM loads it: config.json a Llama 4 text
    config with num_hidden_layers 1 (flat), or vLLM's legacy nested form with
    truncated_vocab_size; model.safetensors with embed_tokens, fc, layers.0.* (a dense
    layer: feed_forward.{gate,up,down}_proj), norm, lm_head [draft vocab, H]."""
    inner = tiny_config(num_hidden_layers=1)
    cfg = {**inner.to_dict(), "architectures": [architecture]}
    cfg = {"model_type": "eagle", "model": cfg, "truncated_vocab_size": truncated} if nested else cfg
    ref = randomize(RefLlama4Eagle(inner, truncated or V), seed)
    weights = {k: v.clone() for k, v in ref.state_dict().items()}
    if not own_embed:
        del weights["embed_tokens.weight"]
    if not own_lm_head:
        del weights["lm_head.weight"]
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(cfg, indent=2))
    save_file(weights, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return ref, weights


@pytest.fixture(scope="module")
def target_and_ref():
    config = tiny_config()
    ref = reference_target(config, seed=11)
    return rm.load_reference(Llama4ForCausalLM(config), ref, "target").eval(), ref


@pytest.fixture(scope="module")
def target(target_and_ref):
    return target_and_ref[0]


LAYOUTS = {
    "flat-eagle-arch": dict(),
    "flat-target-arch-shared-embed": dict(architecture="Llama4ForCausalLM", own_embed=False),
    "legacy-nested-truncated": dict(nested=True, truncated=64),
    "flat-shared-lm-head": dict(own_lm_head=False),
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_published_layouts_load(tmp_path, target, layout):
    kw = LAYOUTS[layout]
    ref, weights = write_llama4_eagle(tmp_path / "head", **kw)
    loaded = eagle_zoo.load(str(tmp_path / "head"), target=target)
    assert (loaded.family, loaded.method, loaded.format) == (
        "llama4", "eagle", "legacy-vllm" if kw.get("nested") else "yuhuili-eagle")
    assert isinstance(loaded.head, Llama4EagleHead)
    shared = [m for m in ("embed_tokens", "lm_head") if f"{m}.weight" not in weights]
    assert loaded.shared == shared
    for m in shared:  # the reference uses the target's modules where the head has none
        getattr(ref, m).weight.data.copy_(getattr(target, m).weight)
    ids, positions, g = ids_and_positions(seed=12, offset=2)
    hidden = torch.randn(B, T, H, generator=g)
    _, expected, logits = rm.eagle_step(loaded.head, ref, ids, positions, hidden, tol=1e-5)
    draft = kw.get("truncated") or V
    torch.testing.assert_close(logits[..., :draft], ref.lm_head(expected), atol=1e-5, rtol=1e-5)


def test_moe_layer_in_a_head_checkpoint_is_refused(tmp_path, target):
    """The head's layer is dense: routed-expert tensors are named as unexpected."""
    _, weights = write_llama4_eagle(tmp_path / "head")
    weights["layers.0.feed_forward.router.weight"] = torch.zeros(E, H)
    save_file(weights, str(tmp_path / "head" / "model.safetensors"))
    with pytest.raises(WeightLoadError, match="unexpected key 'layers.0.feed_forward.router.weight'"):
        eagle_zoo.load(str(tmp_path / "head"), target=target)


def test_eagle3_head_for_a_llama4_target(tmp_path, target_and_ref):
    """nvidia/Llama-4-Maverick-17B-128E-Eagle3 (and SpecForge's Llama 4 heads) are
    LlamaForCausalLMEagle3 checkpoints: the llama family's EAGLE-3 head serves them, fed
    with this target's aux hidden states (vLLM does the same)."""
    target, ref = target_and_ref
    written = cf.write_yuhuili_eagle3(tmp_path / "h", vocab_size=V, draft_vocab=40,
                                      eagle_aux_hidden_state_layer_ids=[1, 2, 3])
    loaded = eagle_zoo.load(str(written.path), target=target)
    assert (loaded.family, loaded.method) == ("llama", "eagle3") and type(loaded.head) is LlamaEagle3Head
    assert loaded.shared == ["embed_tokens"] and loaded.head.embed_tokens is target.embed_tokens
    ids, positions, _ = ids_and_positions(seed=13)
    head = loaded.head
    with torch.no_grad():
        _, aux = target(ids, positions, aux_layer_ids=(1, 2, 3))
        states = ref(ids, position_ids=positions, output_hidden_states=True).hidden_states
        for got, i in zip(aux, (1, 2, 3)):
            torch.testing.assert_close(got, states[i], atol=1e-4, rtol=1e-4)
        # the draft from this target's states equals the draft from transformers' states
        h = head(ids, positions, head.combine_hidden_states(torch.cat(aux, -1)))
        h_ref = head(ids, positions, head.combine_hidden_states(torch.cat([states[i] for i in (1, 2, 3)], -1)))
        torch.testing.assert_close(head.compute_logits(h), head.compute_logits(h_ref), atol=1e-4, rtol=1e-4)


# -- the mapping table and registration ----------------------------------------------------------


def test_every_mapping_entry_is_used_by_a_published_name():
    """Each rename, fused part and ignored name of the table matches a real key."""
    config = tiny_config()
    text = reference_target(config).state_dict()
    keys = (list(text) + list(per_expert(text)) + [f"language_model.{k}" for k in text]
            + ["vision_model.patch_embedding.linear.weight", "multi_modal_projector.linear_1.weight",
               "model.rotary_emb.inv_freq"])
    mapping = llama4_mapping(E)
    rm.assert_mapping_entries_used(mapping, keys)
    assert set(LLAMA4_MAPPING.stacked) < set(mapping.stacked)


def test_registers_llama4_family():
    spec = rm.registered_spec(register_families, name="llama4",
                              architectures=("Llama4ForCausalLM", "Llama4ForConditionalGeneration"),
                              model_types=("llama4", "llama4_text"), target_model=Llama4ForCausalLM,
                              weight_mapping=LLAMA4_MAPPING, heads={"eagle": Llama4EagleHead, "eagle3": None})
    assert spec.config_class(hidden_size=64, num_attention_heads=4).hidden_size == 64


def test_registry_maps_llama4_head_architectures(reset_plugin_host):
    registry = reset_plugin_host.get_registry()
    for arch in ("EagleLlama4ForCausalLM", "EagleLlama4ForConditionalGeneration"):
        family, method = registry.head_for_architecture(arch)
        assert (family.name, method) == ("llama4", "eagle")
    assert registry.family_for_config({"model_type": "llama4_text"}).name == "llama4"
    assert registry.head_for_architecture("LlamaForCausalLMEagle3")[0].name == "llama"
