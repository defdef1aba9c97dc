"""The mistral family against transformers' own Mistral modules (same weights, fp32),
and Mistral-native checkpoint names (consolidated.safetensors spelling) against HF ones."""
from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from transformers import MistralConfig
from transformers.core_model_loading import PermuteForRope
from transformers.models.mistral import modeling_mistral as hf

import checkpoint_factory as cf
import eagle_zoo
import reference_models as rm
from eagle_zoo.models.loader import WeightLoadError
from eagle_zoo.models.mistral import (
    MISTRAL_MAPPING,
    MISTRAL_NATIVE_MAPPING,
    MistralEagle3Head,
    MistralEagleHead,
    MistralForCausalLM,
    register_families,
)
from eagle_zoo.plugins import get_registry

# head_dim 16 != hidden / heads (8); a window shorter than the sequence.
V, H, HD, NH, NKV, B, T, WINDOW = 96, 32, 16, 4, 2, 2, 7, 3


def tiny_config(**kw) -> MistralConfig:
    base = dict(vocab_size=V, hidden_size=H, intermediate_size=64, num_hidden_layers=3, num_attention_heads=NH,
                num_key_value_heads=NKV, head_dim=HD, max_position_embeddings=128, rms_norm_eps=1e-5,
                sliding_window=WINDOW, rope_parameters={"rope_type": "default", "rope_theta": 1000.0},
                attn_implementation="eager")
    base.update(kw)
    return MistralConfig(**base)


randomize, window_mask = rm.randomize, rm.causal_mask


def inputs(seed=1, offset=3):
    return rm.token_inputs(V, B, T, seed, offset)


# -- the Mistral-native spelling, written from the consolidated.safetensors layout ---------
# (HF name pattern, native name) for one decoder layer, and the names outside layers.
NATIVE_LAYER = {
    "self_attn.q_proj": "attention.wq", "self_attn.k_proj": "attention.wk", "self_attn.v_proj": "attention.wv",
    "self_attn.o_proj": "attention.wo", "mlp.gate_proj": "feed_forward.w1", "mlp.down_proj": "feed_forward.w2",
    "mlp.up_proj": "feed_forward.w3", "input_layernorm": "attention_norm", "post_attention_layernorm": "ffn_norm",
}
NATIVE_TOP = {"embed_tokens": "tok_embeddings", "norm": "norm", "lm_head": "output", "fc": "eagle_linear"}


