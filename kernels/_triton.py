"""Triton import guard and the one rule every dispatcher follows.

Without triton (macOS, a CPU-only install) the kernel definitions must still parse,
so `triton` / `tl` fall back to a stub whose `jit` returns the function unchanged;
such kernels are never launched because `use_triton` is then False.
"""
from __future__ import annotations

import torch

from ..envs import triton_interpret

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

# The widest row (values) a kernel that copies whole rows holds in one program's registers
# (embedding.py, scatter_row.py, tree_compact.py); wider rows take the torch reference.
MAX_ROW = 16384

# Programmatic dependent launch (PDL, Hopper and later): a kernel launched with it may be
# scheduled while the kernel before it still runs; it must call gdc_wait() before touching
# anything that kernel (or any earlier one) writes. Every kernel below that takes a PDL
# flag calls gdc_wait() first when it is set, then gdc_launch_dependents() so the next
# kernel's launch overlaps its own work. Why: a batch-1 step of a small model is a chain
# of ~200 tiny kernels whose gaps (launch, block scheduling) cost as much as their work.
try:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    HAS_PDL = True
except ImportError:  # an older triton, or none: the flag is never set, the calls never compiled
    HAS_PDL = False

    @triton.jit
    def gdc_wait():
        pass

    @triton.jit
    def gdc_launch_dependents():
        pass


def needs_autograd(*tensors: torch.Tensor) -> bool:
    """True when autograd would record an op on these tensors (training)."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


_PDL_DEVICES: dict = {}


def pdl_launch(t: torch.Tensor) -> dict:
    """Launch keywords for a kernel with a PDL constexpr: {"PDL": True, "launch_pdl": True}
    on a CUDA device of compute capability 9 or more (where griddepcontrol exists) with a
    triton that has it, {"PDL": False} otherwise (CPU, the interpreter, older GPUs)."""
    if not HAS_PDL or not t.is_cuda or triton_interpret():
        return {"PDL": False}
    index = t.device.index if t.device.index is not None else torch.cuda.current_device()
    if index not in _PDL_DEVICES:
        _PDL_DEVICES[index] = torch.cuda.get_device_capability(index)[0] >= 9
    return {"PDL": True, "launch_pdl": True} if _PDL_DEVICES[index] else {"PDL": False}


def use_triton(*tensors: torch.Tensor) -> bool:
    """Triton for CUDA tensors when it imports, outside autograd (the kernels have no
    backward: training on the GPU takes the torch references, which have one)."""
    if not HAS_TRITON:
        return False
    return all(t.is_cuda for t in tensors) and not needs_autograd(*tensors)
