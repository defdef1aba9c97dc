"""The step-cost table of `eagle-zoo bench --perf --step-costs SHAPES`: where one decode
step's time goes, for each step strategy, on a target of a given shape, at batch 1 or at
the batch of --step-cost-batch, with caches of --perf-max-model-len tokens or what the timed
steps need where that is more (a captured graph's attention is given the whole cache row).

Timing needs no trained weights: the target has random weights in the shape asked for
(SmolLM2-135M's or Llama-3.1-8B's) and the draft is a random one-layer EAGLE-3 head of
the same shape. Each strategy (plain, an EAGLE-3 chain of k drafts, an EAGLE-2 tree) runs
``batch`` requests together through EngineCore as a user's requests run (CUDA graphs and
async scheduling where the engine picks them), and the table gives per engine step:

  step      wall time (mean over the timed steps)
  gpu busy  the union of the device's kernel and copy intervals (torch.profiler), and
            the number of kernels: step - gpu busy is time the device waited for the host
  host      wall time minus the time the host spent waiting for the device
  syncs     host waits for the device (the engine's read-back) and implicit syncs
            (torch.cuda.set_sync_debug_mode) per step
  graphs    each captured graph of the step replayed alone (the target pass, the drafts,
            the catch-up, the whole chain or tree step): what the device needs without the host

then each strategy's step against the plain one, plain decoding's tokens/s (one token a
request a step), the plain step against the weight-read floor (weight bytes over this GPU's
device-to-device copy bandwidth, copy_bandwidth), and, when
an acceptance profile is given, the speed-up those step costs imply for a chain: a
projection from the profile, not a measurement.
"""
from __future__ import annotations

import json
import cProfile
import io
import itertools
import pstats
import statistics
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import Optional

import torch

from .perf import _tree_options

SHAPES = {
    "smollm2": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                    num_key_value_heads=3, vocab_size=49152, max_position_embeddings=8192, rope_theta=100000.0,
                    tie_word_embeddings=True, rms_norm_eps=1e-5),
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192, rope_theta=500000.0,
               tie_word_embeddings=False, rms_norm_eps=1e-5),  # Llama-3.1-8B's
}
# Draft vocabularies of the heads in each shape: SmolLM2's shipped head and Llama-3's
# published EAGLE-3 heads (32,000 of 128,256).
DRAFT_VOCAB = {"smollm2": 12000, "8b": 32000}
PROMPT_TOKENS = 300
# The EAGLE-2 tree the device scripts time and check (top k 6, depth 3, 30 nodes: the
# step-cost tables' `--tree 6,3,30`).
PROFILE_TREE = {"top_k": 6, "depth": 3, "total_tokens": 30}


