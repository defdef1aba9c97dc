"""The catalog of published heads: registry.yaml -> schema-checked CatalogEntry records.

The built-in catalog is registered through the same ``register_catalog`` hook a
third-party plugin uses; a plugin may ship its own yaml and call
``load_catalog_file`` on it. The plugin host (eagle_zoo.plugins) stamps every entry
with the name of the plugin that registered it.

File layout (registry.yaml)::

    entries:
      - id: yuhuili/EAGLE3-LLaMA3.1-Instruct-8B     # Hugging Face repo id of the head
        method: eagle3                              # eagle | eagle3
        family: llama                               # model family plugin that serves it
        target: meta-llama/Llama-3.1-8B-Instruct    # target model id
        format: yuhuili-eagle3                      # checkpoint layout (see FORMATS)
        draft_vocab_size: 32000                     # optional, EAGLE-3 reduced vocab
        acceptance_length: 2.811                    # optional, a published number, needs
        acceptance_setting: "MT-bench 80 prompts, K=3, greedy, 1xH100; source: ..."  # its setting
        measured:                                   # optional: what eagle-zoo bench measured,
          - dataset: mt-bench                       # one record per setting (MEASURED_SCHEMA);
            num_prompts: 80                         # `eagle-zoo list` shows the first one,
            device: cpu                             # `eagle-zoo bench --test` compares against
            dtype: float32                          # the one whose setting (SETTING_KEYS)
            batch: 80                               # equals the run's
            k: 3
            max_tokens: 256
            acceptance_length: 2.910
            speedup: 0.96                           # optional: speculative / plain tokens/s
            hardware: "2-core CPU"                  # optional
            source: "BENCHMARKS.md"                 # optional
        num_speculative_tokens: null                # optional: the k to run it at on a GPU
        revision: null                              # optional pinned hub revision
        path: null                                  # optional: the head ships with the plugin,
                                                    # in this directory (relative to the yaml)
        notes: "..."                                # optional
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

import yaml

from .hookspecs import hookimpl

METHODS = ("eagle", "eagle3")

# Checkpoint layouts used by the built-in catalog. Plugins may name other formats
# (ones their own CheckpointFormat registers), so any slug is accepted by the schema.
FORMATS = {
    "yuhuili-eagle": "official EAGLE-1 layout: plain LlamaForCausalLM config, fc + one "
    "decoder layer, no lm_head",
    "yuhuili-eagle3": "official / SpecForge EAGLE-3 layout: LlamaForCausalLMEagle3 config, "
    "midlayer.*, d2t / t2d",
    "speculators-eagle3": "vllm-project/speculators EAGLE-3 (Eagle3Speculator, layers.0.*)",
    "speculators-peagle": "vllm-project/speculators P-EAGLE (parallel drafting)",
    "legacy-vllm": "converted for vLLM < 0.7: {model_type: eagle, model: {...}}, lm_head added",
    "vllm-eagle": "a head saved in vLLM's own EAGLE model layout for the renamed "
    "architecture (DeepSeek, Llama-4 EAGLE)",
    "mistral-eagle": "Mistral-native EAGLE (params.json, eagle_linear, wq/wk/wv/wo names)",
}

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_SLUG = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


class CatalogError(ValueError):
    """A catalog entry or file does not follow the schema."""


class UnknownCatalogId(LookupError):
    """An id that no plugin registered; the message suggests close ids."""


DEVICES = ("cpu", "cuda")
DTYPES = ("float32", "bfloat16", "float16")
# The keys of a measured record that make its setting: `eagle-zoo bench --test` compares
# acceptance only against a record whose setting equals the run's on every one of them.
SETTING_KEYS = ("dataset", "num_prompts", "device", "dtype", "batch", "k", "max_tokens", "temperature")


@dataclass(frozen=True)
class MeasuredRecord:
    """What `eagle-zoo bench` measured for a head in one setting (greedy unless
    ``temperature`` says otherwise; ``batch`` is --max-num-seqs, ``k`` the drafts a step)."""
    dataset: str             # dev | mt-bench | the name of another prompt set
    num_prompts: int
    device: str              # cpu | cuda
    dtype: str               # float32 | bfloat16 | float16
    batch: int
    k: int
    max_tokens: int
    acceptance_length: float
    temperature: float = 0.0
    speedup: Optional[float] = None   # speculative / plain tokens/s, measured in the same run
    hardware: Optional[str] = None    # e.g. "1xH200", "2-core CPU"
    source: Optional[str] = None      # where the number is written down (BENCHMARKS.md, a commit)

    @property
    def setting(self) -> dict:
        return {key: getattr(self, key) for key in SETTING_KEYS}

    def describe(self) -> str:
        """One line: the setting, then the numbers."""
        temp = "greedy" if self.temperature == 0 else f"temperature {self.temperature:g}"
        text = (f"{self.dataset} {self.num_prompts} prompts, {self.device} {self.dtype}, "
                f"batch {self.batch}, k={self.k}, {self.max_tokens} tokens, {temp}: "
                f"acceptance {self.acceptance_length:.3f}")
        if self.speedup is not None:
            text += f", speed-up {self.speedup:.2f}x"
        return "; ".join([text] + [x for x in (self.hardware, self.source) if x])


def format_setting(setting: Mapping[str, Any]) -> str:
    """A setting as `key=value` pairs in SETTING_KEYS order (for messages)."""
    return ", ".join(f"{key}={setting[key]}" for key in SETTING_KEYS if key in setting)


@dataclass(frozen=True)
class CatalogEntry:
    id: str
    method: str
    family: str
    target: str
    format: str
    draft_vocab_size: Optional[int] = None
    acceptance_length: Optional[float] = None
    acceptance_setting: Optional[str] = None  # dataset, k, temperature, hardware, source
    num_speculative_tokens: Optional[int] = None
    revision: Optional[str] = None
    path: Optional[str] = None  # local directory of a head shipped inside a plugin package
    measured: tuple[MeasuredRecord, ...] = ()  # eagle-zoo bench's numbers, one per setting
    notes: str = ""
    source: str = ""  # the plugin that registered it (set by the plugin host)

    @property
    def headline_acceptance(self) -> Optional[float]:
        """The first measured record's acceptance, else the published acceptance_length."""
        return self.measured[0].acceptance_length if self.measured else self.acceptance_length

    @property
    def headline_speedup(self) -> Optional[float]:
        return self.measured[0].speedup if self.measured else None

    def find_measured(self, setting: Mapping[str, Any]) -> Optional[MeasuredRecord]:
        """The record whose setting equals ``setting`` on every key of SETTING_KEYS."""
        for record in self.measured:
            if all(_same(record.setting[key], setting.get(key)) for key in SETTING_KEYS):
                return record
        return None


