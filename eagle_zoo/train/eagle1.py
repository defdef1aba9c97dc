"""EAGLE-1 loss (FACTS.md, Training): feature regression + distillation.

Chain i reads (target feature f_i + noise, token x_{i+1}) at rope position i, as the
engine's head does, and predicts f_{i+1}; through the target's lm_head that feature
gives the distribution of x_{i+2}. Only positions whose x_{i+2} is an assistant
token count.

    loss = SmoothL1(h_i, f_{i+1}) + 0.1 * CE(softmax(lm_head(f_{i+1})), log_softmax(lm_head(h_i)))

f is the target's final hidden state after its final norm, computed on the fly.
Input noise: uniform, (rand - 0.5) * noise * 512 / seq_len (noise = 0.2).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .batching import Batch

P_WEIGHT = 0.1  # weight of the distillation term; the feature term has weight 1


def eagle1_loss(head, target, batch: Batch, *, noise: float = 0.2, generator=None):
    """-> (loss, metrics dict of detached tensors, number of loss tokens)."""
    ids = batch.input_ids
    B, T = ids.shape
    positions = torch.arange(T, device=ids.device).expand(B, T)
    with torch.no_grad():
        feats, _ = target(ids, positions)
    inputs = feats[:, :-1].float()
    if noise:
        u = torch.rand(inputs.shape, generator=generator, device=inputs.device)
        inputs = inputs + (u - 0.5) * noise * 512 / T
    h = head(ids[:, 1:], positions[:, :-1], inputs)  # [B, T-1]: chain i = 0..T-2

    valid = batch.loss_mask[:, 2:]  # x_{i+2} is an assistant token; chains 0..T-3
    h_v = h[:, : T - 2][valid]
    f_next = feats[:, 1 : T - 1][valid]
    with torch.no_grad():
        target_p = torch.softmax(target.compute_logits(f_next).float(), dim=-1)
    log_q = torch.log_softmax(head.compute_logits(h_v).float(), dim=-1)
    p_loss = -(target_p * log_q).sum(-1).mean()
    v_loss = F.smooth_l1_loss(h_v.float(), f_next.float())  # mean over tokens and features
    loss = v_loss + P_WEIGHT * p_loss
    with torch.no_grad():
        acc = (log_q.argmax(-1) == target_p.argmax(-1)).float().mean()
    metrics = {"loss": loss.detach(), "v_loss": v_loss.detach(), "p_loss": p_loss.detach(), "acc": acc}
    return loss, metrics, h_v.shape[0]