def hf_rope_rows_to_native(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """transformers' own PermuteForRope, inverted: HF (rotate-half) rows -> the original
    interleaved rows Mistral's files hold."""
    return PermuteForRope(inverse=True)._permute_for_rope(w, SimpleNamespace(num_attention_heads=n_heads))


def to_native(state: dict, n_heads=NH, n_kv=NKV) -> dict:
    """HF names (with or without the target's ``model.`` prefix) -> Mistral-native names
    and wq / wk rows in the interleaved layout."""
    out = {}
    for key, value in state.items():
        key = key.removeprefix("model.")
        m = re.fullmatch(r"layers\.(\d+)\.(.+)\.(weight|bias)", key)
        if m:
            native = f"layers.{m[1]}.{NATIVE_LAYER[m[2]]}.{m[3]}"
        else:
            module, leaf = key.rsplit(".", 1)
            native = f"{NATIVE_TOP[module]}.{leaf}"
        if native.endswith("attention.wq.weight"):
            value = hf_rope_rows_to_native(value, n_heads)
        elif native.endswith("attention.wk.weight"):
            value = hf_rope_rows_to_native(value, n_kv)
        out[native] = value.clone()
    return out


def assert_every_native_entry_used(keys):
    """Each rename and stacked part of the native table occurs in some checkpoint key."""
    parts = [old.lstrip("^") for old, _ in MISTRAL_NATIVE_MAPPING.renames]
    parts += [part for _, part, _ in MISTRAL_NATIVE_MAPPING.stacked]
    unused = [p for p in parts if not any(p in ("." + k if p.startswith(".") else k) for k in keys)]
    assert not unused, f"mapping entries never exercised: {unused}"


# -- target model -------------------------------------------------------------------------
@pytest.mark.parametrize("window", [WINDOW, None])
def test_target_matches_transformers(window):
    config = tiny_config(sliding_window=window)
    ref = rm.reference_target(hf.MistralForCausalLM, config, seed=0)
    model = MistralForCausalLM(config)
    loaded = model.load_weights(ref.state_dict(), "model.safetensors")
    assert "layers.2.self_attn.qkv_proj.weight" in loaded and "lm_head.weight" in loaded
    assert all(layer.self_attn.attn.sliding_window == window for layer in model.layers)
    ids, positions, _ = inputs()
    rm.assert_target_matches(model, ref, ids, positions, aux_layer_ids=(2, 0, 1), tol=1e-5)


def test_native_names_load_the_same_parameters_as_hf_names():
    config = tiny_config()
    ref = randomize(hf.MistralForCausalLM(config), seed=1)
    hf_state = ref.state_dict()
    native = to_native(hf_state)
    assert "layers.1.attention.wq.weight" in native and "tok_embeddings.weight" in native and "output.weight" in native
    # the reorder is real: a native wq is not the HF q_proj
    assert not torch.equal(native["layers.0.attention.wq.weight"], hf_state["model.layers.0.self_attn.q_proj.weight"])
    from_hf, from_native = MistralForCausalLM(config), MistralForCausalLM(config)
    loaded_hf = from_hf.load_weights(hf_state, "model.safetensors")
    loaded_native = from_native.load_weights(native, "consolidated.safetensors")
    assert loaded_hf == loaded_native
    for (name, a), (_, b) in zip(from_hf.state_dict().items(), from_native.state_dict().items()):
        assert torch.equal(a, b), name
    # and transformers' own forward permutation (native -> HF) agrees with the load
    q_rows = from_native.layers[0].self_attn.qkv_proj.weight[: NH * HD]
    torch.testing.assert_close(
        q_rows, PermuteForRope()._permute_for_rope(native["layers.0.attention.wq.weight"],
                                                   SimpleNamespace(num_attention_heads=NH)), atol=0, rtol=0)
    ids, positions, _ = inputs()
    rm.assert_target_matches(from_native, ref, ids, positions, tol=1e-5)


def test_native_shape_error_names_the_key():
    native = to_native(randomize(hf.MistralForCausalLM(tiny_config(num_hidden_layers=1)), seed=2).state_dict())
    native["layers.0.attention.wq.weight"] = native["layers.0.attention.wq.weight"][:-HD]
    with pytest.raises(WeightLoadError, match=r"consolidated.safetensors: key 'layers.0.attention.wq.weight'"):
        MistralForCausalLM(tiny_config(num_hidden_layers=1)).load_weights(native, "consolidated.safetensors")


# -- EAGLE-1 head ---------------------------------------------------------------------------
class RefEagle(nn.Module):
    """vLLM's EagleMistralForCausalLM from transformers' Mistral modules:
    h = fc(cat[embed, hidden]) (no bias) -> full Mistral decoder layers (input norm
    kept) -> out = norm(h); logits = lm_head(out); ``out`` is the fed-back feature."""

    def __init__(self, config):
        super().__init__()
        self.embed = nn.Embedding(config.vocab_size, H)
        self.fc = nn.Linear(2 * H, H, bias=False)
        self.layers = nn.ModuleList(hf.MistralDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = hf.MistralRMSNorm(H, config.rms_norm_eps)
        self.rotary = hf.MistralRotaryEmbedding(config)
        self.window = config.sliding_window

    def run_layer(self, i, x, positions):
        return self.layers[i](x, attention_mask=window_mask(x.shape[1], self.window),
                              position_embeddings=self.rotary(x, positions), position_ids=positions)

    def forward(self, ids, positions, hidden):
        h = self.fc(torch.cat([self.embed(ids), hidden], -1))
        for i in range(len(self.layers)):
            h = self.run_layer(i, h, positions)
        return self.norm(h)

    def checkpoint(self, native: bool, embed: bool = False):
        """The head's tensors without embed_tokens / lm_head (vLLM shares the target's)."""
        sd = {"fc.weight": self.fc.weight, "norm.weight": self.norm.weight}
        if embed:
            sd["embed_tokens.weight"] = self.embed.weight
        for i, layer in enumerate(self.layers):
            sd.update({f"layers.{i}.{k}": v for k, v in layer.state_dict().items()})
        sd = {k: v.detach().clone() for k, v in sd.items()}
        return to_native(sd) if native else sd


@pytest.fixture(scope="module")
def target():
    config = tiny_config()
    ref = randomize(hf.MistralForCausalLM(config), seed=6)
    return rm.load_reference(MistralForCausalLM(config), ref, "target").eval()


@pytest.mark.parametrize("native, layers", [(False, 1), (True, 1), (True, 2)], ids=["hf", "native", "native-2-layers"])
def test_eagle_head_matches_reference(target, native, layers):
    config = tiny_config(num_hidden_layers=layers)
    ref = randomize(RefEagle(config), seed=5)
    head = MistralEagleHead(config)
    assert not isinstance(head.layers[0].input_layernorm, nn.Identity) and head.fc.bias is None
    ckpt = ref.checkpoint(native)
    if native:
        assert "eagle_linear.weight" in ckpt and "layers.0.attention_norm.weight" in ckpt
    loaded = head.load_weights(ckpt, "consolidated.safetensors")
    assert {"fc.weight", "norm.weight", "layers.0.input_layernorm.weight"} <= loaded
    assert head.share_from_target(target) == ["embed_tokens", "lm_head"]
    ref.embed.weight.data.copy_(target.embed_tokens.weight)

    ids, positions, g = inputs()
    hidden = torch.randn(B, T, H, generator=g)
    with torch.no_grad():
        x = torch.randn(B, T, H, generator=g)  # the decoder layer alone
        torch.testing.assert_close(head.layers[0](positions, x), ref.run_layer(0, x, positions), atol=1e-5, rtol=1e-5)
        out = head(ids, positions, hidden)  # normed: the fed-back feature
        expected = ref(ids, positions, hidden)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
        # logits = lm_head(out): the norm is not applied twice
        torch.testing.assert_close(head.compute_logits(out), expected @ target.lm_head.weight.T, atol=1e-5, rtol=1e-5)


# -- EAGLE-3 head ---------------------------------------------------------------------------
class RefEagle3(rm.Eagle3Reference):
    """EAGLE-3 layer 0 from transformers' MistralAttention (q/k/v widened to read 2H),
    MistralMLP and MistralRMSNorm, with the config's sliding window."""

    def __init__(self, config, draft_vocab):
        super().__init__()
        self.embed = nn.Embedding(config.vocab_size, H)
        self.fc = nn.Linear(3 * H, H, bias=False)
        self.build_layer(config, draft_vocab, hf.MistralAttention, hf.MistralMLP, hf.MistralRMSNorm,
                         hf.MistralRotaryEmbedding)
        self.window = config.sliding_window  # nbr stays off (yuhuili: norm after the residual)

    def checkpoint(self, d2t, t2d):
        """yuhuili / SpecForge layout: midlayer.*, fc, norm, lm_head, d2t, t2d (no embeddings)."""
        sd = {"fc.weight": self.fc.weight, "norm.weight": self.norm.weight, "lm_head.weight": self.lm_head.weight,
              "d2t": d2t, "t2d": t2d}
        sd.update(self.layer_state("midlayer."))
        return {k: v.detach().clone() for k, v in sd.items()}


@pytest.mark.parametrize("architecture", ["Eagle3MistralForCausalLM", "MistralForCausalLMEagle3"])
def test_eagle3_head_loads_and_matches_reference(tmp_path, target, architecture):
    draft_vocab = 40
    config = tiny_config(num_hidden_layers=1)
    ref = randomize(RefEagle3(config, draft_vocab), seed=7)
    d2t, t2d = cf.vocab_map(V, draft_vocab, seed=3)
    file_config = {k: v for k, v in config.to_dict().items() if k not in ("transformers_version", "_name_or_path")}
    file_config.update(architectures=[architecture], draft_vocab_size=draft_vocab)
    cf.write_config(tmp_path / "h", file_config)
    cf.save_weights(tmp_path / "h", ref.checkpoint(d2t, t2d), "safetensors")

    loaded = eagle_zoo.load(tmp_path / "h", target=target)
    assert (loaded.format, loaded.method, loaded.family) == ("yuhuili-eagle3", "eagle3", "mistral")
    head = loaded.head
    assert isinstance(head, MistralEagle3Head) and loaded.shared == ["embed_tokens"]
    assert head.layers[0].self_attn.attn.sliding_window == WINDOW
    ref.embed.weight.data.copy_(target.embed_tokens.weight)
    ids, positions, g = inputs(seed=9)
    aux_cat = torch.randn(B, T, 3 * H, generator=g)
    draft_logits, logits = rm.eagle3_step(head, ref, ids, positions, aux_cat, tol=1e-5)
    torch.testing.assert_close(logits[..., torch.arange(draft_vocab) + d2t], draft_logits, atol=1e-5, rtol=1e-5)
    assert torch.isneginf(logits[..., ~t2d]).all()


# -- a head checkpoint through eagle_zoo.load ---------------------------------------------------
def _write_eagle1(directory, ref: RefEagle, config: MistralConfig, native: bool, lm_head=None):
    """config.json as transformers writes a MistralConfig (num_hidden_layers 1) and the
    tensors in model.safetensors under Mistral-native or HF names."""
    file_config = {k: v for k, v in config.to_dict().items() if k not in ("transformers_version", "_name_or_path")}
    file_config["architectures"] = ["MistralForCausalLM"]
    weights = ref.checkpoint(native)
    if lm_head is not None:
        weights["output.weight" if native else "lm_head.weight"] = lm_head
    cf.write_config(directory, file_config)
    cf.save_weights(directory, weights, "safetensors")
    return weights


@pytest.mark.parametrize("native, own_lm_head", [(True, False), (True, True), (False, False)],
                         ids=["native", "native-with-output", "hf"])
def test_eagle1_checkpoint_loads(tmp_path, target, native, own_lm_head):
    config = tiny_config(num_hidden_layers=1)
    ref = randomize(RefEagle(config), seed=11)
    lm_head = torch.randn(V, H, generator=torch.Generator().manual_seed(12)) * 0.3 if own_lm_head else None
    weights = _write_eagle1(tmp_path / "h", ref, config, native, lm_head)
    loaded = eagle_zoo.load(tmp_path / "h", target=target)
    assert (loaded.format, loaded.method, loaded.family) == ("yuhuili-eagle", "eagle", "mistral")
    assert loaded.config.architectures == ["EagleMistralForCausalLM"] and isinstance(loaded.head, MistralEagleHead)
    assert loaded.shared == (["embed_tokens"] if own_lm_head else ["embed_tokens", "lm_head"])
    ref.embed.weight.data.copy_(target.embed_tokens.weight)
    ids, positions, g = inputs(seed=13)
    hidden = torch.randn(B, T, H, generator=g)
    with torch.no_grad():
        out = loaded.head(ids, positions, hidden)
        expected = ref(ids, positions, hidden)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
        head_lm = lm_head if own_lm_head else target.lm_head.weight
        torch.testing.assert_close(loaded.head.compute_logits(out), expected @ head_lm.T, atol=1e-5, rtol=1e-5)
    assert ("eagle_linear.weight" in weights) == native


def test_every_native_mapping_entry_is_exercised():
    """Target + head in native names cover the whole table (tok_embeddings, output,
    eagle_linear, attention_norm, ffn_norm, attention, feed_forward, wq..w3)."""
    target_keys = to_native(randomize(hf.MistralForCausalLM(tiny_config(num_hidden_layers=1)), seed=3).state_dict())
    head_keys = RefEagle(tiny_config(num_hidden_layers=1)).checkpoint(native=True)
    assert_every_native_entry_used(list(target_keys) + list(head_keys))
    assert MISTRAL_MAPPING.renames[0] == ("^model.", "")  # HF names first, then the native spellings


# -- registration ----------------------------------------------------------------------------
def test_registers_mistral_family():
    spec = rm.registered_spec(register_families, name="mistral", architectures=("MistralForCausalLM",),
                              model_types=("mistral",), target_model=MistralForCausalLM,
                              weight_mapping=MISTRAL_MAPPING)
    assert spec.extra_head_architectures == ()
    assert isinstance(spec.config_class(hidden_size=64, num_attention_heads=4), MistralConfig)


@pytest.mark.parametrize("arch, cls", [("EagleMistralForCausalLM", MistralEagleHead),
                                       ("Eagle3MistralForCausalLM", MistralEagle3Head),
                                       ("MistralForCausalLMEagle3", MistralEagle3Head)])
def test_registry_resolves_renamed_head_architectures(arch, cls):
    registry = get_registry()
    assert registry.head_class(arch) is cls and registry.head_for_architecture(arch)[0].name == "mistral"
    assert registry.family_for_architecture("MistralForCausalLM").name == "mistral"


def test_mistral_large3_head_is_not_a_mistral_layer_head():
    """EagleMistralLarge3ForCausalLM is built from DeepSeek (MLA) decoder layers: the
    mistral family must not claim it (a family with the MLA layer may)."""
    family = get_registry().head_architectures.get("EagleMistralLarge3ForCausalLM", (None, None))[0]
    assert family is None or family.name != "mistral"
