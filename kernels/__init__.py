"""Triton kernels, each next to a plain-torch reference of the same function.

Every public function here is a dispatcher: Triton on CUDA tensors when triton
imports, the torch reference otherwise (CPU, no triton, or EAGLE_ZOO_KERNELS=torch).
See kernels/README.md.
"""
from ._name_clash import warn_if_hf_kernels_installed

warn_if_hf_kernels_installed()

from .activation import silu_and_mul, silu_and_mul_torch, silu_and_mul_triton  # noqa: E402
from .attention import cache_attention, cache_attention_torch, cache_attention_triton  # noqa: E402
from .kv_cache import write_kv, write_kv_torch, write_kv_triton  # noqa: E402
from .norm import rms_norm, rms_norm_torch, rms_norm_triton  # noqa: E402
from .rejection import rejection_sample, rejection_sample_torch, rejection_sample_triton  # noqa: E402
from .rope import rope_neox, rope_neox_torch, rope_neox_triton  # noqa: E402

__all__ = [
    "cache_attention", "cache_attention_torch", "cache_attention_triton",
    "write_kv", "write_kv_torch", "write_kv_triton",
    "rejection_sample", "rejection_sample_torch", "rejection_sample_triton",
    "rms_norm", "rms_norm_torch", "rms_norm_triton",
    "silu_and_mul", "silu_and_mul_torch", "silu_and_mul_triton",
    "rope_neox", "rope_neox_torch", "rope_neox_triton",
]
