"""The qwen3 family against transformers' own Qwen3 modules (same weights, fp32)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn
from transformers import Qwen3Config
from transformers.models.qwen3 import modeling_qwen3 as hf

import checkpoint_factory as cf
import eagle_zoo
import reference_models as rm
from eagle_zoo.models.qwen3 import (
    QWEN3_MAPPING,
    Qwen3Eagle3Head,
    Qwen3EagleHead,
    Qwen3ForCausalLM,
    layer_sliding_window,
    register_families,
)
from eagle_zoo.plugins import get_registry

# head_dim 16 != hidden / heads (8): the config's head_dim must be the one used.
V, H, HD, B, T = 96, 32, 16, 2, 7
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 32}


def tiny_config(**kw) -> Qwen3Config:
    base = dict(vocab_size=V, hidden_size=H, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, head_dim=HD, max_position_embeddings=128, rms_norm_eps=1e-5,
                rope_parameters={"rope_type": "default", "rope_theta": 1000.0}, attn_implementation="eager")
    base.update(kw)
    return Qwen3Config(**base)


randomize, window_mask = rm.randomize, rm.causal_mask


def inputs(seed=1, offset=3):
    return rm.token_inputs(V, B, T, seed, offset)


# -- target model -------------------------------------------------------------------
SLIDING = {"use_sliding_window": True, "sliding_window": 3, "max_window_layers": 2}  # layers 2, 3 slide
TARGET_CASES = {
    "plain": {},
    "tied": {"tie_word_embeddings": True},
    "bias-yarn": {"attention_bias": True, "rope_parameters": YARN},
    "sliding": SLIDING,
    "layer-types": {"use_sliding_window": True, "sliding_window": 2,
                    "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]},
}


@pytest.mark.parametrize("case", list(TARGET_CASES))
def test_target_matches_transformers(case):
    kw = TARGET_CASES[case]
    config = tiny_config(**kw)
    ref = rm.reference_target(hf.Qwen3ForCausalLM, config, seed=0)
    model = Qwen3ForCausalLM(config)
    loaded = model.load_weights(ref.state_dict(), "model.safetensors")
    assert {"layers.3.self_attn.qkv_proj.weight", "layers.3.self_attn.q_norm.weight",
            "layers.0.self_attn.k_norm.weight"} <= loaded
    assert model.layers[0].self_attn.q_norm.weight.shape == (HD,)
    assert (model.layers[0].self_attn.qkv_proj.bias is not None) == bool(kw.get("attention_bias"))
    if config.tie_word_embeddings:
        assert model.lm_head.weight is model.embed_tokens.weight
    windows = [layer.self_attn.attn.sliding_window for layer in model.layers]
    assert windows == [config.sliding_window if t == "sliding_attention" else None for t in config.layer_types]
    ids, positions, _ = inputs()
    rm.assert_target_matches(model, ref, ids, positions, aux_layer_ids=(3, 0, 2), tol=1e-5)


def test_target_tied_checkpoint_without_lm_head():
    config = tiny_config(tie_word_embeddings=True, num_hidden_layers=1)
    ref = rm.reference_target(hf.Qwen3ForCausalLM, config, seed=3)
    ids, positions, _ = inputs()
    rm.assert_tied_checkpoint_matches(Qwen3ForCausalLM(config), ref, ids, positions, tol=1e-5)


def test_sliding_window_rules():
    assert layer_sliding_window(tiny_config(), 3) is None  # use_sliding_window off
    assert [layer_sliding_window(tiny_config(**SLIDING), i) for i in range(4)] == [None, None, 3, 3]
    # a plain config object without layer_types: transformers' rule (layer >= max_window_layers)
    plain = type("C", (), {"sliding_window": 5, "use_sliding_window": True, "max_window_layers": 1})()
    assert [layer_sliding_window(plain, i) for i in range(3)] == [None, 5, 5]
    with pytest.raises(ValueError, match="layer_types has 4 entries but layer 4"):
        layer_sliding_window(tiny_config(**SLIDING), 4)


# -- EAGLE-1 head --------------------------------------------------------------------
class RefEagle(nn.Module):
    """EAGLE-1 from transformers' Qwen3 modules: fc(cat[embed, hidden]) -> Qwen3 decoder
    layer whose input norm is Identity -> (the target's) lm_head."""

    def __init__(self, config, bias):
        super().__init__()
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.fc = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=bias)
        self.layer = hf.Qwen3DecoderLayer(config, 0)
        self.layer.input_layernorm = nn.Identity()
        self.rotary = hf.Qwen3RotaryEmbedding(config)
        self.window = config.sliding_window if config.layer_types[0] == "sliding_attention" else None

    def run_layer(self, x, positions):
        return self.layer(x, attention_mask=window_mask(x.shape[1], self.window),
                          position_embeddings=self.rotary(x, positions), position_ids=positions)

    def forward(self, ids, positions, hidden):
        return self.run_layer(self.fc(torch.cat([self.embed(ids), hidden], -1)), positions)

    def checkpoint(self):
        """The yuhuili layout: embed_tokens, fc, layers.0.* (no input_layernorm, no lm_head)."""
        sd = {"embed_tokens.weight": self.embed.weight, **{f"fc.{k}": v for k, v in self.fc.state_dict().items()}}
        sd.update({f"layers.0.{k}": v for k, v in self.layer.state_dict().items()})
        return {k: v.clone() for k, v in sd.items()}


