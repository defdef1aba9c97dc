"""Published checkpoint layouts: one detector and one reader per format.

A detector decides from file names and config.json keys alone (no trial loading,
no try/except fall-through). The formats are written so that at most one claims a
directory; detect_format() still checks that exactly one registered format does, so a
plugin's format cannot silently shadow a built-in one.

A reader returns a RawCheckpoint whose tensors are in the zoo's canonical HF-style
naming (CANONICAL_RENAMES), which the family's WeightMapping then loads.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from ..config.eagle_config import is_eagle3_architecture
from ..hookspecs import hookimpl
from ..specs import CheckpointFormat
from .sizes import check_config_sizes, check_sizes_fit_weights
from .tensors import CheckpointError, CorruptCheckpointError, read_tensors, weights_entry

# Publisher tensor-name prefixes -> the canonical names (applied to the start of a key).
CANONICAL_RENAMES: dict[str, tuple[tuple[str, str], ...]] = {
    "yuhuili-eagle": (),
    "yuhuili-eagle3": (("midlayer.", "layers.0."),),
    "speculators-eagle3": (),
    "speculators-peagle": (),
    "legacy-vllm": (),
}

# speculators writes these norm flags at the top of config.json; its defaults differ
# from the yuhuili code (norm_before_residual is on unless the config says otherwise).
SPECULATORS_FLAG_DEFAULTS = {"norm_before_residual": True}
SPECULATORS_FLAGS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")
# speculators_model_type -> the keywords it adds to the EagleConfig.
SPECULATORS_TYPES: dict[str, dict[str, Any]] = {
    "eagle3": {"parallel_drafting": False},
    "peagle": {"parallel_drafting": True},
}
# Top-level speculators keys that describe the head (copied next to the layer config).
SPECULATORS_HEAD_KEYS = ("draft_vocab_size", "target_hidden_size", "eagle_aux_hidden_state_layer_ids",
                         # P-EAGLE: the token id fed at parallel-drafting slots (speculators
                         # writes mask_token_id; vLLM also reads pard_token / ptd_token_id)
                         "mask_token_id", "pard_token", "ptd_token_id")


class CheckpointFormatError(CheckpointError):
    """No format, or more than one, claims a directory; or a config is malformed."""


@dataclass
class RawCheckpoint:
    config: Any  # EagleConfig
    weights: dict[str, torch.Tensor]
    files: list[Path] = field(default_factory=list)
    format: str = ""


# -- config.json ---------------------------------------------------------------
def read_json_object(path: Path) -> dict:
    """A checkpoint's JSON file that must hold an object (config.json, params.json)."""
    try:
        value = json.loads(Path(path).read_text())
    except ValueError as exc:
        raise CorruptCheckpointError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise CorruptCheckpointError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


