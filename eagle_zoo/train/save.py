"""Write a trained head in a published layout (docs/formats.md), readable by eagle_zoo.load.

Every config.json written states the head's method (``eagle_zoo_method``: eagle /
eagle3; speculators configs by their speculators_model_type), so `speculative_config`
method inference never depends on the directory's name.

    yuhuili-eagle        config.json (the target's config, num_hidden_layers 1) +
                         fc.*, layers.0.* (no input_layernorm); embed_tokens only
                         when asked (the loader shares the target's otherwise)
    yuhuili-eagle3       config.json (+ draft_vocab_size, target_hidden_size,
                         eagle_aux_hidden_state_layer_ids, architectures
                         <Arch>Eagle3) + midlayer.*, fc, norm, lm_head, d2t, t2d
    speculators-eagle3   config.json with speculators_model_type eagle3,
                         transformer_layer_config, speculators_config + layers.0.*

Fused parameters (qkv_proj, gate_up_proj) are split back into the checkpoint names
by inverting the family's WeightMapping. Weights go to model.safetensors, or to
model-0000i-of-0000n.safetensors + model.safetensors.index.json when they exceed
the shard size. The directory is written next to the destination and moved in.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Optional

import torch
from safetensors.torch import save_file

from converters.plan import parse_size  # noqa: F401  (re-exported: '14MB' -> bytes, as `eagle-zoo convert shard`)

from ..config.speculative import HEAD_METHOD_KEY
from ..models.layers import FusedColumnLinear
from ..specs import WeightMapping

FORMATS = {"eagle": ("yuhuili-eagle",), "eagle3": ("yuhuili-eagle3", "speculators-eagle3")}
PREFIX = {"yuhuili-eagle": "layers.0.", "yuhuili-eagle3": "midlayer.", "speculators-eagle3": "layers.0."}
FORMAT_METHOD = {fmt: method for method, fmts in FORMATS.items() for fmt in fmts}
INFO_FILE = "eagle_zoo_training.json"


# -- tensors ----------------------------------------------------------------------------
def export_tensors(head, mapping: WeightMapping, skip: tuple[str, ...] = (), dtype: Optional[torch.dtype] = None) -> dict:
    """Head parameters and persistent buffers under checkpoint (HF-style) names.

    skip: name prefixes left out (modules shared with the target). Floating tensors
    are cast to ``dtype``; d2t / t2d keep theirs.
    """
    out = {}
    for mod_name, module in head.named_modules():
        prefix = f"{mod_name}." if mod_name else ""
        tensors = list(module.named_parameters(recurse=False))
        tensors += [(n, b) for n, b in module.named_buffers(recurse=False) if n not in module._non_persistent_buffers_set]
        for pname, tensor in tensors:
            name = prefix + pname
            if any(name.startswith(s) for s in skip):
                continue
            tensor = tensor.detach()
            if dtype is not None and tensor.is_floating_point():
                tensor = tensor.to(dtype)
            if isinstance(module, FusedColumnLinear):
                out.update(_unfuse(name, tensor, module, mapping))
            else:
                out[name] = tensor.cpu().contiguous()
    return out


def _unfuse(name: str, tensor: torch.Tensor, module: FusedColumnLinear, mapping: WeightMapping) -> dict:
    sizes = [local for _, local, _ in module.shards.values()]
    out = {}
    for sid, piece in zip(module.shards, tensor.split(sizes, 0)):
        parts = [part for fused, part, shard in mapping.stacked if fused in name and shard == sid]
        if len(parts) != 1:
            raise ValueError(f"{name}: the weight mapping has no unique checkpoint name for shard {sid!r}")
        fused = next(f for f, p, s in mapping.stacked if p == parts[0] and s == sid)
        out[name.replace(fused, parts[0])] = piece.cpu().contiguous()
    return out


def tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _file_bytes(name: str, t: torch.Tensor) -> int:
    """A tensor's share of a safetensors file: its data plus a generous header entry."""
    return tensor_bytes(t) + len(name) + 128


def check_shard_limit(tensors: dict, max_shard_size: int) -> None:
    big = [(n, _file_bytes(n, t)) for n, t in tensors.items() if _file_bytes(n, t) + 8 > max_shard_size]
    if big:
        name, size = max(big, key=lambda x: x[1])
        raise ValueError(
            f"tensor {name} {tuple(tensors[name].shape)} takes {size:,} bytes, more than --max-shard-size "
            f"({max_shard_size:,} bytes); one tensor cannot be split across files: raise --max-shard-size"
            + (" or lower --draft-vocab-size" if name.endswith("lm_head.weight") else "")
        )


