"""A head laid out exactly as yuhuili/EAGLE-Qwen2-7B-Instruct is published loads through
eagle_zoo.load (format detection, renamed architecture -> this plugin's head, weight
mapping, lm_head shared from the target) and computes what transformers' Qwen2 modules
compute with the same tensors."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import torch
from transformers.models.qwen2 import modeling_qwen2 as hf

import eagle_zoo
from eagle_zoo.loading import HeadLoadError
from eagle_zoo.models.loader import WeightLoadError
from eagle_zoo_qwen2.modeling import Qwen2Eagle3Head, Qwen2EagleHead, Qwen2ForCausalLM
from qwen2_fixtures import (
    TINY,
    RefEagleQwen2,
    hf_config,
    randomize,
    ref_config_from_published,
    write_yuhuili_qwen2_head,
)

# The published layout, typed from the publisher's side (official EAGLE draft code and
# the keys reported against this checkpoint): no input_layernorm, no final norm, no lm_head.
PUBLISHED_KEYS = {
    "embed_tokens.weight", "fc.weight", "fc.bias",
    "layers.0.self_attn.q_proj.weight", "layers.0.self_attn.q_proj.bias",
    "layers.0.self_attn.k_proj.weight", "layers.0.self_attn.k_proj.bias",
    "layers.0.self_attn.v_proj.weight", "layers.0.self_attn.v_proj.bias",
    "layers.0.self_attn.o_proj.weight",
    "layers.0.mlp.gate_proj.weight", "layers.0.mlp.up_proj.weight", "layers.0.mlp.down_proj.weight",
    "layers.0.post_attention_layernorm.weight",
}
PUBLISHED_COMMIT = "8095867226c840b721a12c589a048288280eab9b"
REPO_ID = "yuhuili/EAGLE-Qwen2-7B-Instruct"
B, T = 2, 9


@pytest.fixture(scope="module")
def target():
    """The plugin's target model (grouped-query: 2 kv heads) with transformers' random weights."""
    model = Qwen2ForCausalLM(hf_config(num_hidden_layers=2))
    model.load_weights(randomize(hf.Qwen2ForCausalLM(hf_config(num_hidden_layers=2)), seed=11).state_dict(), "t")
    return model.eval()


@pytest.fixture
def published(tmp_path):
    return write_yuhuili_qwen2_head(tmp_path / "EAGLE-Qwen2-7B-Instruct", seed=4)


def check_against_reference(loaded, written, target):
    ref = RefEagleQwen2(ref_config_from_published(written.config)).load_published(written.weights)
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, TINY["vocab_size"], (B, T), generator=g)
    positions = (torch.arange(T) + 6).expand(B, T)
    hidden = torch.randn(B, T, TINY["hidden_size"], generator=g)
    with torch.no_grad():
        expected = ref(ids, positions, hidden)
        h = loaded.head(ids, positions, hidden)
        torch.testing.assert_close(h, expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(loaded.head.compute_logits(h), target.compute_logits(expected),
                                   atol=1e-5, rtol=1e-5)


def test_written_file_is_the_published_layout(published):
    assert set(published.weights) == PUBLISHED_KEYS
    assert (published.path / "pytorch_model.bin").is_file() and not list(published.path.glob("*.safetensors"))
    cfg = json.loads((published.path / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen2ForCausalLM"] and cfg["model_type"] == "qwen2"
    assert cfg["qkv_bias"] is True and "bias" not in cfg and cfg["num_hidden_layers"] == 1
    assert cfg["num_key_value_heads"] == cfg["num_attention_heads"]  # 28/28 in the 7B head
    assert all(t.dtype == torch.bfloat16 for t in published.weights.values())


def test_published_layout_loads_through_eagle_zoo_load(published, target):
    loaded = eagle_zoo.load(published.path, target=target, dtype=torch.float32)
    assert (loaded.format, loaded.family, loaded.method) == ("yuhuili-eagle", "qwen2", "eagle")
    assert isinstance(loaded.head, Qwen2EagleHead)
    assert loaded.config.architectures == ["EagleQwen2ForCausalLM"]
    assert loaded.shared == ["lm_head"] and loaded.head.lm_head is target.lm_head
    head_attn = loaded.head.layers[0].self_attn
    assert loaded.head.fc.bias is not None and head_attn.qkv_proj.bias is not None and head_attn.o_proj.bias is None
    # the head keeps its own multi-head KV layout over the grouped-query target
    assert head_attn.attn.num_kv_heads == 4 and target.layers[0].self_attn.attn.num_kv_heads == 2
    assert isinstance(loaded.head.layers[0].input_layernorm, torch.nn.Identity)
    assert loaded.head.norm is None
    check_against_reference(loaded, published, target)


def _add_to_hf_cache(cache: Path, repo_id: str, source: Path, commit: str) -> Path:
    """Files laid out as huggingface_hub stores a download (blobs + snapshot symlinks)."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for f in sorted(source.iterdir()):
        data = f.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        os.symlink(os.path.relpath(blob, snapshot), snapshot / f.name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return snapshot


def test_catalog_id_loads_offline_at_the_pinned_commit(published, target, tmp_path, monkeypatch, fresh_plugin_host):
    """The plugin's catalog pins the published commit; the id resolves through
    huggingface_hub's cache without the network."""
    entry = fresh_plugin_host.get_registry().catalog[REPO_ID]
    assert entry.revision == PUBLISHED_COMMIT and entry.format == "yuhuili-eagle" and entry.source == "qwen2"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    snapshot = _add_to_hf_cache(tmp_path / "hub", REPO_ID, published.path, PUBLISHED_COMMIT)
    loaded = eagle_zoo.load(REPO_ID, target=target)
    assert loaded.path == snapshot and loaded.family == "qwen2"
    check_against_reference(loaded, published, target)


def test_qkv_bias_key_decides_and_contradictions_name_the_key(tmp_path, target):
    # qkv_bias false with bias tensors present: the file and the config disagree
    written = write_yuhuili_qwen2_head(tmp_path / "h1", qkv_bias=False)
    with pytest.raises(WeightLoadError, match=r"pytorch_model.bin: unexpected key 'layers.0.self_attn.q_proj.bias'"):
        eagle_zoo.load(written.path, target=target)
    # a head that truly has no q/k/v bias loads when its config says so
    weights = {k: v for k, v in written.weights.items() if not k.endswith("_proj.bias")}
    plain = write_yuhuili_qwen2_head(tmp_path / "h2", weights=weights, qkv_bias=False)
    assert eagle_zoo.load(plain.path, target=target).head.layers[0].self_attn.qkv_proj.bias is None
    # anything but a boolean is refused with the key's name
    odd = write_yuhuili_qwen2_head(tmp_path / "h3", qkv_bias="yes")
    with pytest.raises(ValueError, match="'qkv_bias' must be true or false"):
        eagle_zoo.load(odd.path, target=target)


def test_head_refuses_a_target_of_another_family(published):
    from eagle_zoo.models.llama import LlamaForCausalLM
    from transformers import LlamaConfig

    llama = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in TINY.items()}, num_hidden_layers=1))
    with pytest.raises(HeadLoadError, match="this is a qwen2 EAGLE head .* but the target is a llama model"):
        eagle_zoo.load(published.path, target=llama)


