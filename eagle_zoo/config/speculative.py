"""SpeculativeConfig: the user's ``speculative_config``, validated, with the method inferred.

Same keys and meaning as vLLM's ``--speculative-config``. Two things differ on purpose:
when ``method`` is absent the draft checkpoint's config.json is read before the name
is trusted (so ``EAGLE-3-...`` is not taken for EAGLE-1), and every error says what to
write instead. docs/speculative-config.md lists the fields, rules and errors.
"""
from __future__ import annotations

import difflib
import json
import os
import re
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from .eagle_config import CONFIG_FILE, LEGACY_MODEL_TYPE, is_eagle3_architecture
from . import depth_schedule

# The values speculative_config's quantization takes besides None (models/quantization.py).
QUANTIZATIONS = ("fp8",)


class SpeculativeConfigError(ValueError):
    """A speculative_config the engine cannot run; the message says what to change."""


METHODS = ("eagle", "eagle3", "ngram", "draft_model", "mtp")
# Only EAGLE-3 heads trained for it (P-EAGLE) draft all K tokens in one pass.
PARALLEL_DRAFTING_METHODS = ("eagle3",)
TREE_METHODS = ("eagle", "eagle3")
NEEDS_MODEL = ("eagle", "eagle3", "draft_model")  # mtp defaults to the target itself
NGRAM_MODELS = ("ngram", "[ngram]")
DEFAULT_PROMPT_LOOKUP = 5
# Draft configs whose model_type marks built-in multi-token-prediction layers.
MTP_MODEL_TYPES = (
    "mtp", "deepseek_mtp", "mimo_mtp", "glm4_moe_mtp", "glm4_moe_lite_mtp", "ernie_mtp",
    "qwen3_next_mtp", "longcat_flash_mtp", "pangu_ultra_moe_mtp",
)
# A target config with MTP layers, used as the draft, is an MTP draft (as in vLLM).
MTP_LAYER_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers")
EAGLE3_CONFIG_KEYS = ("draft_vocab_size", "eagle_aux_hidden_state_layer_ids")
SPECULATORS_TYPES = {"eagle3": ("eagle3", False), "peagle": ("eagle3", True), "eagle": ("eagle", False)}
# The config.json key by which a head written by `eagle-zoo train` states its method
# (train/save.py), so that inference never depends on the directory's name.
HEAD_METHOD_KEY = "eagle_zoo_method"
HEAD_METHODS = ("eagle", "eagle3")
# Tensor names only EAGLE heads have (a separate draft model has none of them):
# EAGLE-1's fc, EAGLE-3's midlayer and vocabulary maps.
EAGLE_WEIGHT_MARKERS = ("fc.weight", "midlayer.", "d2t", "t2d")

SAMPLING_KEYS = (
    "temperature", "top_p", "top_k", "min_p", "seed", "max_tokens", "min_tokens", "n",
    "best_of", "presence_penalty", "frequency_penalty", "repetition_penalty", "stop",
    "stop_token_ids", "ignore_eos", "logprobs", "prompt_logprobs",
)
INTERNAL_KEYS = (
    "target_model_config", "target_parallel_config", "draft_model_config",
    "draft_parallel_config", "inferred_from",
)
TREE_KEYS = ("top_k", "depth", "total_tokens")

ConfigReader = Callable[[str], Optional[dict]]
# The reader parse() was given; a context variable because pydantic does not pass
# validation context through a model with its own __init__.
_READER: ContextVar[Optional[ConfigReader]] = ContextVar("eagle_zoo_config_reader", default=None)


def _error(message: str) -> SpeculativeConfigError:
    return SpeculativeConfigError(f"speculative_config: {message}")


