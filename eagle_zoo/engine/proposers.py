"""Draft proposers: EAGLE / EAGLE-3 heads, n-gram prompt lookup, a small draft model.

A proposer answers three calls from the engine (all batched over sequences):
  on_prefill(seq, target_out)      a new sequence's prompt went through the target
  propose(batch) -> (draft[B,K], num_draft[B])
  on_verify(batch, verified)       the target verified the drafts; catch up
Drafts are greedy (argmax), so the draft distribution q is one-hot and the
rejection sampler needs no draft probabilities.

The EAGLE proposers catch up with a padded batch: after verification the head always
consumes all K+1 verified positions (fixed shape) and the state is gathered at each
sequence's number of accepted tokens; unaccepted positions are overwritten by the next
round before anything attends to them.

K may change from step to step (adaptive depth, config/depth_schedule.py): a step's K
is StepBatch.depth, and a step without drafts (K = 0) calls on_plain_step so that a
proposer with state (the head's cache and features, the draft model's cache) keeps up
with the token the target emitted.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ..hookspecs import hookimpl
from ..kernels.scatter_row import scatter_row
from ..models.fused_layer import CpuEagle3Head
from ..specs import ProposerSpec
from .graphs import GraphedForward
from .host_tensors import device_tensor
from .runner import ModelRunner


@dataclass
class StepBatch:
    """The sequences of one decode step, as device tensors."""

    slots: torch.Tensor  # [B] cache rows
    base_positions: torch.Tensor  # [B] position of each sequence's last (unverified) token
    token_history: list[list[int]]  # host-side token ids per sequence (n-gram lookup)
    kv_len: int  # host-known bound: max base position + K + 1
    # Every request greedy: a proposer may then return fewer than K draft columns. With
    # sampling the width must stay K, since verification draws each request's random
    # numbers by width and a seeded request must not depend on the rest of the batch.
    all_greedy: bool = False
    # This step's number of draft tokens (adaptive depth); None: num_speculative_tokens.
    depth: Optional[int] = None


@dataclass
class TargetOutput:
    input_ids: torch.Tensor  # [B, T] tokens the target consumed
    tokens: torch.Tensor  # [B, T] the token that follows each of them (-1: none yet)
    positions: torch.Tensor  # [B, T]
    hidden: torch.Tensor  # [B, T, H] final hidden state
    aux: list[torch.Tensor]  # residual streams of the aux layers, [B, T, H] each


class Proposer:
    num_speculative_tokens: int
    aux_layer_ids: tuple[int, ...] = ()
    needs_token_history = False  # StepBatch.token_history is built only for those that read it
    needs_token_history_on_plain_steps = False  # ... and on plain steps (K = 0) only if this is set
    # Whether propose / on_verify / on_plain_step do device work only (no host inputs, no
    # syncs), so async scheduling may launch a step before the previous one is read back.
    device_only_steps = False
    # The engine's step for this proposer (EngineCore.strategy): "chain" (propose, one
    # target pass over [last, drafts], on_verify), "tree" (propose_tree, tree_verify.py)
    # or "parallel" (a chain step whose drafts come from one head pass).
    step_strategy = "chain"

    def on_prefill(self, slot: int, out: TargetOutput) -> None:
        pass

    def propose(self, batch: StepBatch) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        raise NotImplementedError

    def on_verify(self, batch: StepBatch, out: TargetOutput, num_accepted: torch.Tensor) -> None:
        pass

    def on_plain_step(self, batch: StepBatch, out: TargetOutput) -> None:
        """A step that verified no drafts: ``out`` holds the one token the target consumed
        per sequence and the one it emitted. Stateless proposers ignore it."""

    def depth(self, batch: StepBatch) -> int:
        return self.num_speculative_tokens if batch.depth is None else batch.depth


# The CPU one-call drafts (cpu_head) stop early: a draft is verified only while the
# product of the drafts' top probabilities so far is at least this, the head's own
# estimate that all of them are accepted. On two CPU cores each verified row costs about a
# third of a plain step (four rows of the target's products are compute-bound there), so a
# draft unlikely to be accepted costs more than it returns; on a GPU a row is nearly free
# and CUDA graphs want fixed shapes, so chains there always verify k. Chosen on the dev set
# (BENCHMARKS.md, "Decided by measurement"): 0.35 against 0 (always k), 0.2, 0.25, 0.45, 0.5.
CPU_DRAFT_MIN_CONFIDENCE = 0.35


class EagleProposer(Proposer):
    """EAGLE-1 and EAGLE-3 chains: the head drafts from the target's features."""

    device_only_steps = True

    def __init__(self, head, method: str, k: int, num_slots: int, max_len: int, dtype, device,
                 target_num_layers: int, graph_pool=None):
        self.head = head
        self.method = method
        self.num_speculative_tokens = k
        self.runner = ModelRunner(head, num_slots, max_len, dtype, device, graph_pool)
        hidden_size = head.config.hidden_size
        # The head's output at each sequence's last verified position; the first draft is
        # computed from it in propose(), so plain steps skip the lm_head. One row more for
        # the scratch slot that padding rows of a graphed batch use.
        self.next_hidden = torch.zeros(num_slots + 1, hidden_size, dtype=dtype, device=device)
        self._offsets: dict[int, torch.Tensor] = {}  # step_positions
        # A chain's forms (the tree and parallel-drafting subclasses draft otherwise). With
        # CUDA graphs (the runner has them) the whole drafting loop and the whole catch-up
        # each replay as one graph: a step's head passes, lm_heads, argmaxes and index
        # arithmetic, which eagerly cost more launches and Python than the head itself.
        chain = self.step_strategy == "chain"
        self.graphed_drafts = self.graphed_catch_up = None
        if chain and self.runner.graphed is not None:
            self.graphed_drafts = GraphedForward(self._draft_chain, num_slots, num_slots, graph_pool)
            self.graphed_catch_up = GraphedForward(self._catch_up, num_slots, num_slots, graph_pool)
        # On the CPU an EAGLE-3 head's drafts of a step run as one C++ call, and so does its
        # catch-up, where the head's structure allows (models/fused_layer.py CpuEagle3Head),
        # chosen once here; the drafts stop at cpu_min_confidence, so a step verifies up to k.
        self.cpu_head = (CpuEagle3Head(head, self.runner.kv_caches)
                         if chain and method == "eagle3" and self.runner.graphed is None
                         and CpuEagle3Head.supported(head, self.runner.kv_caches) else None)
        self.cpu_min_confidence = CPU_DRAFT_MIN_CONFIDENCE
        if method == "eagle3":
            ids = getattr(head.config, "eagle_aux_hidden_state_layer_ids", None)
            n = target_num_layers
            self.aux_layer_ids = tuple(ids) if ids else (2, n // 2, n - 3)
            if not all(0 <= i < n for i in self.aux_layer_ids):  # layers the config names: checked at load
                raise ValueError(
                    f"the EAGLE-3 head reads target layers {list(self.aux_layer_ids)} (the default 2, N // 2, "
                    f"N - 3), but the target has {n} layers: set eagle_aux_hidden_state_layer_ids in the "
                    f"head's config to three of 0..{n - 1}")

    def _feature_inputs(self, out: TargetOutput) -> tuple[torch.Tensor, ...]:
        """What the head's features are made of: the aux residual streams (EAGLE-3) or the
        final hidden state."""
        return tuple(out.aux) if self.method == "eagle3" else (out.hidden,)

    def _combine(self, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
        if self.method == "eagle3":
            return self.head.combine_hidden_states(torch.cat(inputs, dim=-1))
        return inputs[0]

    def _features(self, out: TargetOutput) -> torch.Tensor:
        return self._combine(self._feature_inputs(out))

    def _draft_token(self, h: torch.Tensor) -> torch.Tensor:
        return self.head.draft_argmax(h)

    @torch.inference_mode()
    def on_prefill(self, slot: int, out: TargetOutput) -> None:
        # Non-blocking (host_tensors.py), so the host queues the head's pass behind the
        # target's prefill instead of waiting for it to finish first.
        slots = device_tensor([slot], out.tokens.device, torch.long)
        h = self.runner.prefill(out.tokens, slots, self._features(out))  # positions 0 .. L-1: the prompt's
        self.next_hidden[slot] = h[0, -1]

    @torch.inference_mode()
    def propose(self, batch: StepBatch):
        k = self.depth(batch)
        base = batch.base_positions.unsqueeze(1)
        if self.graphed_drafts is not None and self.graphed_drafts.eligible(base):
            return self.graphed_drafts(base, base, batch.slots, k), None
        return self._draft_chain(None, base, batch.slots, k, kv_len=batch.kv_len), None

    def _draft_chain(self, _, base: torch.Tensor, slots: torch.Tensor, k: int, kv_len: Optional[int] = None):
        """K greedy drafts [B, K] from next_hidden[slots] (the CPU one-call drafts: the first
        n <= K [1, n], cpu_min_confidence); base [B, 1] holds each sequence's
        last verified position (the first argument fills GraphedForward's input_ids place).
        Device work only, so one graph on CUDA; captured, kv_len is None (runner.run's
        whole-row form)."""
        hidden = self.next_hidden[slots]
        positions = self.step_positions(base, k)  # draft j + 1 is fed at base + j
        if self._takes_cpu_head(slots, kv_len):
            return self.cpu_head.drafts(hidden, positions[:, :k - 1], int(slots[0]), kv_len, k,
                                        self.cpu_min_confidence)
        token = self._draft_token(hidden)
        drafts = [token]
        for step in range(k - 1):
            hidden = self.runner.run(token.unsqueeze(1), positions[:, step:step + 1], slots, kv_len,
                                     hidden.unsqueeze(1))[:, 0]
            token = self._draft_token(hidden)
            drafts.append(token)
        return torch.stack(drafts, dim=1)

    def step_positions(self, base: torch.Tensor, k: int) -> torch.Tensor:
        """base [B, 1] + (0 .. k) in one launch, from an arange made once per k (the first
        call is a graph's warm-up, outside its capture)."""
        offsets = self._offsets.get(k)
        if offsets is None:
            offsets = self._offsets[k] = torch.arange(k + 1, device=base.device)
        return base + offsets

    @property
    def whole_step_graphable(self) -> bool:
        """Whether greedy_chain_step can be captured: a head runner with CUDA graphs (not
        speculative_config enforce_eager)."""
        return self.runner.graphed is not None

    def greedy_chain_step(self, verify, last: torch.Tensor, base: torch.Tensor, slots: torch.Tensor, k: int):
        """A whole greedy chain step in the whole-row forms, device work only, so that
        EngineCore.chain_step_graph captures it as one CUDA graph: K drafts, the target's
        pass with greedy verification ``verify(input_ids, positions, slots, drafts) ->
        (tokens, accepted, hidden, aux)`` over [last, drafts], then the padded catch-up.
        last, base [B, 1] (base: each sequence's last verified position); -> (tokens
        [B, K+1], -1 past the accepted run; accepted [B])."""
        drafts = self._draft_chain(None, base, slots, k)
        input_ids = torch.cat([last, drafts], dim=1)
        positions = self.step_positions(base, k)
        tokens, accepted, hidden, aux = verify(input_ids, positions, slots, drafts)
        verified = TargetOutput(input_ids, tokens, positions, hidden, aux)
        self._catch_up(tokens, positions, slots, accepted.view(-1, 1), *self._feature_inputs(verified))
        return tokens, accepted

    @torch.inference_mode()
    def on_verify(self, batch: StepBatch, out: TargetOutput, num_accepted: torch.Tensor) -> None:
        inputs = self._feature_inputs(out)
        accepted = num_accepted.view(-1, 1)
        if self.graphed_catch_up is not None and self.graphed_catch_up.eligible(out.tokens):
            self.graphed_catch_up(out.tokens, out.positions, batch.slots, accepted, *inputs)
        else:
            self._catch_up(out.tokens, out.positions, batch.slots, accepted, *inputs, kv_len=batch.kv_len)

    def _catch_up(self, tokens, positions, slots, num_accepted, *inputs, kv_len: Optional[int] = None) -> None:
        """The padded catch-up: the head consumes all K + 1 verified positions ([B, K+1]
        tokens, -1 past the accepted run) and next_hidden[slots] takes its output at each
        sequence's num_accepted ([B, 1]). inputs: the target's final hidden state (EAGLE-1)
        or its aux residual streams (EAGLE-3). Device work only (one graph on CUDA; kv_len
        as in _draft_chain)."""
        h = self._head_pass(tokens, positions, slots, kv_len, inputs)  # -1: a zero row (embedding)
        scatter_row(self.next_hidden, slots, h, num_accepted.view(-1))

    def _head_pass(self, tokens, positions, slots, kv_len: Optional[int], inputs) -> torch.Tensor:
        """The head over [B, T] verified tokens from the target's features (inputs as in
        _catch_up) -> its output [B, T, H]: cpu_head's one C++ call where it applies, else
        the runner over the head's modules."""
        if self._takes_cpu_head(slots, kv_len):
            h = self.cpu_head.catch_up(inputs, tokens, positions, int(slots[0]), kv_len)
            if h is not None:
                return h.unsqueeze(0)
        return self.runner.run(tokens, positions, slots, kv_len, self._combine(inputs))

    def _takes_cpu_head(self, slots: torch.Tensor, kv_len: Optional[int]) -> bool:
        """Whether an eager step's head work runs as cpu_head's C++ calls: one sequence."""
        return self.cpu_head is not None and kv_len is not None and slots.shape[0] == 1

    @torch.inference_mode()
    def on_plain_step(self, batch: StepBatch, out: TargetOutput) -> None:
        # The head consumes the emitted token at the target's position, as in a catch-up
        # after K = 0 drafts; one head layer, no lm_head (the next propose() computes it).
        h = self._head_pass(out.tokens, out.positions, batch.slots, batch.kv_len, self._feature_inputs(out))
        self.next_hidden[batch.slots] = h[:, 0]


class NgramProposer(Proposer):
    """Prompt lookup: find the latest earlier occurrence of the sequence's trailing
    n-gram (longest n first, prompt_lookup_max down to prompt_lookup_min) and propose
    the tokens that followed it."""

    needs_token_history = True

    def __init__(self, k: int, n_min: int, n_max: int, device):
        self.num_speculative_tokens = k
        self.n_min, self.n_max = n_min, n_max
        self.device = device

    def lookup(self, tokens: list[int], k: Optional[int] = None) -> list[int]:
        k = self.num_speculative_tokens if k is None else k
        t = torch.tensor(tokens)
        for n in range(min(self.n_max, len(tokens) - 1), self.n_min - 1, -1):
            windows = t[:-1].unfold(0, n, 1) if len(tokens) - 1 >= n else None
            if windows is None or windows.numel() == 0:
                continue
            hits = (windows == t[-n:]).all(dim=1).nonzero().flatten()
            if hits.numel():
                start = int(hits[-1]) + n
                return tokens[start : start + k]
        return []

    def propose(self, batch: StepBatch):
        k = self.depth(batch)
        rows = [self.lookup(toks, k) for toks in batch.token_history]
        # Greedy batches: only as many columns as the longest match, so a step where
        # nothing matched is a plain one-token step rather than a verification of padding.
        width = max(len(r) for r in rows) if batch.all_greedy else k
        num = device_tensor([len(r) for r in rows], self.device, torch.long)
        drafts = device_tensor([r + [0] * (width - len(r)) for r in rows], self.device, torch.long)
        return drafts.view(len(rows), width), num


class DraftModelProposer(Proposer):
    """A small model sharing the target's vocabulary drafts greedily.

    Its cache holds every verified token but possibly the last two; each round
    starts by (re)feeding the last two verified tokens, which covers the case where
    all drafts were accepted and the last draft was never fed (one extra slot). A plain
    step (K = 0) feeds the two tokens before the emitted one, keeping that invariant."""

    needs_token_history = True
    needs_token_history_on_plain_steps = True

    def __init__(self, model, k: int, num_slots: int, max_len: int, dtype, device, graph_pool=None):
        self.model = model
        self.num_speculative_tokens = k
        self.runner = ModelRunner(model, num_slots, max_len, dtype, device, graph_pool)
        self.device = device

    def _next(self, input_ids, positions, slots, kv_len):
        hidden, _ = self.runner.run(input_ids, positions, slots, kv_len)
        return self.model.compute_logits(hidden[:, -1:])[:, 0].argmax(dim=-1)

    @torch.inference_mode()
    def on_prefill(self, slot: int, out: TargetOutput) -> None:
        # The draft caches the prompt; the first propose() feeds its last token again.
        slots = device_tensor([slot], self.device, torch.long)
        self.runner.prefill(out.input_ids, slots)

    @torch.inference_mode()
    def propose(self, batch: StepBatch):
        last_two = device_tensor([h[-2:] for h in batch.token_history], self.device)
        pos = batch.base_positions.unsqueeze(1) + torch.arange(-1, 1, device=self.device)
        token = self._next(last_two, pos, batch.slots, batch.kv_len)
        drafts = [token]
        for step in range(1, self.depth(batch)):
            pos = (batch.base_positions + step).unsqueeze(1)
            token = self._next(token.unsqueeze(1), pos, batch.slots, batch.kv_len)
            drafts.append(token)
        return torch.stack(drafts, dim=1), None

    @torch.inference_mode()
    def on_plain_step(self, batch: StepBatch, out: TargetOutput) -> None:
        # Before the step the cache held all but the last two of the n tokens; after it
        # there are n + 1, so the two before the emitted one must be in (positions n-2, n-1).
        last_two = device_tensor([h[-2:] for h in batch.token_history], self.device)
        pos = batch.base_positions.unsqueeze(1) + torch.arange(-1, 1, device=self.device)
        self.runner.run(last_two, pos, batch.slots, batch.kv_len)


@hookimpl
def register_proposers(register):
    register(ProposerSpec("eagle", EagleProposer, description="EAGLE-1 head over the target's final hidden state"))
    register(
        ProposerSpec(
            "eagle3",
            EagleProposer,
            parallel_drafting=True,
            description="EAGLE-3 head over three aux hidden states, draft vocabulary",
        )
    )
    register(ProposerSpec("ngram", NgramProposer, needs_model=False, description="prompt lookup (n-gram)"))
    register(ProposerSpec("draft_model", DraftModelProposer, description="a small model sharing the vocabulary"))
