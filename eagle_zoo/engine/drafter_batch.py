"""The EAGLE head's catch-up pass without padding (speculative_config
``disable_padded_drafter_batch: true``).

After verification a sequence that accepted a of its K drafts has a + 1 new verified
tokens. The default (padded) catch-up feeds the head all K + 1 positions of every
sequence, one fixed [B, K+1] shape that CUDA graphs capture, and keeps the output at
position a; the positions past a hold rejected tokens whose keys/values the next round
overwrites before anything attends to them. This pass instead feeds each sequence only
its a + 1 accepted tokens: sequences are grouped by a + 1 and each group runs as one
[B_g, a+1] batch. The shapes depend on what was accepted, so the accepted counts are
read on the host (one device->host copy before the head runs) and the passes run
eagerly, without CUDA graphs; the head's later one-token draft steps keep theirs.
Drafts are the same either way: the head's cache entries at accepted positions are
identical, and nothing attends to the ones the padded pass wrote past them.
"""
from __future__ import annotations

import torch


def accepted_groups(num_accepted: torch.Tensor):
    """(n, rows) for each distinct n = accepted + 1 of the batch: the rows [G] (a device
    tensor) whose sequences have n verified tokens. One host copy of the counts: the
    groups' shapes depend on them."""
    counts = (num_accepted + 1).tolist()
    for n in sorted(set(counts)):
        yield n, torch.tensor([i for i, c in enumerate(counts) if c == n], device=num_accepted.device)


def catch_up_unpadded(runner, out, batch, features: torch.Tensor, num_accepted: torch.Tensor) -> torch.Tensor:
    """Runs the head over each sequence's accepted tokens; returns its output at the last
    of them, [B, H] (the state the next round drafts from).

    ``out`` is the step's TargetOutput (tokens [B, K+1], -1 past the accepted run and
    its recovered/bonus token), ``features`` the head's input features [B, K+1, H]."""
    last = None
    for n, rows in accepted_groups(num_accepted):
        positions = out.positions[rows, :n]
        # Explicit cache positions keep the runner off its CUDA-graph path (fixed shapes only).
        h = runner.run(out.tokens[rows, :n], positions, batch.slots[rows], batch.kv_len,
                       features[rows, :n], cache_positions=positions)
        if last is None:
            last = h.new_empty(num_accepted.shape[0], h.shape[-1])
        last[rows] = h[:, -1]
    return last