def random_target(shape: dict, dtype: torch.dtype, device: torch.device, seed: int = 0):
    """A Llama-architecture target with random weights (norms 1)."""
    from transformers import LlamaConfig

    from .models.llama import LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(**shape, architectures=["LlamaForCausalLM"])
    with torch.device(device):
        model = LlamaForCausalLM(config).to(dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.fill_(1.0) if "norm" in name else p.normal_(0, 0.05)
    return model.eval()


def random_eagle3_head(target, draft_vocab_size: int, dtype: torch.dtype, seed: int = 0):
    """A one-layer EAGLE-3 head of the target's shape, random weights, built as training builds one."""
    from .plugins import get_registry
    from .train.build import build_head, head_config

    family = get_registry().family_for_config(target.config)
    with tempfile.TemporaryDirectory() as tmp:
        target.config.to_json_file(str(Path(tmp) / "config.json"))
        config = head_config(Path(tmp), "eagle3", draft_vocab_size=min(draft_vocab_size, target.config.vocab_size))
    head = build_head(family, config, "eagle3", target, seed)
    return head.to(dtype).eval()


def strategy_engine(target, head, strategy: str, k: int, tree: Optional[dict], dtype, device, max_model_len: int,
                    batch: int = 1, async_scheduling: Optional[bool] = None):
    """An EngineCore of one step strategy ("plain", "chain" with an EAGLE-3 head of k
    drafts, "tree" with ``tree``'s TreeConfig) for ``batch`` requests, with CUDA graphs on
    CUDA and async scheduling as given, else as LLM's default (on for one CUDA device), as a
    user's engine runs (scripts/device/identity_random.py)."""
    from .engine.core import EngineCore
    from .engine.graphs import GraphPool
    from .engine.llm import default_async_scheduling
    from .engine.proposers import EagleProposer

    pool = GraphPool() if device.type == "cuda" else None
    n_layers = target.config.num_hidden_layers
    proposer = None
    if strategy == "chain":
        proposer = EagleProposer(head, "eagle3", k, batch, max_model_len + k + 1, dtype, device,
                                 target_num_layers=n_layers, graph_pool=pool)
    elif strategy == "tree":
        from .config.speculative import TreeConfig
        from .engine.tree_proposer import TreeEagleProposer

        proposer = TreeEagleProposer(head, "eagle3", TreeConfig(**tree), batch, max_model_len, dtype, device,
                                     target_num_layers=n_layers, graph_pool=pool)
    return EngineCore(target, None, max_model_len=max_model_len, max_num_seqs=batch, dtype=dtype, device=device,
                      proposer=proposer, graph_pool=pool,
                      async_scheduling=default_async_scheduling(device, 1) if async_scheduling is None
                      else async_scheduling)


def copy_bandwidth(device: torch.device, nbytes: int = 1 << 30, reps: int = 10) -> float:
    """Bytes/s read plus written by a device-to-device copy on ``device`` (CUDA): the rate
    the weight-read floor divides by, measured on the GPU at hand (an H200 gives ~4.25e12)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        dst.copy_(src)
    end.record()
    end.synchronize()
    return 2 * nbytes * reps / (start.elapsed_time(end) / 1e3)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


class _HostWaits:
    """Times every torch.cuda.Event.synchronize (the engine's read-back wait) while active."""

    def __init__(self):
        self.seconds, self.count = 0.0, 0

    def __enter__(self):
        self._original = original = torch.cuda.Event.synchronize
        waits = self

        def timed(event):
            t = time.perf_counter()
            original(event)
            waits.seconds += time.perf_counter() - t
            waits.count += 1
        torch.cuda.Event.synchronize = timed
        return self

    def __exit__(self, *exc):
        torch.cuda.Event.synchronize = self._original


SYNC_WARNING = "called a synchronizing CUDA operation"  # torch's text for each sync


class ImplicitSyncs:
    """Counts, while active on CUDA, the host syncs the code does not ask for (.item(), a
    blocking copy): torch.cuda.set_sync_debug_mode("warn") turns each into a warning, and
    every one is recorded (not one per call site, as the default filter would)."""

    def __init__(self, device: torch.device):
        self.device, self.count = device, 0

    def __enter__(self):
        self._catching = warnings.catch_warnings(record=True)
        self._caught = self._catching.__enter__()
        warnings.simplefilter("always")
        if self.device.type == "cuda":
            torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.set_sync_debug_mode(0)
        # Not set_sync_debug_mode's own notice ("a prototype feature"), which is no sync.
        self.count = sum(SYNC_WARNING in str(w.message) for w in self._caught)
        self._catching.__exit__(*exc)


def _cprofile_table(run, top: int) -> str:
    """cProfile's table of the ``top`` functions by own time over one call of ``run``."""
    prof = cProfile.Profile()
    prof.enable()
    run()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def _busy_us(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end] intervals (microseconds)."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def _device_profile(step, steps: int) -> dict:
    """GPU busy time and kernels per step over ``steps`` calls of ``step`` (an engine step,
    or an added request's prefill step) under torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    intervals = [(e.time_range.start, e.time_range.end) for e in kernels]
    by_name: dict[str, float] = {}
    for e in kernels:
        by_name[e.name[:80]] = by_name.get(e.name[:80], 0.0) + (e.time_range.end - e.time_range.start)
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:8]
    return {"gpu_busy_us": _busy_us(intervals) / steps, "kernels": len(kernels) / steps,
            "top_kernels_us": {name: round(us / steps, 1) for name, us in top}}


@torch.inference_mode()
def _graph_replays(engine) -> dict:
    """Median microseconds of one replay of each graph the engine captured."""
    if engine.device.type != "cuda":
        return {}
    owners = {"target": engine.runner.graphed, "target+verify": engine.greedy_target_graph,
              "chain step": engine.chain_step_graph, "tree step": engine.tree_step_graph}
    proposer = engine.proposer
    if proposer is not None:
        owners["drafts"] = getattr(proposer, "graphed_drafts", None)
        owners["catch-up"] = getattr(proposer, "graphed_catch_up", None)
    out = {}
    for name, owner in owners.items():
        for key, entry in (owner.graphs.items() if owner is not None else ()):
            graph, (ids, pos, _, _) = entry[0], entry[1]
            # A step graph feeds its next replay (graphs.StepGraph): each round starts from the
            # same inputs, so 20 replays advance its sequences 20 steps at most.
            inputs = [(t, t.clone()) for t in (ids, pos)]
            times = []
            for _ in range(5):
                for t, saved in inputs:
                    t.copy_(saved)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                start.record()
                for _ in range(20):
                    graph.replay()
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end) * 1e3 / 20)
            out[f"{name} T={key[1]}"] = round(statistics.median(times), 1)
    return out


def _tokens_a_step(strategy: str, k: int, tree: Optional[dict]) -> int:
    """The most tokens one step of ``strategy`` adds to a request."""
    return (tree or {}).get("depth", k) + 1 if strategy != "plain" else 1


def _steps_model_len(strategy: str, k: int, tree: Optional[dict], steps: int) -> int:
    """The max_model_len a request needs to outlive ``steps`` more steps of ``strategy``
    (warm_engine), in multiples of 256: 30 steps of warm-up, the ones asked for and two
    that async scheduling may launch ahead, each at the most tokens a step can add, so no
    step count or tree depth outgrows the cache."""
    per_step = _tokens_a_step(strategy, k, tree)
    return -(-(PROMPT_TOKENS + (32 + steps) * per_step + per_step) // 256) * 256


def warm_engine(target, head, strategy: str, k: int, tree: Optional[dict], dtype, device, steps: int,
                 batch: int = 1, max_model_len: int = 0, async_scheduling: Optional[bool] = None):
    """An engine of ``strategy`` serving ``batch`` greedy requests (random prompts of
    PROMPT_TOKENS tokens) that outlive ``steps`` more engine steps, after their prefills,
    graph captures and 30 steps of warm-up; its caches hold max_model_len tokens, or what
    the steps need where that is more; -> (engine, seqs)."""
    from .engine.sampling_params import SamplingParams

    per_step = _tokens_a_step(strategy, k, tree)
    max_model_len = max(_steps_model_len(strategy, k, tree, steps), max_model_len)
    limit = target.config.max_position_embeddings
    if max_model_len > limit:  # step_cost_table refuses a --perf-max-model-len over it first
        raise ValueError(f"step costs: {steps} steps need max_model_len={max_model_len}, over the shape's "
                         f"max_position_embeddings={limit}; give fewer --step-cost-steps")
    engine = strategy_engine(target, head, strategy, k, tree, dtype, device, max_model_len, batch, async_scheduling)
    vocab, rng = target.config.vocab_size, torch.Generator().manual_seed(1)
    params = SamplingParams(temperature=0, max_tokens=(32 + steps) * per_step, ignore_eos=True)
    seqs = [engine.add_request(torch.randint(0, vocab, (PROMPT_TOKENS,), generator=rng).tolist(), params)
            for _ in range(batch)]
    for _ in range(30):  # prefills, graph captures, warm-up
        engine.step()
    _sync(device)
    return engine, seqs


def finish_engine(engine, seqs) -> None:
    """Abort the requests and run the engine dry (its step launched ahead included)."""
    for seq in seqs:
        engine.abort(seq.request_id)
    while engine.has_unfinished():
        engine.step()


def host_profile(target, head, strategy: str, *, k: int = 3, tree: Optional[dict] = None,
                 dtype: torch.dtype, device: torch.device, steps: int = 100, top: int = 25, batch: int = 1) -> str:
    """Where the host's time of ``steps`` engine steps of one strategy, serving ``batch``
    requests, goes: cProfile's table of the ``top`` functions by own time
    (scripts/device/step_profile.py --host)."""
    engine, seqs = warm_engine(target, head, strategy, k, tree, dtype, device, steps, batch)

    def run():
        for _ in range(steps):
            engine.step()
        _sync(device)
    table = _cprofile_table(run, top)
    finish_engine(engine, seqs)
    return table


def prefill_profile(target, head, strategy: str, *, prompt_tokens: int, requests: int = 20, k: int = 3,
                    tree: Optional[dict] = None, dtype: torch.dtype, device: torch.device, top: int = 25) -> dict:
    """Where one request's prefill goes (scripts/device/step_profile.py --prefill): an engine
    of ``strategy`` serves ``requests`` greedy requests one at a time, each a random prompt
    of ``prompt_tokens`` tokens and one output token, so each request's only engine step is
    its prefill (the target's pass, its first token and the proposer's on_prefill).
    Returns the median and every wall time of that step, host waits for the device a
    prefill, cProfile's ``top`` functions by own time over a second round of the same
    requests (its overhead stays out of the times) and, on CUDA, the kernels and GPU busy
    time of one prefill (torch.profiler)."""
    from .engine.sampling_params import SamplingParams

    limit = target.config.max_position_embeddings
    if prompt_tokens < 1:
        raise ValueError(f"prefill profile: prompt_tokens={prompt_tokens}; give --prefill of at least 1 token")
    if prompt_tokens >= limit:
        raise ValueError(f"prefill profile: a prompt of {prompt_tokens} tokens and its first new token need "
                         f"max_model_len={prompt_tokens + 1}, over the shape's max_position_embeddings={limit}; "
                         f"give --prefill between 1 and {limit - 1}")
    if requests < 1:
        raise ValueError(f"prefill profile: requests={requests}; time at least one request")
    if strategy == "tree" and not tree:
        raise ValueError("prefill profile: strategy 'tree' needs tree={'top_k': .., 'depth': .., 'total_tokens': ..}")
    # Cache rows as long as a serving engine's (2,048 positions, or the prompt and its new
    # token if longer, within the shape's limit): the prefill graphs' buckets
    # (engine/prefill_graphs.py) are those that fit the row.
    engine = strategy_engine(target, head, strategy, k, tree, dtype, device, min(limit, max(prompt_tokens + 1, 2048)))
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    rng = torch.Generator().manual_seed(1)

    def prompt():
        return torch.randint(0, target.config.vocab_size, (prompt_tokens,), generator=rng).tolist()

    def prefill(tokens, sync: bool = True) -> float:
        """Seconds of the engine step that prefills a request of ``tokens`` (its only step),
        its device work included unless ``sync`` is off."""
        engine.add_request(tokens, params)
        start = time.perf_counter()
        engine.step()
        if sync:
            _sync(device)
        seconds = time.perf_counter() - start
        assert not engine.has_unfinished(), "a max_tokens=1 request outlived its prefill step"
        return seconds

    prefill(prompt())  # warm-up: graph captures, Triton compiles and allocator growth of this length
    prompts = [prompt() for _ in range(requests)]
    with _HostWaits() as waits:
        seconds = [prefill(p) for p in prompts]
    implicit = ImplicitSyncs(device)
    if device.type == "cuda":
        with implicit:
            for p in prompts:
                prefill(p, sync=False)  # count the prefill's syncs, not the timing's own
    profile = _cprofile_table(lambda: [prefill(p) for p in prompts], top)
    ms = [s * 1e3 for s in seconds]
    result = {"strategy": strategy, "prompt_tokens": prompt_tokens, "requests": requests,
              "prefill_ms": statistics.median(ms), "prefill_ms_all": ms,
              "host_waits_per_prefill": (waits.count + implicit.count) / requests, "profile": profile}
    if device.type == "cuda":
        queue = iter(prompts)
        result.update(_device_profile(lambda: prefill(next(queue)), requests))
    return result


def measure_strategy(target, head, strategy: str, *, k: int = 3, tree: Optional[dict] = None,
                     dtype: torch.dtype, device: torch.device, steps: int = 200, batch: int = 1,
                     max_model_len: int = 0, async_scheduling: Optional[bool] = None) -> dict:
    """One strategy's row: engine-step wall, host and device time, syncs and graphs (module
    doc); tokens_per_step is a request's mean; max_model_len as warm_engine's."""
    engine, seqs = warm_engine(target, head, strategy, k, tree, dtype, device, 2 * steps, batch,  # timed, profiled
                                max_model_len, async_scheduling)

    def tokens() -> int:
        return sum(len(seq.output_token_ids) for seq in seqs)
    with _HostWaits() as waits, ImplicitSyncs(device) as implicit:
        n0, start = tokens(), time.perf_counter()
        for _ in range(steps):
            engine.step()
        _sync(device)
        seconds = time.perf_counter() - start
    row = {"strategy": strategy, "step_us": seconds / steps * 1e6,
           "host_us": (seconds - waits.seconds) / steps * 1e6,
           "syncs_per_step": (waits.count + implicit.count) / steps,
           "tokens_per_step": (tokens() - n0) / steps / batch, "async_scheduling": engine.async_scheduling}
    if strategy == "chain":
        row["k"] = k
    if strategy == "tree":
        row["tree"] = tree
    if device.type == "cuda":
        row.update(_device_profile(engine.step, steps))
    row["graphs_us"] = _graph_replays(engine)
    finish_engine(engine, seqs)
    del engine
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def default_device() -> torch.device:
    """Where the step-cost tables run unless told: CUDA where there is one."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def step_cost_table(shape_name: str, *, shape: Optional[dict] = None, k: int = 3, tree: Optional[dict] = None,
                    dtype: torch.dtype = torch.bfloat16, device: Optional[torch.device] = None, steps: int = 200,
                    acceptance_profile: Optional[list[float]] = None, batch: int = 1,
                    max_model_len: int = 0, async_scheduling: Optional[bool] = None,
                    draft_quantization: Optional[str] = None) -> dict:
    """The table for one target shape (SHAPES[shape_name], or ``shape`` given) at ``batch``
    requests a step: rows for plain, chain k and (with ``tree``) a tree; ratios to plain;
    the plain step against the weight-read floor; the projection. Every row's engine caches
    max_model_len tokens, or what the deepest strategy's timed steps need where that is
    more (the table's max_model_len); async_scheduling as strategy_engine's;
    draft_quantization "fp8": the head's weights as speculative_config quantization="fp8"
    makes them (models/quantization.py)."""
    if batch < 1:
        raise ValueError(f"step_cost_table: batch={batch}; a step serves 1 request or more")
    device = device or default_device()
    shape = shape or SHAPES[shape_name]
    if max_model_len > shape["max_position_embeddings"]:
        raise ValueError(f"step costs: --perf-max-model-len {max_model_len} is over the shape's "
                         f"max_position_embeddings={shape['max_position_embeddings']}; give at most that")
    target = random_target(shape, dtype, device)
    head = random_eagle3_head(target, DRAFT_VOCAB.get(shape_name, shape["vocab_size"]), dtype)
    if draft_quantization is not None:
        from .models.quantization import quantize_fp8_

        quantize_fp8_(head, keep=list(target.parameters()))
    strategies = [("plain", {}), ("chain", {"k": k})] + ([("tree", {"tree": tree})] if tree else [])
    # One cache length for every row (their attention walks the whole cache row alike): the
    # one asked for, or what the deepest strategy's timed steps need.
    max_model_len = max([max_model_len] + [_steps_model_len(name, k, kw.get("tree"), 2 * steps)
                                           for name, kw in strategies])
    rows = [measure_strategy(target, head, name, dtype=dtype, device=device, steps=steps, batch=batch,
                             max_model_len=max_model_len, async_scheduling=async_scheduling, **kw)
            for name, kw in strategies]
    plain_us = rows[0]["step_us"]
    for row in rows:
        row["vs_plain"] = row["step_us"] / plain_us
    table = {"shape": shape_name, "device": str(device), "dtype": str(dtype).replace("torch.", ""),
             "draft_quantization": draft_quantization, "batch": batch, "max_model_len": max_model_len,
             "async_scheduling": rows[0]["async_scheduling"], "rows": rows,
             "plain_tokens_per_s": batch * 1e6 / plain_us}
    table["chain_read_ratio"] = chain_read_ratio(target, head, k)
    if device.type == "cuda":
        bandwidth = copy_bandwidth(device)
        floor_us = read_bytes(target) / bandwidth * 1e6
        table["copy_bandwidth"] = bandwidth
        table["weight_read_floor_us"] = floor_us
        table["plain_vs_floor"] = plain_us / floor_us
    if acceptance_profile:
        table["projection"] = project_speedup(acceptance_profile, rows[1]["vs_plain"])
    del target, head
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return table


