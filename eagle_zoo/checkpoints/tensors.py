"""Reading checkpoint tensors safely.

Which file holds the weights is decided from file names alone (WEIGHT_LAYOUTS,
first match wins: safetensors is preferred because it cannot run code), never by
trying one reader after another. Pickled ``.bin`` files are opened only with
``torch.load(weights_only=True)``; anything that unpickler refuses is reported as an
UnsafeCheckpointError and nothing in the file is executed.

Every file a checkpoint names (its weight file, the shards of its index) must be
inside the checkpoint directory (inside_checkpoint): a relative path without ``..``
whose real location, symlinks followed, is in the directory. The one exception is a
Hugging Face hub cache snapshot, whose files are links into the repository's
``blobs`` folder: there the repository folder is the bound.
"""
from __future__ import annotations

import json
import math
import os
import pickle
import struct
import zipfile
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Iterable, Optional

import torch
from safetensors import SafetensorError, safe_open

CONVERT_HINT = (
    "convert it to safetensors in an environment you trust "
    "(`eagle-zoo convert`), or download the publisher's model.safetensors"
)

# (file name, is an index of shards). The order is the preference.
WEIGHT_LAYOUTS: tuple[tuple[str, bool], ...] = (
    ("model.safetensors", False),
    ("model.safetensors.index.json", True),
    ("pytorch_model.bin", False),
    ("pytorch_model.bin.index.json", True),
)
SAFETENSORS_SUFFIXES = (".safetensors",)
PICKLE_SUFFIXES = (".bin", ".pt", ".pth")


class CheckpointError(ValueError):
    """A checkpoint cannot be used as it is; the message names the file and the fix."""


class UnsafeCheckpointError(CheckpointError):
    """A pickled file holds more than plain tensors: loading it could run code."""


class CorruptCheckpointError(CheckpointError):
    """A weight file is truncated, corrupt or not what its name says."""


class MissingShardError(CheckpointError):
    """An index names a shard file that is not in the directory."""


class OutsideCheckpointError(UnsafeCheckpointError):
    """A checkpoint names a file outside its directory (absolute, ``..``, or a symlink out)."""


def _bound(directory: Path) -> Path:
    """The folder a checkpoint's files must really be in: the directory itself, or for
    a hub cache snapshot (``.../models--org--name/snapshots/<rev>``) its repository
    folder, as the snapshot's files link into its ``blobs`` folder."""
    directory = Path(directory)
    if directory.parent.name == "snapshots" and (directory.parent.parent / "blobs").is_dir():
        return directory.parent.parent.resolve()
    return directory.resolve()


def inside_checkpoint(directory: Path, name: str, named_by: object) -> Path:
    """``directory / name``, when ``name`` (as ``named_by`` gives it: an index, a file
    name) stays inside the checkpoint directory: relative, no ``..``, no symlink (of the
    file or of a folder on the way) leading out. Otherwise an OutsideCheckpointError;
    nothing outside is opened because a checkpoint says so."""
    directory = Path(directory)
    text = str(name)
    posix, windows = PurePosixPath(text), PureWindowsPath(text)
    if (not text or posix.is_absolute() or windows.is_absolute() or windows.drive or ".." in posix.parts
            or ".." in windows.parts):
        raise OutsideCheckpointError(
            f"{named_by} names {text!r}, which is not a file inside {directory}: a checkpoint may only name "
            "its own files by relative paths without '..'. Fix the entry (the shard's file name in the "
            "checkpoint directory) or get the checkpoint again from its publisher"
        )
    path = directory / text
    real = path.resolve()
    bound = _bound(directory)
    if real != bound and bound not in real.parents:
        raise OutsideCheckpointError(
            f"{named_by} names {text!r}, which leads outside {directory} (a symlink to {real}): a checkpoint's "
            "files must be inside its directory. Copy the file in (not a link) or get the checkpoint again"
        )
    return path


# -- which files ----------------------------------------------------------------
def weights_entry(directory: Path) -> Optional[Path]:
    """The file that says where the weights are (a weight file or an index), or None."""
    directory = Path(directory)
    for name, _ in WEIGHT_LAYOUTS:
        if (directory / name).is_file():
            return inside_checkpoint(directory, name, directory / name)
    return None


