"""EAGLE-3 loss with training-time test (TTT): the head drafts S steps on its own
features, attending exactly as it does when the engine drafts.

Chains and steps. Chain i starts at sequence index i. Step 0 reads the fused target
features g_i = fc(aux_i) and token x_{i+1} at rope position i (teacher forcing, as
the engine's catch-up pass over verified tokens). Step s >= 1 reads the head's own
output of step s-1 for the same chain and token x_{i+s+1} at position i+s. Every step
predicts x_{i+s+2}; its target is the target model's distribution at index i+s+1,
restricted to the draft vocabulary and renormalised. The loss is
sum_s 0.8^s * CE over positions whose x_{i+s+2} is an assistant token and whose
target argmax lies in the draft vocabulary (other positions teach nothing a draft
could be accepted for).

Soft-label temperature (``label_temperature``, default 1: the published recipe). The
engine drafts the head's argmax (proposers.py), so a head is judged only on whether its
argmax is the target's; the rest of its distribution is never used. Targets sharpened
to softmax(logits / t) with t < 1 keep the argmax and the order of the candidates
(the loss's minimum is still q = that distribution) but weigh the margin between the
leading candidates more: at the near ties where drafts fail most (`eagle-zoo diagnose`:
a quarter of MT-bench positions give the target's own token less than 0.5 and hold most
misses) the gradient says more plainly which one wins.
t -> 0 is hard-label CE on the target's argmax.

Attention. In the engine (EagleProposer) draft step s of the chain started at the
last verified position c runs at position c+s and attends to every cache entry at
positions <= c+s: entries <= c were written from target features (step 0 of the
chains starting there), entries c+1..c+s by this chain's own steps 1..s. So here the
query of chain i at step s attends to
    step-0 keys of chains j <= i          (the causal part)
    its own keys of steps 1..s            (one per earlier step, same chain)
and nothing else. It runs through the engine's AttentionContext: each step writes
its keys into a per-batch cache at columns s*T' + i (T' = chains per row) and
attends with the mask above, so training and drafting share one attention path.

No host syncs. The positions a step learns from are gathered by index (loss_rows) into
a fixed number of rows, the host's count of the batch's loss tokens, the rows past the
valid ones weighted 0: a boolean index would stop the host until the GPU told it the
count, three or four times per unrolled step, and the host would set a training step's
pace (the GPU idled 70% of an EAGLE-3 step that way on an H200).
"""
from __future__ import annotations

import torch

from ..engine.cache import allocate_kv_caches
from ..models.attention import AttentionContext, use_context
from .batching import Batch

DECAY = 0.8


def ttt_mask(n: int, step: int, device=None) -> torch.Tensor:
    """[n, (step+1)*n] bool: query i of ``step`` may see step-0 key j <= i and key i
    of steps 1..step (columns are step-major: column t*n + j)."""
    i = torch.arange(n, device=device).view(n, 1)
    col = torch.arange((step + 1) * n, device=device).view(1, -1)
    block, j = col // n, col % n
    return ((block == 0) & (j <= i)) | ((block > 0) & (j == i))


def chain_shift(x: torch.Tensor, k: int, n: int) -> torch.Tensor:
    """x[:, k:k+n] padded with zeros (False) to n columns."""
    out = x[:, k : k + n]
    if out.shape[1] < n:
        pad = out.new_zeros((x.shape[0], n - out.shape[1], *x.shape[2:]))
        out = torch.cat([out, pad], 1)
    return out


