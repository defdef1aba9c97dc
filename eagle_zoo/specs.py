"""Typed records that plugins register through the hooks in eagle_zoo.hookspecs."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional


@dataclass(frozen=True)
class WeightMapping:
    """How checkpoint tensor names become module parameter names. Pure data.

    renames: ordered (old, new) substring replacements applied to every key
        (for example ``("midlayer.", "layers.0.")`` or Mistral-native names);
        an ``old`` starting with ``^`` matches only at the start of the key
        (``("^model.", "")`` strips the prefix of target checkpoints).
    stacked: (fused, part, shard_id): a key containing ``part`` is loaded into the
        parameter whose name has ``fused`` in its place, as shard ``shard_id``
        (for example ``(".qkv_proj", ".q_proj", "q")``).
    ignored: substrings of keys that are dropped silently (rotary caches, ...).
    """

    renames: tuple[tuple[str, str], ...] = ()
    stacked: tuple[tuple[str, str, Any], ...] = ()
    ignored: tuple[str, ...] = ()

    def merged(self, other: "WeightMapping") -> "WeightMapping":
        return WeightMapping(
            renames=self.renames + other.renames,
            stacked=self.stacked + other.stacked,
            ignored=self.ignored + other.ignored,
        )


@dataclass(frozen=True)
class FamilySpec:
    """A model family: the target architectures it serves and the heads it builds.

    name: short family name used in the catalog ("llama", "qwen3", ...).
    architectures: target architecture names from HF config.json ("LlamaForCausalLM").
    model_types: HF ``model_type`` values of the family ("llama").
    target_model: nn.Module class built as ``target_model(config)``.
    eagle_head / eagle3_head: head classes built as ``cls(config)`` or None.
    weight_mapping: the family's mapping table (see WeightMapping).
    extra_head_architectures: head architecture names that the renaming rules do
        not produce (``EagleDeepSeekMTPModel``), mapped to a method.
    """

    name: str
    architectures: tuple[str, ...]
    model_types: tuple[str, ...]
    target_model: Optional[type] = None
    eagle_head: Optional[type] = None
    eagle3_head: Optional[type] = None
    weight_mapping: WeightMapping = field(default_factory=WeightMapping)
    extra_head_architectures: tuple[tuple[str, str], ...] = ()
    config_class: Optional[Callable[..., Any]] = None

    def head_class(self, method: str) -> Optional[type]:
        return {"eagle": self.eagle_head, "eagle3": self.eagle3_head}.get(method)


@dataclass(frozen=True)
class CheckpointFormat:
    """A published checkpoint layout.

    detect(directory, config_dict) -> bool must be decided from the files and the
    config alone (no trial loading). read(directory) -> RawCheckpoint.
    """

    name: str
    description: str
    detect: Callable[[Path, dict], bool]
    read: Callable[[Path], Any]


@dataclass(frozen=True)
class ProposerSpec:
    """A speculative proposer method (eagle, eagle3, ngram, draft_model, ...)."""

    name: str
    proposer: Optional[type] = None
    parallel_drafting: bool = False
    needs_model: bool = True
    description: str = ""
