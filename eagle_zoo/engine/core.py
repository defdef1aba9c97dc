"""The engine loop: schedule, prefill new requests, then one speculative step.

One step for the running batch (B sequences, K speculative tokens; K = 0 is plain
decoding):
  drafts[B, K]         <- proposer
  target([last, drafts]) at positions base .. base+K   (one pass, writes the cache)
  tokens, accepted     <- rejection sampler (greedy or lossless random)
  proposer catches up on the verified tokens
  (K comes from the adaptive depth schedule when there is one: a plain step then
  still lets the proposer catch up on the emitted token, on_plain_step)
  one device->host copy of (tokens, accepted); stop checks; metrics
  (requests that asked for logprobs: a second copy of the step's logprobs block, queued
  behind the first and waited for by the same event: still one host sync a step)

Requests with logits processing (penalties, min_tokens, logit bias, bad words) or
logprobs are verified on the eager path: the captured greedy graphs and async run-ahead
serve only plain greedy requests (SamplingParams.plain_greedy).

With async_scheduling (vLLM's option of that name) a step's host work overlaps the
next step's GPU work: while the running batch stays the same, every request is greedy
and the proposer's steps are device-only (plain decoding, EAGLE chains, trees and P-EAGLE), the next step
is launched from the device-side results of the one in flight (its emitted tokens and
positions) before the host waits for that one and does its bookkeeping. A request that
finishes got one step more on the GPU, which is discarded; outputs are unchanged.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import time
from dataclasses import dataclass
from typing import Iterable, Optional

import torch

from . import logprobs as lp
from . import tree_verify
from .detokenizer import update_sequence_text
from ..kernels.step_outputs import step_outputs
from .graphs import StepGraph
from .host_tensors import device_tensor
from .metrics import SpecDecodingMetrics
from .outputs import CompletionOutput, RequestOutput
from .proposers import Proposer, StepBatch, TargetOutput
from .runner import ModelRunner
from .verify import SamplingBatch, verify_drafts, verify_greedy
from .sampling_params import SamplingParams
from .scheduler import Scheduler
from .sequence import Sequence, Status


def tree_unsupported(p: SamplingParams) -> list[str]:
    """The options of ``p`` that EAGLE-2 tree steps do not implement (their verification
    has no logits processing and reads no logprobs back): refused by name."""
    return [name for name, on in (
        ("presence_penalty", p.presence_penalty != 0), ("frequency_penalty", p.frequency_penalty != 0),
        ("repetition_penalty", p.repetition_penalty != 1), ("min_tokens", p.min_tokens > 0),
        ("logit_bias", bool(p.logit_bias)), ("bad_words", bool(p.bad_words)),
        ("allowed_token_ids", p.allowed_token_ids is not None),
        ("logprobs", p.logprobs is not None), ("prompt_logprobs", p.prompt_logprobs is not None)) if on]


def step_strategy(proposer: Optional[Proposer]) -> str:
    """The engine's one step strategy for ``proposer``: "plain" without one, else the
    proposer's ``step_strategy`` ("chain", "tree" or "parallel"; Proposer)."""
    return "plain" if proposer is None else getattr(proposer, "step_strategy", "chain")


@dataclass
class LaunchedStep:
    """A decode step queued on the device, not yet read back by the host."""

    seqs: list[Sequence]
    k: int
    out: torch.Tensor  # [B, k+3]: emitted tokens (-1 padded), accepted drafts, drafted
    slots: torch.Tensor  # [B]
    next_base: torch.Tensor  # [B] each sequence's cached length after the step
    next_last: torch.Tensor  # [B, 1] its last emitted token (the next step's input)
    # CUDA: ``out`` copied into pinned host memory right behind the step, and an event
    # after that copy, so reading it back waits for this step only, not for the next
    # one already queued behind it (a plain .cpu() would wait for the whole stream).
    host_out: Optional[torch.Tensor] = None
    copied: Optional[torch.cuda.Event] = None
    num_positions: Optional[int] = None  # trees: the metrics' positions are the tree's levels
    # Requests that asked for logprobs: [B, k+1, 2 + 2N] (logprobs.pack), and its host copy.
    logprobs: Optional[torch.Tensor] = None
    host_logprobs: Optional[torch.Tensor] = None
    num_top: int = 0