def _same(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(b, (int, float)) and not isinstance(b, bool) and abs(float(a) - float(b)) < 1e-9
    return a == b


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)  # yaml `true` is not a count


def _opt(check):
    return lambda v: v is None or check(v)


def _is_number(v):
    return _is_int(v) or isinstance(v, float)


def _text(v):
    return isinstance(v, str) and v.strip() != ""


# A measured record's schema: key -> (required, check, what is allowed).
MEASURED_SCHEMA = {
    "dataset": (True, _text, "the prompt set's name given to `eagle-zoo bench --dataset` (dev, mt-bench, ...)"),
    "num_prompts": (True, lambda v: _is_int(v) and v > 0, "a positive integer (--num-prompts)"),
    "device": (True, lambda v: v in DEVICES, "one of " + " | ".join(DEVICES)),
    "dtype": (True, lambda v: v in DTYPES, "one of " + " | ".join(DTYPES)),
    "batch": (True, lambda v: _is_int(v) and v > 0, "a positive integer (--max-num-seqs)"),
    "k": (True, lambda v: _is_int(v) and v > 0, "a positive integer (--num-spec-tokens)"),
    "max_tokens": (True, lambda v: _is_int(v) and v > 0, "a positive integer (--max-tokens)"),
    "acceptance_length": (True, lambda v: _is_number(v) and v >= 1,
                          "a number >= 1 (mean accepted tokens per step, bonus included)"),
    "temperature": (False, lambda v: _is_number(v) and v >= 0, "a number >= 0 (default 0: greedy)"),
    "speedup": (False, _opt(lambda v: _is_number(v) and v > 0),
                "a positive number (speculative / plain tokens/s) or null"),
    "hardware": (False, _opt(_text), "a non-empty string (e.g. '1xH200') or null"),
    "source": (False, _opt(_text), "a non-empty string (where the number is written down) or null"),
}
assert set(MEASURED_SCHEMA) == {f.name for f in fields(MeasuredRecord)}


