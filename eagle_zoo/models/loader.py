"""Copy checkpoint tensors into a module through a family's WeightMapping.

Each checkpoint key is: dropped if it contains an ``ignored`` substring; renamed by
the ``renames`` in order (an ``old`` starting with ``^`` matches only at the start
of the key); then, if it contains a ``stacked`` part, pointed at the fused
parameter with that shard id. The parameter's ``weight_loader`` (or a plain
shape-checked copy) does the rest. A floating-point parameter only takes a
floating-point tensor (an int32 or bool ``fc.weight`` is refused by name). Persistent buffers (d2t, t2d) load like
parameters.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Union

import torch
from torch import nn

from ..specs import WeightMapping
from .layers import ShapeMismatch, default_weight_loader


class WeightLoadError(ValueError):
    """A checkpoint does not fit the module: names the file, key and shapes."""


def map_name(key: str, mapping: WeightMapping) -> tuple[str, Any]:
    """Checkpoint key -> (parameter name, shard id or None); ignored keys give ("", None)."""
    if any(part in key for part in mapping.ignored):
        return "", None
    name = key
    for old, new in mapping.renames:
        if old.startswith("^"):
            if name.startswith(old[1:]):
                name = new + name[len(old) - 1:]
        else:
            name = name.replace(old, new)
    for fused, part, shard_id in mapping.stacked:
        if part in name:
            return name.replace(part, fused), shard_id
    return name, None


def load_weights(
    module: nn.Module,
    weights: Union[Mapping[str, torch.Tensor], Iterable[tuple[str, torch.Tensor]]],
    mapping: WeightMapping,
    source: str,
    optional: Iterable[str] = (),
) -> set[str]:
    """Load ``weights`` into ``module``; returns the names of the parameters loaded.

    source: the file (or directory) the tensors came from, for error messages.
    optional: substrings of parameter names that may be missing from the checkpoint.
    """
    targets = dict(module.named_parameters())
    targets.update((n, b) for n, b in module.named_buffers() if _persistent(module, n))
    items = weights.items() if isinstance(weights, Mapping) else weights
    shards_seen: dict[str, set] = {}
    for key, tensor in items:
        name, shard_id = map_name(key, mapping)
        if not name:
            continue
        target = targets.get(name)
        if target is None:
            raise WeightLoadError(
                f"{source}: unexpected key {key!r} (mapped to {name!r}): {type(module).__name__} has no "
                f"such parameter. Is this checkpoint for another model family or head type? "
                f"Parameters look like: {', '.join(list(targets)[:6])}, ..."
            )
        if target.is_floating_point() and not tensor.is_floating_point():
            raise WeightLoadError(
                f"{source}: key {key!r} -> parameter {name!r} is stored as {tensor.dtype}, but it holds "
                f"floating-point weights ({target.dtype}); copying would turn integers / booleans into "
                "meaningless weights. The file is corrupt or was written wrongly: re-export it with float "
                "tensors (float32, float16 or bfloat16) or download it again"
            )
        loader = getattr(target, "weight_loader", default_weight_loader)
        try:
            if shard_id is None:
                loader(target, tensor)
            else:
                loader(target, tensor, shard_id)
        except ShapeMismatch as exc:
            shard = "" if shard_id is None else f" (shard {shard_id!r})"
            raise WeightLoadError(
                f"{source}: key {key!r} -> parameter {name!r}{shard}: expected shape {exc.expected}, "
                f"got {exc.got}. Check that the config matches the weights (hidden_size, heads, vocab)."
            ) from None
        shards_seen.setdefault(name, set()).add(shard_id)

    optional = tuple(optional)
    missing = []
    for name, target in targets.items():
        needed = set(getattr(target, "shard_ids", ()))
        seen = shards_seen.get(name)
        if seen is not None and (None in seen or needed <= seen):
            continue
        if any(o in name for o in optional):
            continue
        lacking = sorted(map(str, needed - (seen or set()))) if seen else []
        missing.append(f"{name!r}" + (f" (shards {lacking})" if lacking else ""))
    if missing:
        raise WeightLoadError(
            f"{source}: missing weights for {', '.join(missing)} of {type(module).__name__}. "
            f"The checkpoint lacks these keys (after renames {[r for r in mapping.renames]}); "
            f"is it complete and of the expected format?"
        )
    return set(shards_seen)


def _persistent(module: nn.Module, name: str) -> bool:
    owner_name, _, leaf = name.rpartition(".")
    owner = module.get_submodule(owner_name) if owner_name else module
    return leaf not in owner._non_persistent_buffers_set