def _unknown_key(key: Any, valid: tuple, where: str) -> SpeculativeConfigError:
    close = difflib.get_close_matches(str(key), valid, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return SpeculativeConfigError(f"{where}: unknown key {key!r}; {hint}valid keys: {', '.join(valid)}")


# -- reading the draft checkpoint's config ------------------------------------
def read_local_config(model: str) -> Optional[dict]:
    """``<model>/config.json`` when ``model`` is a local directory that has one, else None."""
    path = Path(model)
    file = path / CONFIG_FILE
    if not path.is_dir() or not file.is_file():
        return None
    try:
        config = json.loads(file.read_text())
    except json.JSONDecodeError as exc:
        raise _error(f"{file} is not valid JSON ({exc}); fix it or set 'method' explicitly") from None
    return config if isinstance(config, dict) else None


# -- method inference -----------------------------------------------------------
@dataclass(frozen=True)
class Inference:
    method: str
    parallel_drafting: bool
    reason: str


def infer_method(model: str, config_reader: Optional[ConfigReader] = None) -> Inference:
    """The method for a draft ``model`` when the user gave none; ``reason`` says why."""
    model = str(model)
    if model.strip() in NGRAM_MODELS:
        return Inference("ngram", False, f"model is {model!r}")
    return _infer(model, (config_reader or read_local_config)(model))


def _infer(model: str, config: Optional[dict]) -> Inference:
    if model.strip() in NGRAM_MODELS:
        return Inference("ngram", False, f"model is {model!r}")
    found = _infer_from_config(config) if config is not None else None
    return found or _infer_from_name(model, had_config=config is not None)


def _archs(config: dict) -> list:
    archs = config.get("architectures")
    return [a for a in archs if isinstance(a, str)] if isinstance(archs, list) else []


def _infer_from_config(config: dict) -> Optional[Inference]:
    def found(method: str, why: str, parallel: bool = False) -> Inference:
        return Inference(method, parallel, f"config.json has {why}")

    declared = config.get(HEAD_METHOD_KEY)
    if declared is not None:
        if declared not in HEAD_METHODS:
            raise _error(
                f"the draft's config.json has {HEAD_METHOD_KEY}={declared!r}; it must be one of "
                f"{', '.join(map(repr, HEAD_METHODS))}: fix the key or set 'method' explicitly"
            )
        return found(declared, f"{HEAD_METHOD_KEY}={declared!r} (the method the head states)")

    kind = config.get("speculators_model_type")
    if kind is not None:
        if kind not in SPECULATORS_TYPES:
            raise _error(
                f"the draft's config.json has speculators_model_type={kind!r}, which eagle-zoo does "
                f"not serve (known: {', '.join(SPECULATORS_TYPES)}); set 'method' explicitly if a "
                f"plugin provides it"
            )
        method, parallel = SPECULATORS_TYPES[kind]
        return found(method, f"speculators_model_type={kind!r}", parallel)

    # The legacy nested form keeps the head's own config under "model".
    inner = config.get("model") if config.get("model_type") == LEGACY_MODEL_TYPE else None
    inner = inner if isinstance(inner, dict) else {}
    for where, cfg in (("", config), ("model.", inner)):
        for arch in _archs(cfg):
            if is_eagle3_architecture(arch):
                return found("eagle3", f"{where}architectures={_archs(cfg)!r} (an EAGLE-3 name)")
        for arch in _archs(cfg):
            if arch.startswith("Eagle"):
                return found("eagle", f"{where}architectures={_archs(cfg)!r} (an EAGLE name)")
    if config.get("model_type") == LEGACY_MODEL_TYPE:
        method = config.get("method") if config.get("method") in ("eagle", "eagle3") else "eagle"
        return found(method, f"model_type='eagle' (legacy nested EAGLE config, method {method!r})")
    for where, cfg in (("", config), ("model.", inner)):
        for key in EAGLE3_CONFIG_KEYS:
            if key in cfg:
                return found("eagle3", f"{where}{key} (an EAGLE-3 field)")
    model_type = config.get("model_type")
    if isinstance(model_type, str) and (model_type in MTP_MODEL_TYPES or model_type.endswith("_mtp")):
        return found("mtp", f"model_type={model_type!r} (multi-token prediction)")
    for key in MTP_LAYER_KEYS:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return found("mtp", f"{key}={value} (built-in MTP layers)")
    return None


# Markers start a word ("seagle-" is no EAGLE name); eagle3 / eagle-3 / eagle_3 must not
# run on into a digit ("EAGLE-34B" is no EAGLE-3 name).
_EAGLE3_NAME = re.compile(r"(?<![a-z])eagle[-_]?3(?!\d)", re.IGNORECASE)
_EAGLE_NAME = re.compile(r"^eagle|(?<![a-z])eagle-", re.IGNORECASE)


def _infer_from_name(model: str, had_config: bool) -> Inference:
    name = model.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]
    prefix = "config.json matched no rule; " if had_config else ""
    match = _EAGLE3_NAME.search(name)
    if match:
        return Inference("eagle3", False, f"{prefix}the name {name!r} contains {match.group()!r}")
    match = _EAGLE_NAME.search(name)
    if match:
        return Inference("eagle", False, f"{prefix}the name {name!r} contains {match.group()!r}")
    return Inference(
        "draft_model", False,
        f"{prefix}the name {name!r} has no EAGLE marker: a separate draft model "
        f"(set 'method' to choose another)",
    )