def parse_measured(value: Any, where: str) -> tuple[MeasuredRecord, ...]:
    """Validate an entry's ``measured`` list; errors name the entry and the record's index."""
    if not isinstance(value, list):
        raise CatalogError(f"{where}: field 'measured' must be a list of records (one per setting), "
                           f"got {type(value).__name__} {value!r}")
    records, seen = [], {}
    for i, item in enumerate(value):
        here = f"{where}: measured[{i}]"
        if not isinstance(item, dict):
            raise CatalogError(f"{here}: expected a mapping of {', '.join(MEASURED_SCHEMA)}; got {item!r}")
        unknown = sorted((k for k in item if k not in MEASURED_SCHEMA), key=str)
        if unknown:
            close = difflib.get_close_matches(str(unknown[0]), list(MEASURED_SCHEMA), n=1)
            raise CatalogError(f"{here}: unknown key {unknown[0]!r}"
                               + (f" (did you mean {close[0]!r}?)" if close else "")
                               + f". Allowed keys: {', '.join(MEASURED_SCHEMA)}")
        for key, (required, check, allowed) in MEASURED_SCHEMA.items():
            if key not in item:
                if required:
                    raise CatalogError(f"{here}: missing required key {key!r} ({allowed})")
                continue
            if not check(item[key]):
                raise CatalogError(f"{here}: key {key!r} must be {allowed}; got {item[key]!r}")
        values = dict(item)
        for key in ("acceptance_length", "temperature", "speedup"):
            if values.get(key) is not None:
                values[key] = float(values[key])
        record = MeasuredRecord(**values)
        key = tuple(record.setting.values())
        if key in seen:
            raise CatalogError(f"{here}: the same setting as measured[{seen[key]}] "
                               f"({format_setting(record.setting)}); keep one record per setting")
        seen[key] = i
        records.append(record)
    return tuple(records)


# The file schema, as data: field -> (required, check(value) -> bool, what is allowed).
# "source" is not a file field: the plugin host sets it.
_SCHEMA = {
    "id": (True, lambda v: isinstance(v, str) and bool(_REPO_ID.match(v)), "a hub repo id 'owner/name'"),
    "method": (True, lambda v: v in METHODS, "one of " + " | ".join(METHODS)),
    "family": (True, lambda v: isinstance(v, str) and bool(_SLUG.match(v)), "a family name such as 'llama'"),
    "target": (True, lambda v: isinstance(v, str) and bool(_REPO_ID.match(v)), "the target's repo id 'owner/name'"),
    "format": (True, lambda v: isinstance(v, str) and bool(_SLUG.match(v)),
               "a format name such as " + ", ".join(FORMATS)),
    "draft_vocab_size": (False, _opt(lambda v: _is_int(v) and v > 0), "a positive integer or null"),
    "acceptance_length": (False, _opt(lambda v: (_is_int(v) or isinstance(v, float)) and v >= 1),
                          "a number >= 1 (mean accepted tokens per step, bonus included) or null"),
    "acceptance_setting": (False, _opt(lambda v: isinstance(v, str) and v.strip() != ""),
                           "a non-empty string (dataset, k, temperature, hardware, source) or null"),
    "num_speculative_tokens": (False, _opt(lambda v: _is_int(v) and v > 0), "a positive integer or null"),
    "revision": (False, _opt(lambda v: isinstance(v, str) and v != ""), "a branch, tag or commit, or null"),
    "path": (False, _opt(lambda v: isinstance(v, str) and v != ""),
             "a directory holding the head, relative to the catalog file, or null"),
    # checked record by record in parse_measured
    "measured": (False, lambda v: True, "a list of measured records"),
    "notes": (False, lambda v: isinstance(v, str), "a string"),
}


def _where(item: Any, index: Optional[int], origin: str) -> str:
    name = item.get("id") if isinstance(item, dict) else None
    parts = [origin] if origin else []
    if isinstance(name, str):
        parts.append(f"entry {name!r}" + (f" (#{index})" if index is not None else ""))
    elif index is not None:
        parts.append(f"entry #{index} (no valid 'id')")
    else:
        parts.append("entry without a valid 'id'")
    return ": ".join(parts)


