"""EAGLE-1 loss (docs/formats.md, training losses): feature regression + distillation.

Chain i reads (target feature f_i + noise, token x_{i+1}) at rope position i, as the
engine's head does, and predicts f_{i+1}; through the target's lm_head that feature
gives the distribution of x_{i+2}. Only positions whose x_{i+2} is an assistant
token count.

    loss = SmoothL1(h_i, f_{i+1}) + 0.1 * CE(softmax(lm_head(f_{i+1})), log_softmax(lm_head(h_i)))

f is the target's final hidden state after its final norm, computed on the fly.
Input noise: uniform, (rand - 0.5) * noise * 512 / seq_len (noise = 0.2).

ttt_steps > 1 adds training-time test, as EAGLE-3 trains (eagle3.py, same attention):
step s >= 1 of chain i reads the head's own output of step s-1 and token x_{i+s+1} at
position i+s, as the engine's drafting loop does, and is trained towards f_{i+s+1} and
the distribution of x_{i+s+2} with weight decay^s. The noise is on step 0's inputs.
Published EAGLE-1 heads train step 0 only (ttt_steps = 1, the default).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .batching import Batch
from .eagle3 import DECAY, chain_shift, loss_rows, shifted_rows, ttt_steps_forward, weighted_mean

P_WEIGHT = 0.1  # weight of the distillation term; the feature term has weight 1


def eagle1_loss(head, target, batch: Batch, *, noise: float = 0.2, generator=None, ttt_steps: int = 1,
                decay: float = DECAY, cache_dtype: torch.dtype = torch.float32):
    """-> (loss, metrics dict of detached tensors, step-0 loss tokens as a 0-d tensor).
    Loss positions are gathered by index, without a host sync (eagle3.loss_rows)."""
    ids = batch.input_ids
    B, T = ids.shape
    n = T - 1  # chains 0..T-2 (chain i needs token x_{i+1})
    bound = batch.num_loss_tokens()
    positions = torch.arange(T, device=ids.device).expand(B, T)
    if batch.hidden is not None:  # cached (FeatureCache)
        feats = batch.hidden
    else:
        with torch.no_grad():
            feats, _ = target(ids, positions)
    inputs = feats[:, :-1].float()
    if noise:
        u = torch.rand(inputs.shape, generator=generator, device=inputs.device)
        inputs = inputs + (u - 0.5) * noise * 512 / T
    if ttt_steps == 1:  # one step: plain causal attention, no cache
        steps = [(0, head(ids[:, 1:], positions[:, :-1], inputs))]
    else:
        steps = ttt_steps_forward(head, ids, inputs, ttt_steps, cache_dtype)
    flat_feats = feats.reshape(B * T, -1)
    loss = inputs.new_zeros((), dtype=torch.float32)
    metrics, n0 = {}, None
    for s, h in steps:  # h [B, n, H]: chain i at step s predicts f_{i+s+1}
        valid = chain_shift(batch.loss_mask, s + 2, n)  # x_{i+s+2} is an assistant token
        rows, weights = loss_rows(valid, bound)
        count = weights.sum()
        if s == 0:
            n0 = count
        h_v = h.reshape(B * n, -1)[rows]
        f_next = flat_feats[shifted_rows(rows, n, T, s + 1)]
        with torch.no_grad():
            target_p = torch.softmax(target.compute_logits(f_next).float(), dim=-1)
        log_q = torch.log_softmax(head.compute_logits(h_v).float(), dim=-1)
        p_loss = weighted_mean(-(target_p * log_q).sum(-1), weights, count)
        per_token = F.smooth_l1_loss(h_v.float(), f_next.float(), reduction="none").mean(-1)
        v_loss = weighted_mean(per_token, weights, count)  # mean over tokens and features
        loss = loss + decay ** s * (v_loss + P_WEIGHT * p_loss)
        with torch.no_grad():
            acc = weighted_mean((log_q.argmax(-1) == target_p.argmax(-1)).float(), weights, count)
        suffix = "" if s == 0 else str(s)
        metrics.update({f"v_loss{suffix}": v_loss.detach(), f"p_loss{suffix}": p_loss.detach(), f"acc{suffix}": acc})
    metrics["loss"] = loss.detach()
    return loss, metrics, n0
