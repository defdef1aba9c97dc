"""`eagle-zoo convert average`: the weighted mean of heads that share one architecture,
config and draft vocabulary (checkpoint averaging: e.g. a warm-started head and the
head it started from, or checkpoints along one run). The output keeps the first
head's layout, tensor names and sharding; floating tensors are averaged in fp32 and
stored in the first head's dtype, integer and bool tensors (d2t, t2d) must be equal.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

import torch

from eagle_zoo.train.save import INFO_FILE as RECORD_FILE, read_record  # how a head was made

from .errors import ConvertError
from .plan import Plan
from .source import LazyTensor, copyable_files, open_checkpoint, read_config, resolve_dir


def parse_weights(text: Optional[str], count: int) -> list[float]:
    """'0.7,0.3' -> [0.7, 0.3]; None -> equal weights. Normalized to sum to 1.

    A negative weight extrapolates: '1.5,-0.5' is A + 0.5 (A - B), the step from B to A
    taken half again (e.g. a head saved with --ema, A, moved away from its start, B,
    towards the path's own average). The sum must stay positive, else normalizing would
    divide by 0 or flip the sign of every tensor."""
    if text is None:
        return [1.0 / count] * count
    try:
        weights = [float(w) for w in text.split(",")]
    except ValueError:
        raise ConvertError(f"--weights {text!r}: expected comma-separated numbers, one per head (e.g. 0.5,0.5)") from None
    if len(weights) != count:
        raise ConvertError(f"--weights {text!r}: {len(weights)} weights for {count} heads (SRC and each --with): "
                           f"give one per head")
    if any(not math.isfinite(w) for w in weights):
        raise ConvertError(f"--weights {text!r}: every weight must be a finite number")
    if any(w == 0 for w in weights):
        raise ConvertError(f"--weights {text!r}: a weight is 0; leave that head out instead of weighting it 0")
    total = sum(weights)
    if not total > 0:
        raise ConvertError(f"--weights {text!r}: the weights sum to {total:g}; they must sum to more than 0 "
                           f"(negative weights extrapolate, e.g. 1.5,-0.5; they cannot outweigh the rest)")
    return [w / total for w in weights]


def _same_tensors(first: Path, tensors: dict, other: Path, theirs: dict) -> None:
    missing, extra = sorted(tensors.keys() - theirs.keys()), sorted(theirs.keys() - tensors.keys())
    if missing or extra:
        what = f"lacks {missing[0]!r}" if missing else f"has {extra[0]!r}, which {first} lacks"
        raise ConvertError(f"{other}: {what}; only heads with the same tensors can be averaged")
    for name, t in tensors.items():
        o = theirs[name]
        if (t.shape, t.dtype) != (o.shape, o.dtype):
            raise ConvertError(f"{other}: tensor {name!r} is {list(o.shape)} {o.dtype}, in {first} "
                               f"{list(t.shape)} {t.dtype}; only heads of one shape can be averaged")


def _same_integers(name: str, parts: list[LazyTensor], sources: list[Path]) -> None:
    """Integer and bool tensors (d2t, t2d: small) are not averaged: they must be equal,
    checked when planning so that --dry-run refuses what the write would."""
    first = parts[0].load()
    for part, src in zip(parts[1:], sources[1:]):
        if not torch.equal(part.load(), first):
            raise ConvertError(f"{src}: {name!r} differs from {sources[0]}'s: the heads draft over different "
                               f"vocabularies (d2t / t2d) or differ in another integer tensor; average heads of "
                               f"one draft vocabulary (trained with --init-from and no --reselect-draft-vocab)")


def _mean(parts: list[LazyTensor], weights: list[float]) -> torch.Tensor:
    values = [p.load() for p in parts]
    total = sum(w * v.float() for w, v in zip(weights, values))
    return total.to(values[0].dtype)


def _share_starts(entries: list[dict]) -> None:
    """A head trained from another head carries that head's whole record as its
    ``init_from.record``: keep each record once, a copy replaced by a reference to where
    it is kept (else every warm start followed by an average would multiply the file). The start
    may be one of the averaged heads (-> ``average[j].record``), or a head outside the
    average that several of them were trained from, e.g. a head grown to more layers and
    averaged with its own run (-> ``average[j].record.init_from.record``, the first)."""
    def key(record) -> str:  # taken before any entry is rewritten
        return json.dumps(record, sort_keys=True)

    kept = {}
    for j, entry in enumerate(entries):
        kept.setdefault(key(entry["record"]), f"average[{j}].record")
    for i, entry in enumerate(entries):
        start = (entry["record"] or {}).get("init_from")
        if not isinstance(start, dict) or start.get("record") is None:
            continue
        k = key(start["record"])
        if k in kept:
            start["record"] = {"same_as": kept[k]}
        else:
            kept[k] = f"average[{i}].record.init_from.record"


def plan(src: str, others: list[str], weights_text: Optional[str]) -> Plan:
    sources = [resolve_dir(s, "checkpoint") for s in [src, *others]]
    if len({s.resolve() for s in sources}) != len(sources):
        raise ConvertError("convert average: a head is given twice; give each head once (use --weights to favour one)")
    weights = parse_weights(weights_text, len(sources))
    config = read_config(sources[0])
    opened = [open_checkpoint(s) for s in sources]
    tensors, files = opened[0]
    for other, (theirs, _) in zip(sources[1:], opened[1:]):
        cfg = read_config(other)
        diff = sorted(k for k in config.keys() | cfg.keys() if config.get(k) != cfg.get(k))
        if diff:
            raise ConvertError(f"{other}/config.json: {diff[0]!r} is {cfg.get(diff[0])!r}, in {sources[0]} "
                               f"{config.get(diff[0])!r}; only heads of one config can be averaged")
        _same_tensors(sources[0], tensors, other, theirs)
    out = []
    for name, t in tensors.items():
        parts = [theirs[name] for theirs, _ in opened]
        if t.dtype.is_floating_point:
            out.append(LazyTensor(name, t.shape, t.dtype, t.file, t.key, lambda parts=parts: _mean(parts, weights)))
        else:
            _same_integers(name, parts, sources)
            out.append(t)
    by_file = [[t for t in out if t.file == f] for f in files]
    copies, skipped = copyable_files(sources[0], files, keep_config=True)
    copies = [p for p in copies if p.name != RECORD_FILE]  # it describes one head only: the record below replaces it
    record = {"average": [{"head": str(s), "weight": w, "record": read_record(s)} for s, w in zip(sources, weights)]}
    _share_starts(record["average"])
    averaged = {t.name: "average" for t in out if t.dtype.is_floating_point}  # d2t / t2d: kept, equal in all
    return Plan("average", sources[0], by_file, copies=copies, skipped=skipped,
                verbs=averaged, writes={RECORD_FILE: json.dumps(record, indent=1) + "\n"},
                remarks=["weights: " + ", ".join(f"{w:.4g} {s}" for s, w in zip(sources, weights))])

