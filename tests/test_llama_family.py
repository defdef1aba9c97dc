"""The llama family against transformers' own Llama modules (same weights, fp32)."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama import modeling_llama as hf

import reference_models as rm
from eagle_zoo.models.llama import (
    LLAMA_MAPPING,
    LlamaEagle3Head,
    LlamaEagleHead,
    LlamaForCausalLM,
    register_families,
)

V, H, B, T = 96, 32, 2, 7
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16}


def tiny_config(**kw) -> LlamaConfig:
    base = dict(vocab_size=V, hidden_size=H, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5, attn_implementation="eager")
    base.update(kw)
    return LlamaConfig(**base)


randomize, causal_mask = rm.randomize, rm.causal_mask


def inputs(seed=1, offset=3):
    return rm.token_inputs(V, B, T, seed, offset)


# -- target model -------------------------------------------------------------------


@pytest.mark.parametrize("rope", [None, LLAMA3_ROPE])
@pytest.mark.parametrize("tie", [False, True])
def test_target_matches_transformers(rope, tie):
    config = tiny_config(tie_word_embeddings=tie, **({"rope_parameters": rope} if rope else {"rope_theta": 500.0}))
    ref = rm.reference_target(hf.LlamaForCausalLM, config, seed=0)
    model = LlamaForCausalLM(config)
    loaded = model.load_weights(ref.state_dict(), "model.safetensors")
    assert "layers.3.self_attn.qkv_proj.weight" in loaded and "norm.weight" in loaded
    if tie:
        assert model.lm_head.weight is model.embed_tokens.weight
    ids, positions, _ = inputs()
    rm.assert_target_matches(model, ref, ids, positions, aux_layer_ids=(3, 0, 2), tol=1e-5)


def test_target_tied_checkpoint_without_lm_head():
    config = tiny_config(tie_word_embeddings=True, num_hidden_layers=1)
    ref = rm.reference_target(hf.LlamaForCausalLM, config, seed=3)
    ids, positions, _ = inputs()
    rm.assert_tied_checkpoint_matches(LlamaForCausalLM(config), ref, ids, positions, tol=1e-5)


def test_target_rejects_bad_aux_ids():
    model = LlamaForCausalLM(tiny_config(num_hidden_layers=2))
    with pytest.raises(ValueError, match="aux_layer_ids"):
        model(torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 1, dtype=torch.long), (2,))


# -- EAGLE-1 head --------------------------------------------------------------------


class RefEagle(nn.Module):
    """EAGLE-1 assembled from transformers' Llama modules: fc(cat[embed, hidden]) ->
    decoder layer whose input norm is Identity -> lm_head."""

    def __init__(self, config, bias):
        super().__init__()
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.fc = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=bias)
        self.layer = hf.LlamaDecoderLayer(config, 0)
        self.layer.input_layernorm = nn.Identity()
        self.rotary = hf.LlamaRotaryEmbedding(config)

    def forward(self, ids, positions, hidden):
        h = self.fc(torch.cat([self.embed(ids), hidden], -1))
        return self.layer(h, attention_mask=causal_mask(h.shape[1]),
                          position_embeddings=self.rotary(h, positions), position_ids=positions)

    def checkpoint(self):
        """The yuhuili layout: embed_tokens, fc, layers.0.* (no input_layernorm, no lm_head)."""
        sd = {"embed_tokens.weight": self.embed.weight, **{f"fc.{k}": v for k, v in self.fc.state_dict().items()}}
        sd.update({f"layers.0.{k}": v for k, v in self.layer.state_dict().items()})
        return {k: v.clone() for k, v in sd.items()}


@pytest.mark.parametrize("bias_key", [None, "bias", "eagle_fc_bias"])
def test_eagle_head_matches_reference(bias_key):
    config = tiny_config(num_hidden_layers=1, rope_parameters=LLAMA3_ROPE, **({bias_key: True} if bias_key else {}))
    ref = randomize(RefEagle(config, bias=bias_key is not None), seed=5)
    target = rm.load_reference(LlamaForCausalLM(tiny_config()), randomize(hf.LlamaForCausalLM(tiny_config()), seed=6),
                               "target")
    head = LlamaEagleHead(config)
    assert (head.fc.bias is not None) == (bias_key is not None)
    ckpt = ref.checkpoint()
    assert not any("input_layernorm" in k for k in ckpt)
    loaded = head.load_weights(ckpt, "pytorch_model.bin")
    assert "lm_head.weight" not in loaded
    assert head.share_from_target(target) == ["lm_head"]
    assert head.lm_head is target.lm_head

    ids, positions, g = inputs()
    hidden = torch.randn(B, T, H, generator=g)
    with torch.no_grad():
        expected = ref(ids, positions, hidden)
        # the decoder layer alone
        x = torch.randn(B, T, H, generator=g)
        ref_layer = ref.layer(x, attention_mask=causal_mask(T), position_embeddings=ref.rotary(x, positions))
        torch.testing.assert_close(head.layers[0](positions, x), ref_layer, atol=1e-5, rtol=1e-5)
        # the whole head
        h = head(ids, positions, hidden)
        torch.testing.assert_close(h, expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(head.compute_logits(h), target.compute_logits(expected), atol=1e-5, rtol=1e-5)


# -- EAGLE-3 head --------------------------------------------------------------------


class RefEagle3(rm.Eagle3Reference):
    """EAGLE-3 layer 0 from transformers' LlamaAttention (q/k/v widened to read 2H),
    LlamaMLP and LlamaRMSNorm, written from the published description."""

    def __init__(self, config, draft_vocab, norm_before_residual):
        super().__init__()
        H, eps = config.hidden_size, config.rms_norm_eps
        self.nbr = norm_before_residual
        self.embed = nn.Embedding(config.vocab_size, H)
        self.fc_norm = nn.ModuleList(hf.LlamaRMSNorm(H, eps) for _ in range(3))
        self.input_norm = hf.LlamaRMSNorm(3 * H, eps)
        self.fc = nn.Linear(3 * H, H, bias=False)
        self.build_layer(config, draft_vocab, hf.LlamaAttention, hf.LlamaMLP, hf.LlamaRMSNorm, hf.LlamaRotaryEmbedding)

    def combine(self, aux_cat):
        chunks = aux_cat.chunk(3, -1)
        return self.fc(self.input_norm(torch.cat([n(c) for n, c in zip(self.fc_norm, chunks)], -1)))

    def checkpoint(self, d2t):
        """Keys after the format reader's midlayer. -> layers.0. (speculators-style flags)."""
        sd = {"embed_tokens.weight": self.embed.weight, "fc.weight": self.fc.weight,
              "input_norm.weight": self.input_norm.weight, "norm.weight": self.norm.weight,
              "lm_head.weight": self.lm_head.weight, "d2t": d2t}
        sd.update({f"fc_norm.{i}.weight": n.weight for i, n in enumerate(self.fc_norm)})
        sd.update(self.layer_state("layers.0."))
        return {k: v.clone() for k, v in sd.items()}


