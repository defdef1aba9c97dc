"""Synthetic checkpoints laid out exactly as each publisher ships them, at tiny sizes.

Every writer returns a Written(path, config, weights) record: ``config`` is the
config.json it wrote and ``weights`` the tensors under the names the publisher uses
(not the zoo's canonical names), so tests state the expected renaming themselves.

Layouts (docs/formats.md):
  yuhuili EAGLE-1   plain LlamaForCausalLM config, num_hidden_layers 1, optional
                    non-HF "bias" key; pytorch_model.bin (later: model.safetensors);
                    embed_tokens, fc (+bias in some), layers.0.* without input_layernorm
  yuhuili EAGLE-3   architectures LlamaForCausalLMEagle3 / Eagle3LlamaForCausalLM,
                    draft_vocab_size; midlayer.*, fc, norm, lm_head, d2t, t2d
  speculators       speculators_model_type eagle3 | peagle, transformer_layer_config,
                    speculators_config; model.safetensors with layers.0.*
  legacy vLLM<0.7   {"model_type": "eagle", "model": {...}, "eagle_fc_bias"};
                    model.safetensors = the EAGLE-1 tensors + lm_head.weight
Any of them can be sharded (``shards=n``) with the publisher's index file.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Optional

import torch
from safetensors.torch import save_file

# Tiny Llama dimensions shared by every synthetic checkpoint.
TINY = dict(
    hidden_size=32,
    intermediate_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    vocab_size=128,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    hidden_act="silu",
)
DRAFT_VOCAB = 48
# A tiny Llama shape for perf_steps' random targets (step-cost tables, fp8 heads): room for
# the tables' 512-token caches, and a tied lm_head as SmolLM2's.
STEP_COST_TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=512, max_position_embeddings=4096, rope_theta=10000.0,
                      tie_word_embeddings=True, rms_norm_eps=1e-5)


@dataclass
class Written:
    path: Path
    config: dict
    weights: dict[str, torch.Tensor]


def llama_config(num_hidden_layers: int = 1, **overrides) -> dict:
    """A config.json as transformers writes it for a Llama model."""
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "initializer_range": 0.02,
        "num_hidden_layers": num_hidden_layers,
        "rope_scaling": None,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "transformers_version": "4.28.1",
        "use_cache": True,
        **TINY,
    }
    cfg.update(overrides)
    return cfg


def _rand(gen: torch.Generator, *shape: int, dtype=torch.float32) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen) * 0.1).to(dtype)


def _norm(gen: torch.Generator, n: int, dtype=torch.float32) -> torch.Tensor:
    return (1.0 + torch.randn(n, generator=gen) * 0.1).to(dtype)


def decoder_layer(
    gen: torch.Generator, prefix: str, cfg: dict, attn_in: int, norms: tuple[str, ...], dtype=torch.float32
) -> dict[str, torch.Tensor]:
    H, I = cfg["hidden_size"], cfg["intermediate_size"]
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    w = {
        f"{prefix}self_attn.q_proj.weight": _rand(gen, nh * hd, attn_in, dtype=dtype),
        f"{prefix}self_attn.k_proj.weight": _rand(gen, nkv * hd, attn_in, dtype=dtype),
        f"{prefix}self_attn.v_proj.weight": _rand(gen, nkv * hd, attn_in, dtype=dtype),
        f"{prefix}self_attn.o_proj.weight": _rand(gen, H, nh * hd, dtype=dtype),
        f"{prefix}mlp.gate_proj.weight": _rand(gen, I, H, dtype=dtype),
        f"{prefix}mlp.up_proj.weight": _rand(gen, I, H, dtype=dtype),
        f"{prefix}mlp.down_proj.weight": _rand(gen, H, I, dtype=dtype),
    }
    for name in norms:
        w[f"{prefix}{name}.weight"] = _norm(gen, H, dtype=dtype)
    return w


def vocab_map(vocab: int, draft_vocab: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t, t2d) as EAGLE-3 training writes them: the draft vocab is a sorted subset
    of target ids; d2t[d] = target_id - d; t2d[j] marks target ids in the subset."""
    gen = torch.Generator().manual_seed(seed)
    targets = torch.randperm(vocab, generator=gen)[:draft_vocab].sort().values
    d2t = targets - torch.arange(draft_vocab)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[targets] = True
    return d2t.to(torch.int64), t2d