def write_weights(directory: Path, tensors: dict, max_shard_size: int) -> list[Path]:
    """First-fit decreasing: few files, none over ``max_shard_size`` (8 bytes of header
    length + header + data)."""
    check_shard_limit(tensors, max_shard_size)
    shards: list[list[str]] = []
    room: list[int] = []
    for n in sorted(tensors, key=lambda n: (-tensor_bytes(tensors[n]), n)):
        b = _file_bytes(n, tensors[n])
        i = next((i for i, r in enumerate(room) if r >= b), None)
        if i is None:
            shards.append([])
            room.append(max_shard_size - 8)
            i = len(shards) - 1
        shards[i].append(n)
        room[i] -= b
    shards = [sorted(group) for group in shards]
    names = sorted(tensors)
    meta = {"format": "pt"}
    if len(shards) == 1:
        path = directory / "model.safetensors"
        save_file({n: tensors[n] for n in names}, str(path), metadata=meta)
        return [path]
    paths, weight_map = [], {}
    for i, group in enumerate(shards, 1):
        fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file({n: tensors[n] for n in group}, str(directory / fname), metadata=meta)
        weight_map.update({n: fname for n in group})
        paths.append(directory / fname)
    index = {"metadata": {"total_size": sum(tensor_bytes(t) for t in tensors.values())},
             "weight_map": dict(sorted(weight_map.items()))}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return paths


# -- configs ------------------------------------------------------------------------------
def speculators_config(flat: dict, target_name: str, num_speculative_tokens: int) -> dict:
    """The speculators config.json for an EAGLE-3 head whose flat (yuhuili) config is ``flat``."""
    head_keys = ("draft_vocab_size", "target_hidden_size", "eagle_aux_hidden_state_layer_ids")
    layer = {k: v for k, v in flat.items() if k not in head_keys + ("architectures", "torch_dtype")}
    target_archs = [a[: -len("Eagle3")] for a in flat.get("architectures", []) if a.endswith("Eagle3")]
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": "0.1.0",
        **{k: flat[k] for k in head_keys if k in flat},
        "transformer_layer_config": layer,
        # How this head was trained (the yuhuili layer), not the speculators default.
        "norm_before_residual": False,
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": num_speculative_tokens,
                                  "accept_tolerance": 0.0, "verifier_accept_k": 1}],
            "verifier": {"name_or_path": target_name, "architectures": target_archs},
        },
        "torch_dtype": flat.get("torch_dtype", "bfloat16"),
    }


# -- whole checkpoints -----------------------------------------------------------------------
def save_head(head, flat_config: dict, fmt: str, out, *, mapping: WeightMapping, skip: tuple[str, ...],
              dtype: torch.dtype = torch.bfloat16, max_shard_size: int = 14 * 10**6,
              target_name: str = "", num_speculative_tokens: int = 3, info: Optional[dict] = None) -> Path:
    """Write ``head`` to ``out`` in layout ``fmt`` (one of FORMATS); returns ``out``."""
    if fmt not in PREFIX:
        raise ValueError(f"unknown head format {fmt!r}; known: {', '.join(PREFIX)}")
    out = Path(out)
    tensors = export_tensors(head, mapping, skip, dtype)
    tensors = {_rename(n, PREFIX[fmt]): t for n, t in tensors.items()}
    flat = dict(flat_config, torch_dtype=str(dtype).replace("torch.", ""))
    # The head states its method, so method inference never reads the directory's name
    # (config/speculative.py HEAD_METHOD_KEY); speculators configs state theirs already.
    if fmt.startswith("speculators"):
        config = speculators_config(flat, target_name, num_speculative_tokens)
    else:
        config = {**flat, HEAD_METHOD_KEY: FORMAT_METHOD[fmt]}
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    write_weights(tmp, tensors, max_shard_size)
    if info is not None:
        (tmp / INFO_FILE).write_text(json.dumps({"format": fmt, **info}, indent=2, default=str) + "\n")
    _replace(tmp, out)
    return out


def read_record(directory) -> Optional[dict]:
    """The training record saved with a head; None where there is none, and where it does
    not parse {"unreadable": why}, so the record that embeds it says so instead of null
    (an unreadable record is not a reason to refuse the weights)."""
    path = Path(directory) / INFO_FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as err:
        return {"unreadable": f"{path}: {err}"}
    return record if isinstance(record, dict) else {"unreadable": f"{path}: not a JSON object"}


def _rename(name: str, prefix: str) -> str:
    return prefix + name[len("layers.0."):] if name.startswith("layers.0.") else name


def check_output_dir(out: Path) -> None:
    """Refuse a head directory that exists, is not empty and holds no head: saving replaces an
    earlier head's files and would mix its own with anything else. `eagle-zoo train` checks
    its --out with this before training, so a run is never lost to it."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or (not (out / "config.json").is_file() and any(out.iterdir()))):
        raise FileExistsError(f"{out} exists, is not empty and holds no head (no config.json): choose another --out")


def _replace(tmp: Path, out: Path) -> None:
    """Move the files of ``tmp`` into ``out``, first removing an earlier head there."""
    try:
        check_output_dir(out)
    except FileExistsError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if out.exists():
        for p in out.iterdir():
            if p.is_file() and (p.name == "config.json" or p.name == INFO_FILE or p.name.startswith("model")):
                p.unlink()
    out.mkdir(parents=True, exist_ok=True)
    for p in tmp.iterdir():
        p.replace(out / p.name)
    tmp.rmdir()
