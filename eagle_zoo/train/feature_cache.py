"""The target's features for every training sequence, computed once (`--cache-features`).

Why: each training step runs the frozen target over its batch before the head, and a
run goes over the same sequences for many epochs, so the same forward is repeated once
an epoch. On an H200 it is ~40% of an EAGLE-3 step and ~18% of an EAGLE-1 step
(BENCHMARKS.md, eighth session: scripts/device/train_profile.py).

What is kept, per token of every usable sequence (truncated to --max-len), in the
training dtype on the training device: the final hidden state [H] (after the final
norm: what compute_logits and EAGLE-1's regression read) and, for EAGLE-3, the aux
layers' states concatenated [3H]. Memory: tokens * H * 2 bytes (bf16) for EAGLE-1, four
times that for EAGLE-3; 12.8M tokens of SmolLM2 (H = 576): 15 GB / 59 GB.

A batch's padding positions take the last real token's features where the forward
would give the padding token's: no loss reads them (a chain's loss positions, and the
keys its queries attend to, lie inside its own sequence).
"""
from __future__ import annotations

import contextlib
import time
from typing import Callable, Optional, Sequence

import torch

from .batching import collate, plan_epoch
from .data import TokenData

# Share of the free GPU memory the cache may take: the head's training needs the rest.
MAX_FREE_SHARE = 0.6
# Padded tokens per forward while filling the cache (no gradients: larger batches than
# training's fit, and fewer of them run faster).
FILL_TOKENS = 32768


class FeatureCache:
    def __init__(self, target, data: TokenData, index: torch.Tensor, max_len: int, aux_layer_ids: Sequence[int],
                 device: torch.device, dtype: torch.dtype, token_budget: int,
                 autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext, log=print):
        start = time.monotonic()
        self.lengths = data.lengths[index].clamp(max=max_len)  # [n] host, by position in ``index``
        self.starts = torch.cat([torch.zeros(1, dtype=torch.long), self.lengths.cumsum(0)[:-1]])
        aux_layer_ids = list(aux_layer_ids)
        total, H = int(self.lengths.sum()), target.config.hidden_size
        width = H * (1 + len(aux_layer_ids))
        need = total * width * torch.finfo(dtype).bits // 8
        if device.type == "cuda":
            free = torch.cuda.mem_get_info(device)[0]
            if need > MAX_FREE_SHARE * free:
                raise ValueError(f"--cache-features needs {need / 2**30:.1f} GiB for {total:,} tokens, more than "
                                 f"{MAX_FREE_SHARE:.0%} of the {free / 2**30:.1f} GiB free on {device}: drop "
                                 f"--cache-features, or train on less data (fewer --data directories, lower --max-len)")
        self.hidden = torch.empty(total, H, dtype=dtype, device=device)
        self.aux = torch.empty(total, width - H, dtype=dtype, device=device) if aux_layer_ids else None
        with torch.no_grad(), autocast():
            for positions in plan_epoch(self.lengths, max(token_budget, FILL_TOKENS), 0, 0):
                batch = collate(data, index[positions].tolist(), max_len).to(device)
                B, T = batch.input_ids.shape
                hidden, aux = target(batch.input_ids, torch.arange(T, device=device).expand(B, T), aux_layer_ids)
                real = torch.arange(T, device=device) < batch.lengths.unsqueeze(1)  # [B, T]: not padding
                rows = self._rows(positions, T)[real.cpu()].to(device)
                self.hidden[rows] = hidden[real].to(dtype)
                if self.aux is not None:
                    self.aux[rows] = torch.cat(aux, dim=-1)[real].to(dtype)
        log(f"target features of {total:,} tokens cached in {time.monotonic() - start:.1f} s "
            f"({need / 2**30:.2f} GiB on {device})")

    def _rows(self, positions: torch.Tensor, T: int) -> torch.Tensor:
        """[B, T] cache rows of the batch's tokens (host); padding repeats the last token."""
        lengths, starts = self.lengths[positions], self.starts[positions]
        return starts.unsqueeze(1) + torch.minimum(torch.arange(T).unsqueeze(0), lengths.unsqueeze(1) - 1)

    def gather(self, positions: torch.Tensor, T: int) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """(hidden [B, T, H], aux [B, T, 3H] or None) for the sequences at ``positions`` of
        the trainer's index, padded to T as collate pads them."""
        rows = self._rows(positions, T).to(self.hidden.device)
        return self.hidden[rows], (self.aux[rows] if self.aux is not None else None)