def test_speculators_head_with_a_qwen2_layer_config_resolves_by_model_type(tmp_path, target):
    """speculators names no architecture in transformer_layer_config: its model_type
    qwen2 picks this plugin's EAGLE-3 head (q/k/v with bias, reading 2H)."""
    from safetensors.torch import save_file

    H, V, draft_vocab = TINY["hidden_size"], TINY["vocab_size"], 48
    layer = {k: v for k, v in hf_config(num_hidden_layers=1).to_dict().items()
             if k not in ("architectures", "transformers_version", "id2label", "label2id")}
    cfg = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", "draft_vocab_size": draft_vocab,
           "transformer_layer_config": layer, "norm_before_residual": True,
           "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                  "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                                  "verifier": {"name_or_path": "Qwen/Qwen2.5-0.5B",
                                               "architectures": ["Qwen2ForCausalLM"]}}}
    g = torch.Generator().manual_seed(0)
    nh, nkv, d, I = 4, 2, H // 4, TINY["intermediate_size"]
    w = {"fc.weight": torch.randn(H, 3 * H, generator=g), "norm.weight": torch.ones(H),
         "lm_head.weight": torch.randn(draft_vocab, H, generator=g)}
    for name, rows in (("q", nh * d), ("k", nkv * d), ("v", nkv * d)):
        w[f"layers.0.self_attn.{name}_proj.weight"] = torch.randn(rows, 2 * H, generator=g)
        w[f"layers.0.self_attn.{name}_proj.bias"] = torch.randn(rows, generator=g)
    w["layers.0.self_attn.o_proj.weight"] = torch.randn(H, nh * d, generator=g)
    w.update({f"layers.0.mlp.{n}_proj.weight": torch.randn(*s, generator=g)
              for n, s in (("gate", (I, H)), ("up", (I, H)), ("down", (H, I)))})
    w.update({f"layers.0.{n}.weight": torch.ones(H) for n in ("hidden_norm", "input_layernorm", "post_attention_layernorm")})
    ids = torch.randperm(V, generator=g)[:draft_vocab].sort().values
    w["d2t"] = ids - torch.arange(draft_vocab)
    directory = tmp_path / "qwen2.speculator.eagle3"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(cfg))
    save_file(w, str(directory / "model.safetensors"))
    loaded = eagle_zoo.load(directory, target=target)
    assert (loaded.format, loaded.family, loaded.method) == ("speculators-eagle3", "qwen2", "eagle3")
    assert isinstance(loaded.head, Qwen2Eagle3Head) and loaded.shared == ["embed_tokens"]
    assert loaded.config.architectures == ["Eagle3Qwen2ForCausalLM"]
    assert torch.equal(loaded.head.layers[0].self_attn.qkv_proj.bias[: nh * d], w["layers.0.self_attn.q_proj.bias"])


def test_eagle_zoo_converter_handles_the_plugin_family(published, tmp_path):
    """eagle-zoo's own legacy (vLLM < 0.7) conversion needs nothing from the plugin: the
    converted head (nested config, lm_head added from the target) loads into this
    plugin's head and computes what the original does with the target's lm_head."""
    from eagle_zoo.cli import main
    from eagle_zoo.engine.model_loader import load_model

    target_dir = tmp_path / "target"
    hf.Qwen2ForCausalLM(hf_config(num_hidden_layers=1)).save_pretrained(target_dir)
    assert main(["convert", "legacy", str(published.path), "--target", str(target_dir),
                 "-o", str(tmp_path / "legacy"), "--quiet"]) == 0
    cfg = json.loads((tmp_path / "legacy" / "config.json").read_text())
    assert cfg["model_type"] == "eagle" and cfg["eagle_fc_bias"] is True and cfg["model"]["qkv_bias"] is True
    target = load_model(str(target_dir), torch.float32, torch.device("cpu")).model
    legacy = eagle_zoo.load(tmp_path / "legacy")
    assert (legacy.format, legacy.family, legacy.shared) == ("legacy-vllm", "qwen2", [])
    check_against_reference(legacy, published, target)