def eagle_weights_error(model: str, tensor_names, inferred_from: Optional[str]) -> Optional[SpeculativeConfigError]:
    """The error for a draft taken as ``draft_model`` whose checkpoint holds EAGLE head
    weights (which a separate draft model never has); None when it holds none.
    ``inferred_from`` is why draft_model was inferred, None when it was given."""
    found = [n for n in tensor_names if any(n.startswith(m) for m in EAGLE_WEIGHT_MARKERS)]
    if not found:
        return None
    method = "eagle3" if any(n.startswith(("midlayer.", "d2t", "t2d")) for n in found) else "eagle"
    how = (f"method was inferred as 'draft_model' because {inferred_from}" if inferred_from
           else "speculative_config sets method='draft_model'")
    return _error(
        f"speculative_config model {model!r} holds EAGLE head weights ({', '.join(found[:3])}), but {how}; "
        f"a draft_model must be a whole model sharing the target's vocabulary. Set speculative_config "
        f"'method' to {method!r} (e.g. {{\"method\": \"{method}\", \"model\": {str(model)!r}}})"
    )


def _speculators_default_k(config: Optional[dict]) -> Optional[int]:
    """speculators_config.proposal_methods[0].speculative_tokens, when present."""
    try:
        k = config["speculators_config"]["proposal_methods"][0]["speculative_tokens"]
    except (KeyError, IndexError, TypeError):
        return None
    return k if isinstance(k, int) and not isinstance(k, bool) and k > 0 else None