# -- weights ------------------------------------------------------------------
def eagle1_weights(cfg: dict, fc_bias: bool = True, seed: int = 0, inv_freq: bool = False, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    H, V = cfg["hidden_size"], cfg["vocab_size"]
    w = {"embed_tokens.weight": _rand(gen, V, H, dtype=dtype), "fc.weight": _rand(gen, H, 2 * H, dtype=dtype)}
    if fc_bias:
        w["fc.bias"] = _rand(gen, H, dtype=dtype)
    w.update(decoder_layer(gen, "layers.0.", cfg, H, ("post_attention_layernorm",), dtype=dtype))
    if inv_freq:  # transformers 4.28 saved the rotary buffer with the weights
        hd = cfg["head_dim"]
        w["layers.0.self_attn.rotary_emb.inv_freq"] = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
    return w


def eagle3_weights(
    cfg: dict,
    draft_vocab: int = DRAFT_VOCAB,
    target_hidden_size: Optional[int] = None,
    prefix: str = "midlayer.",
    embed: bool = False,
    extra_norms: tuple[str, ...] = (),
    seed: int = 0,
    dtype=torch.float32,
):
    """extra_norms: "input_norm" (norm_before_fc) and/or "fc_norm" (one per aux chunk)."""
    gen = torch.Generator().manual_seed(seed)
    H, V = cfg["hidden_size"], cfg["vocab_size"]
    Ht = target_hidden_size or H
    w = decoder_layer(
        gen, prefix, cfg, 2 * H, ("hidden_norm", "input_layernorm", "post_attention_layernorm"), dtype=dtype
    )
    w["fc.weight"] = _rand(gen, H, 3 * Ht, dtype=dtype)
    w["norm.weight"] = _norm(gen, H, dtype=dtype)
    w["lm_head.weight"] = _rand(gen, draft_vocab, H, dtype=dtype)
    w["d2t"], w["t2d"] = vocab_map(V, draft_vocab, seed)
    if embed:
        w["embed_tokens.weight"] = _rand(gen, V, H, dtype=dtype)
    if "input_norm" in extra_norms:
        w["input_norm.weight"] = _norm(gen, 3 * Ht, dtype=dtype)
    if "fc_norm" in extra_norms:
        for i in range(3):
            w[f"fc_norm.{i}.weight"] = _norm(gen, Ht, dtype=dtype)
    return w


# -- files --------------------------------------------------------------------
def save_weights(directory: Path, weights: dict, kind: str = "safetensors", shards: int = 1) -> list[Path]:
    """Write weights as publishers do: one file, or ``shards`` files plus the index
    (``model-00001-of-00002.safetensors`` + ``model.safetensors.index.json``, or the
    ``pytorch_model-*.bin`` equivalents)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    stem, ext = {"safetensors": ("model", "safetensors"), "bin": ("pytorch_model", "bin")}[kind]

    def write(path: Path, part: dict):
        part = {k: v.contiguous() for k, v in part.items()}
        if kind == "safetensors":
            save_file(part, str(path), metadata={"format": "pt"})
        else:
            torch.save(part, path)

    if shards <= 1:
        path = directory / f"{stem}.{ext}"
        write(path, weights)
        return [path]
    names = sorted(weights)
    groups = [names[i::shards] for i in range(shards)]
    weight_map, paths = {}, []
    for i, group in enumerate(groups, 1):
        fname = f"{stem}-{i:05d}-of-{shards:05d}.{ext}"
        write(directory / fname, {n: weights[n] for n in group})
        weight_map.update({n: fname for n in group})
        paths.append(directory / fname)
    total = sum(t.numel() * t.element_size() for t in weights.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (directory / f"{stem}.{ext}.index.json").write_text(json.dumps(index, indent=2))
    return paths


def write_config(directory: Path, config: dict) -> None:
    Path(directory).mkdir(parents=True, exist_ok=True)
    (Path(directory) / "config.json").write_text(json.dumps(config, indent=2))


# -- the publishers' layouts ---------------------------------------------------
def write_yuhuili_eagle(
    directory: Path,
    fc_bias: bool = True,
    kind: str = "bin",
    shards: int = 1,
    bias_key: Optional[bool] = None,
    inv_freq: bool = False,
    seed: int = 0,
    **config_overrides,
) -> Written:
    """yuhuili EAGLE-1 (``yuhuili/EAGLE-llama2-chat-7B`` style). ``bias_key`` writes the
    non-HF ``"bias"`` config key some of these heads carry."""
    cfg = llama_config(**config_overrides)
    if bias_key is not None:
        cfg["bias"] = bias_key
    w = eagle1_weights(cfg, fc_bias=fc_bias, seed=seed, inv_freq=inv_freq)
    write_config(directory, cfg)
    save_weights(directory, w, kind, shards)
    return Written(Path(directory), cfg, w)


def write_yuhuili_eagle3(
    directory: Path,
    architecture: str = "LlamaForCausalLMEagle3",
    kind: str = "bin",
    shards: int = 1,
    embed: bool = False,
    target_hidden_size: Optional[int] = None,
    draft_vocab: int = DRAFT_VOCAB,
    seed: int = 0,
    **config_overrides,
) -> Written:
    """yuhuili EAGLE-3 / SpecForge (``yuhuili/EAGLE3-LLaMA3.1-Instruct-8B`` style)."""
    cfg = llama_config(architectures=[architecture], draft_vocab_size=draft_vocab, **config_overrides)
    if target_hidden_size is not None:
        cfg["target_hidden_size"] = target_hidden_size
    w = eagle3_weights(cfg, draft_vocab, target_hidden_size, "midlayer.", embed, seed=seed)
    write_config(directory, cfg)
    save_weights(directory, w, kind, shards)
    return Written(Path(directory), cfg, w)


def write_speculators(
    directory: Path,
    model_type: str = "eagle3",
    shards: int = 1,
    embed: bool = False,
    target_hidden_size: Optional[int] = None,
    draft_vocab: int = DRAFT_VOCAB,
    speculative_tokens: int = 3,
    flags: Optional[dict] = None,
    verifier_architectures: tuple[str, ...] = ("LlamaForCausalLM",),
    layer_model_type: str = "llama",
    aux_layer_ids: Optional[list[int]] = None,
    seed: int = 0,
    mask_token_id: Optional[int] = None,
) -> Written:
    """speculators (``RedHatAI/*.speculator.eagle3`` style). ``flags`` are the norm
    flags written at top level (norm_before_residual, norm_before_fc, fc_norm,
    norm_output); absent ones take the speculators defaults. ``mask_token_id`` (P-EAGLE)
    also writes it at top level and the ``mask_hidden`` tensor [1, 1, 3 * H_target]
    that speculators' P-EAGLE model keeps for parallel-drafting slots."""
    flags = dict(flags or {})
    layer_cfg = llama_config(model_type=layer_model_type)
    layer_cfg.pop("architectures")  # transformer_layer_config is a bare layer config
    cfg = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": model_type,
        "speculators_version": "0.1.0",
        "draft_vocab_size": draft_vocab,
        "target_hidden_size": target_hidden_size,
        "transformer_layer_config": layer_cfg,
        "speculators_config": {
            "algorithm": model_type,
            "default_proposal_method": "greedy",
            "proposal_methods": [
                {
                    "proposal_type": "greedy",
                    "speculative_tokens": speculative_tokens,
                    "accept_tolerance": 0.0,
                    "verifier_accept_k": 1,
                }
            ],
            "verifier": {"name_or_path": "tiny/verifier", "architectures": list(verifier_architectures)},
        },
        "torch_dtype": "float32",
        "transformers_version": "4.55.0",
        **flags,
    }
    if aux_layer_ids is not None:
        cfg["eagle_aux_hidden_state_layer_ids"] = aux_layer_ids
    extra = tuple(n for n, f in (("input_norm", "norm_before_fc"), ("fc_norm", "fc_norm")) if flags.get(f))
    w = eagle3_weights(layer_cfg, draft_vocab, target_hidden_size, "layers.0.", embed, extra, seed=seed)
    if mask_token_id is not None:
        cfg["mask_token_id"] = mask_token_id
        Ht = target_hidden_size or layer_cfg["hidden_size"]
        w["mask_hidden"] = torch.randn(1, 1, 3 * Ht, generator=torch.Generator().manual_seed(seed + 7))
    write_config(directory, cfg)
    save_weights(directory, w, "safetensors", shards)
    return Written(Path(directory), cfg, w)


def write_legacy_vllm(
    directory: Path,
    fc_bias: bool = True,
    shards: int = 1,
    lm_head: Optional[torch.Tensor] = None,
    truncated_vocab_size: Optional[int] = None,
    seed: int = 0,
) -> Written:
    """What vLLM < 0.7's conversion recipe produced from a yuhuili EAGLE-1 head."""
    inner = llama_config()
    w = eagle1_weights(inner, fc_bias=fc_bias, seed=seed)
    if lm_head is None:
        lm_head = _rand(torch.Generator().manual_seed(seed + 1), inner["vocab_size"], inner["hidden_size"])
    w["lm_head.weight"] = lm_head
    cfg = {"model_type": "eagle", "model": inner}
    if fc_bias:
        cfg["eagle_fc_bias"] = True
    if truncated_vocab_size is not None:
        cfg["truncated_vocab_size"] = truncated_vocab_size
    write_config(directory, cfg)
    save_weights(directory, w, "safetensors", shards)
    return Written(Path(directory), cfg, w)


def write_target(directory: Path, num_hidden_layers: int = 2, max_shard_size=None, seed: int = 0, **overrides) -> Written:
    """A tiny Llama target saved by transformers itself (the reference HF layout);
    ``max_shard_size`` (e.g. "20KB") makes transformers shard it with its index."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = llama_config(num_hidden_layers=num_hidden_layers, **overrides)
    model = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in cfg.items() if k != "transformers_version"}))
    kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(directory, **kwargs)
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    config = json.loads((Path(directory) / "config.json").read_text())
    return Written(Path(directory), config, weights)


def write_peaked_target(directory: Path, num_hidden_layers: int, seed: int) -> Written:
    """write_target with a large init (initializer_range 0.5: peaked next-token
    distributions, a distillation target worth learning and drafts that get accepted),
    its config.json then saying 0.02 again: what heads built for it are initialised with."""
    written = write_target(directory, num_hidden_layers=num_hidden_layers, initializer_range=0.5, seed=seed)
    cfg = json.loads((Path(directory) / "config.json").read_text())
    cfg["initializer_range"] = 0.02
    (Path(directory) / "config.json").write_text(json.dumps(cfg))
    return Written(Path(directory), cfg, written.weights)


# Every publisher layout at its default settings, by format name (used to check that
# each format is detected, and by converter / engine tests that want "one of each").
WRITERS = {
    "yuhuili-eagle": write_yuhuili_eagle,
    "yuhuili-eagle3": write_yuhuili_eagle3,
    "speculators-eagle3": write_speculators,
    "speculators-peagle": partial(write_speculators, model_type="peagle"),
    "legacy-vllm": write_legacy_vllm,
}