def read_bytes(model, select=lambda name: True) -> int:
    """Bytes of the selected weights a forward reads whole: every parameter once (a tied
    lm_head too: it shares the embedding's tensor, but is read whole where the embedding
    is a lookup of a few rows, so only the embedding's name is left out), and an fp8
    weight's row scales."""
    seen, total = set(), 0
    scales = ((name, b) for name, b in model.named_buffers() if name.endswith("weight_scale"))
    for name, p in itertools.chain(model.named_parameters(remove_duplicate=False), scales):
        if "embed_tokens" in name or id(p) in seen or not select(name):
            continue
        seen.add(id(p))
        total += p.numel() * p.element_size()
    return total


def chain_read_ratio(target, head, k: int) -> float:
    """The weight bytes a chain step of k drafts reads over a plain step's: the target's
    once (verifying k + 1 rows reads them once), the EAGLE-3 head's fc once (the
    catch-up's input) and the rest of the head once a draft (k passes, each waiting for
    the one before). While each pass reads its weights from memory, no chain step can
    cost less than this times a plain step of the same weight-read speed."""
    target_bytes = read_bytes(target)
    once = read_bytes(head, lambda name: name.startswith("fc."))
    per_draft = read_bytes(head, lambda name: not name.startswith("fc."))
    return (target_bytes + once + k * per_draft) / target_bytes


