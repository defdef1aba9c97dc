"""Tiny Qwen2 checkpoints for this plugin's tests, and references nobody here wrote.

* Targets are written by transformers itself (Qwen2ForCausalLM(config).save_pretrained).
* Heads are written in the layout yuhuili/EAGLE-Qwen2-7B-Instruct is published in
  (config.json at hub commit 8095867, pytorch_model.bin in bfloat16), at tiny sizes:
  the same keys, the same non-HF ``qkv_bias`` key, a multi-head-attention head
  (num_key_value_heads == num_attention_heads) over a grouped-query target.
* References: transformers' Qwen2 modules and its forward / KV cache (greedy).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch
from torch import nn

# Tiny dimensions: 4 query heads of 8, a grouped-query target (2 kv heads).
TINY = dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=128, max_position_embeddings=256, rms_norm_eps=1e-6, rope_theta=10000.0,
            hidden_act="silu", bos_token_id=1, eos_token_id=2)
HEAD_DIM = TINY["hidden_size"] // TINY["num_attention_heads"]


@dataclass
class Written:
    path: Path
    config: dict
    weights: dict  # tensors under the names the publisher uses


def hf_config(**overrides):
    """transformers' Qwen2Config at tiny sizes (eager attention: the plain reference)."""
    from transformers import Qwen2Config

    fields = {**TINY, "num_hidden_layers": 4, "tie_word_embeddings": False, **overrides}
    config = Qwen2Config(**fields)
    config._attn_implementation = "eager"
    return config


@torch.no_grad()
def randomize(module: nn.Module, seed: int, scale: float = 0.3) -> nn.Module:
    """Random weights everywhere: matrices N(0, scale), biases N(0, 0.1), norm scales
    1 + N(0, 0.1) (transformers initialises biases to 0 and norms to 1, which would hide
    a missing bias or norm)."""
    gen = torch.Generator().manual_seed(seed)
    for name, p in module.named_parameters():
        noise = torch.randn(p.shape, generator=gen)
        if p.dim() >= 2:
            p.copy_(noise * scale)
        elif name.endswith("bias"):
            p.copy_(noise * 0.1)
        else:
            p.copy_(1.0 + noise * 0.1)
    return module.eval()


def write_target(directory, seed: int = 0, edit: Optional[Callable] = None, **overrides) -> Path:
    """A tiny random Qwen2 target saved by transformers (model.safetensors + config.json)."""
    from transformers import Qwen2ForCausalLM

    model = randomize(Qwen2ForCausalLM(hf_config(**overrides)), seed)
    if edit is not None:
        with torch.no_grad():
            edit(model)
    model.save_pretrained(directory)
    return Path(directory)


def bigram_edit(scale: float = 0.001) -> Callable:
    """edit= for write_target: attention and MLP outputs scaled down and the final norm
    weight set to 1, so the next token is (almost) argmax lm_head(embed(current token)):
    with this scale it is for about 96% of the tokens, whatever the context."""
    def edit(model):
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(scale)
            layer.mlp.down_proj.weight.mul_(scale)
        model.model.norm.weight.fill_(1.0)
    return edit


