"""fp8 weights for a draft: speculative_config ``quantization="fp8"``.

Each linear layer (models/layers.py LinearBase: not a mixture of experts' expert weights
or router) and lm_head of the draft gets e4m3 weights with one float32 scale a weight row
(kernels/linear.py quantize_fp8), made from its checkpoint weights when the engine loads
it; embeddings stay as they are (a step reads a few of their rows). The products read the
fp8 values and widen them exactly to the activations' dtype inside the linear kernel,
accumulate in float32 and apply the row scale once (weight-only fp8: the activations are
not quantized). A draft's speculative passes wait on one another, so the bytes they read
are what a chain step pays for them: a one-layer EAGLE-3 head of Llama-3.1-8B's shape
reads 1.156x a plain step's weight bytes at k = 3 in bf16 and 1.078x in fp8
(BENCHMARKS.md, "Step costs"). The rounding changes which tokens the draft proposes,
never which tokens are emitted: the target verifies every draft.

CUDA only (the LLM refuses it elsewhere): the CPU runs drafts through C++ kernels for
float32 and bfloat16 weights. The decoder layers of a quantized draft take the module
path (models/fused_layer.py's regrouped kernels read weights of the activations' dtype).
"""
from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

from eagle_zoo.kernels.linear import quantize_fp8

from .layers import LinearBase, ParallelLMHead


@torch.no_grad()
def quantize_fp8_(model: nn.Module, keep: Iterable[torch.Tensor] = ()) -> list[str]:
    """Every linear layer and lm_head of ``model`` whose weight is not in ``keep`` (a
    target's parameters that a head shares, such as an EAGLE-1 head's lm_head) to fp8
    weights with row scales, in place; returns the names of the modules quantized."""
    kept = {id(p) for p in keep}
    names = []
    for name, module in model.named_modules():
        if (not isinstance(module, (LinearBase, ParallelLMHead)) or id(module.weight) in kept
                or module.weight_scale is not None):  # a module already quantized
            continue
        values, scale = quantize_fp8(module.weight)
        module.weight = nn.Parameter(values, requires_grad=False)
        module.weight_scale = scale
        names.append(name)
    return names
