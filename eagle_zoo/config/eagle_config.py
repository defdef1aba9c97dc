"""EagleConfig: a draft head's configuration, and the architecture renaming rule.

A head's config.json comes in two shapes:

* legacy nested (vLLM < 0.7 conversions): ``{"model_type": "eagle", "model": {<inner HF
  config>}, "truncated_vocab_size": ..., "eagle_fc_bias": ...}``;
* flat (yuhuili, SpecForge): the whole file is the inner HF config, possibly with
  non-HF keys such as ``bias`` or ``draft_vocab_size``.

Either way EagleConfig keeps the inner config as a transformers config (``.model``),
the top-level keys as attributes, and derives ``method``, the renamed
``architectures`` and ``truncated_vocab_size``. Reads fall back from the top level to
the inner config. ``to_dict`` writes back exactly what was read (plus later edits), in
the shape it was read in, so a round trip never loses or invents keys.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Optional, Union

SUPPORTED_METHODS = ("eagle", "eagle3")
LEGACY_MODEL_TYPE = "eagle"
CONFIG_FILE = "config.json"


def is_eagle3_architecture(arch: str) -> bool:
    """True for names already in EAGLE-3 form (Eagle3LlamaForCausalLM, LlamaForCausalLMEagle3)."""
    return arch.startswith("Eagle3") or arch.endswith("Eagle3")


def rename_architecture(arch: str, method: str) -> str:
    """The head architecture for a target architecture: Eagle<Arch> / Eagle3<Arch>.

    Idempotent: names already in the method's form are returned unchanged.
    """
    if not isinstance(arch, str) or not arch:
        raise ValueError(f"architecture names are non-empty strings, got {arch!r}")
    if method == "eagle":
        return arch if arch.startswith("Eagle") else f"Eagle{arch}"
    if method == "eagle3":
        return arch if is_eagle3_architecture(arch) else f"Eagle3{arch}"
    raise ValueError(
        f"unsupported EAGLE method {method!r} for architecture {arch!r}; "
        f"supported methods: {', '.join(map(repr, SUPPORTED_METHODS))}"
    )


def _check_method(method: Any) -> str:
    if method not in SUPPORTED_METHODS:
        raise ValueError(
            f"config key 'method' is {method!r}; EagleConfig supports "
            f"{' or '.join(map(repr, SUPPORTED_METHODS))} (other methods have no EAGLE head)"
        )
    return method


def _check_architectures(archs: Any, where: str) -> list:
    if not isinstance(archs, list) or not all(isinstance(a, str) and a for a in archs):
        hint = f'; write ["{archs}"]' if isinstance(archs, str) else ""
        raise ValueError(f"{where} 'architectures' must be a list of names, got {archs!r}{hint}")
    return archs


def _check_vocab_size(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"config key 'truncated_vocab_size' must be a positive integer, got {value!r}")
    return value


def _check_dtype_keys(fields: dict, path: str = "") -> None:
    """transformers reads every 'dtype' key of a config, in nested objects too, as a torch
    dtype name (configuration_utils' dict_dtype_to_str: an IndexError on a list, a float
    cut at its point): refuse any value but a name, an integer, an object or null, by path."""
    for key, value in fields.items():
        where = f"{path}{key}"
        if key == "dtype" and value is not None and not isinstance(value, (str, int, dict)):
            raise ValueError(f"config key '{where}' is {value!r}: transformers reads a 'dtype' key as a torch "
                             f"dtype name; give one as a string (e.g. \"bfloat16\") or remove the key")
        if isinstance(value, dict):
            _check_dtype_keys(value, f"{where}.")


def _build_hf_config(fields: dict, where: str = ""):
    """The inner config as transformers' own class, or a plain PretrainedConfig; ``where``:
    the fields' place in the file ("model." in the nested form), for error messages."""
    from transformers import AutoConfig, PretrainedConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    _check_dtype_keys(fields, where)
    model_type = fields.get("model_type")
    try:
        if isinstance(model_type, str) and model_type in CONFIG_MAPPING:
            kwargs = {k: v for k, v in fields.items() if k != "model_type"}
            return AutoConfig.for_model(model_type, **kwargs)
        # Unknown (or missing) model_type: keep every field as a plain attribute.
        return PretrainedConfig(**fields)
    except Exception as exc:  # transformers raises several types; name the config and the cause
        cause = " ".join(str(exc).split()).rstrip(".")
        raise ValueError(
            f"transformers rejected the inner model config (model_type={model_type!r}): {cause}. "
            f"Fix that key in the config."
        ) from exc


