"""eagle_zoo.load(): an id or a directory -> a ready EAGLE / EAGLE-3 head.

resolve (hub.py) -> detect the format and read it (checkpoints/formats.py) -> the
renamed architecture picks the family plugin and head class (the registry) -> build,
load the weights -> dtype / device -> embeddings / lm_head shared from the target
where the checkpoint has none. Given a target, its config is checked against the head's
before anything is built, so a head for another model fails with a readable message.
Without a target model those modules are left unset: ``LoadedHead.needs`` names them,
running the head raises an error saying to pass the target, and
``LoadedHead.attach_target(model)`` shares them later. ``load_target()`` builds a target
model to pass as ``target=``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

import torch
from torch import nn

from . import hub
from .checkpoints.formats import RawCheckpoint, detect_format
from .plugins import get_registry
from .specs import FamilySpec

# Modules a checkpoint may leave out because they are the target's own.
SHARED_FROM_TARGET = ("embed_tokens", "lm_head")


class HeadLoadError(ValueError):
    """A head cannot be built or does not fit the given target; the message says why."""


@dataclass
class LoadedHead:
    head: nn.Module
    config: Any  # EagleConfig
    method: str
    format: str
    path: Path
    family: str
    shared: list[str] = field(default_factory=list)  # modules taken from the target
    needs: list[str] = field(default_factory=list)   # modules still to take from a target

    @property
    def ready(self) -> bool:
        """Whether the head can draft (it has every module it runs)."""
        return not self.needs

    def attach_target(self, target: Any) -> "LoadedHead":
        """Check ``target`` (a target model, e.g. from ``eagle_zoo.load_target``) against
        the head and share its embed_tokens / lm_head where the checkpoint has none."""
        target_config = _target_config(target)
        if target_config is not None:
            family, _ = _head_family(self.config, self.format, self.path)
            check_target(self.config, self.method, family, target_config, self.path)
        if self.needs:
            _check_can_share(target, self.needs, self.path)
            self.shared += self.head.share_from_target(target)
            self.needs = []
        return self


def _placement(dtype, device) -> dict:
    """load()'s dtype and device as head.to() takes them, named as LLM takes them
    ("bfloat16", "cuda:0", ...); None leaves the checkpoint's dtype or the CPU."""
    from .engine.llm import resolve_device, resolve_dtype

    device = None if device is None else resolve_device(device)
    return {"device": device, "dtype": None if dtype is None else resolve_dtype(dtype, device or torch.device("cpu"))}


def load(
    id_or_path,
    target: Any = None,
    revision: Optional[str] = None,
    dtype: Union[torch.dtype, str, None] = None,
    device: Any = None,
    fetch: hub.Fetch = hub.DEFAULT_FETCH,
) -> LoadedHead:
    """Load a head. ``target``: the target model (an object with ``.config``,
    ``embed_tokens`` and ``lm_head``), or only its config (a transformers config or a
    dict) to check compatibility; heads without their own embeddings / lm_head need
    the model. ``fetch``: the cache directory and token for a hub id (hub.Fetch)."""
    path = hub.resolve(id_or_path, revision, fetch)
    fmt = detect_format(path)
    raw: RawCheckpoint = fmt.read(path)
    source = str(raw.files[0]) if len(raw.files) == 1 else str(path)
    family, method = _head_family(raw.config, raw.format, path)
    target_config = _target_config(target)
    if target_config is not None:
        check_target(raw.config, method, family, target_config, path)

    head = family.head_class(method)(raw.config)
    loaded = head.load_weights(raw.weights, source=source)
    head.to(**_placement(dtype, device)).eval()
    # Shared after the cast: the target's modules are tied in as they are, never
    # converted behind the target's back.
    missing = [m for m in SHARED_FROM_TARGET if f"{m}.weight" not in loaded]
    shared, needs = [], []
    if missing and _is_model(target):
        _check_can_share(target, missing, path)
        shared = head.share_from_target(target)
    elif missing:  # no target model: the head says what it needs before it can draft
        needs = head.leave_for_target(str(path))
    return LoadedHead(head, raw.config, method, fmt.name, path, family.name, shared, needs)


def _is_model(target: Any) -> bool:
    return target is not None and not isinstance(target, dict) and hasattr(target, "config") \
        and not (hasattr(target, "to_dict") and hasattr(target, "model_type"))


def load_target(model: str, *, dtype: Any = None, device: Any = None, revision: Optional[str] = None) -> nn.Module:
    """The target model ``model`` (an id, a catalog target or a directory, as ``LLM(model=...)``
    reads it), built by the family plugin that serves it, to pass as
    ``eagle_zoo.load(head, target=...)``: it has ``.config``, ``embed_tokens`` and
    ``lm_head``. ``dtype`` / ``device`` as LLM's ("auto" / None: bf16 on CUDA, else fp32)."""
    from .engine.llm import resolve_device, resolve_dtype
    from .engine.model_loader import load_model

    device = resolve_device(device)
    return load_model(str(model), resolve_dtype(dtype, device), device, revision=revision).model