@pytest.mark.parametrize("kw", [{}, {"eagle_fc_bias": True, "attention_bias": True},
                                {**SLIDING, "max_window_layers": 0}], ids=["plain", "biases", "sliding"])
def test_eagle_head_matches_reference(kw):
    config = tiny_config(num_hidden_layers=1, **kw)
    ref = randomize(RefEagle(config, bias=bool(kw.get("eagle_fc_bias"))), seed=5)
    target = rm.load_reference(Qwen3ForCausalLM(tiny_config()), randomize(hf.Qwen3ForCausalLM(tiny_config()), seed=6),
                               "target")
    head = Qwen3EagleHead(config)
    assert isinstance(head.layers[0].input_layernorm, nn.Identity)
    ckpt = ref.checkpoint()
    assert "layers.0.self_attn.q_norm.weight" in ckpt and not any("input_layernorm" in k for k in ckpt)
    loaded = head.load_weights(ckpt, "pytorch_model.bin")
    assert "lm_head.weight" not in loaded
    assert head.share_from_target(target) == ["lm_head"]

    ids, positions, g = inputs()
    hidden = torch.randn(B, T, H, generator=g)
    with torch.no_grad():
        x = torch.randn(B, T, H, generator=g)  # the decoder layer alone
        torch.testing.assert_close(head.layers[0](positions, x), ref.run_layer(x, positions), atol=1e-5, rtol=1e-5)
        h = head(ids, positions, hidden)
        expected = ref(ids, positions, hidden)
        torch.testing.assert_close(h, expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(head.compute_logits(h), target.compute_logits(expected), atol=1e-5, rtol=1e-5)


# -- EAGLE-3 head --------------------------------------------------------------------
class RefEagle3(rm.Eagle3Reference):
    """EAGLE-3 layer 0 from transformers' Qwen3Attention (q/k/v widened to read 2H; its
    q_norm / k_norm kept), Qwen3MLP and Qwen3RMSNorm, written from the published
    description (vLLM's Eagle3Qwen3ForCausalLM)."""

    def __init__(self, config, draft_vocab, norm_before_residual):
        super().__init__()
        self.nbr = norm_before_residual
        self.embed = nn.Embedding(config.vocab_size, H)
        self.fc = nn.Linear(3 * H, H, bias=False)
        # q/k/v keep transformers' bias (config.attention_bias) and its q_norm / k_norm
        self.build_layer(config, draft_vocab, hf.Qwen3Attention, hf.Qwen3MLP, hf.Qwen3RMSNorm, hf.Qwen3RotaryEmbedding)
        self.window = config.sliding_window if config.layer_types[0] == "sliding_attention" else None

    def checkpoint(self, d2t, prefix="layers.0."):
        sd = {"embed_tokens.weight": self.embed.weight, "fc.weight": self.fc.weight, "norm.weight": self.norm.weight,
              "lm_head.weight": self.lm_head.weight, "d2t": d2t}
        sd.update(self.layer_state(prefix))
        return {k: v.clone() for k, v in sd.items()}


def draft_map(draft_vocab, seed=8):
    g = torch.Generator().manual_seed(seed)
    draft_ids = torch.randperm(V, generator=g)[:draft_vocab].sort().values  # target ids in the draft vocab
    return draft_ids, draft_ids - torch.arange(draft_vocab)


@pytest.mark.parametrize("norm_before_residual", [False, True])
@pytest.mark.parametrize("kw", [{}, {"attention_bias": True, "rope_parameters": YARN},
                                {**SLIDING, "max_window_layers": 0}], ids=["plain", "bias-yarn", "sliding"])
def test_eagle3_head_matches_reference(norm_before_residual, kw):
    draft_vocab = 40
    config = tiny_config(num_hidden_layers=1, draft_vocab_size=draft_vocab,
                         norm_before_residual=norm_before_residual, **kw)
    ref = randomize(RefEagle3(config, draft_vocab, norm_before_residual), seed=7)
    draft_ids, d2t = draft_map(draft_vocab)
    head = Qwen3Eagle3Head(config)
    attn = head.layers[0].self_attn
    assert attn.qkv_proj.weight.shape == ((4 + 2 + 2) * HD, 2 * H) and attn.q_norm.weight.shape == (HD,)
    assert attn.attn.sliding_window == (3 if "sliding_window" in kw else None)
    loaded = head.load_weights(ref.checkpoint(d2t), "model.safetensors")
    assert {"layers.0.self_attn.q_norm.weight", "layers.0.self_attn.k_norm.weight", "d2t"} <= loaded

    ids, positions, g = inputs(seed=9)
    aux_cat = torch.randn(B, T, 3 * H, generator=g)
    draft_logits, logits = rm.eagle3_step(head, ref, ids, positions, aux_cat, tol=1e-5)
    x = torch.randn(B, T, 2 * H, generator=g)  # the attention alone, on a 2H input
    with torch.no_grad():
        torch.testing.assert_close(attn(positions, x), ref.attend(x, positions), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits[..., draft_ids], draft_logits, atol=1e-5, rtol=1e-5)
    outside = torch.ones(V, dtype=torch.bool)
    outside[draft_ids] = False
    assert torch.isneginf(logits[..., outside]).all()


# -- registration ----------------------------------------------------------------------
def test_registers_qwen3_family():
    spec = rm.registered_spec(register_families, name="qwen3", architectures=("Qwen3ForCausalLM",),
                              model_types=("qwen3",), target_model=Qwen3ForCausalLM, weight_mapping=QWEN3_MAPPING)
    assert isinstance(spec.config_class(hidden_size=64, num_attention_heads=4), Qwen3Config)


@pytest.mark.parametrize("arch, cls", [("Eagle3Qwen3ForCausalLM", Qwen3Eagle3Head),
                                       ("Qwen3ForCausalLMEagle3", Qwen3Eagle3Head),
                                       ("EagleQwen3ForCausalLM", Qwen3EagleHead)])
def test_registry_resolves_renamed_head_architectures(arch, cls):
    registry = get_registry()
    assert registry.head_class(arch) is cls
    assert registry.head_for_architecture(arch)[0].name == "qwen3"
    assert registry.family_for_architecture("Qwen3ForCausalLM").name == "qwen3"
    assert registry.model_types["qwen3"].name == "qwen3"


# -- published layouts through eagle_zoo.load -------------------------------------------
# transformers' Qwen3Config.to_dict() as speculators nests it (no architectures).
LAYER_FIELDS = dict(vocab_size=V, hidden_size=H, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=HD, max_position_embeddings=128, rms_norm_eps=1e-5,
                    rope_parameters={"rope_type": "default", "rope_theta": 1000.0})


def write_speculators_qwen3(directory: Path, ref: RefEagle3, d2t, t2d, embed: bool, flags: dict) -> dict:
    """A vllm-project/speculators EAGLE-3 head for a Qwen3 verifier: config.json with
    speculators_model_type, transformer_layer_config model_type qwen3 and the norm
    flags at top level; model.safetensors with layers.0.* (q_norm / k_norm included)."""
    layer = Qwen3Config(**LAYER_FIELDS).to_dict()
    for key in ("architectures", "transformers_version", "_name_or_path", "id2label", "label2id"):
        layer.pop(key, None)
    config = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": "0.1.0",
        "draft_vocab_size": int(d2t.numel()),
        "target_hidden_size": None,
        "transformer_layer_config": layer,
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3,
                                  "accept_tolerance": 0.0, "verifier_accept_k": 1}],
            "verifier": {"name_or_path": "Qwen/Qwen3-tiny", "architectures": ["Qwen3ForCausalLM"]},
        },
        "torch_dtype": "float32",
        "transformers_version": "4.55.0",
        **flags,
    }
    weights = ref.checkpoint(d2t)
    weights["t2d"] = t2d
    if not embed:
        del weights["embed_tokens.weight"]
    cf.write_config(directory, config)
    cf.save_weights(directory, weights, "safetensors")
    return weights