def project_speedup(acceptance_profile: list[float], chain_vs_plain: float) -> dict:
    """A chain's speed-up over plain decoding implied by a per-position acceptance profile
    (the share of drafts accepted at positions 1..k, as `bench` prints it) and the ratio of
    a chain step to a plain one: (1 + sum of the profile) tokens a step for the cost of
    ``chain_vs_plain`` plain steps. A projection, not a measurement."""
    if not acceptance_profile or any(not 0 <= p <= 1 for p in acceptance_profile):
        raise ValueError(f"acceptance profile {acceptance_profile!r}: give k rates in [0, 1], e.g. 0.75,0.57,0.45")
    tokens = 1 + sum(acceptance_profile)
    return {"acceptance_profile": list(acceptance_profile), "mean_acceptance_length": tokens,
            "projected_speedup": tokens / chain_vs_plain, "label": "projection, not a measurement"}


def parse_acceptance_profile(text: Optional[str]) -> Optional[list[float]]:
    """--acceptance-profile "0.75,0.57,0.45" -> [0.75, 0.57, 0.45] (None when not given)."""
    if not text:
        return None
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise SystemExit(f"--acceptance-profile: expected comma-separated rates in [0, 1] such as "
                         f"0.75,0.57,0.45, got {text!r}") from None
    if any(not 0 <= v <= 1 for v in values):
        raise SystemExit(f"--acceptance-profile: every rate must lie in [0, 1], got {text!r}")
    return values