@pytest.mark.parametrize("norm_before_residual", [False, True])
def test_eagle3_head_matches_reference(norm_before_residual):
    draft_vocab = 40
    config = tiny_config(num_hidden_layers=1, rope_parameters=LLAMA3_ROPE, draft_vocab_size=draft_vocab,
                         norm_before_residual=norm_before_residual, norm_before_fc=True, fc_norm=True)
    ref = randomize(RefEagle3(config, draft_vocab, norm_before_residual), seed=7)
    g = torch.Generator().manual_seed(8)
    draft_ids = torch.randperm(V, generator=g)[:draft_vocab].sort().values  # target ids in the draft vocab
    d2t = draft_ids - torch.arange(draft_vocab)
    head = LlamaEagle3Head(config)
    assert head.layers[0].self_attn.qkv_proj.weight.shape[1] == 2 * H
    loaded = head.load_weights(ref.checkpoint(d2t), "model.safetensors")
    assert "d2t" in loaded and "t2d" not in loaded
    membership = torch.zeros(V, dtype=torch.bool)
    membership[draft_ids] = True
    assert head.d2t.dtype == torch.int64 and torch.equal(head.t2d, membership)  # derived from d2t

    ids, positions, g = inputs(seed=9)
    aux_cat = torch.randn(B, T, 3 * H, generator=g)
    draft_logits, logits = rm.eagle3_step(head, ref, ids, positions, aux_cat, combine=ref.combine, tol=1e-5)
    assert logits.shape == (B, T, V)
    torch.testing.assert_close(logits[..., draft_ids], draft_logits, atol=1e-5, rtol=1e-5)
    assert torch.isneginf(logits[..., ~membership]).all()
    # the argmax in the target vocabulary is the mapped draft argmax
    assert torch.equal(logits.argmax(-1), draft_ids[draft_logits.argmax(-1)])


def test_eagle3_plain_yuhuili_layout_and_t2d_from_checkpoint():
    """No fc_norm / input_norm; t2d given; embed_tokens absent -> shared from the target."""
    config = tiny_config(num_hidden_layers=1, draft_vocab_size=V)
    ref = randomize(RefEagle3(config, V, False), seed=11)
    ckpt = ref.checkpoint(torch.zeros(V, dtype=torch.long))
    for k in ["embed_tokens.weight", "input_norm.weight", *(f"fc_norm.{i}.weight" for i in range(3))]:
        del ckpt[k]
    ckpt["t2d"] = torch.ones(V, dtype=torch.bool)
    head = LlamaEagle3Head(config)
    assert head.fc_norm is None and head.input_norm is None
    assert "t2d" in head.load_weights(ckpt, "pytorch_model.bin")
    target = rm.load_reference(LlamaForCausalLM(tiny_config(num_hidden_layers=1)),
                               randomize(hf.LlamaForCausalLM(tiny_config(num_hidden_layers=1)), seed=12), "t")
    assert head.share_from_target(target) == ["embed_tokens"]
    ref.embed.weight.data.copy_(target.embed_tokens.weight)
    ids, positions, g = inputs()
    aux_cat = torch.randn(B, T, 3 * H, generator=g)
    with torch.no_grad():
        hidden = head.combine_hidden_states(aux_cat)
        torch.testing.assert_close(hidden, ref.fc(aux_cat), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(head.compute_logits(head(ids, positions, hidden)),
                                   ref.lm_head(ref.norm(ref(ids, positions, hidden))), atol=1e-5, rtol=1e-5)


def test_share_from_target_refuses_mismatched_lm_head():
    head = LlamaEagle3Head(tiny_config(num_hidden_layers=1, draft_vocab_size=40))
    target = LlamaForCausalLM(tiny_config(num_hidden_layers=1))
    with pytest.raises(ValueError, match="lm_head"):
        head.share_from_target(target)


# -- registration ----------------------------------------------------------------------


def test_registers_llama_family():
    spec = rm.registered_spec(register_families, name="llama", architectures=("LlamaForCausalLM",),
                              model_types=("llama",), target_model=LlamaForCausalLM, weight_mapping=LLAMA_MAPPING,
                              heads={"eagle": LlamaEagleHead, "eagle3": LlamaEagle3Head})
    assert spec.config_class(hidden_size=64, num_attention_heads=4).hidden_size == 64