def load_config_json(directory: Path) -> dict:
    """config.json as a dict, its size keys checked (types and bounds: sizes.py)."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise CheckpointFormatError(f"{directory}: no config.json; an EAGLE head directory needs one")
    config = read_json_object(path)
    check_config_sizes(config, path)
    return config


def _is_legacy(cfg: dict) -> bool:
    return cfg.get("model_type") == "eagle" and isinstance(cfg.get("model"), dict)


def _is_flat(cfg: dict) -> bool:
    return "speculators_model_type" not in cfg and not _is_legacy(cfg)


def _is_eagle3(cfg: dict) -> bool:
    return "draft_vocab_size" in cfg or any(is_eagle3_architecture(a) for a in cfg.get("architectures") or [])


# -- detectors -------------------------------------------------------------------
def detect_yuhuili_eagle(directory: Path, cfg: dict) -> bool:
    return (
        _is_flat(cfg) and not _is_eagle3(cfg) and cfg.get("num_hidden_layers") == 1
        and weights_entry(directory) is not None
    )


def detect_yuhuili_eagle3(directory: Path, cfg: dict) -> bool:
    return _is_flat(cfg) and _is_eagle3(cfg) and weights_entry(directory) is not None


def _detect_speculators(model_type: str) -> Callable[[Path, dict], bool]:
    def detect(directory: Path, cfg: dict) -> bool:
        return cfg.get("speculators_model_type") == model_type and weights_entry(directory) is not None

    detect.__name__ = f"detect_speculators_{model_type}"
    return detect


def detect_legacy_vllm(directory: Path, cfg: dict) -> bool:
    return _is_legacy(cfg) and weights_entry(directory) is not None


# -- shared reading steps --------------------------------------------------------------
def canonical_names(weights: dict[str, torch.Tensor], renames: tuple[tuple[str, str], ...]) -> dict:
    out = {}
    for name, tensor in weights.items():
        for old, new in renames:
            if name.startswith(old):
                name = new + name[len(old):]
                break
        out[name] = tensor
    return out


def validate_vocab_map(weights: dict[str, torch.Tensor], config: dict, source: Any) -> None:
    """Check EAGLE-3's d2t / t2d: target_id = d + d2t[d]; t2d[j] is True exactly for
    those target ids; sizes agree with draft_vocab_size / vocab_size."""
    d2t, t2d = weights.get("d2t"), weights.get("t2d")
    if d2t is None:
        raise CheckpointFormatError(
            f"{source}: an EAGLE-3 checkpoint needs the d2t tensor (draft id -> target id offset); "
            f"it has none"
        )
    if d2t.dim() != 1 or d2t.numel() == 0 or d2t.dtype.is_floating_point or d2t.dtype == torch.bool:
        raise CheckpointFormatError(f"{source}: d2t must be a non-empty 1-D integer tensor, got {d2t.dtype} {tuple(d2t.shape)}")
    draft_vocab = config.get("draft_vocab_size")
    if draft_vocab is not None and d2t.numel() != draft_vocab:
        raise CheckpointFormatError(
            f"{source}: d2t has {d2t.numel()} entries but config.json draft_vocab_size is {draft_vocab}"
        )
    targets = torch.arange(d2t.numel()) + d2t.long()
    vocab = config.get("vocab_size") or (t2d.numel() if t2d is not None else None)
    if vocab is not None and (targets.min() < 0 or targets.max() >= vocab):
        bad = int(((targets < 0) | (targets >= vocab)).nonzero()[0])
        raise CheckpointFormatError(
            f"{source}: d2t maps draft id {bad} to target id {int(targets[bad])}, outside the "
            f"target vocabulary of {vocab}"
        )
    if targets.unique().numel() != targets.numel():
        raise CheckpointFormatError(f"{source}: d2t maps two draft ids to the same target id")
    if t2d is None:
        return
    if t2d.dim() != 1 or t2d.dtype.is_floating_point:
        raise CheckpointFormatError(f"{source}: t2d must be a 1-D bool tensor, got {t2d.dtype} {tuple(t2d.shape)}")
    if vocab is not None and t2d.numel() != vocab:
        raise CheckpointFormatError(
            f"{source}: t2d has {t2d.numel()} entries but config.json vocab_size is {vocab}"
        )
    marked = t2d.bool()
    if int(marked.sum()) != d2t.numel():
        raise CheckpointFormatError(
            f"{source}: t2d marks {int(marked.sum())} target tokens but d2t has {d2t.numel()} draft "
            f"tokens; the two vocabulary maps do not belong together"
        )
    expected = torch.zeros_like(marked)
    expected[targets] = True
    wrong = (expected != marked).nonzero().flatten()
    if wrong.numel():
        j = int(wrong[0])
        raise CheckpointFormatError(
            f"{source}: t2d[{j}] is {bool(marked[j])} but d2t {'maps' if bool(expected[j]) else 'does not map'} "
            f"a draft id to target id {j} ({wrong.numel()} mismatches); t2d[j] must be true exactly "
            f"when j == d + d2t[d] for some draft id d"
        )


# Sizes every head's config.json states (flat, or under the legacy form's "model").
REQUIRED_SIZES = ("hidden_size", "num_attention_heads", "intermediate_size", "vocab_size")


def _eagle_config(config: dict, method: str, source: Path, weights: dict, **keywords):
    """EagleConfig of a config.json (flat or legacy nested); ``keywords`` become
    top-level keys (they override the inner config's). The sizes must fit ``weights``
    (the checkpoint's tensors) before a head is built from them."""
    from ..config.eagle_config import EagleConfig

    check_sizes_fit_weights(config, sum(t.numel() for t in weights.values()), source)
    layer = config["model"] if isinstance(config.get("model"), dict) else config  # legacy nested or flat
    missing = [key for key in REQUIRED_SIZES if layer.get(key) is None]
    if missing:
        # A config class would fill them in with its defaults (Llama-7B's sizes), and the
        # error would come later as some weight's shape mismatch.
        raise CheckpointFormatError(
            f"{source}: no {', '.join(map(repr, missing))}: a head's config.json gives the sizes of its layer; "
            f"add {'it' if len(missing) == 1 else 'them'} (the draft's own values)")

    try:
        config = EagleConfig.from_dict(config, method=method)
    except ValueError as exc:
        raise CheckpointFormatError(f"{source}: {exc}") from None
    for key, value in keywords.items():
        setattr(config, key, value)
    return config


def _read_weights(directory: Path, fmt: str) -> tuple[dict, list[Path]]:
    weights, files = read_tensors(directory)
    return canonical_names(weights, CANONICAL_RENAMES[fmt]), files


# -- readers ------------------------------------------------------------------------
def read_yuhuili_eagle(directory: Path) -> RawCheckpoint:
    directory = Path(directory)
    cfg = load_config_json(directory)
    weights, files = _read_weights(directory, "yuhuili-eagle")
    # Some of these configs carry a non-HF "bias" key; what the file holds decides
    # whether fc has a bias, and the key must not leak into the HF config.
    cfg.pop("bias", None)
    config = _eagle_config(cfg, "eagle", directory / "config.json", weights,
                           eagle_fc_bias="fc.bias" in weights)
    return RawCheckpoint(config, weights, files, "yuhuili-eagle")


def read_yuhuili_eagle3(directory: Path) -> RawCheckpoint:
    directory = Path(directory)
    cfg = load_config_json(directory)
    weights, files = _read_weights(directory, "yuhuili-eagle3")
    validate_vocab_map(weights, cfg, files[0] if len(files) == 1 else directory)
    return RawCheckpoint(_eagle_config(cfg, "eagle3", directory / "config.json", weights), weights, files, "yuhuili-eagle3")


def _speculators_architecture(layer: dict, path: Path) -> str:
    archs = layer.get("architectures") or []
    if archs:
        return archs[0]
    from ..plugins import get_registry

    model_types = get_registry().model_types
    model_type = layer.get("model_type")
    if model_type not in model_types:
        raise CheckpointFormatError(
            f"{path}: transformer_layer_config.model_type {model_type!r} is not served by any "
            f"registered family; supported: {', '.join(sorted(model_types))}"
        )
    return model_types[model_type].architectures[0]


def read_speculators(directory: Path) -> RawCheckpoint:
    directory = Path(directory)
    path = directory / "config.json"
    cfg = load_config_json(directory)
    layer = cfg.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise CheckpointFormatError(f"{path}: a speculators config needs a transformer_layer_config object")
    flat = dict(layer)
    flat["architectures"] = [_speculators_architecture(layer, path)]
    flat.update({k: cfg[k] for k in SPECULATORS_HEAD_KEYS if cfg.get(k) is not None})

    spec = cfg.get("speculators_config") or {}
    methods = spec.get("proposal_methods") or [{}]
    verifier = spec.get("verifier") or {}
    keywords = {
        **SPECULATORS_FLAG_DEFAULTS,
        **{k: cfg[k] for k in SPECULATORS_FLAGS if k in cfg},
        **SPECULATORS_TYPES[cfg["speculators_model_type"]],
        "speculators_model_type": cfg["speculators_model_type"],
        "num_speculative_tokens": methods[0].get("speculative_tokens"),
        "verifier_name_or_path": verifier.get("name_or_path"),
        "verifier_architectures": list(verifier.get("architectures") or []),
    }
    fmt = f"speculators-{cfg['speculators_model_type']}"
    weights, files = _read_weights(directory, fmt)
    validate_vocab_map(weights, flat, files[0] if len(files) == 1 else directory)
    if "mask_hidden" in weights:  # P-EAGLE's feature for parallel slots, stored [1, 1, 3*H]
        weights["mask_hidden"] = weights["mask_hidden"].reshape(-1)
    return RawCheckpoint(_eagle_config(flat, "eagle3", path, weights, **keywords), weights, files, fmt)


def read_legacy_vllm(directory: Path) -> RawCheckpoint:
    directory = Path(directory)
    cfg = load_config_json(directory)
    weights, files = _read_weights(directory, "legacy-vllm")
    flag, has_bias = bool(cfg.get("eagle_fc_bias", False)), "fc.bias" in weights
    if flag != has_bias:
        raise CheckpointFormatError(
            f"{directory / 'config.json'}: eagle_fc_bias is {flag} but the weights "
            f"{'hold' if has_bias else 'do not hold'} fc.bias; set \"eagle_fc_bias\": {str(has_bias).lower()}"
        )
    return RawCheckpoint(_eagle_config(cfg, "eagle", directory / "config.json", weights), weights, files,
                         "legacy-vllm")


# -- the formats as data ------------------------------------------------------------
WEIGHTS_TEXT = "model.safetensors / pytorch_model.bin or a sharded *.index.json"
FORMATS = (
    CheckpointFormat(
        "yuhuili-eagle",
        "yuhuili EAGLE-1: a flat HF config with num_hidden_layers 1, no draft_vocab_size, "
        f"no Eagle3 architecture, no speculators_model_type; {WEIGHTS_TEXT}",
        detect_yuhuili_eagle,
        read_yuhuili_eagle,
    ),
    CheckpointFormat(
        "yuhuili-eagle3",
        "yuhuili / SpecForge EAGLE-3: a flat HF config with draft_vocab_size or an architecture "
        f"like LlamaForCausalLMEagle3 / Eagle3LlamaForCausalLM; {WEIGHTS_TEXT} with midlayer.* keys",
        detect_yuhuili_eagle3,
        read_yuhuili_eagle3,
    ),
    *(
        CheckpointFormat(
            f"speculators-{model_type}",
            f"speculators {model_type}: config.json with speculators_model_type {model_type!r} "
            f"and transformer_layer_config; {WEIGHTS_TEXT} with layers.0.* keys",
            _detect_speculators(model_type),
            read_speculators,
        )
        for model_type in SPECULATORS_TYPES
    ),
    CheckpointFormat(
        "legacy-vllm",
        'legacy vLLM < 0.7: config.json {"model_type": "eagle", "model": {...}}; '
        f"{WEIGHTS_TEXT} including lm_head.weight",
        detect_legacy_vllm,
        read_legacy_vllm,
    ),
)


@hookimpl
def register_formats(register: Callable[[CheckpointFormat], None]) -> None:
    for fmt in FORMATS:
        register(fmt)


# -- choosing the format -------------------------------------------------------------
def _describe(directory: Path, cfg: dict) -> str:
    keys = ("architectures", "model_type", "num_hidden_layers", "draft_vocab_size", "speculators_model_type")
    seen = ", ".join(f"{k}={cfg[k]!r}" for k in keys if k in cfg) or "none of the keys formats look for"
    files = sorted(p.name for p in Path(directory).iterdir() if p.is_file())
    return f"config.json has {seen}; files: {', '.join(files)}"


def detect_format(directory: Path) -> CheckpointFormat:
    """The one registered format that claims ``directory``."""
    from ..plugins import get_registry

    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointFormatError(f"{directory}: not a directory")
    # Mistral-native directories have params.json and no config.json: their detector
    # reads the files itself and sees an empty config here.
    native = (directory / "params.json").is_file() and not (directory / "config.json").is_file()
    cfg = {} if native else load_config_json(directory)
    formats = list(get_registry().formats.values())
    claims = [f for f in formats if f.detect(directory, cfg)]
    if len(claims) == 1:
        return claims[0]
    if not claims:
        listing = "\n".join(f"  - {f.name}: {f.description}" for f in formats)
        raise CheckpointFormatError(
            f"{directory}: no checkpoint format recognises this directory ({_describe(directory, cfg)}).\n"
            f"Known formats and what each looks for:\n{listing}"
        )
    raise CheckpointFormatError(
        f"{directory}: formats {' and '.join(repr(f.name) for f in claims)} each claim this directory; "
        f"a format plugin's detector is too broad: uninstall one of the plugins or narrow its detector"
    )


def read_checkpoint(directory: Path) -> RawCheckpoint:
    """Detect the format of ``directory`` and read it."""
    return detect_format(directory).read(Path(directory))
