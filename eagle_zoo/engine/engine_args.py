"""vLLM's engine arguments that LLM(...) and `eagle-zoo serve` take besides their own.

vLLM code passes engine arguments this engine has no use for (``gpu_memory_utilization``,
``enable_prefix_caching``, ...). ``check()`` sorts what LLM(...) got beyond its own
parameters:

- NO_EFFECT: arguments that cannot change any output here (memory sizing, caching,
  logging, scheduling internals); accepted, and named in one logged line with the reason.
- SUPPORTED_VALUES: arguments that would change results; accepted at the values that mean
  what this engine does anyway (``quantization=None``, ``kv_cache_dtype="auto"``, ...),
  an error naming the argument and what to do otherwise.
- anything else: TypeError naming the argument and the closest known one.

``add_cli_arguments()`` offers the same arguments as `eagle-zoo serve` flags
(``--gpu-memory-utilization 0.9``, ``--enable-prefix-caching``, ...).
"""
from __future__ import annotations

import argparse
import difflib
import logging
from dataclasses import dataclass
from typing import Any, Callable, Optional

log = logging.getLogger("eagle_zoo.engine")


@dataclass(frozen=True)
class EngineArg:
    why: str                                    # what this engine does instead
    cli_type: Optional[Callable] = str          # None: an on/off flag (--x / --no-x)
    allowed: Optional[tuple] = None             # SUPPORTED_VALUES: the values accepted


_KV = "the KV cache holds max_num_seqs requests of max_model_len tokens in one preallocated block"
NO_EFFECT: dict[str, EngineArg] = {
    "gpu_memory_utilization": EngineArg(f"memory is not sized by a share of the GPU: {_KV}", float),
    "swap_space": EngineArg("requests are never swapped out to CPU memory", float),
    "cpu_offload_gb": EngineArg("weights stay on the device", float),
    "block_size": EngineArg(f"there are no paged KV blocks: {_KV}", int),
    "num_gpu_blocks_override": EngineArg(f"there are no paged KV blocks: {_KV}", int),
    "enable_prefix_caching": EngineArg("every prompt is prefilled (a prefix cache would not change outputs)", None),
    "enable_chunked_prefill": EngineArg("prompts are prefilled whole (chunking would not change outputs)", None),
    "max_num_batched_tokens": EngineArg("each step prefills whole prompts and decodes every running request", int),
    "disable_log_stats": EngineArg("the offline engine logs no periodic statistics; llm.get_metrics() counts "
                                   "always", None),
    "disable_log_requests": EngineArg("requests are not logged one by one", None),
    "enable_log_requests": EngineArg("requests are not logged one by one", None),
    "trust_remote_code": EngineArg("models are built by eagle-zoo's family plugins, never from code in a "
                                   "checkpoint", None),
    "max_seq_len_to_capture": EngineArg("CUDA graphs cover every decode batch size up to max_num_seqs", int),
    "disable_custom_all_reduce": EngineArg("tensor parallelism uses torch.distributed's all-reduce", None),
    "disable_async_output_proc": EngineArg("outputs are processed where the step is read back", None),
    "compilation_config": EngineArg("no torch.compile: CUDA graphs (off with enforce_eager) and Triton kernels",
                                    str),
    "max_parallel_loading_workers": EngineArg("weights load in this process", int),
    "enable_sleep_mode": EngineArg("the engine has no sleep mode", None),
    "scheduling_policy": EngineArg("requests are served first come, first served (order never changes "
                                   "a request's output)", str),
    "preemption_mode": EngineArg("requests are never preempted", str),
    "enable_expert_parallel": EngineArg("experts are not distributed (results are the same)", None),
    "use_tqdm_on_load": EngineArg("loading shows no progress bar", None),
    "tokenizer_pool_size": EngineArg("tokenization runs in this process", int),
    "otlp_traces_endpoint": EngineArg("no tracing", str),
    "limit_mm_per_prompt": EngineArg("the served models take text only, so no prompt carries images or audio",
                                     str),
    "disable_chunked_mm_input": EngineArg("the served models take text only", None),
    "mm_processor_kwargs": EngineArg("the served models take text only", str),
    "allowed_local_media_path": EngineArg("the served models take text only", str),
    "attention_backend": EngineArg("attention runs this engine's own kernels (torch SDPA / Triton)", str),
    "max_loras": EngineArg("LoRA is not supported (enable_lora is refused)", int),
    "max_lora_rank": EngineArg("LoRA is not supported (enable_lora is refused)", int),
}