def format_table(table: dict) -> str:
    """The table as Markdown rows (BENCHMARKS.md's step-cost tables)."""
    lines = [f"shape {table['shape']}, {table['device']}, {table['dtype']}" +
             (f", draft {table['draft_quantization']}" if table.get("draft_quantization") else "") +
             f", batch {table['batch']}" +
             (f", max_model_len {table['max_model_len']}" if "max_model_len" in table else "") +
             (f", async scheduling {'on' if table['async_scheduling'] else 'off'}" if "async_scheduling" in table
              else "") + "; plain "
             f"{table['plain_tokens_per_s']:.1f} tokens/s" +
             (f"; plain step {table['plain_vs_floor']:.2f}x the weight-read floor "
              f"({table['weight_read_floor_us']:.1f} us at a measured copy bandwidth of "
              f"{table['copy_bandwidth'] / 1e12:.2f} TB/s)" if "plain_vs_floor" in table else "") +
             (f"; a chain step reads {table['chain_read_ratio']:.3f}x a plain step's weight bytes"
              if "chain_read_ratio" in table else ""),
             "| strategy | step us | vs plain | gpu busy us | host us | kernels | syncs | graphs us |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in table["rows"]:
        name = r["strategy"] + (f" k={r['k']}" if "k" in r else "") + \
            (" " + ",".join(str(r["tree"][x]) for x in ("top_k", "depth", "total_tokens")) if "tree" in r else "")
        graphs = ", ".join(f"{n} {us}" for n, us in r["graphs_us"].items()) or "-"
        busy = f"{r['gpu_busy_us']:.1f}" if "gpu_busy_us" in r else "-"
        kernels = f"{r['kernels']:.0f}" if "kernels" in r else "-"
        lines.append(f"| {name} | {r['step_us']:.1f} | {r['vs_plain']:.2f}x | {busy} | {r['host_us']:.1f} | "
                     f"{kernels} | {r['syncs_per_step']:.2f} | {graphs} |")
    if "projection" in table:
        p = table["projection"]
        lines.append(f"projection (not a measurement): acceptance profile {p['acceptance_profile']} -> "
                     f"{p['mean_acceptance_length']:.2f} tokens a step -> {p['projected_speedup']:.2f}x plain")
    return "\n".join(lines)


def run_step_costs(args, record) -> None:
    """The step-cost tables of --step-costs, each recorded under "step_costs"."""
    tree = None
    if getattr(args, "tree", None):
        tree = _tree_options(args.tree)[0][1]
    profile = parse_acceptance_profile(getattr(args, "acceptance_profile", None))
    dtype = {"auto": torch.bfloat16, "bfloat16": torch.bfloat16, "float32": torch.float32,
             "float16": torch.float16}.get(args.dtype)
    if dtype is None:
        raise SystemExit(f"--dtype {args.dtype!r}: the step-cost tables take auto, bfloat16, float16 or float32")
    device = torch.device(args.device) if args.device else default_device()
    if args.draft_quantization and device.type != "cuda":
        raise SystemExit(f"--draft-quantization {args.draft_quantization}: fp8 drafts run on CUDA only; drop it or "
                         f"run the step costs on a GPU")
    if args.step_cost_batch < 1:
        raise SystemExit(f"--step-cost-batch {args.step_cost_batch}: give the number of requests a step serves, "
                         "1 or more")
    for name in [s for s in args.step_costs.split(",") if s]:
        if name not in SHAPES:
            raise SystemExit(f"--step-costs: unknown shape {name!r}; choose from {', '.join(SHAPES)}")
        try:
            table = step_cost_table(name, k=args.tput_k, tree=tree, dtype=dtype, device=device,
                                    steps=args.step_cost_steps, acceptance_profile=profile,
                                    batch=args.step_cost_batch, max_model_len=args.perf_max_model_len,
                                    async_scheduling=args.async_scheduling,
                                    draft_quantization=args.draft_quantization)
        except Exception as exc:  # one shape's failure must not cost the tables after it
            traceback.print_exc()
            record("step_costs", {"shape": name, "error": f"{type(exc).__name__}: {exc}"})
            continue
        print(format_table(table), flush=True)
        record("step_costs", json.loads(json.dumps(table)))