class EagleConfig:
    """Configuration of an EAGLE / EAGLE-3 head. See the module docstring.

    Keyword construction is the nested form:
    ``EagleConfig(model=LlamaConfig(...) or {...}, method="eagle3", draft_vocab_size=32000)``.
    """

    def __init__(self, model: Any = None, method: Optional[str] = None, **kwargs: Any):
        from transformers import PretrainedConfig

        if isinstance(model, PretrainedConfig):
            raw = {k: v for k, v in model.to_diff_dict().items() if k != "transformers_version"}
            hf = model
        elif isinstance(model, dict):
            raw = copy.deepcopy(model)
            hf = _build_hf_config(raw, "model.")
        else:
            raise ValueError(
                f"EagleConfig needs model=<the inner HF config, a PretrainedConfig or dict>, got "
                f"{type(model).__name__}; for a flat config.json use EagleConfig.from_dict(d)"
            )
        top = dict(kwargs)
        if method is not None:
            top["method"] = method
        self._setup(hf, raw, top, nested=True)

    def _setup(self, hf, raw: dict, top: dict, nested: bool) -> None:
        set_ = object.__setattr__
        set_(self, "model", hf)
        set_(self, "_inner_raw", raw)  # inner keys exactly as written
        set_(self, "_top", top)  # top-level keys exactly as written (or set later)
        set_(self, "_nested", nested)
        # What transformers made of the inner keys; edits through cfg.model show up as
        # differences from this snapshot and are written back by to_dict().
        set_(self, "_baseline", copy.deepcopy(hf.to_dict()))
        if "method" in top:
            _check_method(top["method"])
        if "architectures" in top:
            _check_architectures(top["architectures"], "top-level")
        if raw.get("architectures") is not None:
            _check_architectures(raw["architectures"], "inner config")
        if top.get("truncated_vocab_size") is not None:
            _check_vocab_size(top["truncated_vocab_size"])

    # -- construction from / to dicts and files --------------------------------
    @classmethod
    def from_dict(cls, config: dict, method: Optional[str] = None) -> "EagleConfig":
        """Read either config shape; ``method`` (if given) overrides the file's."""
        if not isinstance(config, dict):
            raise ValueError(f"an EAGLE config is a JSON object, got {type(config).__name__}")
        config = copy.deepcopy(config)
        inner = config.get("model")
        nested = config.get("model_type") == LEGACY_MODEL_TYPE or isinstance(inner, dict)
        self = cls.__new__(cls)
        if nested:
            if not isinstance(inner, dict):
                raise ValueError(
                    "config has model_type 'eagle' (the legacy nested form) but no 'model' object; "
                    "put the draft's HF config under 'model', or drop model_type 'eagle' for a flat config"
                )
            if config.get("model_type", LEGACY_MODEL_TYPE) != LEGACY_MODEL_TYPE:
                raise ValueError(
                    f"config has a 'model' object but model_type {config['model_type']!r}; "
                    f"the legacy nested form has model_type 'eagle'"
                )
            top = {k: v for k, v in config.items() if k not in ("model_type", "model")}
            raw = inner
        else:
            top = {"method": config.pop("method")} if "method" in config else {}
            raw = config
        if method is not None:
            top["method"] = method
        self._setup(_build_hf_config(raw, "model." if nested else ""), raw, top, nested)
        return self

    def to_dict(self) -> dict:
        """The config in the shape it was read, with every key as written plus later edits."""
        inner = copy.deepcopy(self._inner_raw)
        for key, value in self.model.to_dict().items():
            if key not in self._baseline or self._baseline[key] != value:
                inner[key] = value
        top = copy.deepcopy(self._top)
        if self._nested:
            return {"model_type": LEGACY_MODEL_TYPE, "model": inner, **top}
        return {**inner, **top}

    @classmethod
    def from_pretrained(cls, path: Union[str, Path], method: Optional[str] = None) -> "EagleConfig":
        """Read ``<path>/config.json`` (or ``path`` itself when it is a file)."""
        path = Path(path)
        file = path / CONFIG_FILE if path.is_dir() else path
        if not file.is_file():
            raise FileNotFoundError(
                f"no {CONFIG_FILE} at {path}: an EAGLE head directory needs its config.json "
                f"(point at the checkpoint directory, or download the full checkpoint)"
            )
        try:
            config = json.loads(file.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{file} is not valid JSON ({exc}); fix or re-download it") from None
        try:
            return cls.from_dict(config, method=method)
        except ValueError as exc:
            raise ValueError(f"{file}: {exc}") from exc

    def save_pretrained(self, directory: Union[str, Path]) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        file = directory / CONFIG_FILE
        file.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return file

    # -- derived attributes ------------------------------------------------------
    @property
    def method(self) -> str:
        """The top-level ``method`` if written; else eagle3 when the config says EAGLE-3."""
        method = self._top.get("method")
        if method is not None:
            return method
        archs = self._top.get("architectures") or self._inner_raw.get("architectures") or []
        if any(is_eagle3_architecture(a) for a in archs) or self._lookup("draft_vocab_size") is not None:
            return "eagle3"
        return "eagle"

    @method.setter
    def method(self, value: str) -> None:
        self._top["method"] = _check_method(value)

    @property
    def architectures(self) -> list:
        """Head architectures: the top-level (else inner) names, renamed for the method."""
        archs = self._top.get("architectures")
        if archs is None:
            archs = self._inner_raw.get("architectures") or getattr(self.model, "architectures", None) or []
        return [rename_architecture(a, self.method) for a in archs]

    @architectures.setter
    def architectures(self, value: list) -> None:
        self._top["architectures"] = _check_architectures(value, "top-level")

    @property
    def truncated_vocab_size(self) -> Optional[int]:
        """Written value, else the inner config's vocab size."""
        value = self._top.get("truncated_vocab_size")
        if value is None:
            value = getattr(self.model, "vocab_size", None) or self._inner_raw.get("vocab_size")
        return value

    @truncated_vocab_size.setter
    def truncated_vocab_size(self, value: int) -> None:
        self._top["truncated_vocab_size"] = _check_vocab_size(value)

    # -- attribute access: top level first, then the inner config ---------------
    _MISSING = object()

    def _lookup(self, name: str, default: Any = None) -> Any:
        if name in self._top:
            return self._top[name]
        value = getattr(self.model, name, self._MISSING)
        if value is self._MISSING:
            # transformers may rename a key it was given (rope_theta -> rope_parameters);
            # the key as written stays readable.
            value = self._inner_raw.get(name, default)
        return value

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or "_top" not in self.__dict__:
            raise AttributeError(name)
        value = self._lookup(name, self._MISSING)
        if value is self._MISSING:
            raise AttributeError(
                f"EagleConfig has no key {name!r}: not at the top level and not in the inner "
                f"{self._inner_raw.get('model_type', 'model')!r} config; add it to config.json "
                f"or use getattr(config, {name!r}, default)"
            )
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_") or isinstance(getattr(type(self), name, None), property):
            object.__setattr__(self, name, value)
        elif name == "model":
            raise AttributeError(
                "EagleConfig.model cannot be replaced; edit its fields (config.model.hidden_size = ...) "
                "or build a new EagleConfig(model=...)"
            )
        else:
            self._top[name] = value  # a top-level key: overrides the inner one, written by to_dict

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, EagleConfig):
            return NotImplemented
        return self.method == other.method and self.to_dict() == other.to_dict()

    __hash__ = None  # mutable

    def __repr__(self) -> str:
        derived = ("method", "architectures", "truncated_vocab_size")
        extra = "".join(
            f", {k}={_short(v)}" for k, v in self._top.items() if k not in derived
        )
        return (
            f"EagleConfig(method={self.method!r}, architectures={self.architectures!r}, "
            f"model={type(self.model).__name__}(model_type={self._inner_raw.get('model_type')!r}, "
            f"hidden_size={getattr(self.model, 'hidden_size', None)!r}, "
            f"num_hidden_layers={getattr(self.model, 'num_hidden_layers', None)!r}), "
            f"truncated_vocab_size={self.truncated_vocab_size!r}{extra})"
        )


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