SUPPORTED_VALUES: dict[str, EngineArg] = {
    "quantization": EngineArg("weights run unquantized; use an unquantized checkpoint", str, (None,)),
    "kv_cache_dtype": EngineArg("the KV cache is kept in the model's dtype", str, ("auto",)),
    "load_format": EngineArg("safetensors and PyTorch checkpoints are read as they are", str,
                             ("auto", "safetensors", "pt")),
    "tokenizer_mode": EngineArg("the tokenizer is transformers' AutoTokenizer; pass tokenizer=<directory> for "
                                "another", str, ("auto", "hf")),
    "tokenizer_revision": EngineArg("the tokenizer is read at the model's revision; pass tokenizer=<directory> "
                                    "for another", str, (None,)),
    "skip_tokenizer_init": EngineArg("outputs are detokenized; pass prompts as {'prompt_token_ids': [...]} "
                                     "if text is not wanted", None, (False, None)),
    "enable_lora": EngineArg("LoRA adapters are not supported; merge the adapter into the model", None,
                             (False, None)),
    "hf_overrides": EngineArg("the model config is read as it is; edit a copy of config.json instead", str,
                              (None, {})),
    "rope_scaling": EngineArg("RoPE is set by config.json; edit a copy of config.json instead", str, (None, {})),
    "rope_theta": EngineArg("RoPE is set by config.json; edit a copy of config.json instead", float, (None,)),
    "override_generation_config": EngineArg("SamplingParams are used as given", str, (None, {})),
    "generation_config": EngineArg("SamplingParams are used as given, as with vLLM's 'vllm' "
                                   "(generation_config.json gives only the EOS ids)", str, ("auto", "vllm", None)),
    "data_parallel_size": EngineArg("one engine per process; start several servers instead", int, (1,)),
    "calculate_kv_scales": EngineArg("the KV cache is not quantized", None, (False, None)),
    "model_impl": EngineArg("models are eagle-zoo's family plugins", str, ("auto", None)),
    "task": EngineArg("the engine generates text", str, ("auto", "generate", None)),
    "runner": EngineArg("the engine generates text", str, ("auto", "generate", None)),
    "logits_processors": EngineArg("logits processors are not supported", str, (None, ())),
    "speculative_model": EngineArg("speculative decoding is set with speculative_config={'model': ..., "
                                   "'num_speculative_tokens': ...}", str, (None,)),
    "num_speculative_tokens": EngineArg("speculative decoding is set with speculative_config={'model': ..., "
                                        "'num_speculative_tokens': ...}", int, (None,)),
}


class UnsupportedEngineArgument(ValueError):
    """An engine argument whose value would change results in a way this engine does not support."""


def _same(value: Any, allowed: tuple) -> bool:
    return any(value == a and type(value) is type(a) or (value is None and a is None)
               or (isinstance(a, (dict, tuple)) and isinstance(value, (dict, list, tuple)) and not value and not a)
               for a in allowed)


def check(kwargs: dict, own: tuple[str, ...], where: str = "LLM") -> None:
    """Accept ``kwargs`` (engine arguments beyond LLM's own parameters ``own``) or raise.
    No-effect ones are named in one logged line."""
    unknown = [k for k in kwargs if k not in NO_EFFECT and k not in SUPPORTED_VALUES]
    if unknown:
        known = sorted({*own, *NO_EFFECT, *SUPPORTED_VALUES})
        name = unknown[0]
        close = difflib.get_close_matches(name, known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise TypeError(f"{where}() got an unexpected keyword argument {name!r}{hint}; it takes {', '.join(own)} "
                        f"and vLLM's engine arguments listed in eagle_zoo/engine/engine_args.py")
    bad = [(k, v) for k, v in kwargs.items() if k in SUPPORTED_VALUES and not _same(v, SUPPORTED_VALUES[k].allowed)]
    if bad:
        lines = "; ".join(f"{k}={v!r} is not supported ({SUPPORTED_VALUES[k].why}); accepted: "
                          f"{', '.join(repr(a) for a in SUPPORTED_VALUES[k].allowed)}" for k, v in bad)
        raise UnsupportedEngineArgument(f"{where}(): {lines}")
    ignored = [k for k in kwargs if k in NO_EFFECT]
    if ignored:
        log.warning("%s(%s): no effect in eagle-zoo: %s", where,
                    ", ".join(f"{k}={kwargs[k]!r}" for k in ignored),
                    "; ".join(f"{k}: {NO_EFFECT[k].why}" for k in ignored))


def add_cli_arguments(p: argparse.ArgumentParser, taken: Callable[[str], bool] = lambda flag: False) -> None:
    """vLLM's engine-argument flags (``--gpu-memory-utilization``, ``--enable-prefix-caching``,
    ...) for `eagle-zoo serve`; ``taken(flag)`` skips flags the parser already has."""
    # The group's text names only the flags it adds: one the parser already has is its own.
    no_effect = ", ".join(_flag(n) for n in NO_EFFECT if not taken(_flag(n)))
    values = ", ".join(f"{_flag(n)} ({_shown(arg.allowed)})"
                       for n, arg in SUPPORTED_VALUES.items() if not taken(_flag(n)))
    group = p.add_argument_group(
        "vLLM engine arguments",
        f"accepted as vLLM takes them. Without effect here (named in one log line): {no_effect}. "
        f"Accepted only at the values that mean what this engine does (an error otherwise): {values}.")
    for name, arg in {**NO_EFFECT, **SUPPORTED_VALUES}.items():
        if taken(_flag(name)):
            continue
        if arg.cli_type is None:
            group.add_argument(_flag(name), dest=f"engine_arg_{name}", action=argparse.BooleanOptionalAction,
                               default=None, help=argparse.SUPPRESS)
        else:
            group.add_argument(_flag(name), dest=f"engine_arg_{name}", type=arg.cli_type, default=None,
                               help=argparse.SUPPRESS)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _shown(allowed: tuple) -> str:
    return "/".join(str(a) for a in allowed if a not in (None, {}, ())) or "unset"


def from_cli(args: argparse.Namespace) -> dict:
    """The engine arguments given on the command line, as LLM keyword arguments."""
    out = {}
    for key, value in vars(args).items():
        if key.startswith("engine_arg_") and value is not None:
            out[key[len("engine_arg_"):]] = value
    return out
