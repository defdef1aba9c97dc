"""Config sizes checked before anything is allocated from them.

A model is built from its config.json before its weights are copied in, so an absurd
size there (``intermediate_size`` 10**12, ``num_hidden_layers`` 10**6) or a size of
the wrong JSON type (``"vocab_size": "49152"``) would otherwise surface as an
allocator error, a machine out of memory, or a TypeError far from the cause. Here:

- check_config_sizes: every size key present is an integer (not a string, float or
  boolean) within a bound no published model comes near; the error names the key.
- check_sizes_fit_weights: a model of these sizes allocates at least
  ``num_hidden_layers * 3 * hidden_size * intermediate_size`` numbers (its MLPs
  alone) plus ``vocab_size * hidden_size`` (its embedding table); a checkpoint
  holding far fewer (a 16x margin for packed / quantized formats, and heads that
  borrow the target's embedding) does not belong to this config.
"""
from __future__ import annotations

from typing import Any, Optional

from .tensors import CheckpointError

# key -> (smallest, largest) accepted value.
SIZE_BOUNDS: dict[str, tuple[int, int]] = {
    "vocab_size": (1, 2**22),
    "hidden_size": (1, 2**17),
    "intermediate_size": (1, 2**20),
    "num_hidden_layers": (1, 2**10),
    "num_attention_heads": (1, 2**12),
    "num_key_value_heads": (1, 2**12),
    "head_dim": (1, 2**12),
    "draft_vocab_size": (1, 2**22),
    "target_hidden_size": (1, 2**17),
    "moe_intermediate_size": (1, 2**20),
    "intermediate_size_mlp": (1, 2**20),
    "n_routed_experts": (0, 2**12),
    "num_local_experts": (0, 2**12),
    "num_experts": (0, 2**12),
    "num_experts_per_tok": (0, 2**12),
    "max_position_embeddings": (1, 2**26),
}
# Nested objects that hold a model's sizes (multimodal text_config, the legacy
# {"model_type": "eagle", "model": {...}} wrapper, speculators' layer config).
NESTED = ("text_config", "model", "transformer_layer_config")
# How much smaller than the config's lower bound a checkpoint may be, and a floor.
MARGIN, SLACK = 16, 2**24


class ConfigSizeError(CheckpointError):
    """A config size is of the wrong type, out of bounds, or does not fit the weights."""


def _sections(config: dict, where: str):
    yield config, where
    for key in NESTED:
        inner = config.get(key)
        if isinstance(inner, dict):
            yield from _sections(inner, f"{where}.{key}" if where else key)


def check_config_sizes(config: dict, source: Any) -> None:
    """Raises ConfigSizeError naming ``source`` (the config file) and the key."""
    for section, where in _sections(config, ""):
        for key, (low, high) in SIZE_BOUNDS.items():
            if key not in section or section[key] is None:
                continue
            value, name = section[key], f"{where}.{key}" if where else key
            if not isinstance(value, int) or isinstance(value, bool):
                hint = " (write the number without quotes)" if isinstance(value, str) else ""
                raise ConfigSizeError(f"{source}: {name!r} must be an integer, got {value!r} "
                                      f"({type(value).__name__}){hint}")
            if not low <= value <= high:
                raise ConfigSizeError(f"{source}: {name!r} = {value} is outside [{low}, {high}], the range this "
                                      "loader accepts; the config is corrupt or not for this kind of model: "
                                      "fix the value or get the config again")


def _numbers_needed(section: dict) -> tuple[int, list[str]]:
    """A lower bound on the numbers a model of these sizes allocates (its decoder
    layers' MLPs and its embedding table), and the keys it comes from."""
    def get(key):
        value = section.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    need, keys = 0, []
    layers, hidden, inter, vocab = (get(k) for k in ("num_hidden_layers", "hidden_size", "intermediate_size",
                                                        "vocab_size"))
    if layers and hidden and inter:
        need += layers * 3 * hidden * inter
        keys += ["num_hidden_layers", "hidden_size", "intermediate_size"]
    if vocab and hidden:
        need += vocab * hidden
        keys += ["vocab_size"] + ([] if "hidden_size" in keys else ["hidden_size"])
    return need, keys


def check_sizes_fit_weights(config: dict, numel: Optional[int], source: Any) -> None:
    """Refuses a config whose decoder layers and embedding need far more numbers than
    the checkpoint holds (``numel``; None: unknown, nothing to compare)."""
    if numel is None:
        return
    for section, where in _sections(config, ""):
        need, keys = _numbers_needed(section)
        if need > MARGIN * numel + SLACK:
            sizes = ", ".join(f"{k}={section[k]}" for k in keys)
            raise ConfigSizeError(
                f"{source}: {where + ': ' if where else ''}{sizes} describe a model of at least {need:,} "
                f"numbers, but the checkpoint's tensors hold {numel:,} in all: the config does not belong to "
                "these weights (nothing was allocated); fix the sizes or get the matching config.json"
            )
