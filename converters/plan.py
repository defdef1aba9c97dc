"""What a conversion writes, and writing it so that it can't leave a broken checkpoint.

A Plan is data: the output tensors grouped into files (each LazyTensor knows where its
bytes come from), the tensors dropped and why, the config.json to write, the files
copied verbatim. ``describe`` is what --dry-run prints; ``execute`` writes everything
into a temporary directory beside OUT and renames it into place only when complete,
so an interrupted or failed run leaves OUT as it was.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from .errors import ConvertError, OutputExistsError
from .safetensors_out import write_safetensors
from .source import LazyTensor

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(text: str) -> int:
    """'5GB' -> 5e9 bytes (decimal units as Hugging Face uses them; KiB/MiB/GiB binary)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(text))
    unit = m.group(2).upper() if m else None
    if not m or unit not in _UNITS or float(m.group(1)) <= 0:
        raise ConvertError(f"--max-shard-size {text!r}: expected a positive size such as 5GB, 500MB or 2GiB")
    return int(float(m.group(1)) * _UNITS[unit])


def human(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


def pack(tensors: list[LazyTensor], max_bytes: Optional[int]) -> list[list[LazyTensor]]:
    """Greedy shards in order, each at most ``max_bytes`` (a bigger tensor gets its own)."""
    groups: list[list[LazyTensor]] = [[]]
    size = 0
    for t in tensors:
        if max_bytes is not None and groups[-1] and size + t.nbytes > max_bytes:
            groups.append([])
            size = 0
        groups[-1].append(t)
        size += t.nbytes
    return groups


@dataclass
class Plan:
    title: str
    src: Path
    groups: list[list[LazyTensor]]            # one list per output file
    dropped: list[tuple[LazyTensor, str]] = field(default_factory=list)
    config: Optional[dict] = None             # config.json to write (None: not rewritten)
    notes: list[str] = field(default_factory=list)
    copies: list[Path] = field(default_factory=list)
    skipped: list[Path] = field(default_factory=list)
    remarks: list[str] = field(default_factory=list)
    writes: dict[str, str] = field(default_factory=dict)  # other files to write: name -> text
    verbs: dict[str, str] = field(default_factory=dict)  # tensor name -> what --dry-run calls it (e.g. "average"), where not its source's fate

    @property
    def tensors(self) -> list[LazyTensor]:
        return [t for g in self.groups for t in g]

    def file_names(self) -> list[str]:
        n = len(self.groups)
        return [SINGLE_FILE] if n == 1 else [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]

    def check(self) -> None:
        names = [t.name for t in self.tensors]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ConvertError(f"{self.src}: the conversion would write {dup[0]!r} twice (the head holds both spellings)")

    def action(self, t: LazyTensor) -> str:
        if t.name in self.verbs:
            return self.verbs[t.name]
        src_dir = self.src if self.src.is_dir() else self.src.parent
        if t.file.parent.resolve() != src_dir.resolve():
            return "add"
        return "keep" if t.name == t.key else "rename"

    def describe(self, out: Path) -> str:
        lines = [f"convert {self.title}: {self.src} -> {out}"]
        if out.exists():
            lines.append(f"  note: {out} exists; it is replaced only with --force")
        acts = [self.action(t) for t in self.tensors]
        counts = ", ".join(f"{acts.count(a)} {a}" for a in dict.fromkeys(("keep", "rename", "add", *acts)) if a in acts)
        lines.append(f"tensors: {len(self.tensors)} written ({counts}), {len(self.dropped)} dropped")
        width = max([len(t.name) for t in self.tensors] + [len(t.key) for t, _ in self.dropped] + [10])
        col = max([7] + [len(a) + 1 for a in acts])  # "rename " sets the column; a longer verb widens it
        for t, act in zip(self.tensors, acts):
            what = {"rename": f"{t.key} -> {t.name}", "add": f"{t.name} <- {t.file}:{t.key}"}.get(act, t.name)
            lines.append(f"  {act:<{col}}{what:<{width}}  {list(t.shape)} {str(t.dtype).replace('torch.', '')}")
        for t, why in self.dropped:
            lines.append(f"  {'drop':<{col}}{t.key:<{width}}  {list(t.shape)} {str(t.dtype).replace('torch.', '')}  ({why})")
        if self.config is not None:
            lines.append("config.json: " + "; ".join(self.notes))
        elif any(p.name == "config.json" for p in self.copies):
            lines.append("config.json: copied unchanged")
        for fname, g in zip(self.file_names(), self.groups):
            lines.append(f"file: {fname} ({len(g)} tensors, {human(sum(t.nbytes for t in g))})")
        if len(self.groups) > 1:
            lines.append(f"file: {INDEX_FILE}")
        if self.copies:
            lines.append("copied: " + ", ".join(p.name for p in self.copies))
        for name in self.writes:
            lines.append(f"file: {name}")
        if self.skipped:
            lines.append("not copied (weight files this conversion does not use): " + ", ".join(p.name for p in self.skipped))
        lines += [f"note: {r}" for r in self.remarks]
        return "\n".join(lines)

    def execute(self, out: Path, force: bool = False, progress: Optional[bool] = None) -> Path:
        """Write the plan to ``out`` atomically; returns ``out``."""
        from tqdm import tqdm

        self.check()
        out = Path(out).absolute()
        if out.exists() and not force:
            raise OutputExistsError(f"{out} exists; pass --force to replace it, or choose another -o")
        created = _make_parents(out.parent)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
        try:
            _chmod_default(tmp)
            total = sum(t.nbytes for t in self.tensors)
            with tqdm(total=total, unit="B", unit_scale=True, desc=f"convert {self.title}",
                      disable=None if progress is None else not progress) as bar:
                for fname, group in zip(self.file_names(), self.groups):
                    write_safetensors(tmp / fname, group, lambda n, name: (bar.update(n), bar.set_postfix_str(name, refresh=False)))
            if len(self.groups) > 1:
                weight_map = {t.name: f for f, g in zip(self.file_names(), self.groups) for t in g}
                index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
                (tmp / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
            if self.config is not None:
                (tmp / "config.json").write_text(json.dumps(self.config, indent=2) + "\n")
            for p in self.copies:
                shutil.copy2(p, tmp / p.name)
            for name, text in self.writes.items():
                (tmp / name).write_text(text)
            _swap_into_place(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            for d in reversed(created):
                try:
                    d.rmdir()
                except OSError:
                    pass
            raise
        return out


def _make_parents(parent: Path) -> list[Path]:
    """mkdir -p, returning what was created (removed again if the conversion fails)."""
    missing = []
    while not parent.exists():
        missing.append(parent)
        parent = parent.parent
    for d in reversed(missing):
        d.mkdir()
    return list(reversed(missing))


def _chmod_default(path: Path) -> None:
    # mkdtemp makes 0700; the result should get the permissions of a normal mkdir.
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o777 & ~umask)


def _swap_into_place(tmp: Path, out: Path) -> None:
    if not out.exists() and not out.is_symlink():
        os.rename(tmp, out)
        return
    # --force: move the old one aside first, so a failure between the renames still
    # leaves one complete checkpoint under a known name.
    old = out.with_name(f".{out.name}.{os.getpid()}.old")
    os.rename(out, old)
    try:
        os.rename(tmp, out)
    except BaseException:
        os.rename(old, out)
        raise
    if old.is_dir() and not old.is_symlink():
        shutil.rmtree(old)
    else:
        old.unlink()
