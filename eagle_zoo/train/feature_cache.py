"""The target's features for every training sequence, computed once (`--cache-features`).

Why: each training step runs the frozen target over its batch before the head, and a
run goes over the same sequences for many epochs, so the same forward is repeated once
an epoch. On an H200 it is ~40% of an EAGLE-3 step and ~18% of an EAGLE-1 step.

What is kept, per token of every usable sequence (truncated to --max-len), in the
training dtype on the training device: the final hidden state [H] (after the final
norm: what compute_logits and EAGLE-1's regression read) and, for EAGLE-3, the aux
layers' states concatenated [3H]. Memory: tokens * H * 2 bytes (bf16) for EAGLE-1, four
times that for EAGLE-3; 12.6M tokens of SmolLM2 (H = 576): 14.5 GB / 58 GB (54.1 GiB
measured).

What does not fit on the GPU (more than MAX_FREE_SHARE of its free memory) spills to host
memory: the first rows stay on the device, the rest live in ordinary host memory, and a
batch's spilled rows are gathered on the host into a pinned buffer and copied over
without waiting (the caching host allocator keeps that buffer until the copy is done).
Why: once the forward is cached a run goes through its data many times (23 epochs in
930 s on an H200), so more data, not more steps, is what helps, and more data
no longer fits the GPU alone.

A batch's padding positions take the last real token's features where the forward
would give the padding token's: no loss reads them (a chain's loss positions, and the
keys its queries attend to, lie inside its own sequence).
"""
from __future__ import annotations

import contextlib
import os
import time
from typing import Callable, Optional, Sequence

import torch

from .batching import collate, plan_epoch
from .data import TokenData

# Share of the free GPU memory the cache may take: the head's training needs the rest.
MAX_FREE_SHARE = 0.6
# Share of the host's free memory the spilled rows may take.
MAX_HOST_SHARE = 0.7
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
        row_bytes = width * torch.finfo(dtype).bits // 8
        on_device = rows_on_device(total, row_bytes, device)
        spilled = (total - on_device) * row_bytes
        host_free = host_free_bytes() if spilled else 0
        if spilled > MAX_HOST_SHARE * host_free:
            raise ValueError(f"--cache-features needs {total * row_bytes / 2**30:.1f} GiB for {total:,} tokens: "
                             f"{on_device * row_bytes / 2**30:.1f} GiB fit on {device} and the other "
                             f"{spilled / 2**30:.1f} GiB are more than {MAX_HOST_SHARE:.0%} of the host's "
                             f"{host_free / 2**30:.1f} GiB free: drop --cache-features, or train on less "
                             f"data (fewer --data directories, lower --max-len)")
        self.hidden = SplitRows(total, H, on_device, dtype, device)
        self.aux = SplitRows(total, width - H, on_device, dtype, device) if aux_layer_ids else None
        with torch.no_grad(), autocast():
            for positions in plan_epoch(self.lengths, max(token_budget, FILL_TOKENS), 0, 0):
                batch = collate(data, index[positions].tolist(), max_len).to(device)
                B, T = batch.input_ids.shape
                hidden, aux = target(batch.input_ids, torch.arange(T, device=device).expand(B, T), aux_layer_ids)
                real = torch.arange(T, device=device) < batch.lengths.unsqueeze(1)  # [B, T]: not padding
                rows = self._rows(positions, T)[real.cpu()]
                self.hidden.write(rows, hidden[real].to(dtype))
                if self.aux is not None:
                    self.aux.write(rows, torch.cat(aux, dim=-1)[real].to(dtype))
        where = f"{on_device * row_bytes / 2**30:.2f} GiB on {device}"
        if spilled:
            where += f", {spilled / 2**30:.2f} GiB in host memory"
        log(f"target features of {total:,} tokens cached in {time.monotonic() - start:.1f} s ({where})")

    def _rows(self, positions: torch.Tensor, T: int) -> torch.Tensor:
        """[B, T] cache rows of the batch's tokens (host); padding repeats the last token."""
        lengths, starts = self.lengths[positions], self.starts[positions]
        return starts.unsqueeze(1) + torch.minimum(torch.arange(T).unsqueeze(0), lengths.unsqueeze(1) - 1)

    def gather(self, positions: torch.Tensor, T: int) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """(hidden [B, T, H], aux [B, T, 3H] or None) for the sequences at ``positions`` of
        the trainer's index, padded to T as collate pads them."""
        rows = self._rows(positions, T)
        return self.hidden.read(rows), (self.aux.read(rows) if self.aux is not None else None)


def rows_on_device(total: int, row_bytes: int, device: torch.device) -> int:
    """How many of the cache's rows stay on ``device`` (all of them off CUDA)."""
    if device.type != "cuda":
        return total
    return min(total, int(MAX_FREE_SHARE * torch.cuda.mem_get_info(device)[0]) // row_bytes)


# (limit, usage) files of this process's memory cgroup, v2 then v1: a container sees the
# whole machine's free memory in sysconf, but is killed at its own limit.
CGROUP_MEMORY_FILES = (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                       ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"))


def host_free_bytes() -> int:
    """Free physical memory of this host (not counting what the kernel could reclaim),
    and no more than the memory cgroup's limit leaves."""
    free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    for limit_file, usage_file in CGROUP_MEMORY_FILES:
        try:
            with open(limit_file) as f:
                limit = f.read().strip()
            with open(usage_file) as f:
                usage = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit():  # "max": no limit
            free = min(free, int(limit) - usage)
        break
    return max(0, free)


class SplitRows:
    """A [rows, width] table whose first ``on_device`` rows live on the device and the
    others in host memory; reads return device tensors whatever the split."""

    def __init__(self, total: int, width: int, on_device: int, dtype: torch.dtype, device: torch.device):
        self.on_device, self.device = on_device, device
        self.device_rows = torch.empty(on_device, width, dtype=dtype, device=device)
        self.host_rows = torch.empty(total - on_device, width, dtype=dtype) if total > on_device else None

    def write(self, rows: torch.Tensor, values: torch.Tensor) -> None:
        """values [n, width] (device) into the table's rows [n] (host, long)."""
        here = rows < self.on_device
        self.device_rows[rows[here].to(self.device)] = values[here.to(values.device)]
        if self.host_rows is not None and not bool(here.all()):
            self.host_rows[rows[~here] - self.on_device] = values[(~here).to(values.device)].cpu()

    def read(self, rows: torch.Tensor) -> torch.Tensor:
        """[..., width] on the device for table rows [...] (host, long). Nothing is read
        back from the device: the indices are the host's, and spilled rows are gathered
        on the host and copied host->device without waiting."""
        if self.host_rows is None:
            return self.device_rows[rows.to(self.device)]
        flat = rows.reshape(-1)
        here = flat < self.on_device
        out = torch.empty(len(flat), self.device_rows.shape[1], dtype=self.device_rows.dtype, device=self.device)
        at = here.nonzero().squeeze(1)
        out[at.to(self.device)] = self.device_rows[flat[at].to(self.device)]
        away = (~here).nonzero().squeeze(1)
        staged = torch.empty(len(away), out.shape[1], dtype=out.dtype, pin_memory=self.device.type == "cuda")
        torch.index_select(self.host_rows, 0, flat[away] - self.on_device, out=staged)
        out[away.to(self.device)] = staged.to(self.device, non_blocking=True)
        return out.view(*rows.shape, out.shape[1])
