"""eagle_zoo.load end to end: every publisher layout -> a llama head whose outputs
match a reference assembled from transformers' own Llama modules with the published
tensors; and the errors for a head that does not fit its target."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaMLP,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
)

import checkpoint_factory as cf
import eagle_zoo
from eagle_zoo.checkpoints.tensors import load_state_dict
from eagle_zoo.hookspecs import hookimpl
from eagle_zoo.loading import HeadLoadError
from eagle_zoo.plugins import get_registry
from eagle_zoo.specs import FamilySpec

H, V, EPS = cf.TINY["hidden_size"], cf.TINY["vocab_size"], cf.TINY["rms_norm_eps"]
TARGET_LAYERS = 3


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    written = cf.write_target(tmp_path_factory.mktemp("target") / "t", num_hidden_layers=TARGET_LAYERS)
    config = LlamaConfig.from_pretrained(written.path)
    model = get_registry().family_for_config(config).target_model(config)
    model.load_weights(load_state_dict(written.path), source=str(written.path))
    return SimpleNamespace(model=model.eval(), config=config, weights=written.weights)


def _inputs(seed=0, hidden_size=H, T=5):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (2, T), generator=gen)
    positions = torch.arange(3, 3 + T).expand(2, T)
    hidden = torch.randn(2, T, hidden_size, generator=gen)
    return ids, positions, hidden


# -- references from transformers' modules ------------------------------------------
def _hf_config(**overrides) -> LlamaConfig:
    return LlamaConfig(**{**cf.TINY, **overrides}, num_hidden_layers=1, attn_implementation="eager")


def _causal(T: int) -> torch.Tensor:
    return torch.full((T, T), float("-inf")).triu(1)[None, None]


def _load(module: nn.Module, weights: dict, prefix: str) -> None:
    sd = {k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)}
    module.load_state_dict({k: v for k, v in sd.items() if k in module.state_dict()}, strict=False)


def reference_eagle1(w, ids, positions, hidden, lm_head):
    """docs/formats.md: h = fc(cat([embed, hidden])); decoder layer with identity input norm;
    logits = lm_head(h)."""
    hf = _hf_config()
    layer = LlamaDecoderLayer(hf, layer_idx=0)
    _load(layer, w, "layers.0.")
    layer.input_layernorm = nn.Identity()
    x = F.linear(torch.cat([w["embed_tokens.weight"][ids], hidden], -1), w["fc.weight"], w.get("fc.bias"))
    cos_sin = LlamaRotaryEmbedding(hf)(x, positions)
    h = layer(x, attention_mask=_causal(x.shape[1]), position_ids=positions, position_embeddings=cos_sin)
    return h, h @ lm_head.T


def reference_eagle3(w, ids, positions, hidden, embed, norm_before_residual):
    """docs/formats.md: attention over cat([input_layernorm(e), hidden_norm(h)]); residual is h
    (or hidden_norm(h) with norm_before_residual); post-attention norm + MLP;
    logits = lm_head(norm(h)) scattered to target ids d + d2t[d], -inf elsewhere."""
    hf = _hf_config()
    attn = LlamaAttention(_hf_config(hidden_size=2 * H), layer_idx=0)  # q/k/v read 2H
    attn.o_proj = nn.Linear(attn.o_proj.in_features, H, bias=False)  # o_proj writes H
    _load(attn, w, "layers.0.self_attn.")
    mlp = LlamaMLP(hf)
    _load(mlp, w, "layers.0.mlp.")
    norms = {}
    for name in ("hidden_norm", "input_layernorm", "post_attention_layernorm"):
        norms[name] = LlamaRMSNorm(H, EPS)
        norms[name].weight.data.copy_(w[f"layers.0.{name}.weight"])
    final = LlamaRMSNorm(H, EPS)
    final.weight.data.copy_(w["norm.weight"])

    normed = norms["hidden_norm"](hidden)
    residual = normed if norm_before_residual else hidden
    x = torch.cat([norms["input_layernorm"](embed[ids]), normed], -1)
    cos_sin = LlamaRotaryEmbedding(hf)(x, positions)
    a, _ = attn(x, attention_mask=_causal(x.shape[1]), position_embeddings=cos_sin)
    h = residual + a
    h = h + mlp(norms["post_attention_layernorm"](h))
    draft = final(h) @ w["lm_head.weight"].T
    full = torch.full((*draft.shape[:-1], V), float("-inf"))
    full[..., torch.arange(w["d2t"].numel()) + w["d2t"]] = draft
    return h, full


def _canonical(weights: dict) -> dict:
    return {("layers.0." + k[len("midlayer."):] if k.startswith("midlayer.") else k): v for k, v in weights.items()}


# -- EAGLE-1 ------------------------------------------------------------------------------
EAGLE1 = [
    ("yuhuili-eagle", cf.write_yuhuili_eagle, {}),
    ("yuhuili-eagle", cf.write_yuhuili_eagle, {"kind": "safetensors", "fc_bias": False}),
    ("yuhuili-eagle", cf.write_yuhuili_eagle, {"shards": 2, "bias_key": True, "inv_freq": True}),
    ("legacy-vllm", cf.write_legacy_vllm, {}),
    ("legacy-vllm", cf.write_legacy_vllm, {"shards": 2, "fc_bias": False}),
]


@pytest.mark.parametrize("fmt, write, kwargs", EAGLE1, ids=[f"{f}-{k}" for f, _, k in EAGLE1])
def test_eagle1_heads_match_the_reference(tmp_path, target, fmt, write, kwargs):
    written = write(tmp_path / "h", **kwargs)
    loaded = eagle_zoo.load(str(written.path), target=target.model)
    assert (loaded.format, loaded.method, loaded.family) == (fmt, "eagle", "llama")
    own_lm_head = "lm_head.weight" in written.weights  # legacy vLLM added the target's copy
    assert loaded.shared == ([] if own_lm_head else ["lm_head"])
    lm_head = written.weights["lm_head.weight"] if own_lm_head else target.weights["lm_head.weight"]

    ids, positions, hidden = _inputs()
    ref_h, ref_logits = reference_eagle1(_canonical(written.weights), ids, positions, hidden, lm_head)
    with torch.no_grad():
        h = loaded.head(ids, positions, hidden)
        logits = loaded.head.compute_logits(h)
    torch.testing.assert_close(h, ref_h, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-5, atol=1e-5)


# -- EAGLE-3 ------------------------------------------------------------------------------
EAGLE3 = [
    ("yuhuili-eagle3", cf.write_yuhuili_eagle3, {}),
    ("yuhuili-eagle3", cf.write_yuhuili_eagle3, {"architecture": "Eagle3LlamaForCausalLM", "kind": "safetensors",
                                                 "shards": 2, "embed": True}),
    ("speculators-eagle3", cf.write_speculators, {}),
    ("speculators-eagle3", cf.write_speculators, {"flags": {"norm_before_residual": False}, "embed": True}),
    ("speculators-peagle", cf.write_speculators, {"model_type": "peagle", "shards": 2}),
]


@pytest.mark.parametrize("fmt, write, kwargs", EAGLE3, ids=[f"{f}-{k}" for f, _, k in EAGLE3])
def test_eagle3_heads_match_the_reference(tmp_path, target, fmt, write, kwargs):
    written = write(tmp_path / "h", **kwargs)
    loaded = eagle_zoo.load(str(written.path), target=target.model)
    assert (loaded.format, loaded.method, loaded.family) == (fmt, "eagle3", "llama")
    own_embed = "embed_tokens.weight" in written.weights
    assert loaded.shared == ([] if own_embed else ["embed_tokens"])
    embed = written.weights["embed_tokens.weight"] if own_embed else target.weights["model.embed_tokens.weight"]
    # yuhuili normalises after the residual; speculators before, unless its config says not.
    norm_before_residual = fmt.startswith("speculators") and (kwargs.get("flags") or {}).get(
        "norm_before_residual", True)

    ids, positions, hidden = _inputs()
    w = _canonical(written.weights)
    ref_h, ref_logits = reference_eagle3(w, ids, positions, hidden, embed, norm_before_residual)
    aux = torch.randn(2, 5, 3 * H)
    with torch.no_grad():
        h = loaded.head(ids, positions, hidden)
        logits = loaded.head.compute_logits(h)
        fused = loaded.head.combine_hidden_states(aux)
    torch.testing.assert_close(h, ref_h, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fused, aux @ w["fc.weight"].T, rtol=1e-5, atol=1e-5)
    assert torch.equal(loaded.head.t2d, w["t2d"])


@pytest.mark.parametrize("flag", ["norm_before_fc", "fc_norm"])
def test_speculators_fc_norms_and_target_hidden_size(tmp_path, flag):
    Ht = 40
    written = cf.write_speculators(tmp_path / "h", flags={flag: True}, target_hidden_size=Ht, embed=True)
    loaded = eagle_zoo.load(written.path)  # own embeddings and lm_head: no target needed
    w = written.weights
    aux = torch.randn(2, 5, 3 * Ht)
    if flag == "norm_before_fc":
        norm = LlamaRMSNorm(3 * Ht, EPS)
        norm.weight.data.copy_(w["input_norm.weight"])
        x = norm(aux)
    else:
        chunks = []
        for i, chunk in enumerate(aux.chunk(3, -1)):
            norm = LlamaRMSNorm(Ht, EPS)
            norm.weight.data.copy_(w[f"fc_norm.{i}.weight"])
            chunks.append(norm(chunk))
        x = torch.cat(chunks, -1)
    with torch.no_grad():
        torch.testing.assert_close(loaded.head.combine_hidden_states(aux), x @ w["fc.weight"].T, rtol=1e-5, atol=1e-5)


def test_dtype_and_the_target_left_alone(tmp_path, target):
    written = cf.write_yuhuili_eagle3(tmp_path / "h")
    loaded = eagle_zoo.load(written.path, target=target.model, dtype=torch.bfloat16)
    head = loaded.head
    assert head.fc.weight.dtype == torch.bfloat16 and head.lm_head.weight.dtype == torch.bfloat16
    assert head.d2t.dtype == torch.int64 and head.t2d.dtype == torch.bool
    assert head.embed_tokens is target.model.embed_tokens  # shared, not copied
    assert target.model.embed_tokens.weight.dtype == torch.float32  # not converted behind its back


# -- a head that does not fit -----------------------------------------------------------------
def _target_dict(**overrides):
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H,
            "vocab_size": V, "num_hidden_layers": TARGET_LAYERS, **overrides}


def test_hidden_size_mismatch(tmp_path):
    head = cf.write_yuhuili_eagle(tmp_path / "h").path
    with pytest.raises(HeadLoadError, match=f"size {H} \\(hidden_size .* target has hidden_size 64"):
        eagle_zoo.load(head, target=_target_dict(hidden_size=64))


def test_target_hidden_size_mismatch(tmp_path):
    head = cf.write_yuhuili_eagle3(tmp_path / "h", target_hidden_size=40, embed=True).path
    with pytest.raises(HeadLoadError, match="size 40 \\(target_hidden_size .* target has hidden_size 32"):
        eagle_zoo.load(head, target=_target_dict())
    assert eagle_zoo.load(head, target=_target_dict(hidden_size=40)).method == "eagle3"  # needs no target module


def test_vocab_mismatch(tmp_path):
    head = cf.write_speculators(tmp_path / "h").path
    with pytest.raises(HeadLoadError, match=f"vocab_size is {V} but the target's is 256"):
        eagle_zoo.load(head, target=LlamaConfig(**_target_dict(vocab_size=256)))


def test_aux_layers_beyond_the_target(tmp_path):
    head = cf.write_speculators(tmp_path / "h", aux_layer_ids=[0, 1, 5], embed=True).path
    with pytest.raises(HeadLoadError, match=r"\[0, 1, 5\] need a target with more than 5 layers; the target has 3"):
        eagle_zoo.load(head, target=_target_dict())


def test_verifier_mismatch(tmp_path):
    head = cf.write_speculators(tmp_path / "h", verifier_architectures=("Qwen3ForCausalLM",)).path
    with pytest.raises(HeadLoadError, match="Qwen3ForCausalLM verifier .* target is LlamaForCausalLM"):
        eagle_zoo.load(head, target=_target_dict())


class ToyFamily:
    @hookimpl
    def register_families(self, register):
        register(FamilySpec(name="toy", architectures=("ToyForCausalLM",), model_types=("toy",)))


def test_family_mismatch(tmp_path, register_plugin):
    register_plugin(ToyFamily(), "toy-family")
    toy = _target_dict(architectures=["ToyForCausalLM"], model_type="toy")
    eagle1 = cf.write_yuhuili_eagle(tmp_path / "e1").path
    with pytest.raises(HeadLoadError, match="llama EAGLE head .* target is a toy model"):
        eagle_zoo.load(eagle1, target=toy)
    # EAGLE-3 heads are Llama-style drafts for any target: sizes decide.
    eagle3 = cf.write_yuhuili_eagle3(tmp_path / "e3", embed=True).path
    assert eagle_zoo.load(eagle3, target=toy).family == "llama"


def test_head_without_a_target_says_what_it_needs(tmp_path, target):
    """Loaded without a target, a head lacking lm_head keeps none (no random stand-in):
    it names what it needs, refuses to run saying how to give it, and once given the
    target (eagle_zoo.load_target, attach_target) computes what load(target=) computes."""
    from eagle_zoo.models.heads import HeadNeedsTargetError

    written = cf.write_yuhuili_eagle(tmp_path / "h")
    alone = eagle_zoo.load(written.path)
    assert alone.needs == ["lm_head"] and not alone.ready and alone.shared == []
    ids, positions, hidden = _inputs()
    with torch.no_grad():
        h = alone.head(ids, positions, hidden)  # the checkpoint's own embeddings run
        with pytest.raises(HeadNeedsTargetError, match="no lm_head.weight .*attach_target"):
            alone.head.compute_logits(h)
    # a config checks sizes but cannot lend modules
    assert eagle_zoo.load(written.path, target=_target_dict()).needs == ["lm_head"]
    with pytest.raises(HeadLoadError, match="a config alone is not enough"):
        alone.attach_target(_target_dict())
    with pytest.raises(HeadLoadError, match="hidden_size"):
        alone.attach_target(_target_dict(hidden_size=40))

    built = eagle_zoo.load_target(str(target_dir(tmp_path)), device="cpu")
    assert alone.attach_target(built) is alone and alone.ready and alone.shared == ["lm_head"]
    assert alone.head.lm_head is built.lm_head
    with torch.no_grad():
        got = alone.head.compute_logits(alone.head(ids, positions, hidden))
        want_head = eagle_zoo.load(written.path, target=built).head
        want = want_head.compute_logits(want_head(ids, positions, hidden))
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def target_dir(tmp_path):
    """The module target's weights written again (same seed), for load_target to read."""
    return cf.write_target(tmp_path / "target", num_hidden_layers=TARGET_LAYERS).path