def parse_entry(item: Any, source: str, *, index: Optional[int] = None, origin: str = "") -> CatalogEntry:
    """Validate one entry (a dict from yaml or from a plugin) and build a CatalogEntry.

    ``source`` names the plugin registering it; ``index`` / ``origin`` (the file)
    only make error messages point at the right place.
    """
    origin = origin or (f"plugin {source!r}" if source else "")
    if not isinstance(item, dict):
        raise CatalogError(
            f"{_where(item, index, origin)}: expected a mapping of catalog fields, got "
            f"{type(item).__name__} {item!r}"
        )
    where = _where(item, index, origin)
    unknown = sorted((k for k in item if k not in _SCHEMA), key=str)
    if unknown:
        key = unknown[0]
        if key == "source":
            why = "'source' is set by the plugin host, do not write it"
        else:
            close = difflib.get_close_matches(str(key), list(_SCHEMA), n=1)
            why = f"unknown field {key!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
        raise CatalogError(f"{where}: {why}. Allowed fields: {', '.join(_SCHEMA)}")
    for key, (required, check, allowed) in _SCHEMA.items():
        if key not in item:
            if required:
                raise CatalogError(f"{where}: missing required field {key!r} ({allowed})")
            continue
        if not check(item[key]):
            raise CatalogError(f"{where}: field {key!r} must be {allowed}; got {item[key]!r}")
    if item.get("acceptance_length") is not None and not item.get("acceptance_setting"):
        raise CatalogError(
            f"{where}: field 'acceptance_setting' is required when 'acceptance_length' is "
            f"given: say the dataset, k, temperature, hardware and where the number comes from"
        )
    values = dict(item)
    values["measured"] = parse_measured(item["measured"], where) if "measured" in item else ()
    if values.get("acceptance_length") is not None:
        values["acceptance_length"] = float(values["acceptance_length"])
    values.setdefault("notes", "")
    return CatalogEntry(**values, source=source)


def load_catalog_file(path: str | Path, source: str = "") -> list[CatalogEntry]:
    """Read a catalog yaml (``entries: [...]``); errors name the file and the entry."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CatalogError(f"cannot read catalog file {path}: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CatalogError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
        raise CatalogError(f"{path}: expected a mapping with an 'entries:' list at the top level")
    extra = sorted(set(data) - {"entries"})
    if extra:
        raise CatalogError(f"{path}: unknown top-level key {extra[0]!r}; only 'entries' is allowed")
    entries, seen = [], {}
    for i, item in enumerate(data["entries"]):
        entry = parse_entry(item, source or str(path), index=i, origin=str(path))
        if entry.path is not None:  # heads shipped with a plugin: relative to its yaml
            entry = replace(entry, path=str((path.parent / entry.path).resolve()))
        if entry.id in seen:
            raise CatalogError(f"{path}: entry {entry.id!r} appears twice (#{seen[entry.id]} and #{i})")
        seen[entry.id] = i
        entries.append(entry)
    return entries


def registry_path() -> Path:
    """The built-in registry.yaml: the copy installed beside the package (placed by
    setup.py at build time) first, else the repository root (editable installs)."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "registry.yaml", here.parent / "registry.yaml"):
        if candidate.is_file():
            return candidate
    raise CatalogError(
        f"registry.yaml not found next to {here} nor at {here.parent}; reinstall eagle-zoo "
        f"(the build copies it into the package) or run from a checkout"
    )


def find_entry(catalog: Mapping[str, CatalogEntry], entry_id: str) -> CatalogEntry:
    """Look an id up; an unknown id raises UnknownCatalogId naming close ids."""
    if entry_id in catalog:
        return catalog[entry_id]
    raise UnknownCatalogId(f"unknown catalog id {entry_id!r}. {suggest(catalog, entry_id)}")


def suggest(ids: Iterable[str], wanted: str) -> str:
    ids = list(ids)
    by_lower = {i.lower(): i for i in ids}
    close = [by_lower[m] for m in difflib.get_close_matches(wanted.lower(), list(by_lower), n=5, cutoff=0.5)]
    tail = wanted.lower().split("/")[-1]
    close += [i for i in ids if tail and tail in i.lower() and i not in close][: 5 - len(close)]
    hint = f"Did you mean: {', '.join(close)}? " if close else ""
    return hint + "Run `eagle-zoo list` to see every id."


@hookimpl
def register_catalog(register):
    for entry in load_catalog_file(registry_path()):
        register(entry)


__all__ = [
    "CatalogEntry", "CatalogError", "UnknownCatalogId", "ENTRY_FIELDS", "FORMATS", "METHODS",
    "MeasuredRecord", "MEASURED_SCHEMA", "SETTING_KEYS", "DEVICES", "DTYPES", "format_setting",
    "parse_measured", "parse_entry", "load_catalog_file", "registry_path", "find_entry", "suggest",
]

# Field order for display (eagle-zoo info); the schema must cover every field.
ENTRY_FIELDS = tuple(f.name for f in fields(CatalogEntry))
assert set(_SCHEMA) | {"source"} == set(ENTRY_FIELDS)
