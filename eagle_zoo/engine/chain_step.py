"""A greedy EAGLE chain step as one CUDA graph: the K-step drafting loop, the target's
pass over [last, drafts] with its lm_head and greedy verification, and the head's padded
catch-up, captured together per batch bucket and K.

Why: the engine otherwise replays three graphs a chain step (EagleProposer's drafting
loop and catch-up, EngineCore's greedy target pass) with Python and small eager ops
(the concatenation of the drafts, positions, the catch-up's inputs) in between. On an
H200 those three graphs take ~870 us for SmolLM2 with the EAGLE-3 head (k = 3) while the
engine step with async scheduling takes ~1,280 us (BENCHMARKS.md, seventh session): the
host, not the GPU, sets the pace. One graph leaves one replay and its input copies.

The captured function is exactly the three graphs' functions in their order, in their
whole-row forms (kv_len = the cache row's length, masked by position), so the output is
the same token for token. Off by default until it is measured on the GPU:
EAGLE_ZOO_CHAIN_STEP_GRAPH=1 turns it on.
"""
from __future__ import annotations

import os
from typing import Optional

import torch

from .graphs import GraphedForward, whole_step_graphs
from .proposers import EagleProposer, TargetOutput


def chain_step_graph_enabled() -> bool:
    return os.environ.get("EAGLE_ZOO_CHAIN_STEP_GRAPH", "0") == "1" and whole_step_graphs()


def whole_row_greedy_chain_step(engine):
    """The function the graph captures, taking GraphedForward's (input_ids, positions,
    slot_ids) = (last [B,1], base [B,1], slots [B]) and K; -> (emitted tokens [B, K+1],
    -1 past the accepted run; accepted drafts [B])."""
    proposer = engine.proposer

    def step(last: torch.Tensor, base: torch.Tensor, slots: torch.Tensor, k: int):
        drafts = proposer._draft_chain(None, base, slots, k)
        input_ids = torch.cat([last, drafts], dim=1)
        positions = base + torch.arange(k + 1, device=base.device)
        tokens, accepted, hidden, aux = engine.greedy_target_pass(input_ids, positions, slots, drafts)
        verified = TargetOutput(input_ids, tokens, positions, hidden, aux)
        proposer._catch_up(tokens, positions, slots, accepted.view(-1, 1), *proposer._feature_inputs(verified))
        return tokens, accepted

    return step


def graphed_chain_step(engine) -> Optional[GraphedForward]:
    """The engine's chain-step graphs (made on first use), or None: switch off, no CUDA
    graphs, or a proposer other than EagleProposer's padded chain (P-EAGLE, trees and the
    unpadded catch-up keep their own paths)."""
    graphed = getattr(engine, "_chain_step_graph", None)
    proposer = engine.proposer
    if (graphed is None and chain_step_graph_enabled() and type(proposer) is EagleProposer
            and proposer.padded_drafter_batch and engine.runner.graphed is not None):
        target = engine.runner.graphed
        graphed = engine._chain_step_graph = GraphedForward(whole_row_greedy_chain_step(engine), target.buckets[-1],
                                                            target.scratch_slot, target.pool)
    return graphed