def test_load_target_equals_the_directory_weights(tmp_path, target):
    built = eagle_zoo.load_target(str(target_dir(tmp_path)), dtype="float32", device="cpu")
    assert built.config.num_hidden_layers == TARGET_LAYERS
    torch.testing.assert_close(built.lm_head.weight.detach(), target.weights["lm_head.weight"])
    assert eagle_zoo.load(cf.write_yuhuili_eagle(tmp_path / "h").path, target=built).ready


def test_unknown_head_architecture(tmp_path):
    head = cf.write_yuhuili_eagle(tmp_path / "h", architectures=["FooForCausalLM"]).path
    with pytest.raises(HeadLoadError, match="no installed family plugin provides a head for "
                                            "\\['EagleFooForCausalLM'\\] \\(read as yuhuili-eagle, method eagle, "
                                            "config.json: \\['FooForCausalLM'\\]\\)"):
        eagle_zoo.load(head)


def test_bad_target_argument(tmp_path):
    head = cf.write_yuhuili_eagle(tmp_path / "h").path
    with pytest.raises(HeadLoadError, match="target= must be"):
        eagle_zoo.load(head, target=Path("/nope"))


def test_dtype_and_device_are_taken_by_name_or_refused_by_name(tmp_path):
    # As LLM takes them ("bfloat16", "fp32", "cpu"); anything else is a ValueError naming
    # it, not a torch error from inside .to().
    path = cf.write_yuhuili_eagle3(tmp_path / "h").path
    assert eagle_zoo.load(path, dtype="bfloat16").head.fc.weight.dtype == torch.bfloat16
    assert eagle_zoo.load(path, dtype="fp32", device="cpu").head.fc.weight.dtype == torch.float32
    with pytest.raises(ValueError, match=r"dtype='int4' is not supported"):
        eagle_zoo.load(path, dtype="int4")
    with pytest.raises(ValueError, match=r"device='tpu' is not a device"):
        eagle_zoo.load(path, device="tpu")


@pytest.mark.parametrize("key", ["hidden_size", "intermediate_size", "vocab_size"])
def test_a_config_without_a_layer_size_is_refused_by_the_key(tmp_path, key):
    # Not filled in with a config class's defaults (Llama-7B's), which surfaced as some
    # weight's shape mismatch.
    import json

    path = cf.write_yuhuili_eagle3(tmp_path / "h").path
    config = json.loads((path / "config.json").read_text())
    del config[key]
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=rf"{tmp_path / 'h'}.*: no '{key}': a head's config.json gives the sizes"):
        eagle_zoo.load(path)
