"""Conversions that change files, never names or values: pickled .bin -> safetensors,
one file -> shards, shards -> one file. config.json and other small files are copied.
"""
from __future__ import annotations

from pathlib import Path

from eagle_zoo.checkpoints import tensors as ckpt

from .errors import ConvertError
from .plan import Plan, pack, parse_size
from .source import copyable_files, open_checkpoint, resolve_dir

PICKLE_ENTRIES = ("pytorch_model.bin.index.json", "pytorch_model.bin")


def _source(src: str) -> Path:
    path = Path(src).expanduser()
    return path if path.is_file() else resolve_dir(src, "checkpoint")


def to_safetensors(src: str) -> Plan:
    """Every tensor of the pickled checkpoint, unpickled weights_only; the source's
    sharding is kept (shard i of n -> model-0000i-of-0000n.safetensors)."""
    path = _source(src)
    if path.is_file():
        if not path.name.endswith(ckpt.PICKLE_SUFFIXES):
            raise ConvertError(f"{path}: not a pickled weight file (expected {', '.join(ckpt.PICKLE_SUFFIXES)})")
        tensors, files = open_checkpoint(path)
        return Plan("to-safetensors", path, [list(tensors.values())], remarks=["no config.json (a single weight file was given)"])
    entry = next((path / n for n in PICKLE_ENTRIES if (path / n).is_file()), None)
    if entry is None:
        have = ckpt.weights_entry(path)
        raise ConvertError(
            f"{path}: no {' or '.join(PICKLE_ENTRIES)}"
            + (f" (it already holds {have.name}; nothing to convert)" if have else "")
        )
    tensors, files = _open_pickles(path, entry)
    by_file = [[t for t in tensors.values() if t.file == f] for f in files]
    copies, skipped = copyable_files(path, files, keep_config=True)
    return Plan("to-safetensors", path, by_file, copies=copies, skipped=skipped)


def _open_pickles(directory: Path, entry: Path):
    """open_checkpoint, but for the pickled layout even when a safetensors file sits
    beside it (open_checkpoint prefers safetensors)."""
    from .source import open_file

    if not entry.name.endswith(".index.json"):
        return open_file(entry), [entry]
    weight_map = ckpt.read_index(entry)
    files = [directory / s for s in dict.fromkeys(weight_map.values())]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise ckpt.MissingShardError(f"{entry} names shard(s) that are not in {directory}: {', '.join(missing)}")
    tensors = {}
    for f in files:
        tensors.update(open_file(f))
    absent = sorted(set(weight_map) ^ set(tensors))
    if absent:
        raise ckpt.CorruptCheckpointError(f"{entry}: {absent[0]!r} is in the index or a shard but not both")
    return tensors, files


def shard(src: str, max_shard_size: str) -> Plan:
    limit = parse_size(max_shard_size)
    path = resolve_dir(src, "checkpoint")
    tensors, files = open_checkpoint(path)
    groups = pack(list(tensors.values()), limit)
    copies, skipped = copyable_files(path, files, keep_config=True)
    remarks = [] if len(groups) > 1 else [f"everything fits in one {max_shard_size} shard: one model.safetensors, no index"]
    return Plan("shard", path, groups, copies=copies, skipped=skipped, remarks=remarks)


def unshard(src: str) -> Plan:
    path = resolve_dir(src, "checkpoint")
    entry = ckpt.weights_entry(path)
    if entry is not None and not entry.name.endswith(".index.json"):
        raise ConvertError(f"{path}: already a single weight file ({entry.name}); nothing to unshard")
    tensors, files = open_checkpoint(path)
    copies, skipped = copyable_files(path, files, keep_config=True)
    return Plan("unshard", path, [list(tensors.values())], copies=copies, skipped=skipped)
