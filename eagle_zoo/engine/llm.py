"""`LLM`: the offline entry point, shaped like vLLM's.

    llm = LLM(model="HuggingFaceTB/SmolLM2-135M-Instruct",
              speculative_config={"model": "...", "num_speculative_tokens": 3})
    outputs = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=32))
"""
from __future__ import annotations

import functools
import inspect
import json
import operator
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional, Sequence as Seq, Union

import torch

from .. import envs, hub
from ..config.depth_schedule import DepthSchedule
from ..config.speculative import SpeculativeConfig
from ..models.layers import add_exact_bf16_copies
from ..models.quantization import quantize_fp8_
from .core import EngineCore
from .graphs import GraphPool
from .model_loader import load_model
from .outputs import RequestOutput
from .parallel import draft_scope, start as start_parallel, target_scope
from .proposers import DraftModelProposer, EagleProposer, NgramProposer, Proposer
from .sampling_params import SamplingParams

# A lone UTF-16 surrogate (an unpaired U+D800..U+DFFF code point) cannot be encoded as text.
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")

DEFAULT_NUM_SPECULATIVE_TOKENS = 3
_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
           "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16, "half": torch.float16}


def resolve_device(device: Optional[Union[str, torch.device]]) -> torch.device:
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device={device!r} is not a device: use 'cpu', 'cuda', 'cuda:N' or 'auto'") from None
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device={str(device)!r}: this engine runs on 'cpu' or 'cuda' (or 'auto')")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' was asked for but CUDA is not available here: use device='cpu'")
    return device


