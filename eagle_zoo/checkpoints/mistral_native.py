"""Mistral-native checkpoints (params.json + consolidated*.safetensors): format ``mistral-eagle``.

Facts (vLLM's transformers_utils/configs/mistral.py, adapt_config_dict):
- params.json keys -> HF keys: dim -> hidden_size, norm_eps -> rms_norm_eps,
  n_kv_heads -> num_key_value_heads, n_layers -> num_hidden_layers, n_heads ->
  num_attention_heads, hidden_dim -> intermediate_size; tied_embeddings ->
  tie_word_embeddings (default false); max_position_embeddings default 128000.
- MLA (qk_nope_head_dim set) without a ``moe`` section: one expert, one shared expert,
  first_k_dense_replace = n_layers, i.e. every layer dense. A ``moe`` section with
  shared experts makes the model Mistral Large 3: model_type deepseek_v3,
  architectures [MistralLarge3ForCausalLM]; moe keys: route_every_n -> moe_layer_freq,
  first_k_dense_replace, num_experts_per_tok, num_experts -> n_routed_experts,
  expert_hidden_dim -> moe_intermediate_size, routed_scale -> routed_scaling_factor,
  num_shared_experts -> n_shared_experts, num_expert_groups -> n_group,
  num_expert_groups_per_tok -> topk_group; softmax scoring, norm_topk_prob true, no
  correction bias (vLLM then picks by group maximum: group_limited_greedy here).
- ``yarn`` {factor, original_max_position_embeddings, beta -> beta_fast, alpha ->
  beta_slow, apply_scale} -> a yarn rope with mscale_all_dim 1 (apply_scale false:
  attention_factor 1). mscale is set to 1 here as DeepSeek's rope assumes it, so
  transformers' rope does not derive another attention factor.
- ``llama_4_scaling`` {original_max_position_embeddings, beta} stays a top-level key
  (the MLA attention scales queries with it).
- fp8 weights (``quantization.qformat_weight == "fp8_e4m3"``) carry ``qscale_weight``
  (real = fp8 * scale) and ``qscale_act``; they are dequantized here on read (the zoo has
  no fp8 kernels), in bfloat16.

The head is EAGLE-1 (vLLM renames MistralLarge3ForCausalLM to
EagleMistralLarge3ForCausalLM). Tensor names stay native: the family's table maps them.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch

from ..hookspecs import hookimpl
from ..specs import CheckpointFormat
from .formats import CheckpointFormatError, RawCheckpoint, _eagle_config, read_json_object
from .sizes import check_config_sizes
from .tensors import CorruptCheckpointError, inside_checkpoint, read_file, weights_entry

PARAMS_FILE = "params.json"
WEIGHTS_GLOB = "consolidated*.safetensors"
GENERAL_KEYS = {"dim": "hidden_size", "norm_eps": "rms_norm_eps", "n_kv_heads": "num_key_value_heads",
                "n_layers": "num_hidden_layers", "n_heads": "num_attention_heads",
                "hidden_dim": "intermediate_size"}
MOE_KEYS = {"route_every_n": "moe_layer_freq", "first_k_dense_replace": "first_k_dense_replace",
            "num_experts_per_tok": "num_experts_per_tok", "num_experts": "n_routed_experts",
            "expert_hidden_dim": "moe_intermediate_size", "routed_scale": "routed_scaling_factor",
            "num_shared_experts": "n_shared_experts", "num_expert_groups": "n_group",
            "num_expert_groups_per_tok": "topk_group"}
YARN_KEYS = {"factor": ("factor", float), "original_max_position_embeddings": ("original_max_position_embeddings", int),
             "beta": ("beta_fast", float), "alpha": ("beta_slow", float)}
# Keys of the native config that describe other parts of the model (not the text head).
IGNORED_KEYS = ("vision_encoder", "multimodal", "quantization", "lora")


def _weight_files(directory: Path) -> list[Path]:
    """The consolidated*.safetensors files, each checked to be really inside ``directory``."""
    return [inside_checkpoint(directory, p.name, p)
            for p in sorted(Path(directory).glob(WEIGHTS_GLOB)) if p.is_file()]


def detect_mistral_eagle(directory: Path, cfg: dict) -> bool:
    # An HF-layout copy in the same directory (config.json + model.safetensors) is left to
    # the HF formats.
    return ((Path(directory) / PARAMS_FILE).is_file() and not cfg and weights_entry(directory) is None
            and bool(_weight_files(directory)))


def load_params(directory: Path) -> dict:
    return read_json_object(Path(directory) / PARAMS_FILE)


def hf_config_dict(params: dict, path: Any) -> dict:
    """params.json -> a flat HF-style deepseek_v3 config dict (MLA configs only)."""
    p = {k: v for k, v in params.items() if k not in IGNORED_KEYS}
    if not p.get("qk_nope_head_dim"):
        raise CheckpointFormatError(
            f"{path}: mistral-eagle reads MLA (Mistral Large 3) heads; this params.json has no "
            f"qk_nope_head_dim. Mistral-native Llama-layer heads need a config.json (MistralForCausalLM)"
        )
    out = {GENERAL_KEYS.get(k, k): v for k, v in p.items() if k not in ("moe", "yarn", "tied_embeddings",
                                                                        "activation", "max_seq_len")}
    out["hidden_act"] = p.get("activation", "silu")
    out["tie_word_embeddings"] = bool(p.get("tied_embeddings", False))
    out.setdefault("max_position_embeddings", 128_000)
    moe = p.get("moe") or {"num_experts": 1, "first_k_dense_replace": out.get("num_hidden_layers"),
                           "route_every_n": 1, "num_shared_experts": 1,
                           "expert_hidden_dim": out.get("intermediate_size"), "num_experts_per_tok": 1,
                           "routed_scale": 1.0, "num_expert_groups": 1, "num_expert_groups_per_tok": 1}
    out.update({MOE_KEYS[k]: v for k, v in moe.items() if k in MOE_KEYS})
    grouped = int(out.get("n_group") or 1) > 1
    out.update(scoring_func="softmax", topk_method="group_limited_greedy" if grouped else "greedy",
               norm_topk_prob=True, model_type="deepseek_v3", architectures=["MistralLarge3ForCausalLM"])
    yarn = dict(p.get("yarn") or {})
    if yarn:
        rope = {"rope_type": "yarn", "mscale_all_dim": 1.0, "mscale": 1.0,
                "rope_theta": float(out.pop("rope_theta", 10000.0))}
        rope.update({new: cast(yarn.pop(old)) for old, (new, cast) in YARN_KEYS.items() if old in yarn})
        if not yarn.pop("apply_scale", True):
            rope["attention_factor"] = 1.0
        if yarn:
            raise CheckpointFormatError(f"{path}: unknown keys in yarn: {sorted(yarn)}")
        out["rope_parameters"] = rope
    scaling = p.get("llama_4_scaling")
    if scaling is not None and not {"original_max_position_embeddings", "beta"} <= set(scaling):
        raise CheckpointFormatError(
            f"{path}: llama_4_scaling needs the keys original_max_position_embeddings and beta, has {sorted(scaling)}")
    return out


def _dequantize(weights: dict[str, torch.Tensor], path: Any) -> dict[str, torch.Tensor]:
    out = {}
    for name, t in weights.items():
        if name.endswith((".qscale_weight", ".qscale_act")):
            continue
        if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            scale_key = name[: -len("weight")] + "qscale_weight"
            if not name.endswith(".weight") or scale_key not in weights:
                raise CheckpointFormatError(f"{path}: fp8 tensor {name!r} has no {scale_key!r} to dequantize it with")
            t = (t.float() * weights[scale_key].float()).to(torch.bfloat16)
        out[name] = t
    return out


def read_mistral_eagle(directory: Path) -> RawCheckpoint:
    directory = Path(directory)
    path = directory / PARAMS_FILE
    files = _weight_files(directory)
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        part = read_file(f)
        clash = set(part) & set(weights)
        if clash:
            raise CorruptCheckpointError(f"{f}: tensor {sorted(clash)[0]!r} also appears in another consolidated file")
        weights.update(part)
    weights = _dequantize(weights, directory)
    hf = hf_config_dict(load_params(directory), path)
    check_config_sizes(hf, path)
    config = _eagle_config(hf, "eagle", path, weights)
    return RawCheckpoint(config, weights, files, "mistral-eagle")


MISTRAL_EAGLE = CheckpointFormat(
    "mistral-eagle",
    f"Mistral-native EAGLE head (Mistral Large 3): {PARAMS_FILE} with MLA keys and no config.json; "
    f"{WEIGHTS_GLOB} with native names (eagle_linear, layers.N.attention.wq_a, ...)",
    detect_mistral_eagle,
    read_mistral_eagle,
)


@hookimpl
def register_formats(register: Callable[[CheckpointFormat], None]) -> None:
    register(MISTRAL_EAGLE)