def _head_family(config: Any, fmt: str, path: Path) -> tuple[FamilySpec, str]:
    registry = get_registry()
    archs = list(config.architectures)
    for arch in archs:
        if arch in registry.head_architectures:
            return registry.head_architectures[arch]
    written = config.to_dict()
    written = written.get("architectures") or (written.get("model") or {}).get("architectures")
    as_written = f", config.json: {written}" if written and written != archs else ""
    raise HeadLoadError(
        f"{path}: no installed family plugin provides a head for {archs or 'an unnamed architecture'} "
        f"(read as {fmt}, method {config.method}{as_written}). Known head architectures: "
        f"{', '.join(sorted(registry.head_architectures)) or 'none'}. Install the plugin for this "
        f"model family (`eagle-zoo plugins` lists what is installed)."
    )


def _get(config: Any, key: str, default: Any = None) -> Any:
    value = config.get(key) if isinstance(config, dict) else getattr(config, key, None)
    return default if value is None else value


def _target_config(target: Any) -> Any:
    if target is None or isinstance(target, dict):
        return target
    if hasattr(target, "to_dict") and hasattr(target, "model_type"):  # a transformers config
        return target
    if getattr(target, "config", None) is not None:
        return target.config
    raise HeadLoadError(
        f"target= must be the target model (with .config), its transformers config or a config "
        f"dict; got {type(target).__name__}"
    )


def check_target(config: Any, method: str, family: FamilySpec, target_config: Any, path: Path) -> None:
    """Fail early, and readably, when the head was trained for another target."""
    want_hidden = _get(config, "target_hidden_size", config.hidden_size)
    have_hidden = _get(target_config, "hidden_size")
    if have_hidden is not None and have_hidden != want_hidden:
        key = "target_hidden_size" if _get(config, "target_hidden_size") is not None else "hidden_size"
        raise HeadLoadError(
            f"{path}: the head reads target hidden states of size {want_hidden} ({key} in its "
            f"config.json) but the target has hidden_size {have_hidden}: this head belongs to "
            f"another target model"
        )
    have_vocab = _get(target_config, "vocab_size")
    if have_vocab is not None and have_vocab != config.vocab_size:
        raise HeadLoadError(
            f"{path}: the head's vocab_size is {config.vocab_size} but the target's is {have_vocab}: "
            f"the head was trained for a target with another tokenizer"
        )
    aux = _get(config, "eagle_aux_hidden_state_layer_ids")
    n_layers = _get(target_config, "num_hidden_layers")
    if method == "eagle3" and aux and n_layers is not None and max(aux) >= n_layers:
        raise HeadLoadError(
            f"{path}: eagle_aux_hidden_state_layer_ids {list(aux)} need a target with more than "
            f"{max(aux)} layers; the target has {n_layers}"
        )
    _check_family(config, method, family, target_config, path)


def _check_family(config: Any, method: str, family: FamilySpec, target_config: Any, path: Path) -> None:
    target_archs = list(_get(target_config, "architectures", []))
    verifier_archs = list(_get(config, "verifier_architectures", []))
    if verifier_archs and target_archs and not set(verifier_archs) & set(target_archs):
        raise HeadLoadError(
            f"{path}: the head was trained for a {', '.join(verifier_archs)} verifier "
            f"(speculators_config.verifier) but the target is {', '.join(target_archs)}"
        )
    if method != "eagle":
        # EAGLE-3 heads are Llama-style drafts whatever the target (SpecForge trains
        # LlamaForCausalLMEagle3 heads for Qwen targets): only sizes must agree.
        return
    # An EAGLE-1 head reads the target's last hidden state and uses its embeddings
    # and lm_head: it belongs to one family.
    try:
        target_family = get_registry().family_for_config(target_config)
    except KeyError:
        target_family = None
    if target_family is not None and target_family.name != family.name:
        raise HeadLoadError(
            f"{path}: this is a {family.name} EAGLE head ({', '.join(config.architectures)}) but the "
            f"target is a {target_family.name} model ({', '.join(target_archs) or _get(target_config, 'model_type')})"
        )


def _check_can_share(target: Any, missing: list[str], path: Path) -> None:
    what = " and ".join(f"{m}.weight" for m in missing)
    if target is None or isinstance(target, dict) or not hasattr(target, "config"):
        raise HeadLoadError(
            f"{path}: the checkpoint has no {what}; the head uses the target model's. Pass "
            f"target=<the target model> to eagle_zoo.load (a config alone is not enough)."
        )
    absent = [m for m in missing if not hasattr(target, m)]
    if absent:
        raise HeadLoadError(
            f"{path}: the checkpoint has no {what} and the target ({type(target).__name__}) has no "
            f"{' / '.join(absent)} attribute to share; pass an eagle_zoo target model "
            f"(FamilySpec.target_model)"
        )