@pytest.fixture(scope="module")
def target():
    config = tiny_config(num_hidden_layers=3)
    return rm.load_reference(Qwen3ForCausalLM(config), randomize(hf.Qwen3ForCausalLM(config), seed=21), "target").eval()


@pytest.mark.parametrize("embed, nbr", [(False, None), (True, False)], ids=["shared-embed", "own-embed-nbr-off"])
def test_speculators_qwen3_eagle3_loads(tmp_path, target, embed, nbr):
    draft_vocab = 48
    flags = {} if nbr is None else {"norm_before_residual": nbr}
    norm_before_residual = True if nbr is None else nbr  # the speculators default is on
    config = Qwen3Config(**LAYER_FIELDS, attn_implementation="eager")
    ref = randomize(RefEagle3(config, draft_vocab, norm_before_residual), seed=23)
    d2t, t2d = cf.vocab_map(V, draft_vocab, seed=4)
    weights = write_speculators_qwen3(tmp_path / "h", ref, d2t, t2d, embed, flags)
    assert json.loads((tmp_path / "h" / "config.json").read_text())["transformer_layer_config"]["model_type"] == "qwen3"

    loaded = eagle_zoo.load(tmp_path / "h", target=target)
    assert (loaded.format, loaded.method, loaded.family) == ("speculators-eagle3", "eagle3", "qwen3")
    assert loaded.config.architectures == ["Eagle3Qwen3ForCausalLM"] and isinstance(loaded.head, Qwen3Eagle3Head)
    assert loaded.shared == ([] if embed else ["embed_tokens"])
    if not embed:
        ref.embed.weight.data.copy_(target.embed_tokens.weight)
    assert torch.equal(loaded.head.t2d, t2d)

    ids, positions, g = inputs(seed=2)
    hidden = torch.randn(B, T, H, generator=g)
    with torch.no_grad():
        h = loaded.head(ids, positions, hidden)
        torch.testing.assert_close(h, ref(ids, positions, hidden), atol=1e-5, rtol=1e-5)
        draft = ref.lm_head(ref.norm(h))
        logits = loaded.head.compute_logits(h)
    torch.testing.assert_close(logits[..., torch.arange(draft_vocab) + d2t], draft, atol=1e-5, rtol=1e-5)
    assert set(weights) >= {"layers.0.self_attn.q_norm.weight", "layers.0.self_attn.k_norm.weight"}