# -- the config -------------------------------------------------------------------
class TreeConfig(BaseModel):
    """EAGLE-2 dynamic draft tree (defaults from the official EAGLE code)."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    top_k: int = 10
    depth: int = 6
    total_tokens: int = 60

    @field_validator("top_k", "depth", "total_tokens")
    @classmethod
    def _positive(cls, value: int, info: ValidationInfo) -> int:
        least = 2 if info.field_name == "total_tokens" else 1  # the root plus one draft node
        if value < least:
            raise _error(f"tree.{info.field_name} must be >= {least}, got {value}")
        return value

    @model_validator(mode="after")
    def _enough_candidates(self) -> "TreeConfig":
        # The root's top_k children plus top_k * top_k per expansion round are all the
        # candidates there are (engine/tree_proposer.py); the tree needs total_tokens - 1.
        most = 1 + self.top_k + self.depth * self.top_k ** 2
        if self.total_tokens > most:
            raise _error(
                f"tree.total_tokens={self.total_tokens} but top_k={self.top_k} and depth={self.depth} draft "
                f"only {most - 1} candidates, so total_tokens can be at most {most}: lower total_tokens "
                f"or raise top_k / depth"
            )
        return self


class SpeculativeConfig(BaseModel):
    """A validated speculative_config. Build with ``SpeculativeConfig.parse(obj)``."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, protected_namespaces=())

    method: str
    model: Optional[str] = None
    num_speculative_tokens: Optional[int] = None
    draft_tensor_parallel_size: Optional[int] = None
    # vLLM's option for attention backends without padded batches; only false here.
    disable_padded_drafter_batch: bool = False
    parallel_drafting: bool = False
    prompt_lookup_min: Optional[int] = None
    prompt_lookup_max: Optional[int] = None
    # The longest context the draft serves; the engine's max_model_len must fit in it
    # (LLM: it caps the default, and a larger explicit one is an error).
    max_model_len: Optional[int] = None
    revision: Optional[str] = None
    # "fp8": the draft's linear layers and lm_head run from fp8 weights with row scales
    # made at load (models/quantization.py; CUDA only); None: the engine's dtype.
    quantization: Optional[str] = None
    # True: the draft's passes run eagerly (no CUDA graphs) while the target keeps its;
    # None / False: the draft follows the engine's enforce_eager (False with an eager
    # engine is refused, LLM).
    enforce_eager: Optional[bool] = None
    tree: Optional[TreeConfig] = None
    # Adaptive depth: "auto" or {"<smallest batch size>": K}; config/depth_schedule.py.
    num_speculative_tokens_by_batch_size: Union[None, str, dict[str, int]] = None
    # Why `method` has its value when the user gave none; None when given.
    inferred_from: Optional[str] = Field(default=None, exclude=True)

    def __init__(self, **data: Any):
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise SpeculativeConfigError(_describe(exc)) from None

    @classmethod
    def parse(
        cls, obj: Union[None, str, bytes, dict, "SpeculativeConfig"],
        config_reader: Optional[ConfigReader] = None,
    ) -> Optional["SpeculativeConfig"]:
        """From a dict, a JSON string (``--speculative-config '{...}'``) or None (no speculation)."""
        if obj is None or isinstance(obj, cls):
            return obj
        if isinstance(obj, (str, bytes)):
            try:
                obj = json.loads(obj)
            except json.JSONDecodeError as exc:
                raise _error(
                    f"not valid JSON ({exc.msg} at column {exc.colno}); write a JSON object such as "
                    "'{\"method\": \"eagle3\", \"model\": \"<draft>\", \"num_speculative_tokens\": 3}'"
                ) from None
        if not isinstance(obj, dict):
            raise _error(f"expected a JSON object (dict) of options, got {type(obj).__name__}")
        if not all(isinstance(key, str) for key in obj):
            raise _error(f"option names are strings, got {[k for k in obj if not isinstance(k, str)]!r}")
        token = _READER.set(config_reader)
        try:
            return cls(**obj)
        finally:
            _READER.reset(token)

    # -- before field validation: keys, inference, defaults -----------------------
    @model_validator(mode="before")
    @classmethod
    def _prepare(cls, data: Any) -> dict:
        if not isinstance(data, dict):
            raise _error(f"expected a JSON object (dict) of options, got {type(data).__name__}")
        _check_keys(data)
        data = dict(data)
        if isinstance(data.get("model"), os.PathLike):
            data["model"] = os.fspath(data["model"])
        method, model = data.get("method"), data.get("model")
        if method is not None:
            _check_method(method)
        elif model is None:
            raise _error("give 'method' or 'model' (the draft checkpoint); e.g. {\"method\": \"ngram\"}")

        # The checkpoint's config decides the method (when absent) and the defaults
        # that speculators configs carry.
        config = None
        if isinstance(model, str) and model.strip() not in NGRAM_MODELS and method != "ngram":
            config = (_READER.get() or read_local_config)(model)
        if method is None:
            found = _infer(str(model), config)
            data["method"], data["inferred_from"] = found.method, found.reason
        _prepare_depth_schedule(data)
        if data.get("tree") not in (None, False):
            # A tree's drafts are set by its depth and total_tokens; a speculators config's
            # default K is for a chain and is not filled in.
            if data.get("num_speculative_tokens") is not None:
                raise _error(
                    f"num_speculative_tokens={data['num_speculative_tokens']!r} with 'tree': the tree's depth "
                    f"and total_tokens decide what it drafts; remove num_speculative_tokens (or 'tree' for a chain)"
                )
        elif data.get("num_speculative_tokens") is None:
            data["num_speculative_tokens"] = _speculators_default_k(config)
        if data.get("parallel_drafting") is None and data["method"] == "eagle3":
            # A P-EAGLE head is trained to draft in parallel; the user may still say false.
            data["parallel_drafting"] = bool(config and config.get("speculators_model_type") == "peagle")

        lookup = ("prompt_lookup_min", "prompt_lookup_max")
        if data["method"] == "ngram":
            # Prompt lookup loads no checkpoint: a draft model or revision would go unread.
            if isinstance(model, str) and model.strip() not in NGRAM_MODELS:
                raise _error(f"method 'ngram' drafts from the prompt and loads no draft model, so model={model!r} "
                             f"would be ignored; drop 'model' (or give 'model' alone for a draft checkpoint)")
            if data.get("revision") is not None:
                raise _error(f"method 'ngram' loads no draft model, so revision={data['revision']!r} would be "
                             f"ignored; drop 'revision'")
            lo, hi = data.get(lookup[0]), data.get(lookup[1])
            if lo is None and hi is None:
                lo = hi = DEFAULT_PROMPT_LOOKUP
            data[lookup[0]] = hi if lo is None else lo  # one given: copy it to the other
            data[lookup[1]] = lo if hi is None else hi
        elif any(data.get(k) is not None for k in lookup):
            raise _error(
                f"prompt_lookup_min/max apply to method 'ngram' only (method is {data['method']!r}); "
                f"remove them or set \"method\": \"ngram\""
            )

        tree = data.get("tree")
        if tree is True:
            data["tree"] = {}
        elif tree is False:
            data["tree"] = None
        elif isinstance(tree, dict):
            for key in tree:
                if key not in TREE_KEYS:
                    raise _unknown_key(key, TREE_KEYS, "speculative_config.tree")
        elif tree is not None:
            raise _error(f"'tree' must be true or an object with {', '.join(TREE_KEYS)}, got {tree!r}")
        return data

    @field_validator("num_speculative_tokens", "draft_tensor_parallel_size", "max_model_len")
    @classmethod
    def _positive(cls, value: Optional[int], info: ValidationInfo) -> Optional[int]:
        if value is not None and value <= 0:
            what = {
                "num_speculative_tokens": "the number of draft tokens per step, e.g. 3",
                "draft_tensor_parallel_size": "1 or the target's tensor_parallel_size",
                "max_model_len": "a token count, or leave it out to use the target's",
            }[info.field_name]
            raise _error(f"{info.field_name} must be > 0, got {value}; it is {what}")
        return value

    # -- after: combinations ----------------------------------------------------------
    @model_validator(mode="after")
    def _check_combinations(self) -> "SpeculativeConfig":
        if self.quantization is not None and self.quantization not in QUANTIZATIONS:
            raise _error(
                f"quantization={self.quantization!r}: drafts run in the engine's dtype or, with "
                f"quantization='fp8', from fp8 weights; give 'fp8' or leave 'quantization' out"
            )
        if self.quantization is not None and self.method == "ngram":
            raise _error(f"quantization={self.quantization!r}: method 'ngram' runs no draft model to quantize: "
                         f"remove quantization")
        if self.method in NEEDS_MODEL and not self.model:
            raise _error(f"method {self.method!r} needs 'model': the draft checkpoint's id or directory")
        if self.parallel_drafting and self.method not in PARALLEL_DRAFTING_METHODS:
            raise _error(
                f"parallel_drafting needs a head trained to draft in parallel (P-EAGLE, method "
                f"'eagle3'); method {self.method!r} drafts one token at a time: remove parallel_drafting"
            )
        if self.method == "ngram":
            if self.enforce_eager is not None:
                raise _error(f"enforce_eager={self.enforce_eager!r}: method 'ngram' looks drafts up in the prompt "
                             f"and runs no draft model, eager or graphed: remove enforce_eager")
            lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
            if lo < 1 or hi < 1:
                raise _error(f"prompt_lookup_min/max must be >= 1, got min={lo}, max={hi}")
            if lo > hi:
                raise _error(
                    f"prompt_lookup_min ({lo}) > prompt_lookup_max ({hi}); "
                    f"the n-gram window needs min <= max: swap them or raise prompt_lookup_max"
                )
        if self.disable_padded_drafter_batch:
            raise _error(
                "disable_padded_drafter_batch=true: this engine's EAGLE catch-up is always the padded "
                "pass over all K + 1 verified positions, part of the step's CUDA graph, and drafts the "
                "same tokens the unpadded one would: remove disable_padded_drafter_batch"
            )
        if self.num_speculative_tokens_by_batch_size is not None and self.tree is not None:
            raise _error(
                f"{depth_schedule.OPTION} chooses a chain's depth per batch size and does not combine "
                f"with 'tree' (whose depth is tree.depth): remove one of them"
            )
        if self.tree is not None and self.method not in TREE_METHODS:
            raise _error(
                f"'tree' (EAGLE-2 dynamic tree) applies to methods {' and '.join(TREE_METHODS)}; "
                f"method {self.method!r} drafts a single chain: remove 'tree'"
            )
        return self

    def validate_against_target(self, target_tp: int, pipeline_parallel_size: int = 1) -> int:
        """Check against the target's parallelism; returns the draft's tensor-parallel size."""
        if pipeline_parallel_size != 1:
            raise _error(
                f"speculative decoding does not combine with pipeline parallelism "
                f"(pipeline_parallel_size={pipeline_parallel_size}); use tensor parallelism instead"
            )
        tp = self.draft_tensor_parallel_size
        if tp is None:
            return target_tp
        if tp not in (1, target_tp):
            raise _error(
                f"draft_tensor_parallel_size={tp} but the target runs with tensor_parallel_size="
                f"{target_tp}; use 1 or {target_tp} (or leave it out for {target_tp})"
            )
        return tp