def read_index(index_path: Path) -> dict[str, str]:
    """weight_map of a ``*.index.json``: tensor name -> shard file name."""
    try:
        index = json.loads(Path(index_path).read_text())
        weight_map = index["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CorruptCheckpointError(
            f"{index_path}: not a valid shard index ({exc}); it must be JSON with a "
            f'"weight_map" object mapping tensor names to shard files'
        ) from None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CorruptCheckpointError(f"{index_path}: \"weight_map\" must map tensor names to file names")
    directory = Path(index_path).parent
    for tensor, shard in weight_map.items():
        inside_checkpoint(directory, shard, f"{index_path} (weight_map[{tensor!r}])")
    return weight_map


def _entry_or_error(directory: Path) -> Path:
    entry = weights_entry(directory)
    if entry is None:
        raise CheckpointError(
            f"{directory}: no weight file; expected one of "
            f"{', '.join(name for name, _ in WEIGHT_LAYOUTS)}"
        )
    return entry


def weight_files(directory: Path) -> list[Path]:
    """The weight files of a checkpoint directory (all shards when it is sharded)."""
    directory = Path(directory)
    entry = _entry_or_error(directory)
    if not entry.name.endswith(".index.json"):
        return [entry]
    shards = sorted(set(read_index(entry).values()))
    missing = [s for s in shards if not (directory / s).is_file()]
    if missing:
        raise MissingShardError(
            f"{entry} names shard(s) that are not in {directory}: {', '.join(missing)}. "
            f"The download is incomplete: fetch the missing files again."
        )
    return [directory / s for s in shards]


