"""load_weights: the mapping table entries and the errors a user sees."""
from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaForCausalLM as HFLlama

from eagle_zoo.models.llama import LLAMA_MAPPING, LlamaEagle3Head, LlamaForCausalLM
from eagle_zoo.models.loader import WeightLoadError, load_weights, map_name
from eagle_zoo.specs import WeightMapping

CONFIG = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4,
              num_key_value_heads=2)


@pytest.fixture(scope="module")
def hf_weights():
    torch.manual_seed(0)
    return {k: v.clone() for k, v in HFLlama(LlamaConfig(**CONFIG)).state_dict().items()}


def fresh():
    return LlamaForCausalLM(LlamaConfig(**CONFIG))


def test_every_llama_mapping_entry():
    for fused, part, shard in LLAMA_MAPPING.stacked:
        assert map_name(f"model.layers.0.x{part}.weight", LLAMA_MAPPING) == (f"layers.0.x{fused}.weight", shard)
    (old, new), = LLAMA_MAPPING.renames
    assert (old, new) == ("^model.", "")
    assert map_name("model.norm.weight", LLAMA_MAPPING) == ("norm.weight", None)
    assert map_name("lm_head.weight", LLAMA_MAPPING) == ("lm_head.weight", None)
    assert map_name("layers.0.model.x", LLAMA_MAPPING) == ("layers.0.model.x", None)  # anchored
    for ignored in LLAMA_MAPPING.ignored:
        assert map_name(f"model.layers.0.self_attn.{ignored}", LLAMA_MAPPING) == ("", None)


def test_loads_hf_names_into_fused_parameters(hf_weights):
    model = fresh()
    weights = dict(hf_weights, **{"model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(4)})  # ignored
    loaded = model.load_weights(weights, "model.safetensors")
    assert loaded == {n for n, _ in model.named_parameters()}
    qkv = model.layers[0].self_attn.qkv_proj.weight
    a = "model.layers.0.self_attn."
    torch.testing.assert_close(qkv, torch.cat([hf_weights[a + "q_proj.weight"], hf_weights[a + "k_proj.weight"],
                                               hf_weights[a + "v_proj.weight"]]))
    m = "model.layers.0.mlp."
    torch.testing.assert_close(model.layers[0].mlp.gate_up_proj.weight,
                               torch.cat([hf_weights[m + "gate_proj.weight"], hf_weights[m + "up_proj.weight"]]))


def test_plain_renames_and_prefused_tensor():
    """A non-anchored rename (Mistral-style names) and an already fused checkpoint tensor."""
    model = fresh()
    mapping = LLAMA_MAPPING.merged(WeightMapping(renames=((".attention.wqkv", ".self_attn.qkv_proj"),)))
    fused = torch.randn(64, 32)  # q 32 + k 16 + v 16 rows
    sd = {n: torch.randn(p.shape) for n, p in model.named_parameters()}
    del sd["layers.0.self_attn.qkv_proj.weight"]
    sd["layers.0.attention.wqkv.weight"] = fused
    load_weights(model, sd, mapping, "consolidated.safetensors")
    torch.testing.assert_close(model.layers[0].self_attn.qkv_proj.weight, fused)


def test_missing_key(hf_weights):
    weights = {k: v for k, v in hf_weights.items() if k != "model.norm.weight"}
    with pytest.raises(WeightLoadError, match=r"/ckpt/model\.safetensors: missing weights for 'norm\.weight'"):
        fresh().load_weights(weights, "/ckpt/model.safetensors")


def test_missing_shard(hf_weights):
    weights = {k: v for k, v in hf_weights.items() if "k_proj" not in k}
    with pytest.raises(WeightLoadError, match=r"'layers\.0\.self_attn\.qkv_proj\.weight' \(shards \['k'\]\)"):
        fresh().load_weights(weights, "model.safetensors")


def test_unexpected_key(hf_weights):
    weights = dict(hf_weights, **{"model.layers.0.self_attn.extra.weight": torch.zeros(2)})
    with pytest.raises(WeightLoadError) as err:
        fresh().load_weights(weights, "shard-00001.safetensors")
    msg = str(err.value)
    assert "shard-00001.safetensors" in msg and "unexpected key 'model.layers.0.self_attn.extra.weight'" in msg
    assert "layers.0.self_attn.extra.weight" in msg


@pytest.mark.parametrize("key,bad,expected", [
    ("model.layers.0.self_attn.v_proj.weight", (8, 31), "(16, 32)"),
    ("model.norm.weight", (33,), "(32,)"),
    ("model.embed_tokens.weight", (65, 32), "(64, 32)"),
    ("model.layers.0.mlp.down_proj.weight", (32, 47), "(32, 48)"),
])
def test_misshaped_key(hf_weights, key, bad, expected):
    weights = dict(hf_weights, **{key: torch.zeros(bad)})
    with pytest.raises(WeightLoadError) as err:
        fresh().load_weights(weights, "pytorch_model.bin")
    msg = str(err.value)
    assert "pytorch_model.bin" in msg and repr(key) in msg
    assert f"expected shape {expected}, got {bad}" in msg
    assert isinstance(err.value, ValueError)


def test_optional_and_buffers():
    """Heads may lack embed_tokens / lm_head; d2t / t2d are buffers loaded like parameters,
    and d2t is required when the draft vocabulary is smaller."""
    config = LlamaConfig(**CONFIG, draft_vocab_size=16)
    head = LlamaEagle3Head(config)
    sd = {n: torch.randn(p.shape) for n, p in head.named_parameters()
          if not n.startswith(("embed_tokens", "lm_head"))}
    with pytest.raises(WeightLoadError, match="missing weights for 'd2t'"):
        LlamaEagle3Head(config).load_weights(sd, "model.safetensors")
    sd["d2t"] = torch.arange(16) * 2
    loaded = head.load_weights(sd, "model.safetensors")
    assert "d2t" in loaded and "lm_head.weight" not in loaded
    assert torch.equal(head.t2d.nonzero().flatten(), torch.arange(16) * 3)