class EngineCore:
    def __init__(
        self,
        target,
        tokenizer,
        *,
        max_model_len: int,
        max_num_seqs: int,
        dtype: torch.dtype,
        device: torch.device,
        proposer: Optional[Proposer] = None,
        seed: int = 0,
        eos_token_ids: Iterable[int] = (),
        graph_pool=None,
        depth_schedule=None,
        async_scheduling: bool = False,
        max_logprobs: int = 20,
    ):
        self.target = target
        self.tokenizer = tokenizer
        self.device = device
        self.max_model_len = max_model_len
        self.proposer = proposer
        self.k = proposer.num_speculative_tokens if proposer else 0  # the largest K
        self.depth_schedule = depth_schedule  # config/depth_schedule.py: K by batch size
        # Verification writes up to K positions past the last verified token (a tree
        # proposer: up to its total_tokens - 1 nodes, tree_verify.py).
        self.max_len = max_model_len + max(self.k, getattr(proposer, "max_verify_tokens", 0)) + 1
        self.runner = ModelRunner(target, max_num_seqs, self.max_len, dtype, device, graph_pool)
        # The step strategy, chosen once: "plain" (no proposer), "tree" (EAGLE-2 trees,
        # tree_verify.launch_tree_step), "parallel" (P-EAGLE drafts from one head pass) or
        # "chain" (EAGLE chains, n-gram, a draft model); plain, chain and parallel steps
        # share _launch. CUDA form: captured graphs (graph_pool given); CPU form (or
        # enforce_eager): the same functions run eagerly.
        self.strategy = step_strategy(proposer)
        graphed = self.runner.graphed is not None
        # Greedy plain / chain / parallel steps: the target's pass, its lm_head and the
        # greedy verification in one CUDA graph. Each whole-step graph here is a StepGraph
        # (graphs.py): it leaves the next step's inputs in its own input buffers, so a step
        # launched ahead of the same batch replays it with nothing copied in.
        self.greedy_target_graph = None
        # Greedy tree steps: drafting, the target's tree pass, acceptance, compaction and
        # the head's catch-up in one CUDA graph (tree_verify.whole_row_greedy_step); only
        # when the head's runner has graphs too (not with speculative_config enforce_eager).
        self.tree_step_graph = None
        if self.strategy == "tree":
            if graphed and proposer.runner.graphed is not None:
                from .tree_verify import whole_row_greedy_step

                self.tree_step_graph = StepGraph(whole_row_greedy_step(self), max_num_seqs, self.runner.scratch_slot,
                                                 graph_pool, drafted=proposer.total_tokens - 1)
        elif graphed:
            self.greedy_target_graph = StepGraph(self.greedy_target_pass, max_num_seqs, self.runner.scratch_slot,
                                                 graph_pool)
        # Greedy EAGLE chain steps: drafting, the target's pass with greedy verification and
        # the catch-up in one CUDA graph (EagleProposer.greedy_chain_step), so the GPU runs
        # the step without eager kernels or idle gaps between graphs (BENCHMARKS.md, "Step
        # costs"); when the head's passes can be captured.
        self.chain_step_graph = None
        if graphed and self.strategy == "chain" and getattr(proposer, "whole_step_graphable", False):
            self.chain_step_graph = StepGraph(functools.partial(proposer.greedy_chain_step, self.greedy_target_pass),
                                              max_num_seqs, self.runner.scratch_slot, graph_pool)
        self.scheduler = Scheduler(max_num_seqs)
        self.metrics = SpecDecodingMetrics(num_speculative_tokens=self.k)
        self.seed = seed
        self.eos_token_ids = set(eos_token_ids)
        self._ids = itertools.count()
        self.aux_layer_ids = tuple(getattr(proposer, "aux_layer_ids", ()) or ())
        self.async_scheduling = async_scheduling
        self.max_logprobs = max_logprobs  # vLLM's engine argument: the most logprobs a request may ask for
        self._token_text: dict[int, str] = {}  # logprobs' decoded tokens
        self._in_flight: Optional[LaunchedStep] = None  # async scheduling: the step not yet read back

    # -- requests --------------------------------------------------------------
    def add_request(
        self, prompt_token_ids: list[int], params: SamplingParams, prompt: Optional[str] = None,
        request_id: Optional[str] = None,
    ) -> Sequence:
        n = next(self._ids)
        if not prompt_token_ids:
            raise ValueError("the prompt is empty: give at least one token")
        if len(prompt_token_ids) >= self.max_model_len:
            raise ValueError(
                f"prompt of {len(prompt_token_ids)} tokens does not fit max_model_len={self.max_model_len} "
                f"(it needs room for at least one new token): shorten the prompt or raise max_model_len"
            )
        vocab = self.target.config.vocab_size
        bad = [t for t in prompt_token_ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {vocab})")
        seq = Sequence(str(n) if request_id is None else request_id, prompt, list(prompt_token_ids), params, n)
        self._check_options(seq, vocab)
        # Every request gets its own generator (seeded by the request, else derived from
        # the engine seed) so sampled outputs do not depend on batch composition.
        seed = params.seed if params.seed is not None else (self.seed * 1_000_003 + n) % 2**64
        seq.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.scheduler.add(seq)
        return seq

    def _check_options(self, seq: Sequence, vocab: int) -> None:
        """Refuses, by name, what this engine cannot honour for ``seq``; turns its bad
        words into token sequences."""
        p = seq.params
        if p.n != 1:
            raise ValueError(f"SamplingParams.n={p.n}: EngineCore runs one completion per request; LLM.generate "
                             "and the server expand n into n requests (SamplingParams.child)")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(p, name)
            if value is not None and value > self.max_logprobs:
                raise ValueError(f"SamplingParams.{name}={value} exceeds max_logprobs={self.max_logprobs}: ask "
                                 f"for fewer, or raise the engine argument max_logprobs")
        if self.strategy == "tree":
            asked = tree_unsupported(p)
            if asked:
                raise ValueError(f"SamplingParams {', '.join(asked)}: not supported with EAGLE-2 tree speculation "
                                 "(speculative_config 'tree'); use an EAGLE chain (no 'tree') or plain decoding")
        bad_bias = sorted(t for t in (p.logit_bias or {}) if t >= vocab)
        if bad_bias:
            raise ValueError(f"SamplingParams.logit_bias token ids {bad_bias[:5]} are outside the vocabulary "
                             f"[0, {vocab})")
        outside = [t for t in (p.allowed_token_ids or []) if t >= vocab]
        if outside:
            raise ValueError(f"SamplingParams.allowed_token_ids {outside[:5]} are outside the vocabulary [0, {vocab})")
        if p.bad_words:
            if self.tokenizer is None:
                raise ValueError("SamplingParams.bad_words needs a tokenizer to turn the words into tokens, and "
                                 "this model has none")
            from .logits_processing import bad_words_token_ids

            seq.bad_words_ids = bad_words_token_ids(p.bad_words, self.tokenizer)
            outside = sorted({t for w in seq.bad_words_ids for t in w if not 0 <= t < vocab})
            if outside:
                raise ValueError(f"SamplingParams.bad_words encode to token ids {outside[:5]}, outside the "
                                 f"model's vocabulary [0, {vocab})")
        if p.logprobs is not None:
            seq.logprobs, seq.cumulative_logprob = [], 0.0

    def abort(self, request_id: str) -> None:
        self.scheduler.abort(request_id)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # -- one engine step -------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> list[Sequence]:
        """Runs one step; returns the sequences that finished in it (a request whose own
        inputs broke the step among them, finished with reason "error"; _fail_request)."""
        plan = self.scheduler.schedule()
        finished = []
        for seq in plan.prefill:
            try:
                self._prefill(seq)
            except Exception as exc:  # one request's prefill: that request alone fails
                self._fail_request(seq, exc)
                finished.append(seq)
                continue
            finished += self._finish_if_done([seq])
        running = [s for s in plan.decode if s.status is Status.RUNNING]
        if running:
            finished += self._decode_isolated(running)
        elif self._in_flight is not None:  # every request of it finished: nothing to read
            self._in_flight = None
        return finished

    def _decode_isolated(self, seqs: list[Sequence]) -> list[Sequence]:
        """_decode, and when it raises, the requests whose own inputs cause the error
        (check_request) fail alone and the step runs again for the others. A step fails
        on those inputs before it changes any state (the sampling batch is built first),
        so the others' outputs are what they would have been without the bad request. An
        error no request is found to cause (the device, the model) propagates."""
        try:
            return self._decode(seqs)
        except Exception:
            culprits = [(s, e) for s in seqs if (e := self.check_request(s)) is not None]
            if not culprits:
                raise
        for seq, exc in culprits:
            self._fail_request(seq, exc)
        rest = [s for s in seqs if s.status is Status.RUNNING]
        return [s for s, _ in culprits] + (self._decode(rest) if rest else [])

    def check_request(self, seq: Sequence) -> Optional[Exception]:
        """The error one request's own per-step inputs raise (its sampling parameters'
        range checks, its sampling values on the device), or None."""
        try:
            dataclasses.replace(seq.params)  # its range checks again (a SamplingParams is mutable)
            self._sampling_batch([seq])
        except Exception as exc:
            return exc
        return None

    def _fail_request(self, seq: Sequence, exc: BaseException) -> None:
        """Finishes ``seq`` with reason "error" (the message in seq.error), freeing its slot."""
        seq.error = f"{type(exc).__name__}: {exc}"
        seq.finish_reason = "error"
        self.scheduler.finish(seq)
        self.metrics.observe_request(len(seq.prompt_token_ids), len(seq.output_token_ids))

    def _sampling_batch(self, seqs: list[Sequence]) -> SamplingBatch:
        """The batch's sampling values on the device; chain and plain steps (and prefill)
        with its logits processing, tree steps without (they refuse it: _check_options)."""
        vocab = None if self.strategy == "tree" else self.target.config.vocab_size
        return SamplingBatch.from_sequences(seqs, self.device, vocab, self.eos_token_ids)

    def _decode_token(self, token: int) -> Optional[str]:
        """A token's text for logprobs (vLLM: the token decoded alone), cached."""
        if self.tokenizer is None:
            return None
        text = self._token_text.get(token)
        if text is None:
            text = self._token_text[token] = self.tokenizer.decode([token])
        return text

    def _prefill(self, seq: Sequence) -> None:
        # Pinned, non-blocking copies (host_tensors.py): the host queues the prefill behind a
        # step still running instead of waiting for it.
        ids = device_tensor([seq.prompt_token_ids], self.device, torch.long)
        positions = torch.arange(ids.shape[1], device=self.device).unsqueeze(0)
        slots = device_tensor([seq.slot], self.device, torch.long)
        hidden, aux = self.runner.prefill(ids, slots, self.aux_layer_ids)
        logits = self.target.compute_logits(hidden[:, -1:])
        batch = self._sampling_batch([seq])
        tokens, _ = verify_drafts(logits, None, None, batch)
        if self.proposer is not None:
            next_tokens = torch.cat([ids[:, 1:], tokens[:, :1]], dim=1)
            self.proposer.on_prefill(seq.slot, TargetOutput(ids, next_tokens, positions, hidden, aux))
        p = seq.params
        if p.prompt_logprobs is not None:
            seq.prompt_logprobs = self._prompt_logprobs(hidden, seq.prompt_token_ids, p.prompt_logprobs)
        rows = None
        if p.logprobs is not None:
            rows = lp.pack(logits, tokens[:, :1], p.logprobs)[0].tolist()
        self._append(seq, [int(tokens[0, 0])], rows)

    PROMPT_LOGPROBS_CHUNK = 512  # prompt positions whose [chunk, V] logits exist at once

    def _prompt_logprobs(self, hidden: torch.Tensor, prompt: list[int], num_top: int) -> list:
        out: list = [None]
        step = self.PROMPT_LOGPROBS_CHUNK
        for start in range(0, len(prompt) - 1, step):
            end = min(start + step, len(prompt) - 1)
            logits = self.target.compute_logits(hidden[:, start:end])[0]
            out += lp.prompt_logprobs(logits, prompt[start:end + 1], num_top, self._decode_token)[1:]
        return out

    def _decode(self, seqs: list[Sequence]) -> list[Sequence]:
        k = self.k if self.depth_schedule is None or not self.k else self.depth_schedule.choose(len(seqs))
        finished = []
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is not None:
            if k == in_flight.k and len(seqs) == len(in_flight.seqs) and self._may_run_ahead(seqs) \
                    and all(a is b for a, b in zip(seqs, in_flight.seqs)):
                # The same batch: queue its next step from the device-side results first,
                # then read back the one in flight while the GPU runs the next.
                kv_len = max(s.num_cached for s in seqs) + 2 * (k + 1)  # in flight: up to k + 1 more tokens
                self._in_flight = self._launch_step(seqs, k, in_flight.slots, in_flight.next_base,
                                                    in_flight.next_last, kv_len)
                return self._read_back(in_flight)
            finished = self._read_back(in_flight)
            seqs = [s for s in seqs if s.status is Status.RUNNING]
            if not seqs:
                return finished
        # One host->device copy for the step's three per-sequence columns.
        cached = [s.num_cached for s in seqs]
        columns = device_tensor([[s.slot for s in seqs], cached, [s.last_token_id for s in seqs]], self.device,
                                torch.long)
        slots, base, last = columns[0], columns[1], columns[2].unsqueeze(1)
        launched = self._launch_step(seqs, k, slots, base, last, max(cached) + k + 1)
        if self._may_run_ahead(seqs):
            self._in_flight = launched
            return finished
        return finished + self._read_back(launched)

    def _may_run_ahead(self, seqs: list[Sequence]) -> bool:
        """Whether the next step of ``seqs`` may be launched before this one is read back:
        plain greedy requests (a sampled one's generator must not draw for a discarded step;
        a processed one's history must hold the step before),
        a proposer without host-side inputs or syncs, and room in the caches for a step
        beyond one that may already have filled a request to max_model_len."""
        return (self.async_scheduling and all(s.params.plain_greedy for s in seqs)
                and (self.proposer is None or getattr(self.proposer, "device_only_steps", False))
                and max(s.num_tokens for s in seqs) + 2 * (self.k + 1) < self.max_model_len)

    def _launch_step(self, seqs: list[Sequence], k: int, slots: torch.Tensor, base: torch.Tensor,
                     last: torch.Tensor, kv_len: int) -> LaunchedStep:
        """Queue one decode step on the device (no host sync): a chain step (_launch) or an
        EAGLE-2 tree step (tree_verify.launch_tree_step, whose max_base is the bound on the
        sequences' cached lengths that kv_len carries). base [B]; last [B, 1]."""
        if self.strategy == "tree":
            return tree_verify.launch_tree_step(self, seqs, slots, base, last[:, 0], kv_len - (k + 1))
        return self._launch(seqs, k, slots, base, last, kv_len)

    def step_outputs(self, tokens: torch.Tensor, accepted: torch.Tensor, drafted, base: torch.Tensor,
                     slots: torch.Tensor) -> tuple:
        """An eager step's (out, next_last, next_base) from its emitted tokens [B, k+1] (-1
        padded), accepted drafts [B] and drafted tokens ([B], or the count every row drafted):
        what a StepGraph computes inside its graph (kernels/step_outputs.py)."""
        return step_outputs(tokens, accepted, drafted, base, slots, self.runner.scratch_slot)

    def launched_step(self, seqs: list[Sequence], k: int, out: torch.Tensor, next_last: torch.Tensor,
                      next_base: torch.Tensor, slots: torch.Tensor, num_positions: Optional[int] = None,
                      logprobs: Optional[torch.Tensor] = None, num_top: int = 0) -> LaunchedStep:
        """The LaunchedStep of a step queued on the device: out [B, k+3], next_last [B, 1]
        and next_base [B] as step_outputs gives them (and the logprobs block of
        logprobs.pack, when a request of the step asked for logprobs)."""
        step = LaunchedStep(seqs, k, out, slots, next_base, next_last,
                            num_positions=num_positions, logprobs=logprobs, num_top=num_top)
        if out.is_cuda:
            step.host_out = torch.empty(out.shape, dtype=out.dtype, pin_memory=True)
            step.host_out.copy_(out, non_blocking=True)
            if logprobs is not None:  # behind the same event: still one wait a step
                step.host_logprobs = torch.empty(logprobs.shape, dtype=logprobs.dtype, pin_memory=True)
                step.host_logprobs.copy_(logprobs, non_blocking=True)
            step.copied = torch.cuda.Event()
            step.copied.record()
        return step

    def _launch(self, seqs: list[Sequence], k: int, slots: torch.Tensor, base: torch.Tensor, last: torch.Tensor,
                kv_len: int) -> LaunchedStep:
        """Queue one chain decode step on the device (no host sync): drafts, the target's
        pass, verification, the proposer's catch-up. base [B]: cached lengths; last [B, 1]."""
        dev = self.device
        # First, before anything changes state: a request whose sampling values cannot be
        # put on the device fails here, and the step can run again without it.
        sampling = self._sampling_batch(seqs)
        wants_logprobs = [s.params.logprobs for s in seqs if s.params.logprobs is not None]
        whole = self.chain_step_graph
        if k and whole is not None and sampling.plain_greedy and not wants_logprobs and whole.eligible(last):
            return self.launched_step(seqs, k, *whole(last, base.unsqueeze(1), slots, k))
        # Copying every sequence's token list is O(length) per step: only for proposers
        # that read it (n-gram lookup, the draft model's last two tokens).
        reads = self.proposer is not None and (self.proposer.needs_token_history if k else
                                               self.proposer.needs_token_history_on_plain_steps)
        history = [s.all_token_ids for s in seqs] if reads else []
        batch = StepBatch(slots, base, history, kv_len,
                          all_greedy=all(s.params.greedy for s in seqs), depth=k)
        drafts = num_draft = None
        if k:
            drafts, num_draft = self.proposer.propose(batch)
            # A proposer may return fewer than K columns (n-gram: the longest match in
            # the batch, known on the host); verify only those, down to plain decoding.
            k = drafts.shape[1]
            input_ids = torch.cat([last, drafts], dim=1) if k else last
            if not k:
                drafts = num_draft = None
        else:
            input_ids = last
        positions = base.unsqueeze(1) + torch.arange(k + 1, device=dev) if k else base.unsqueeze(1)
        graph = self.greedy_target_graph
        block = None
        if sampling.plain_greedy and not wants_logprobs and num_draft is None and graph is not None \
                and graph.eligible(input_ids):
            # A plain step verifies [B, 0] drafts.
            *outputs, hidden, aux = graph(input_ids, positions, slots, drafts if k else input_ids[:, :0])
            tokens, accepted = outputs[0][:, :k + 1], outputs[0][:, k + 1]
        else:
            hidden, aux = self.runner.run(input_ids, positions, slots, kv_len, self.aux_layer_ids)
            logits = self.target.compute_logits(hidden)
            tokens, accepted = verify_drafts(logits, drafts, num_draft, sampling)
            if wants_logprobs:
                block = lp.pack(logits, tokens, max(wants_logprobs))
            outputs = (*self.step_outputs(tokens, accepted, k if num_draft is None else num_draft, base, slots), slots)
        if k:
            self.proposer.on_verify(batch, TargetOutput(input_ids, tokens, positions, hidden, aux), accepted)
        elif self.proposer is not None:  # a plain step (schedule K = 0, or no n-gram match)
            self.proposer.on_plain_step(batch, TargetOutput(input_ids, tokens, positions, hidden, aux))
        return self.launched_step(seqs, k, *outputs, logprobs=block, num_top=max(wants_logprobs, default=0))

    def greedy_target_pass(self, input_ids, positions, slots, drafts):
        """The target over [B, K+1] tokens (whole cache rows) and greedy verification of
        the K drafts: -> (tokens, accepted, hidden, aux), what the eager path computes with
        runner.run + compute_logits + verify_drafts; the form greedy_target_graph captures."""
        hidden, aux = self.runner.forward_full_length(input_ids, positions, slots, self.aux_layer_ids)
        tokens, accepted = verify_greedy(self.target.compute_logits(hidden), drafts, None)
        return tokens, accepted, hidden, aux

    def _read_back(self, step: LaunchedStep) -> list[Sequence]:
        """The step's one device->host synchronisation (tokens, accepted, drafted), then
        metrics, stop checks and finishing. Requests that finished or were aborted since
        the step was launched are skipped (async scheduling ran one step past them)."""
        k = step.k
        if step.copied is not None:
            step.copied.synchronize()
            host = step.host_out.tolist()
            host_lp = step.host_logprobs.tolist() if step.host_logprobs is not None else None
        else:
            host = step.out.cpu().tolist()
            host_lp = step.logprobs.cpu().tolist() if step.logprobs is not None else None
        if host_lp is None:
            host_lp = [None] * len(host)
        live = [(seq, row, rows_lp) for seq, row, rows_lp in zip(step.seqs, host, host_lp)
                if seq.status is Status.RUNNING]
        if self.k:
            self.metrics.observe([row[k + 2] for _, row, _ in live], [row[k + 1] for _, row, _ in live],
                                 num_positions=step.num_positions)
        failed = []
        for seq, row, rows_lp in live:
            if row[k + 2]:  # the request's own counters (vLLM's RequestOutput.metrics)
                m = seq.metrics
                m.num_drafts += 1
                m.num_draft_tokens += row[k + 2]
                m.num_accepted_tokens += row[k + 1]
            try:
                self._append(seq, row[: row[k + 1] + 1], rows_lp)
            except Exception as exc:  # its stop checks or detokenization: it alone fails
                self._fail_request(seq, exc)
                failed.append(seq)
        return failed + self._finish_if_done([seq for seq, _, _ in live if seq.status is Status.RUNNING])

    # -- bookkeeping -----------------------------------------------------------
    def _append(self, seq: Sequence, new_tokens: list[int], logprob_rows: Optional[list] = None) -> None:
        """``logprob_rows``: one logprobs.pack row per new token (a step's rows, for
        requests that asked for logprobs)."""
        if new_tokens and not seq.output_token_ids:
            seq.metrics.first_token_time = time.monotonic()
        for i, t in enumerate(new_tokens):
            seq.output_token_ids.append(t)
            if seq.logprobs is not None:
                entry = lp.unpack(logprob_rows[i], t, seq.params.logprobs, self._decode_token)
                seq.logprobs.append(entry)
                seq.cumulative_logprob += entry[t].logprob
            if self._stop_reason(seq, t):
                break
            if self._at_length_limit(seq):
                break
        self._update_text(seq)

    def _at_length_limit(self, seq: Sequence) -> bool:
        # max_tokens None means: until the context (max_model_len) is full.
        limit = seq.params.max_tokens
        return (limit is not None and len(seq.output_token_ids) >= limit) or seq.num_tokens >= self.max_model_len

    def _stop_reason(self, seq: Sequence, token: int) -> bool:
        p = seq.params
        if len(seq.output_token_ids) < p.min_tokens:  # masked from sampling; and never a stop before
            return False
        if token in (p.stop_token_ids or ()):
            seq.finish_reason, seq.stop_reason = "stop", token
        elif not p.ignore_eos and token in self.eos_token_ids:
            seq.finish_reason, seq.stop_reason = "stop", None
        return seq.finish_reason is not None

    def _update_text(self, seq: Sequence) -> None:
        if self.tokenizer is None:
            return
        update_sequence_text(seq, self.tokenizer)  # incremental: decodes only the new tokens' window

    def _finish_if_done(self, seqs: list[Sequence]) -> list[Sequence]:
        done = []
        for seq in seqs:
            if seq.finish_reason is None and self._at_length_limit(seq):
                seq.finish_reason = "length"
            if seq.finish_reason is not None:
                self.scheduler.finish(seq)
                self.metrics.observe_request(len(seq.prompt_token_ids), len(seq.output_token_ids),
                                             seq.finish_reason)
                done.append(seq)
        return done

    def to_output(self, seq: Sequence) -> RequestOutput:
        completion = CompletionOutput(
            index=0,
            text=seq.output_text,
            token_ids=list(seq.output_token_ids),
            finish_reason=seq.finish_reason,
            stop_reason=seq.error if seq.error is not None else seq.stop_reason,
            logprobs=None if seq.logprobs is None else list(seq.logprobs),
            cumulative_logprob=seq.cumulative_logprob,
        )
        return RequestOutput(
            request_id=seq.request_id,
            prompt=seq.prompt,
            prompt_token_ids=seq.prompt_token_ids,
            outputs=[completion],
            finished=seq.finished,
            metrics=dataclasses.replace(seq.metrics),
            prompt_logprobs=seq.prompt_logprobs,
        )