# -- one file -------------------------------------------------------------------
def read_file(path: Path, names: Optional[Iterable[str]] = None) -> dict[str, torch.Tensor]:
    """All tensors of one weight file (or only ``names``), on the CPU."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such weight file")
    if path.name.endswith(SAFETENSORS_SUFFIXES):
        return _read_safetensors(path, names)
    if path.name.endswith(PICKLE_SUFFIXES):
        tensors = _read_pickle(path)
        if names is None:
            return tensors
        return {n: tensors[n] for n in names if n in tensors}
    raise CheckpointError(
        f"{path}: unknown weight file type; expected a name ending in "
        f"{', '.join(SAFETENSORS_SUFFIXES + PICKLE_SUFFIXES)}"
    )


def _read_safetensors(path: Path, names: Optional[Iterable[str]]) -> dict[str, torch.Tensor]:
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            present = list(f.keys())
            keys = present if names is None else [n for n in names if n in set(present)]
            return {k: f.get_tensor(k) for k in keys}
    except SafetensorError as exc:
        raise CorruptCheckpointError(
            f"{path}: not a readable safetensors file ({exc}); it is truncated or "
            f"corrupt: download it again"
        ) from None


def _read_pickle(path: Path) -> dict[str, torch.Tensor]:
    # torch.save writes a zip archive (mmap works on it); older torch wrote a bare
    # pickle stream, which always starts with the PROTO opcode 0x80. Anything else is
    # not a torch checkpoint at all (a truncated zip loses its central directory).
    is_zip = zipfile.is_zipfile(path)
    if not is_zip:
        with open(path, "rb") as f:
            if f.read(1) != b"\x80":
                raise CorruptCheckpointError(
                    f"{path}: neither a torch zip checkpoint nor a pickle stream; "
                    f"it is truncated or corrupt: download it again"
                )
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=is_zip)
    except pickle.UnpicklingError as exc:
        reason = next((ln.strip() for ln in str(exc).splitlines() if "GLOBAL" in ln or "Unsupported" in ln), "")
        raise UnsafeCheckpointError(
            f"{path}: refused to unpickle: the file holds objects other than plain "
            f"tensors, and loading it could run code{f' ({reason})' if reason else ''}. "
            f"Only weights_only pickles are read; {CONVERT_HINT}."
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError) as exc:
        raise CorruptCheckpointError(
            f"{path}: cannot read this torch checkpoint ({str(exc).splitlines()[0]}); "
            f"it is truncated or corrupt: download it again"
        ) from None
    if not isinstance(obj, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items()
    ):
        raise CorruptCheckpointError(
            f"{path}: expected a flat dict of tensor name -> tensor, got "
            f"{type(obj).__name__}; save the state_dict itself"
        )
    return obj


# -- headers without the data -------------------------------------------------------
# A safetensors header is JSON of at most this size (safetensors' own limit is 100 MB).
MAX_HEADER_BYTES = 100_000_000


def safetensors_header(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """{tensor name: (dtype code such as "F16", shape)} of a safetensors file, read from
    its header alone with plain file reads: the data is neither read nor memory
    mapped, so a file of any size (larger than memory too) can be inspected. The header
    is checked against the file's size (each tensor's bytes inside the file)."""
    path = Path(path)
    size = os.path.getsize(path)
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ValueError("shorter than the 8-byte header length")
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER_BYTES or 8 + n > size:
                raise ValueError(f"a header length of {n} bytes does not fit the file ({size} bytes)")
            header = json.loads(f.read(n))
        if not isinstance(header, dict):
            raise ValueError("the header is not a JSON object")
        out, data_size = {}, size - 8 - n
        for name, info in header.items():
            if name == "__metadata__":
                continue
            dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
            if not (isinstance(dtype, str) and isinstance(shape, list)
                    and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
                    and isinstance(offsets, list) and len(offsets) == 2
                    and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
                    and 0 <= offsets[0] <= offsets[1] <= data_size):
                raise ValueError(f"tensor {name!r} has a malformed entry or lies past the end of the file")
            out[name] = (dtype, tuple(shape))
        return dict(sorted(out.items()))  # by name, as safetensors' own keys()
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise CorruptCheckpointError(
            f"{path}: not a readable safetensors file ({exc}); it is truncated or corrupt: download it again"
        ) from None


def checkpoint_numel(directory: Path) -> Optional[int]:
    """How many numbers a checkpoint's tensors hold, from safetensors headers alone;
    None when its weights are pickled (counting those means unpickling them)."""
    total = 0
    for path in weight_files(directory):
        if not path.name.endswith(SAFETENSORS_SUFFIXES):
            return None
        total += sum(math.prod(shape) for _, shape in safetensors_header(path).values())
    return total


# -- a whole checkpoint -----------------------------------------------------------
def read_tensors(directory: Path) -> tuple[dict[str, torch.Tensor], list[Path]]:
    """Every tensor of a checkpoint directory and the files they came from.

    A sharded checkpoint must hold exactly what its index promises.
    """
    directory = Path(directory)
    files = weight_files(directory)
    entry = _entry_or_error(directory)
    tensors: dict[str, torch.Tensor] = {}
    for path in files:
        part = read_file(path)
        clash = sorted(set(part) & set(tensors))
        if clash:
            raise CorruptCheckpointError(f"{path}: tensor {clash[0]!r} is also in another shard")
        tensors.update(part)
    if entry.name.endswith(".index.json"):
        weight_map = read_index(entry)
        missing = sorted(set(weight_map) - set(tensors))
        if missing:
            name = missing[0]
            raise CorruptCheckpointError(
                f"{directory / weight_map[name]}: {entry.name} says it holds {name!r} "
                f"but it does not ({len(missing)} tensor(s) missing)"
            )
    return tensors, files


def tensor_names(directory: Path) -> list[str]:
    """Names of the tensors of a checkpoint, without reading pickled shards where an
    index or safetensors header already says."""
    directory = Path(directory)
    entry = weights_entry(directory)
    if entry is not None and entry.name.endswith(".index.json"):
        return sorted(read_index(entry))
    (path,) = weight_files(directory)
    if path.name.endswith(SAFETENSORS_SUFFIXES):
        return sorted(safetensors_header(path))
    return sorted(_read_pickle(path))


def read_tensor(directory: Path, name: str) -> torch.Tensor:
    """One named tensor of a (possibly sharded) checkpoint, reading only its shard.

    From safetensors only that tensor's bytes are read; a pickled shard is memory
    mapped, so the rest of it is not brought into memory either.
    """
    directory = Path(directory)
    entry = _entry_or_error(directory)
    if entry.name.endswith(".index.json"):
        weight_map = read_index(entry)
        if name not in weight_map:
            raise CheckpointError(f"{entry}: no tensor named {name!r} in the weight map")
        path = directory / weight_map[name]
        if not path.is_file():
            raise MissingShardError(f"{entry} puts {name!r} in {path.name}, which is not in {directory}")
    else:
        path = entry
    found = read_file(path, names=[name])
    if name not in found:
        raise CheckpointError(f"{path}: no tensor named {name!r}")
    return found[name]


def load_state_dict(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint directory, by its name in the files."""
    return read_tensors(directory)[0]