def ttt_steps_forward(head, ids: torch.Tensor, feats: torch.Tensor, steps: int, cache_dtype=torch.float32):
    """Yield (s, h_s) for s = 0..steps-1: h_s [B, n, H] is the head's output for every
    chain i = 0..n-1 at step s (n = T-1; token x_{i+s+1} at position i+s; feats [B, n, H]
    are the fused target features of the chains). Outputs feed the next step."""
    B, n = feats.shape[:2]
    dev = ids.device
    caches = allocate_kv_caches(head, B, steps * n, cache_dtype, dev, stack=False)  # autograd runs through them
    slots = torch.arange(B, device=dev)
    chain = torch.arange(n, device=dev)
    for s in range(steps):
        ctx = AttentionContext(caches, slots, (s * n + chain).expand(B, n), (s + 1) * n,
                               ttt_mask(n, s, dev).expand(B, n, (s + 1) * n))
        with use_context(ctx):
            feats = head(chain_shift(ids, s + 1, n), (chain + s).expand(B, n), feats)
        yield s, feats


def loss_rows(valid: torch.Tensor, bound: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, weights): the flat indices of ``valid``'s True entries in order, then other
    indices up to ``bound`` entries, with weights 1.0 / 0.0, computed on the device
    without a sync. ``bound`` (a host int) must be at least the number of True entries."""
    flat = valid.reshape(-1)
    bound = max(1, min(bound, flat.numel()))
    rows = torch.argsort((~flat).to(torch.uint8), stable=True)[:bound]  # True first, in order
    return rows, flat[rows].float()


def shifted_rows(rows: torch.Tensor, n: int, T: int, shift: int) -> torch.Tensor:
    """Flat indices into [B, T] of x[b, i + shift] for the flat chain indices ``rows``
    into [B, n] (what chain_shift(x, shift, n)[b, i] reads; clamped for padding rows)."""
    b, i = rows // n, rows % n
    return b * T + (i + shift).clamp(max=T - 1)


def weighted_mean(x: torch.Tensor, weights: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    return (x * weights).sum() / count.clamp(min=1)


def eagle3_loss(head, target, batch: Batch, *, aux_layer_ids, ttt_steps: int = 7, decay: float = DECAY,
                cache_dtype: torch.dtype = torch.float32, label_temperature: float = 1.0):
    """-> (loss, metrics dict of detached tensors, step-0 loss tokens as a 0-d tensor)."""
    ids = batch.input_ids
    B, T = ids.shape
    n = T - 1  # chains 0..T-2 (chain i needs token x_{i+1})
    dev = ids.device
    bound = batch.num_loss_tokens()
    positions = torch.arange(T, device=dev).expand(B, T)
    draft_ids = torch.arange(head.draft_vocab_size, device=dev) + head.d2t
    with torch.no_grad():
        if batch.hidden is not None:  # cached (FeatureCache)
            hidden, aux_states = batch.hidden, batch.aux
        else:
            hidden, aux = target(ids, positions, aux_layer_ids)
            aux_states = torch.cat(aux, dim=-1)
        logits = target.compute_logits(hidden)
        top_ok = head.t2d[logits.argmax(-1)]  # the target's choice can be drafted
        target_logits = logits[..., draft_ids].reshape(B * T, -1)
        del logits
    feats = head.combine_hidden_states(aux_states)[:, :n]
    loss = feats.new_zeros((), dtype=torch.float32)
    metrics, n0 = {}, None
    for s, h in ttt_steps_forward(head, ids, feats, ttt_steps, cache_dtype):
        valid = chain_shift(batch.loss_mask, s + 2, n) & chain_shift(top_ok, s + 1, n)
        rows, weights = loss_rows(valid, bound)
        count = weights.sum()
        if s == 0:
            n0 = count
        log_q = torch.log_softmax(head.compute_draft_logits(h.reshape(B * n, -1)[rows]).float(), dim=-1)
        with torch.no_grad():
            p = torch.softmax(target_logits[shifted_rows(rows, n, T, s + 1)].float() / label_temperature, dim=-1)
        ce = weighted_mean(-(p * log_q).sum(-1), weights, count)
        loss = loss + decay ** s * ce
        with torch.no_grad():
            metrics[f"acc{s}"] = weighted_mean((log_q.argmax(-1) == p.argmax(-1)).float(), weights, count)
            metrics[f"ce{s}"] = ce.detach()
    metrics["loss"] = loss.detach()
    return loss, metrics, n0