USER_KEYS = tuple(k for k in SpeculativeConfig.model_fields if k != "inferred_from")


def _check_keys(data: dict) -> None:
    for key in data:
        if key == "tensor_parallel_size":
            raise _error(
                "'tensor_parallel_size' is not a speculative option; use 'draft_tensor_parallel_size' "
                "(1 or the target's tensor_parallel_size)"
            )
        if key in SAMPLING_KEYS:
            tree = f" (for the EAGLE-2 tree's {key} write \"tree\": {{\"{key}\": ...}})" if key in TREE_KEYS else ""
            raise _error(
                f"{key!r} is a sampling parameter: pass it in SamplingParams (or the request), "
                f"not in speculative_config{tree}"
            )
        if key in INTERNAL_KEYS:
            raise _error(f"{key!r} is internal, filled by the engine: remove it")
        if key in TREE_KEYS:
            raise _error(f"{key!r} is a tree option: write \"tree\": {{\"{key}\": ...}}")
        if key not in USER_KEYS:
            sampling = difflib.get_close_matches(str(key), SAMPLING_KEYS, n=1, cutoff=0.8)
            if sampling and not difflib.get_close_matches(str(key), USER_KEYS, n=1):
                raise _error(
                    f"unknown key {key!r}; {sampling[0]!r} is a sampling parameter: pass it in "
                    f"SamplingParams (or the request), not in speculative_config"
                )
            raise _unknown_key(key, USER_KEYS, "speculative_config")


