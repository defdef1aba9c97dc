"""Triton import guard and the one rule every dispatcher follows.

Without triton (macOS, a CPU-only install) the kernel definitions must still parse,
so `triton` / `tl` fall back to a stub whose `jit` returns the function unchanged;
such kernels are never launched because `use_triton` is then False.
"""
from __future__ import annotations

import os

import torch

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # the torch references still work
    HAS_TRITON = False

    class _Stub:
        constexpr = object

        @staticmethod
        def jit(fn=None, **_):
            return fn if fn is not None else (lambda f: f)

    triton = tl = _Stub()


def needs_autograd(*tensors: torch.Tensor) -> bool:
    """True when autograd would record an op on these tensors (training)."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def use_triton(*tensors: torch.Tensor) -> bool:
    """Triton for CUDA tensors when it imports, outside autograd (the kernels have no
    backward: training on the GPU takes the torch references, which have one);
    EAGLE_ZOO_KERNELS=torch forces the references."""
    if not HAS_TRITON or os.environ.get("EAGLE_ZOO_KERNELS", "auto").lower() == "torch":
        return False
    return all(t.is_cuda for t in tensors) and not needs_autograd(*tensors)
