"""Opening checkpoints lazily: names, shapes and dtypes come from safetensors headers
(read with plain file reads, never memory mapped, so --dry-run works on a file of
any size; or the memory-mapped, weights_only-unpickled .bin), and the bytes of a tensor are
read only when the writer asks for them. File choice, index checks and the safe
unpickling are eagle_zoo.checkpoints.tensors'; this module only adds laziness.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Optional

import torch

from eagle_zoo.checkpoints import tensors as ckpt

from .errors import ConvertError
from .safetensors_out import DTYPES, nbytes


@dataclass(frozen=True)
class LazyTensor:
    name: str                 # name in the output
    shape: tuple[int, ...]
    dtype: torch.dtype
    file: Path                # the file holding the bytes
    key: str                  # the name inside that file
    fetch: Callable[[], torch.Tensor] = field(repr=False, compare=False)

    @property
    def nbytes(self) -> int:
        return nbytes(self.shape, self.dtype)

    def load(self) -> torch.Tensor:
        return self.fetch()

    def renamed(self, name: str) -> "LazyTensor":
        return replace(self, name=name)


def resolve_dir(id_or_path: str, what: str) -> Path:
    """A local directory for ``id_or_path`` (a path, or a hub id already in the cache)."""
    from eagle_zoo.hub import resolve

    path = Path(id_or_path).expanduser()
    if path.is_file():
        raise ConvertError(f"{what} {path} is a file; pass the checkpoint directory that holds config.json")
    return resolve(id_or_path)


def read_config(directory: Path, required: bool = True) -> Optional[dict]:
    path = Path(directory) / "config.json"
    if not path.is_file():
        if required:
            raise ConvertError(f"{directory}: no config.json; a checkpoint directory needs one")
        return None
    try:
        config = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConvertError(f"{path}: not valid JSON ({exc}); fix or re-download it") from None
    if not isinstance(config, dict):
        raise ConvertError(f"{path}: expected a JSON object, got {type(config).__name__}")
    return config


def open_file(path: Path, names: Optional[set] = None) -> dict[str, LazyTensor]:
    """The tensors of one weight file (or only ``names``), lazily."""
    path = Path(path)
    if path.name.endswith(ckpt.SAFETENSORS_SUFFIXES) and path.is_file():
        # The header alone (plain reads, no memory map): any file size can be planned.
        meta = {k: (shape, code) for k, (code, shape) in ckpt.safetensors_header(path).items()
                if names is None or k in names}
        out = {}
        for k, (shape, code) in meta.items():
            if code not in DTYPES:
                raise ConvertError(f"{path}: tensor {k!r} has dtype {code}, which this converter does not handle")
            out[k] = LazyTensor(k, shape, DTYPES[code], path, k, _safetensors_fetch(path, k))
        return out
    # pickles: weights_only and memory-mapped (zip format) by eagle_zoo.checkpoints
    loaded = ckpt.read_file(path)
    return {
        k: LazyTensor(k, tuple(v.shape), v.dtype, path, k, (lambda v=v: v))
        for k, v in loaded.items()
        if names is None or k in names
    }


def _safetensors_fetch(path: Path, key: str) -> Callable[[], torch.Tensor]:
    return lambda: ckpt.read_file(path, names=[key])[key]


def open_checkpoint(path: Path) -> tuple[dict[str, LazyTensor], list[Path]]:
    """Every tensor of a checkpoint directory (or of one weight file), lazily, and the
    weight files. A sharded checkpoint must hold exactly what its index says."""
    path = Path(path)
    files = [path] if path.is_file() else ckpt.weight_files(path)
    out: dict[str, LazyTensor] = {}
    for file in files:
        part = open_file(file)
        clash = sorted(set(part) & set(out))
        if clash:
            raise ckpt.CorruptCheckpointError(f"{file}: tensor {clash[0]!r} is also in another shard")
        out.update(part)
    entry = None if path.is_file() else ckpt.weights_entry(path)
    if entry is not None and entry.name.endswith(".index.json"):
        weight_map = ckpt.read_index(entry)
        for name in sorted(set(weight_map) ^ set(out)):
            where = f"{entry.name} names it but {weight_map[name]} lacks it" if name in weight_map else "no entry in the index"
            raise ckpt.CorruptCheckpointError(f"{path}: tensor {name!r}: {where}; the download is incomplete or mixed")
        wrong = sorted(n for n, t in out.items() if t.file.name != weight_map[n])
        if wrong:
            raise ckpt.CorruptCheckpointError(
                f"{entry}: {wrong[0]!r} is in {out[wrong[0]].file.name}, not {weight_map[wrong[0]]}"
            )
    return out, files


def open_one(directory: Path, name: str) -> LazyTensor:
    """One tensor of a (possibly sharded) checkpoint: only its shard's header is read."""
    directory = Path(directory)
    entry = ckpt.weights_entry(directory)
    if entry is None:
        ckpt.weight_files(directory)  # raises the "no weight file" error
    path = entry
    if entry.name.endswith(".index.json"):
        shard = ckpt.read_index(entry).get(name)
        if shard is None:
            raise ConvertError(f"{entry}: no tensor named {name!r} in the weight map")
        path = directory / shard
        if not path.is_file():
            raise ckpt.MissingShardError(f"{entry} puts {name!r} in {shard}, which is not in {directory}")
    found = open_file(path, {name})
    if name not in found:
        raise ConvertError(f"{path}: no tensor named {name!r}")
    return found[name]


def copyable_files(directory: Path, used: list[Path], keep_config: bool) -> tuple[list[Path], list[Path]]:
    """(files copied verbatim, files left behind): every top-level file that is not a
    weight file or index; pickles that are not weights (training_args.bin ...) stay
    behind, they are code-bearing and no loader needs them."""
    if not Path(directory).is_dir():
        return [], []
    copies, skipped = [], []
    used = {Path(p).name for p in used}
    for p in sorted(Path(directory).iterdir()):
        if not p.is_file() or p.name.startswith(".") or p.name in used:
            continue
        if p.name.endswith(".index.json") or (p.name == "config.json" and not keep_config):
            continue
        if p.name.endswith(ckpt.PICKLE_SUFFIXES + ckpt.SAFETENSORS_SUFFIXES):
            skipped.append(p)
        else:  # copied into the output: a link out of the directory is refused
            copies.append(ckpt.inside_checkpoint(directory, p.name, p))
    return copies, skipped
