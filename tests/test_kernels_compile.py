"""Every Triton kernel compiles for Hopper (sm_90) on a machine without a GPU.

The interpreter tests (test_kernels.py) run the kernels' Python, not the compiler, and CI
has no GPU, so a kernel that the compiler rejects would first fail on the GPU machine.
Here the Triton wrappers are called on CPU tensors with JITFunction.run replaced by a
compile of the same arguments for sm_90 (with the ptxas that triton's wheel bundles) and
PDL on, as on a Hopper GPU. Nothing is launched and the outputs are not looked at;
test_kernels.py checks what the kernels compute.
"""
from __future__ import annotations

import importlib
import os
import pkgutil

import pytest
import torch

import test_kernels as tk  # its problems (inputs) for each kernel
from eagle_zoo.kernels import (argmax_rows_triton, cache_attention_triton, chain_accept_greedy_triton,
                               log_softmax_top_k_triton,
                               rms_norm_triton, rope_angles_triton, rope_neox_triton, silu_and_mul_triton,
                               tree_accept_greedy_triton, tree_expand_triton, tree_select_triton, write_kv_triton)
from eagle_zoo.kernels._triton import HAS_TRITON
from eagle_zoo.kernels.linear import fused_linear_triton
from eagle_zoo.kernels.norm import add_rms_norm_triton, rms_norm_pair_triton
from eagle_zoo.kernels.qkv_rope import qkv_rope_write_kv_triton, rope_write_kv_triton
from eagle_zoo.kernels.step_outputs import step_outputs_triton
from eagle_zoo.kernels.embedding import embedding_triton
from eagle_zoo.kernels.gather_rows import gather_rows_triton
from eagle_zoo.kernels.scatter_row import scatter_row_triton
from eagle_zoo.kernels.tree_compact import tree_compact_triton


def _can_compile_for_hopper() -> bool:
    if not HAS_TRITON or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    from triton.backends import backends

    return "nvidia" in backends


pytestmark = [
    pytest.mark.skipif(not _can_compile_for_hopper(), reason="needs triton with its NVIDIA backend, not interpreting"),
    pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the GPU tests compile and run the kernels"),
]

TYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.int64: "i64",
         torch.int32: "i32", torch.int8: "i8", torch.uint8: "u8", torch.bool: "i1"}


def _signature(kernel, args, kwargs):
    """(signature, constexprs) of a launch, as triton.compile takes them: a pointer type
    per tensor, a scalar type per number, constexpr parameters (and None) by value."""
    names = [p.name for p in kernel.params]
    bound = dict(zip(names, args)) | {k: v for k, v in kwargs.items() if k in names}
    signature, constexprs = {}, {}
    for p in kernel.params:
        value = bound[p.name]
        if p.is_constexpr or value is None:
            signature[p.name], constexprs[p.name] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            signature[p.name] = "*" + TYPES[value.dtype]
        elif isinstance(value, bool):
            signature[p.name] = "i1"
        elif isinstance(value, int):
            signature[p.name] = "i32" if -2**31 <= value < 2**31 else "i64"
        elif isinstance(value, float):
            signature[p.name] = "fp32"
        else:
            raise TypeError(f"{kernel.__name__}: no signature type for {p.name} = {value!r}")
    return signature, constexprs