def test_yuhuili_layout_qwen3_eagle1_loads(tmp_path, target):
    """A yuhuili EAGLE-1 layout over a Qwen3 config (pytorch_model.bin, no lm_head)."""
    config = tiny_config(num_hidden_layers=1)
    ref = randomize(RefEagle(config, bias=True), seed=25)
    file_config = {**{k: v for k, v in config.to_dict().items() if k not in ("transformers_version", "_name_or_path")},
                   "architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 1}
    file_config.pop("attn_implementation", None)
    cf.write_config(tmp_path / "h", file_config)
    cf.save_weights(tmp_path / "h", ref.checkpoint(), "bin")

    loaded = eagle_zoo.load(tmp_path / "h", target=target)
    assert (loaded.format, loaded.method, loaded.family) == ("yuhuili-eagle", "eagle", "qwen3")
    assert isinstance(loaded.head, Qwen3EagleHead) and loaded.head.fc.bias is not None
    assert loaded.shared == ["lm_head"]
    ids, positions, g = inputs(seed=3)
    hidden = torch.randn(B, T, H, generator=g)
    with torch.no_grad():
        h = loaded.head(ids, positions, hidden)
        torch.testing.assert_close(h, ref(ids, positions, hidden), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(loaded.head.compute_logits(h), target.compute_logits(h), atol=1e-5, rtol=1e-5)
