"""Host lists -> device tensors without stalling the host.

``torch.tensor(values, device="cuda")`` copies from pageable memory and waits for the
stream, so every such call in a step waits for the GPU work launched before it (on the
H200 the step's four sampling-value tensors alone waited ~1 ms a step for the graph
replay: scripts/device/step_profile.py --host). Staging the values in pinned memory and
copying with non_blocking=True queues the copy behind that work and returns at once;
PyTorch's pinned-memory allocator keeps the staging buffer alive until the copy ran.
"""
from __future__ import annotations

from typing import Optional

import torch


def device_tensor(values, device: torch.device | str, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """torch.tensor(values, dtype=dtype) on ``device``; on CUDA through pinned memory, non-blocking."""
    device = torch.device(device)
    if device.type != "cuda":
        return torch.tensor(values, dtype=dtype, device=device)
    return torch.tensor(values, dtype=dtype, pin_memory=True).to(device, non_blocking=True)