# -- the published EAGLE-Qwen2 layout ---------------------------------------------------
def yuhuili_qwen2_config(**overrides) -> dict:
    """yuhuili/EAGLE-Qwen2-7B-Instruct's config.json, key for key, at tiny sizes.

    Published values kept where size does not matter (max_position_embeddings 2048,
    sliding_window 131072 with use_sliding_window false, rope_theta 1e6, bf16 dtype,
    transformers 4.41.2); num_key_value_heads equals num_attention_heads as there (28/28).
    """
    cfg = {
        "architectures": ["Qwen2ForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": TINY["bos_token_id"],
        "eos_token_id": TINY["eos_token_id"],
        "hidden_act": "silu",
        "hidden_size": TINY["hidden_size"],
        "initializer_range": 0.02,
        "intermediate_size": TINY["intermediate_size"],
        "max_position_embeddings": 2048,
        "max_window_layers": 28,
        "model_type": "qwen2",
        "num_attention_heads": TINY["num_attention_heads"],
        "num_hidden_layers": 1,
        "num_key_value_heads": TINY["num_attention_heads"],
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "sliding_window": 131072,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.41.2",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": TINY["vocab_size"],
        "qkv_bias": True,
    }
    cfg.update(overrides)
    return cfg


def yuhuili_qwen2_weights(cfg: dict, seed: int = 0, dtype=torch.bfloat16) -> dict:
    """The tensors of pytorch_model.bin under the published names: embed_tokens, fc
    (with bias), layers.0.self_attn.{q,k,v}_proj.{weight,bias}, o_proj.weight,
    layers.0.mlp.*, layers.0.post_attention_layernorm; no input_layernorm, norm, lm_head."""
    gen = torch.Generator().manual_seed(seed)
    H, I, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = H // nh

    def rand(*shape, scale=0.1):
        return (torch.randn(*shape, generator=gen) * scale).to(dtype)

    w = {"embed_tokens.weight": rand(V, H, scale=0.3)}
    p = "layers.0."
    w[p + "self_attn.q_proj.weight"], w[p + "self_attn.q_proj.bias"] = rand(nh * d, H), rand(nh * d)
    w[p + "self_attn.k_proj.weight"], w[p + "self_attn.k_proj.bias"] = rand(nkv * d, H), rand(nkv * d)
    w[p + "self_attn.v_proj.weight"], w[p + "self_attn.v_proj.bias"] = rand(nkv * d, H), rand(nkv * d)
    w[p + "self_attn.o_proj.weight"] = rand(H, nh * d)
    w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"] = rand(I, H), rand(I, H)
    w[p + "mlp.down_proj.weight"] = rand(H, I)
    w[p + "post_attention_layernorm.weight"] = (1.0 + torch.randn(H, generator=gen) * 0.1).to(dtype)
    w["fc.weight"], w["fc.bias"] = rand(H, 2 * H), rand(H)
    return w


def write_yuhuili_qwen2_head(directory, seed: int = 0, weights: Optional[dict] = None,
                             **config_overrides) -> Written:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    cfg = yuhuili_qwen2_config(**config_overrides)
    w = weights if weights is not None else yuhuili_qwen2_weights(cfg, seed)
    (directory / "config.json").write_text(json.dumps(cfg, indent=2))
    torch.save({k: v.contiguous() for k, v in w.items()}, directory / "pytorch_model.bin")
    return Written(directory, cfg, w)


def write_bigram_head(directory, target_dir, seed: int = 3, every: int = 7) -> Path:
    """A published-layout head that drafts a bigram target's next token from the token
    alone: fc = [I | 0] with zero bias, attention and MLP outputs zero, embeddings the
    target's, so its logits are lm_head(embed(x)). Every ``every``-th embedding row is
    noise, so some drafts are wrong: acceptance high but not total."""
    from safetensors.torch import load_file

    target = load_file(str(Path(target_dir) / "model.safetensors"))
    cfg = yuhuili_qwen2_config(rope_theta=TINY["rope_theta"])
    H = cfg["hidden_size"]
    w = {k: v.float() for k, v in yuhuili_qwen2_weights(cfg, seed).items()}
    w["fc.weight"] = torch.cat([torch.eye(H), torch.zeros(H, H)], 1)
    w["fc.bias"] = torch.zeros(H)
    w["layers.0.self_attn.o_proj.weight"].zero_()
    w["layers.0.mlp.down_proj.weight"].zero_()
    embed = target["model.embed_tokens.weight"].clone()
    gen = torch.Generator().manual_seed(seed)
    embed[::every] = torch.randn(embed[::every].shape, generator=gen) * 0.3
    w["embed_tokens.weight"] = embed
    return write_yuhuili_qwen2_head(directory, weights=w, rope_theta=TINY["rope_theta"]).path


# -- references from transformers' own Qwen2 modules -------------------------------------
def causal_mask(t: int) -> torch.Tensor:
    """Additive [1,1,T,T] mask for transformers' eager attention."""
    return torch.full((t, t), float("-inf")).triu(1)[None, None]


class RefEagleQwen2(nn.Module):
    """The EAGLE-1 head assembled from transformers' Qwen2 modules:
    fc(cat[embed, hidden]) -> Qwen2DecoderLayer with an Identity input norm.

    ``load_published`` loads the publisher's tensors by their published names with
    strict=True, so a key the layout has and this module lacks (or the reverse) fails."""

    def __init__(self, config):
        from transformers.models.qwen2 import modeling_qwen2 as hf

        super().__init__()
        H = config.hidden_size
        self.embed_tokens = nn.Embedding(config.vocab_size, H)
        self.fc = nn.Linear(2 * H, H, bias=True)
        self.layers = nn.ModuleList([hf.Qwen2DecoderLayer(config, 0)])
        self.layers[0].input_layernorm = nn.Identity()
        self.rotary = hf.Qwen2RotaryEmbedding(config)

    def load_published(self, weights: dict) -> "RefEagleQwen2":
        self.load_state_dict({k: v.float() for k, v in weights.items()}, strict=True)
        return self.eval()

    def forward(self, ids, positions, hidden):
        h = self.fc(torch.cat([self.embed_tokens(ids), hidden], -1))
        return self.layers[0](h, attention_mask=causal_mask(h.shape[1]),
                              position_embeddings=self.rotary(h, positions), position_ids=positions)


def ref_config_from_published(cfg: dict):
    """transformers' Qwen2Config of a published head config (the non-HF key dropped)."""
    fields = {k: v for k, v in cfg.items() if k not in ("qkv_bias", "transformers_version", "architectures")}
    return hf_config(**fields)


# -- transformers' greedy decoding ------------------------------------------------------
def load_hf(directory):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32,
                                                attn_implementation="eager").eval()


@torch.no_grad()
def hf_greedy(directory, prompts: list[list[int]], max_tokens: list[int]) -> list[list[int]]:
    """Greedy continuations (EOS ignored) by transformers' forward and its own KV cache."""
    model = load_hf(directory)
    outs = []
    for prompt, n in zip(prompts, max_tokens):
        out = model(torch.tensor([prompt]), use_cache=True)
        tokens = [int(out.logits[0, -1].argmax())]
        while len(tokens) < n:
            out = model(torch.tensor([tokens[-1:]]), past_key_values=out.past_key_values, use_cache=True)
            tokens.append(int(out.logits[0, -1].argmax()))
        outs.append(tokens)
    return outs


def random_prompts(lengths, vocab: int = TINY["vocab_size"], seed: int = 0, low: int = 3) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(low, vocab, (n,), generator=gen).tolist() for n in lengths]