@pytest.fixture
def hopper(monkeypatch):
    """Kernel launches compile for sm_90 instead; returns the names of the kernels compiled."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    import eagle_zoo.kernels

    compiled = []

    def compile_for_hopper(self, *args, grid, warmup, **kwargs):
        signature, constexprs = _signature(self, args, kwargs)
        options = {k: kwargs[k] for k in ("num_warps", "num_stages") if k in kwargs}
        kernel = triton.compile(ASTSource(self, signature, constexprs=constexprs), target=GPUTarget("cuda", 90, 32),
                                options=options)
        # What a launch would refuse (OutOfResources): more shared memory than an H100 has.
        assert kernel.metadata.shared <= HOPPER_SHARED_BYTES, \
            f"{self.__name__} {constexprs}: {kernel.metadata.shared} bytes of shared memory"
        compiled.append(self.__name__)

    monkeypatch.setattr(JITFunction, "run", compile_for_hopper)
    for info in pkgutil.iter_modules(eagle_zoo.kernels.__path__):  # every module that launches with PDL
        module = importlib.import_module(f"eagle_zoo.kernels.{info.name}")  # the package's name may be a function
        if hasattr(module, "pdl_launch"):
            monkeypatch.setattr(module, "pdl_launch", lambda t: {"PDL": True, "launch_pdl": True})
    return compiled


DTYPES = [torch.bfloat16, torch.float32]  # the GPU engine's (fp32: the IEEE products)
HOPPER_SHARED_BYTES = 232448  # an H100's shared memory a block may use (227 KiB)


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_cache_kernels_compile(hopper, dtype):
    write_kv_triton(*tk._kv_problem("cpu", dtype, dtype))
    for case in ({}, {"window": 8}, {"tree": True}):  # causal, a sliding window, an explicit mask
        q, kc, vc, slots, pos, mask = tk._attn_problem("cpu", dtype=dtype, tree=case.get("tree", False))
        cache_attention_triton(q, kc, vc, slots, pos, 40, 0.3, attn_mask=mask, window=case.get("window"))
    for dims in (64, 128):  # SmolLM2's heads and 8B-sized ones: their blocks of keys (default_block_n)
        q, kc, vc, slots, pos, _ = tk._attn_problem("cpu", dtype=dtype, dk=dims, dv=dims)
        cache_attention_triton(q, kc, vc, slots, pos, 40, 0.3)
    q, kc, vc, slots, cols, kv_len, _, tree = tk._tree_attention_problem("cpu", dtype)[:8]
    cache_attention_triton(q, kc, vc, slots, cols, kv_len, 0.25, tree=tree)
    assert set(hopper) == {"_write_kv_kernel", "_attn_split_kernel", "_attn_merge_kernel"}


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_layer_op_kernels_compile(hopper, dtype):
    x = torch.randn(3, 2, 96).to(dtype)
    w = torch.ones(96, dtype=dtype)
    rms_norm_triton(x, w, 1e-6)
    rms_norm_pair_triton(x, w, 1e-6, x, w, 1e-5)
    add_rms_norm_triton(x, x, w, 1e-6)
    silu_and_mul_triton(x)
    rope_neox_triton(*tk._rope_problem("cpu", dtype))
    _, _, cos, sin = tk._rope_problem("cpu", dtype)
    rope_write_kv_triton(torch.randn(2, 3, 15 * 64).to(dtype), cos, sin, torch.zeros(4, 400, 3, 64, dtype=dtype),
                         torch.zeros(4, 400, 3, 64, dtype=dtype), torch.tensor([2, 0]),
                         torch.tensor([[0, 7, 9], [5, 6, 7]]), 9, 3)
    rope_angles_triton(torch.tensor([[5, 9]]), torch.rand(32), 0.5)
    embedding_triton(torch.tensor([[5, 9]]), torch.randn(12, 96).to(dtype))
    assert set(hopper) == {"_rms_norm_kernel", "_rms_norm_pair_kernel", "_add_rms_norm_kernel", "_silu_and_mul_kernel",
                           "_rope_neox_kernel", "_rope_write_kv_kernel", "_rope_angles_kernel", "_embedding_kernel"}


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_linear_kernels_compile_for_every_case_and_row_count(hopper, dtype):
    for case in tk.LINEAR_CASES:
        for rows in (1, 4, 100):  # a decode step, a verification, a prefill
            x, w, kw = tk._linear_problem("cpu", dtype, rows, case)
            fused_linear_triton(x, w, **kw)
    _, _, cos, sin = tk._rope_problem("cpu", dtype)
    for norm in (None, torch.ones(96, dtype=dtype)):
        qkv_rope_write_kv_triton(torch.randn(2, 3, 96).to(dtype), torch.randn(15 * 64, 96).to(dtype), cos, sin,
                                 torch.zeros(4, 400, 3, 64, dtype=dtype), torch.zeros(4, 400, 3, 64, dtype=dtype),
                                 torch.tensor([2, 0]), torch.tensor([[0, 7, 9], [5, 6, 7]]), 9, 3, norm_weight=norm)
    assert set(hopper) == {"_linear_kernel", "_qkv_rope_kernel"}
    assert len(hopper) == 3 * len(tk.LINEAR_CASES) + 2  # one kernel a call


def test_the_drafting_and_acceptance_kernels_compile(hopper):
    # bf16 logits as the heads' lm_heads give them on the GPU: an EAGLE-3 draft vocabulary, a full one
    log_softmax_top_k_triton(torch.randn(3, 6, 12000).bfloat16(), 6, torch.zeros(12000, dtype=torch.long))
    log_softmax_top_k_triton(torch.randn(1, 6, 49152).bfloat16(), 6)
    log_softmax_top_k_triton(torch.randn(1, 6, 12000).bfloat16(), 6, add=torch.zeros(1, 6))  # a tree round's children
    argmax_rows_triton(torch.randn(4, 49152).bfloat16())  # the target's greedy tokens
    expand = tk._expand_problem("cpu", k=6, H=576, W=3)
    tree_expand_triton(*expand, first=6, level=1, parents_out=tk._parent_rows(expand[0])[1])
    tree_select_triton(*tk._candidates(2, 6, 3), 30, 4)
    tree_accept_greedy_triton(*tk._accept_problem("cpu"))
    argmax, drafts, num_draft = tk._chain_problem("cpu")
    chain_accept_greedy_triton(argmax, drafts, num_draft)
    chain_accept_greedy_triton(argmax[:, :1], drafts[:, :0])  # a plain step
    tokens, accepted, base, slots, drafted = tk._step_problem("cpu")
    for d in (3, drafted):  # a chain's or tree's count, an n-gram step's per-row counts
        step_outputs_triton(tokens, accepted, d, base, slots, 9)
    for dtype in DTYPES:
        tree_compact_triton(*tk._compact_problem("cpu", dtype))
    tree_compact_triton(*tk._compact_problem("cpu", torch.bfloat16, n_kv=8, d=128))  # an 8B-shaped cache column
    for dtype, H in ((torch.bfloat16, 576), (torch.bfloat16, 4096), (torch.float32, 576)):
        scatter_row_triton(*tk._scatter_problem("cpu", dtype, H))
    for S in (3, 1):  # an EAGLE-3 head's streams, an EAGLE-1 head's hidden state
        gather_rows_triton(*tk._gather_problem("cpu", S=S))
    assert set(hopper) == {"_top_k_part_kernel", "_top_k_merge_kernel", "_tree_expand_kernel", "_tree_select_kernel",
                           "_tree_accept_kernel", "_chain_accept_kernel", "_step_outputs_kernel",
                           "_tree_compact_kernel", "_scatter_row_kernel", "_gather_rows_kernel"}