def resolve_dtype(dtype: Union[str, torch.dtype, None], device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in _DTYPES:
        raise ValueError(f"dtype={dtype!r} is not supported; use one of {sorted(_DTYPES)} or 'auto'")
    return _DTYPES[dtype]


def check_own_args(max_model_len, max_num_seqs, seed, enforce_eager, async_scheduling, download_dir,
                   hf_token) -> None:
    """Refuse, by name and before anything loads, values of LLM's own arguments that mean
    nothing (vLLM's types: an integer length, count and seed, a yes / no switch, a
    directory path and a token string)."""
    def integer(value) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    for name, value in (("max_model_len", max_model_len), ("max_num_seqs", max_num_seqs)):
        if value is not None and (not integer(value) or value < 1):
            raise ValueError(f"{name} must be an integer >= 1 (or None for the default), got {value!r}")
    if not integer(seed):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    if not isinstance(enforce_eager, bool):
        raise ValueError(f"enforce_eager must be True or False, got {enforce_eager!r}")
    if async_scheduling is not None and not isinstance(async_scheduling, bool):
        raise ValueError(f"async_scheduling must be True, False or None (the default), got {async_scheduling!r}")
    if download_dir is not None and not isinstance(download_dir, (str, os.PathLike)):
        raise ValueError(f"download_dir must be a directory path (or None for huggingface_hub's cache), got "
                         f"{download_dir!r}")
    if hf_token is not None and not isinstance(hf_token, str):
        raise ValueError(f"hf_token must be a string (or None for HF_TOKEN / the `hf auth login` token), got "
                         f"{type(hf_token).__name__}")


def default_async_scheduling(device: torch.device, tensor_parallel_size: int) -> bool:
    """async_scheduling when the caller leaves it unset: EAGLE_ZOO_ASYNC_SCHEDULING=0/1 for
    a whole process (eagle_zoo/envs.py), else on for one CUDA device. On a GPU it hides
    the host's work of a step behind the device's (measured on an H200: +16% tokens/s for
    plain decoding and EAGLE-3 chains, BENCHMARKS.md); on the CPU nothing runs in the
    background, so running ahead only costs a discarded step per finished request."""
    env = envs.async_scheduling()
    if env is False or tensor_parallel_size > 1:
        return False
    return env is True or device.type == "cuda"


class LLM:
    def __init__(
        self,
        model: str,
        speculative_config: Union[dict, str, SpeculativeConfig, None] = None,
        *,
        dtype: Union[str, torch.dtype, None] = "auto",
        device: Union[str, torch.device, None] = None,
        max_model_len: Optional[int] = None,
        max_num_seqs: Optional[int] = None,
        seed: int = 0,
        tensor_parallel_size: int = 1,
        pipeline_parallel_size: int = 1,
        distributed_executor_backend: Optional[str] = None,
        revision: Optional[str] = None,
        tokenizer: Optional[str] = None,
        download_dir: Optional[str] = None,
        hf_token: Optional[str] = None,
        enforce_eager: bool = False,
        async_scheduling: Optional[bool] = None,
        max_logprobs: int = 20,
        **engine_args: Any,
    ):
        """``engine_args``: vLLM's other engine arguments (``gpu_memory_utilization``,
        ``enable_prefix_caching``, ``quantization``, ...): accepted where they have no effect
        here (one logged line names them), an error where they would change results
        (engine/engine_args.py). ``max_logprobs``: the most logprobs / prompt_logprobs a
        request may ask for (vLLM's default 20; -1: the vocabulary size). ``download_dir`` /
        ``hf_token``: as vLLM's, the Hugging Face cache directory hub ids (target, draft,
        tokenizer) are read from and downloaded to, and the token for gated repos."""
        from . import engine_args as _engine_args

        _engine_args.check(engine_args, _OWN_ARGS)
        # tensor-parallel workers rebuild from these (engine_args are checked, and do nothing)
        init_args = {k: v for k, v in locals().items() if k in _OWN_ARGS}
        check_own_args(max_model_len, max_num_seqs, seed, enforce_eager, async_scheduling, download_dir, hf_token)
        self._fetch = hub.Fetch(None if download_dir is None else os.fspath(download_dir), hf_token)
        if async_scheduling and isinstance(tensor_parallel_size, int) and tensor_parallel_size > 1:  # before ranks start
            raise ValueError("async_scheduling=True is not supported with tensor_parallel_size > 1 (the ranks' "
                             "run-ahead is untested): leave async_scheduling off")
        if isinstance(max_logprobs, bool) or not isinstance(max_logprobs, int) or max_logprobs < -1:
            raise ValueError(f"max_logprobs must be an integer >= 0, or -1 for the vocabulary size; got "
                             f"{max_logprobs!r}")
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        self.speculative_config = SpeculativeConfig.parse(
            speculative_config, config_reader=functools.partial(read_draft_config, fetch=self._fetch))
        if self.speculative_config and self.speculative_config.quantization and self.device.type != "cuda":
            raise ValueError(
                f"speculative_config quantization={self.speculative_config.quantization!r} runs on CUDA only "
                f"(device={self.device.type!r}: drafts on the CPU run from the head's own weights through C++ "
                f"kernels): remove quantization or use device='cuda'"
            )
        # Checks the parallel sizes; with tensor_parallel_size > 1 brings up this rank
        # (and, in a plain process, starts the other ranks): engine/parallel.py.
        self.parallel = start_parallel(init_args, self.speculative_config, self.device, owner=self)
        if self.parallel is not None:
            self.device = self.parallel.device  # cuda:<local rank> on GPUs
        if async_scheduling is None:
            async_scheduling = default_async_scheduling(self.device, tensor_parallel_size)
        torch.manual_seed(seed)
        with target_scope(self.parallel):
            loaded = load_model(model, self.dtype, self.device, revision=revision, fetch=self._fetch)
        self.model_path = loaded.path
        self._model_name = model
        self.model_config = loaded.config
        self.tokenizer = loaded.tokenizer
        if tokenizer is not None:
            from transformers import AutoTokenizer

            try:
                self.tokenizer = AutoTokenizer.from_pretrained(tokenizer, cache_dir=self._fetch.download_dir,
                                                               token=self._fetch.token)
            except (OSError, ValueError) as exc:
                raise ValueError(f"tokenizer={tokenizer!r}: cannot be loaded as a tokenizer ({exc}); give a "
                                 f"tokenizer directory or hub id, or leave it unset for the model's own") from None
        limit = getattr(loaded.config, "max_position_embeddings", None) or 2048
        draft_limit = self.speculative_config.max_model_len if self.speculative_config else None
        if max_model_len is None:
            max_model_len = min(limit, 2048, draft_limit or limit)
        elif max_model_len > limit:
            raise ValueError(
                f"max_model_len={max_model_len} exceeds the model's max_position_embeddings={limit}: lower it"
            )
        elif draft_limit is not None and max_model_len > draft_limit:
            raise ValueError(
                f"max_model_len={max_model_len} exceeds speculative_config.max_model_len={draft_limit}, the "
                f"longest context the draft serves: lower max_model_len to {draft_limit}, or raise or "
                f"remove speculative_config's max_model_len"
            )
        if max_num_seqs is None:
            max_num_seqs = 64 if self.device.type == "cuda" else 8
        if enforce_eager and self.speculative_config and self.speculative_config.enforce_eager is False:
            raise ValueError(
                "speculative_config enforce_eager=false asks for the draft's CUDA graphs, but the engine runs "
                "eagerly (enforce_eager=True): remove one of them"
            )
        # CUDA graphs for decode-shaped steps unless eager mode is asked for.
        self.graph_pool = GraphPool() if self.device.type == "cuda" and not enforce_eager else None
        with draft_scope(self.parallel):
            proposer = self._build_proposer(loaded, max_model_len, max_num_seqs)
        self.engine = EngineCore(
            loaded.model,
            self.tokenizer,
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            dtype=self.dtype,
            device=self.device,
            proposer=proposer,
            seed=seed,
            eos_token_ids=_eos_token_ids(loaded.path, loaded.config, self.tokenizer),
            graph_pool=self.graph_pool,
            depth_schedule=self._depth_schedule(proposer),
            async_scheduling=async_scheduling,
            max_logprobs=loaded.config.vocab_size if max_logprobs == -1 else max_logprobs,
        )
        if self.parallel is not None:  # rank 0 of workers it started: mirror engine calls to them
            self.engine = self.parallel.attach(self.engine)

    def shutdown(self) -> None:
        """Stops the tensor-parallel workers this LLM started (also done when it is
        garbage-collected and at exit); nothing to do otherwise."""
        if self.parallel is not None:
            self.parallel.shutdown()

    # -- construction ----------------------------------------------------------
    def _build_proposer(self, loaded, max_model_len: int, max_num_seqs: int) -> Optional[Proposer]:
        spec = self.speculative_config
        if spec is None:
            return None
        k = spec.num_speculative_tokens or DEFAULT_NUM_SPECULATIVE_TOKENS
        max_len = max_model_len + k + 1
        args = (max_num_seqs, max_len, self.dtype, self.device)
        # speculative_config enforce_eager: the draft's passes without CUDA graphs.
        graph_pool = None if spec.enforce_eager else self.graph_pool
        if spec.method == "ngram":
            return NgramProposer(k, spec.prompt_lookup_min, spec.prompt_lookup_max, self.device)
        if spec.method in ("eagle", "eagle3"):
            from ..loading import load as load_head

            head = load_head(spec.model, target=loaded.model, revision=spec.revision, dtype=self.dtype,
                             device=self.device, fetch=self._fetch)
            if head.method != spec.method:
                raise ValueError(
                    f"speculative_config method={spec.method!r} but {spec.model!r} is an {head.method} head: "
                    f"set method={head.method!r} or leave it out"
                )
            if self.device.type == "cpu" and self.dtype == torch.float32:
                # A head shipped in bf16: its draft passes read half the bytes, same results.
                add_exact_bf16_copies(head.head, keep=list(loaded.model.parameters()))
            if spec.quantization == "fp8":  # the target's modules a head shares stay as they are
                quantize_fp8_(head.head, keep=list(loaded.model.parameters()))
            n_layers = loaded.config.num_hidden_layers
            if spec.tree is not None:  # EAGLE-2 dynamic tree (engine/tree_proposer.py)
                from .tree_proposer import build_tree_proposer

                return build_tree_proposer(spec, head.head, loaded.model, max_num_seqs, max_model_len, self.dtype,
                                           self.device, n_layers, graph_pool)
            if spec.parallel_drafting:  # P-EAGLE: all K drafts from one head pass
                from .parallel_drafting import ParallelEagleProposer

                return ParallelEagleProposer(head.head, k, *args, target_num_layers=n_layers,
                                             graph_pool=graph_pool, source=str(spec.model))
            return EagleProposer(head.head, head.method, k, *args, target_num_layers=n_layers,
                                 graph_pool=graph_pool)
        if spec.method == "draft_model":
            _refuse_eagle_weights(spec, self._fetch)
            draft = load_model(spec.model, self.dtype, self.device, revision=spec.revision, fetch=self._fetch)
            if spec.quantization == "fp8":
                quantize_fp8_(draft.model)
            if draft.config.vocab_size != loaded.config.vocab_size:
                raise ValueError(
                    f"draft model {spec.model!r} has vocab_size {draft.config.vocab_size}, the target "
                    f"{loaded.config.vocab_size}: a draft model must share the target's vocabulary"
                )
            return DraftModelProposer(draft.model, k, *args, graph_pool=graph_pool)
        raise ValueError(
            f"speculative method {spec.method!r} is not supported by this engine; use eagle, eagle3, ngram or draft_model"
        )

    def _depth_schedule(self, proposer: Optional[Proposer]) -> Optional[DepthSchedule]:
        spec = self.speculative_config
        if proposer is None:
            return None
        return DepthSchedule.from_config(spec.num_speculative_tokens_by_batch_size, proposer.num_speculative_tokens,
                                         self.device.type)

    # -- generation ------------------------------------------------------------
    def generate(
        self,
        prompts: Union[str, dict, Seq[Union[str, dict]]],
        sampling_params: Union[SamplingParams, Seq[SamplingParams], None] = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        params = self._params_list(sampling_params, len(prompts))
        encoded = [self._encode(prompt) for prompt in prompts]  # bad prompts fail before any is queued
        seqs = []  # every completion's sequence; groups[i]: prompt i's (n of them)
        groups: list[list] = []
        try:
            for (text, ids), p in zip(encoded, params):
                # n > 1: n engine requests, child i with seed + i (SamplingParams.child)
                group = [self.engine.add_request(ids, p if p.n == 1 else p.child(i), prompt=text)
                         for i in range(p.n)]
                groups.append(group)
                seqs += group
            progress = None
            if use_tqdm:
                from tqdm import tqdm

                progress = tqdm(total=len(seqs), desc="generate")
            while self.engine.has_unfinished():
                done = self.engine.step()
                if progress is not None:
                    progress.update(len(done))
            if progress is not None:
                progress.close()
        except BaseException:
            # A failed (or interrupted) call leaves none of its requests queued: the
            # next generate() would otherwise run them too.
            for seq in seqs:
                self.engine.abort(seq.request_id)
            raise
        return [self._request_output(group) for group in groups]

    def _request_output(self, group: list) -> RequestOutput:
        """One prompt's RequestOutput: its n completions, indexed 0..n-1, as vLLM returns them."""
        outs = [self.engine.to_output(s) for s in group]
        first = outs[0]
        for i, out in enumerate(outs):
            out.outputs[0].index = i
        first.outputs = [o.outputs[0] for o in outs]
        first.finished = all(o.finished for o in outs)
        if len(outs) > 1:  # the request's metrics over its n completions
            times = [o.metrics for o in outs]
            m = first.metrics
            firsts = [t.first_token_time for t in times if t.first_token_time is not None]
            m.first_token_time = min(firsts) if firsts else None
            scheduled = [t.first_scheduled_time for t in times if t.first_scheduled_time is not None]
            m.first_scheduled_time = min(scheduled) if scheduled else None
            m.finished_time = None if any(t.finished_time is None for t in times) else max(t.finished_time for t in times)
            m.num_drafts = sum(t.num_drafts for t in times)
            m.num_draft_tokens = sum(t.num_draft_tokens for t in times)
            m.num_accepted_tokens = sum(t.num_accepted_tokens for t in times)
        return first

    def chat(
        self,
        messages: Union[list[dict], list[list[dict]]],
        sampling_params: Union[SamplingParams, Seq[SamplingParams], None] = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [{"prompt": self.apply_chat_template(c)} for c in conversations]
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def apply_chat_template(self, conversation: list[dict]) -> str:
        if self.tokenizer is None or not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(f"{self.model_path}: the model has no chat template; use generate() with plain prompts")
        return self.tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)

    def get_metrics(self) -> list:
        """vLLM's metrics, shaped and named as vLLM's ``LLM.get_metrics()`` returns them
        (eagle_zoo.metrics: Counter, Gauge, Histogram, Vector), labelled ``model_name`` and
        ``engine``: the gauges ``vllm:num_requests_running`` / ``vllm:num_requests_waiting``,
        then engine/metrics.py's counters (``vllm:spec_decode_num_drafts``,
        ``vllm:spec_decode_num_accepted_tokens_per_pos`` as a Vector, ...), counted since
        the LLM was built."""
        from .metrics import Gauge

        labels = {"model_name": str(self._model_name), "engine": "0"}
        sched = self.engine.scheduler
        return [Gauge("vllm:num_requests_running", dict(labels), float(len(sched.running))),
                Gauge("vllm:num_requests_waiting", dict(labels), float(len(sched.waiting))),
                *self.engine.metrics.get_metrics("vllm:", labels)]

    def get_tokenizer(self):
        return self.tokenizer

    # -- helpers ---------------------------------------------------------------
    def _encode(self, prompt) -> tuple[Optional[str], list[int]]:
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                ids = prompt["prompt_token_ids"]
                # transformers' apply_chat_template(..., tokenize=True) returns a BatchEncoding
                # in recent versions (a list of ids in the versions vLLM's examples were written for)
                if isinstance(ids, Mapping) and "input_ids" in ids:
                    ids = ids["input_ids"]
                try:
                    if isinstance(ids, (str, bytes)):
                        raise TypeError
                    return prompt.get("prompt"), [operator.index(t) for t in ids]
                except TypeError:
                    raise TypeError(
                        f"'prompt_token_ids' must be a list of integer token ids, got {ids!r:.80}"
                    ) from None
            if "prompt" not in prompt:
                raise ValueError("a prompt dict needs 'prompt' (text) or 'prompt_token_ids'")
            prompt = prompt["prompt"]
            special = False  # chat templates already carry their special tokens
        else:
            special = True
        if not isinstance(prompt, str):
            raise TypeError(f"prompts must be strings or dicts, got {type(prompt).__name__}")
        surrogate = _LONE_SURROGATE.search(prompt)
        if surrogate is not None:
            raise ValueError(f"the prompt holds a lone UTF-16 surrogate ({ascii(surrogate.group())} at character "
                             f"{surrogate.start()}), which is not text and cannot be encoded: pass valid Unicode")
        if self.tokenizer is None:
            raise ValueError(f"{self.model_path} has no tokenizer: pass {{'prompt_token_ids': [...]}} instead of text")
        return prompt, self.tokenizer.encode(prompt, add_special_tokens=special)

    @staticmethod
    def _params_list(sampling_params, n: int) -> list[SamplingParams]:
        if sampling_params is None:
            return [SamplingParams()] * n
        if isinstance(sampling_params, SamplingParams):
            return [sampling_params] * n
        if isinstance(sampling_params, (dict, str)):
            raise TypeError(
                f"sampling_params must be a SamplingParams or a list of them, got a {type(sampling_params).__name__}: "
                f"write SamplingParams(temperature=..., max_tokens=...)"
            )
        sampling_params = list(sampling_params)
        bad = sorted({type(p).__name__ for p in sampling_params if not isinstance(p, SamplingParams)})
        if bad:
            raise TypeError(f"sampling_params must all be SamplingParams, got {', '.join(bad)}")
        if len(sampling_params) != n:
            raise ValueError(f"got {len(sampling_params)} SamplingParams for {n} prompts: give one, or one per prompt")
        return sampling_params


_OWN_ARGS = tuple(p for p in inspect.signature(LLM.__init__).parameters if p not in ("self", "engine_args"))


def _refuse_eagle_weights(spec: SpeculativeConfig, fetch: hub.Fetch) -> None:
    """A head's directory taken as a separate draft model fails here, saying to set
    ``method``, instead of with a missing-weight error from the model loader."""
    from ..checkpoints.tensors import CheckpointError, tensor_names
    from ..config.speculative import eagle_weights_error
    from .model_loader import resolve_model_dir

    try:
        names = tensor_names(resolve_model_dir(str(spec.model), spec.revision, fetch))
    except (CheckpointError, OSError, ValueError):  # the loader reports what is wrong with it
        return
    error = eagle_weights_error(str(spec.model), names, spec.inferred_from)
    if error is not None:
        raise error


def read_draft_config(model: str, fetch: hub.Fetch = hub.DEFAULT_FETCH) -> Optional[dict]:
    """The draft's config.json for method inference, without downloading anything: a
    local directory, a head shipped inside a plugin (catalog `path`), or a snapshot
    already in the Hugging Face cache. None when it is not available offline."""
    from ..config.speculative import read_local_config
    from ..plugins import get_registry

    found = read_local_config(model)
    if found is not None:
        return found
    entry = get_registry().catalog.get(model)
    if entry is not None and entry.path is not None:
        return read_local_config(entry.path)
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(model, "config.json", revision=getattr(entry, "revision", None),
                                        cache_dir=str(fetch.cache_dir()))
    except Exception:  # not a valid repo id: the name rules decide
        return None
    return json.loads(Path(cached).read_text()) if isinstance(cached, str) else None


def _eos_token_ids(path: Path, config: Any, tokenizer) -> set[int]:
    ids: set[int] = set()

    def add(value):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(v for v in value if isinstance(v, int))

    gen = path / "generation_config.json"
    if gen.is_file():
        add(json.loads(gen.read_text()).get("eos_token_id"))
    add(getattr(config, "eos_token_id", None))
    if tokenizer is not None:
        add(tokenizer.eos_token_id)
    return ids