def _prepare_depth_schedule(data: dict) -> None:
    """Validates num_speculative_tokens_by_batch_size in place; an explicit schedule's
    largest depth is num_speculative_tokens when that is not given."""
    value = data.get(depth_schedule.OPTION)
    if value is None:
        return
    given = data.get("num_speculative_tokens")
    given = given if isinstance(given, int) and not isinstance(given, bool) and given > 0 else None
    try:
        value = depth_schedule.normalize(value, given)
    except depth_schedule.DepthScheduleError as exc:
        raise _error(str(exc)) from None
    data[depth_schedule.OPTION] = value
    if isinstance(value, dict) and data.get("num_speculative_tokens") is None:
        data["num_speculative_tokens"] = max(value.values())


def _check_method(method: Any) -> None:
    if method in METHODS:
        return
    if method == "peagle":
        hint = "P-EAGLE heads use \"method\": \"eagle3\" with \"parallel_drafting\": true"
    elif isinstance(method, str) and method.endswith("_mtp"):
        hint = "use \"method\": \"mtp\" (one method for every MTP model)"
    else:
        close = difflib.get_close_matches(str(method), METHODS, n=1)
        hint = f"did you mean {close[0]!r}?" if close else "or leave 'method' out to infer it from 'model'"
    raise _error(f"unknown method {method!r}; supported: {', '.join(METHODS)}; {hint}")


def _describe(exc: ValidationError) -> str:
    """pydantic's errors as lines naming the key; our own messages pass through unchanged."""
    lines = []
    for err in exc.errors():
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, SpeculativeConfigError):
            lines.append(str(cause))
            continue
        loc = ".".join(str(p) for p in err["loc"])
        lines.append(f"speculative_config.{loc}: {err['msg']} (got {err.get('input')!r})")
    return "\n".join(dict.fromkeys(lines))
