"""Build a target (or draft) model from an id or a directory.

id -> directory (the embedded default, a local directory, or the hub cache) ->
config.json -> the family that registered the architecture -> model -> weights.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch
from torch import nn

from .. import hub
from ..checkpoints.formats import read_json_object
from ..checkpoints.sizes import check_config_sizes, check_sizes_fit_weights
from ..checkpoints.tensors import checkpoint_numel, load_state_dict
from ..default_target import resolve_default
from ..plugins import get_registry


@dataclass
class LoadedModel:
    model: nn.Module
    config: Any
    path: Path
    family: str
    tokenizer: Any


def resolve_model_dir(model: str, revision: Optional[str] = None, fetch: hub.Fetch = hub.DEFAULT_FETCH) -> Path:
    default = resolve_default(model)
    if default is not None:
        return Path(default)
    return Path(hub.resolve(model, revision=revision, fetch=fetch))


def load_config(path: Path):
    from transformers import AutoConfig

    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path}: no config.json; a target model directory needs one")
    # Sizes of the wrong type or out of bounds are named here, before transformers reads them.
    check_config_sizes(read_json_object(path / "config.json"), path / "config.json")
    return AutoConfig.from_pretrained(str(path))


def load_tokenizer(path: Path, required: bool):
    from transformers import AutoTokenizer

    has_tokenizer = any((path / n).is_file() for n in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model"))
    if not has_tokenizer:
        if required:
            raise FileNotFoundError(f"{path}: no tokenizer files; pass token ids as prompts or add a tokenizer")
        return None
    return AutoTokenizer.from_pretrained(str(path))


def load_model(
    model: str,
    dtype: torch.dtype,
    device: torch.device,
    revision: Optional[str] = None,
    tokenizer_required: bool = False,
    fetch: hub.Fetch = hub.DEFAULT_FETCH,
) -> LoadedModel:
    path = resolve_model_dir(model, revision, fetch)
    config = load_config(path)
    family = get_registry().family_for_config(config)
    if family.target_model is None:
        raise ValueError(f"family {family.name!r} registers no target model class; cannot serve {model!r}")
    # Before the model is allocated: its sizes must fit the weights (safetensors headers).
    check_sizes_fit_weights(config.to_dict(), checkpoint_numel(path), path / "config.json")
    net = family.target_model(config)
    net.load_weights(load_state_dict(path).items(), source=str(path))
    net.to(device=device, dtype=dtype).eval()
    return LoadedModel(net, config, path, family.name, load_tokenizer(path, tokenizer_required))
