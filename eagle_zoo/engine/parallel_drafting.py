"""Parallel drafting for P-EAGLE heads (speculators ``peagle``; speculative_config
``parallel_drafting``): all K drafts of a sequence from one head pass.

A P-EAGLE head is an EAGLE-3 head trained so that K-1 extra slots appended after the
last verified position predict the tokens after the first draft in the same forward
pass (K-1 extra draft slots per request). Each extra slot is fed the
checkpoint's placeholder instead of a real token and feature:
  token    config.json ``mask_token_id`` (vLLM also reads ``pard_token`` /
           ``ptd_token_id``; the first one present wins, in that order)
  feature  the ``mask_hidden`` tensor, an aux-concat vector [3 * H_target] that goes
           through the head's fc like the target's concatenated aux states
and the slots take the positions after the last verified one, attending causally to
the context and to the slots before them.

One pass per step does the catch-up and the drafting (engine/proposers.py explains the
catch-up): the K+1 verified positions of the step (padded; rejected ones included) plus
K-1 slots at positions p+1 .. p+K-1, p the last accepted position. The rejected
positions' keys/values would collide with the slots', so their cache writes are moved
K columns on (cache_positions; rope positions unchanged): nothing reads them, and the
next round overwrites them. Draft 0 is the output at p, drafts 1..K-1 the slots'
outputs. The drafts are made at the end of a step (and at prefill) for the next one,
always K of them; a step of depth d < K (adaptive depth) proposes the first d. A plain
step (K = 0) runs the same pass over its one emitted token (a verification of one token,
none of it rejected).

With CUDA graphs the pass after a step is one graph (graphed_pass), captured per batch
bucket and width in its whole-row form, as the chain's catch-up is; the prompt's pass
at prefill runs eagerly. The mask token must be inside the head's embedding: a
checkpoint whose mask_token_id is past the target vocabulary needs its own embed_tokens
with that row.
"""
from __future__ import annotations

import torch

from .graphs import GraphedForward
from .host_tensors import device_tensor
from .proposers import EagleProposer, StepBatch, TargetOutput

MASK_TOKEN_KEYS = ("mask_token_id", "pard_token", "ptd_token_id")


def mask_token_id(config, source: str) -> int:
    for key in MASK_TOKEN_KEYS:
        value = getattr(config, key, None)
        if value is not None:
            return int(value)
    raise ValueError(
        f"{source}: parallel_drafting needs the P-EAGLE placeholder token id in config.json "
        f"({' / '.join(MASK_TOKEN_KEYS)}); it has none: add it, or set \"parallel_drafting\": false "
        f"to draft one token at a time"
    )


class ParallelEagleProposer(EagleProposer):
    step_strategy = "parallel"

    def __init__(self, head, k: int, num_slots: int, max_len: int, dtype, device, target_num_layers: int,
                 graph_pool=None, source: str = "the draft head"):
        # Room for the moved writes of rejected positions: up to 2K past the last verified one
        # (with async scheduling one step later still: within the engine's room check,
        # EngineCore._may_run_ahead).
        super().__init__(head, "eagle3", k, num_slots, max_len + k, dtype, device, target_num_layers,
                         graph_pool)
        if "mask_hidden" not in getattr(head, "loaded", ()):
            raise ValueError(
                f"{source}: parallel_drafting needs the P-EAGLE mask_hidden tensor (the feature of "
                f"parallel slots) and the checkpoint has none: set \"parallel_drafting\": false to "
                f"draft one token at a time"
            )
        self.mask_token = mask_token_id(head.config, source)
        vocab = head.embed_tokens.num_embeddings
        if not 0 <= self.mask_token < vocab:
            raise ValueError(
                f"{source}: mask token id {self.mask_token} is outside the head's embedding of {vocab} "
                f"rows; the checkpoint needs its own embed_tokens with that row"
            )
        # One row more for the scratch slot that padding rows of a graphed batch use.
        self.drafts = torch.zeros(num_slots + 1, k, dtype=torch.long, device=device)
        # The slots' feature: constant for the loaded weights, so made once, not per pass.
        with torch.inference_mode():
            self.mask_feature = head.combine_hidden_states(head.mask_hidden.view(1, 1, -1))
        self.graphed_pass = None
        if self.runner.graphed is not None:
            self.graphed_pass = GraphedForward(self._pass, num_slots, num_slots, graph_pool)

    def _run(self, tokens, positions, cache_positions, slots, kv_len, features, last: torch.Tensor):
        """Verified columns + K-1 slots in one pass; returns the K drafts [B, K].
        last [B]: the column of the last accepted position. kv_len None: the whole cache
        row (a graph's form)."""
        B, k = tokens.shape[0], self.num_speculative_tokens
        p = positions.gather(1, last.view(-1, 1))
        slot_pos = p + torch.arange(1, k, device=positions.device)
        ids = torch.cat([tokens, tokens.new_full((B, k - 1), self.mask_token)], 1)
        hidden = torch.cat([features, self.mask_feature.to(features.dtype).expand(B, k - 1, -1)], 1)
        h = self.runner.run(ids, torch.cat([positions, slot_pos], 1), slots, None if kv_len is None else kv_len + k,
                            hidden, cache_positions=torch.cat([cache_positions, slot_pos], 1))
        first = h.gather(1, last.view(-1, 1, 1).expand(-1, 1, h.shape[-1]))
        return self._draft_token(torch.cat([first, h[:, h.shape[1] - (k - 1):]], 1))

    @torch.inference_mode()
    def on_prefill(self, slot: int, out: TargetOutput) -> None:
        L = out.positions.shape[1]
        slots, last = device_tensor([[slot], [L - 1]], out.tokens.device, torch.long)  # non-blocking (host_tensors.py)
        self.drafts[slot] = self._run(out.tokens, out.positions, out.positions, slots, L, self._features(out), last)[0]

    @torch.inference_mode()
    def propose(self, batch: StepBatch):
        return self.drafts[batch.slots, : self.depth(batch)], None

    def _pass(self, tokens, positions, slots, num_accepted, *feature_inputs, kv_len=None) -> None:
        """The pass after a step: its verified tokens [B, T] (-1 past the accepted run: a
        zero row of the embedding), num_accepted [B, 1], the target's feature inputs; the
        next step's drafts into drafts[slots]. Device work only (one graph on CUDA)."""
        col = torch.arange(tokens.shape[1], device=tokens.device)
        moved = torch.where(col <= num_accepted, positions, positions + self.num_speculative_tokens)
        self.drafts[slots] = self._run(tokens, positions, moved, slots, kv_len, self._combine(feature_inputs),
                                       num_accepted.view(-1))

    @torch.inference_mode()
    def on_verify(self, batch: StepBatch, out: TargetOutput, num_accepted: torch.Tensor) -> None:
        args = (out.tokens, out.positions, batch.slots, num_accepted.view(-1, 1), *self._feature_inputs(out))
        if self.graphed_pass is not None and self.graphed_pass.eligible(out.tokens):
            self.graphed_pass(*args)
        else:
            self._pass(*args, kv_len=batch.kv_len)

    @torch.inference_mode()
    def on_plain_step(self, batch: StepBatch, out: TargetOutput) -> None:
        self.on_verify(batch, out, torch.zeros(out.tokens.shape[0], dtype=torch.long, device=out.tokens.device))

