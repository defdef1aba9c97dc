"""`python -m eagle_zoo.kernels.bench` (CUDA): GPU time of the attention, KV-write, linear and
top-k / argmax kernels against their torch paths, replayed from CUDA graphs as the engine
runs them, the linear kernel's tilings, plus batch-invariance sweeps.
`python -m eagle_zoo.kernels.bench --fp8`: only the linear kernel with fp8 weights at the
products of a Llama-3.1-8B-shaped EAGLE-3 head, every tiling of FP8_TILINGS against
fp8_wide_tile's and cuBLAS on the bf16 weights."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from . import cache_attention, write_kv, write_kv_torch
from .attention import visible_keys
from ._triton import triton
from .linear import BLOCK_M, fused_linear_torch, fused_linear_triton, row_block
from .top_k import BLOCK, NUM_WARPS, argmax_rows_triton, log_softmax_top_k_triton


def graphed_us(fn) -> float:
    """Median microseconds of fn replayed from a CUDA graph (no Python launch overhead)."""
    from triton.testing import do_bench

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # compile and warm up outside the capture
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return do_bench(graph.replay, warmup=25, rep=100) * 1e3


def _gather_sdpa(q, kc, vc, slots, pos, L, scale):
    """The dense path (index-gather the rows, masked SDPA) the kernels replace."""
    mask = visible_keys(pos, L).unsqueeze(1)
    return F.scaled_dot_product_attention(q.transpose(1, 2), kc[slots, :L].transpose(1, 2),
                                          vc[slots, :L].transpose(1, 2), attn_mask=mask, scale=scale,
                                          enable_gqa=True).transpose(1, 2)


def main() -> None:
    dev, bf16 = "cuda", torch.bfloat16
    torch.manual_seed(0)
    print(torch.cuda.get_device_name(), "| us per call, CUDA-graph replay")
    H, n_kv, d = 32, 8, 128
    for B, T, L in [(1, 1, 2048), (1, 1, 8192), (16, 1, 2048), (64, 1, 2048), (64, 1, 8192), (16, 4, 2048),
                    (64, 4, 2048), (4, 64, 2048)]:
        kc = torch.randn(B, L, n_kv, d, device=dev, dtype=bf16)
        vc = torch.randn_like(kc)
        q = torch.randn(B, T, H, d, device=dev, dtype=bf16)
        slots, pos = torch.arange(B, device=dev), (L - T + torch.arange(T, device=dev)).expand(B, T).contiguous()
        t1 = graphed_us(lambda: cache_attention(q, kc, vc, slots, pos, L, d ** -0.5))
        t2 = graphed_us(lambda: _gather_sdpa(q, kc, vc, slots, pos, L, d ** -0.5))
        gbs = 2 * kc.numel() * 2 / (t1 * 1e3)
        print(f"attention bf16 H={H} kv={n_kv} d={d} B={B:3d} T={T:2d} L={L:5d}: triton {t1:7.1f} "
              f"({gbs:5.0f} GB/s of K+V)  gather+sdpa {t2:7.1f}")

    for dtype in (bf16, torch.float32):  # every row of a T=5 batch against itself decoded alone
        B, T, L = 8, 5, 3000
        kc = torch.randn(B + 3, L + 8, n_kv, d, device=dev, dtype=dtype)
        vc = torch.randn_like(kc)
        q = torch.randn(B, T, H, d, device=dev, dtype=dtype)
        slots = torch.randperm(B + 3, device=dev)[:B]
        pos = torch.randint(0, L - T, (B, 1), device=dev) + torch.arange(T, device=dev)
        batch = cache_attention(q, kc, vc, slots, pos, L, d ** -0.5)
        differ = sum(not torch.equal(batch[b, t], cache_attention(
            q[b:b + 1, t:t + 1], kc, vc, slots[b:b + 1], pos[b:b + 1, t:t + 1], int(pos[b, t]) + 1, d ** -0.5)[0, 0])
            for b in range(B) for t in range(T))
        print(f"batch invariance {dtype}: {differ} of {B * T} rows differ alone vs in the batch")

    kc = torch.zeros(64, 4096, n_kv, d, device=dev, dtype=bf16)
    vc = torch.zeros_like(kc)
    for B, T in [(64, 1), (16, 5)]:
        k = torch.randn(B, T, n_kv, d, device=dev, dtype=bf16)
        slots = torch.randperm(64, device=dev)[:B]
        pos = torch.randint(0, 4000, (B, 1), device=dev) + torch.arange(T, device=dev)
        t1 = graphed_us(lambda: write_kv(kc, vc, k, k, slots, pos))
        t2 = graphed_us(lambda: write_kv_torch(kc, vc, k, k, slots, pos))
        print(f"write_kv bf16 B={B} T={T}: triton {t1:.1f}  torch {t2:.1f}")

    _linear_rows(dev, bf16)
    _tile_rows(dev, bf16)
    _top_k_rows(dev, bf16)


# SmolLM2-135M's products (name, weight rows, columns, fused_linear options) and the
# EAGLE-3 head's 12,000-token draft vocabulary.
LINEAR_SHAPES = [("qkv+norm", 960, 576, {"norm": True}), ("o_proj+residual", 576, 576, {"residual": True}),
                 ("gate_up+norm", 3072, 576, {"norm": True, "gated": True}),
                 ("down_proj+residual", 576, 1536, {"residual": True}), ("lm_head", 49152, 576, {}),
                 ("draft lm_head", 12000, 576, {})]


def _linear_rows(dev, dtype) -> None:
    """fused_linear's kernel at the rows of plain steps (1, 16), verifications at batch 16
    (64, 80) and a tree at batch 16 (480), at row_block's BLOCK_M and at BLOCK_M; cuBLAS; and
    how many rows differ alone from the same rows in the step."""
    for name, n, k, opts in LINEAR_SHAPES:
        w = torch.randn(n, k, device=dev, dtype=dtype) * k ** -0.5
        for M in (1, 16, 64, 80, 480):
            x = torch.randn(M, k, device=dev, dtype=dtype)
            kw = {"gated": bool(opts.get("gated"))}
            if opts.get("norm"):
                kw["norm_weight"] = torch.rand(k, device=dev, dtype=dtype) + 0.5
            if opts.get("residual"):
                kw["residual"] = torch.randn(M, n, device=dev, dtype=dtype)
            block_m = row_block(M, n)
            t1 = graphed_us(lambda: fused_linear_triton(x, w, **kw))
            line = f"linear bf16 {name:18s} {n:5d}x{k} M={M:3d}: triton {t1:6.1f} (BLOCK_M {block_m})"
            if block_m != BLOCK_M:
                t16 = graphed_us(lambda: fused_linear_triton(x, w, **kw, block_m=BLOCK_M))
                line += f", at BLOCK_M {BLOCK_M} {t16:6.1f}"
            t2 = graphed_us(lambda: fused_linear_torch(x, w, **kw))
            full = fused_linear_triton(x, w, **kw)
            differ = sum(not torch.equal(full[r], fused_linear_triton(
                x[r:r + 1], w, **{a: (v[r:r + 1] if a == "residual" else v) for a, v in kw.items()})[0])
                for r in range(M))
            print(f"{line}  cuBLAS {t2:6.1f}  rows differing alone: {differ}")


# Tilings (BLOCK_N, BLOCK_K, num_warps, num_stages) against tile_config's own, for the draft
# vocabulary's product and gate_up: its wide and narrow ones and those between.
TILE_CHOICES = [(128, 128, 8, 3), (64, 128, 8, 3), (64, 128, 4, 3), (32, 128, 4, 3), (32, 128, 2, 4),
                (16, 128, 2, 4)]


def _tile_rows(dev, dtype) -> None:
    """fused_linear's kernel (with its norm prologue) at each tiling of TILE_CHOICES
    (tile_config's marked *), at the rows of a chain's draft (1), a tree round's (6) and a
    tree's target pass or drafts at batch 5 (31)."""
    from .linear import tile_config

    for name, n, k, gated in (("draft lm_head", 12000, 576, False), ("gate_up", 3072, 576, True)):
        w = torch.randn(n, k, device=dev, dtype=dtype) * k ** -0.5
        nw = torch.rand(k, device=dev, dtype=dtype) + 0.5
        own = tile_config(n, k)
        for bn, bk, warps, stages in TILE_CHOICES:
            tile = dict(BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, num_stages=stages)
            line = f"tile {name:13s} {n:5d}x{k} {bn:3d}/{bk}/{warps}/{stages}{'*' if tile == own else ' '}:"
            for M in (1, 6, 31):
                x = torch.randn(M, k, device=dev, dtype=dtype)
                t = graphed_us(lambda: fused_linear_triton(x, w, norm_weight=nw, eps=1e-5, gated=gated, tile=tile))
                line += f"  M={M:2d} {t:6.2f}"
            print(line)


# (what, rows, row length, k): an EAGLE-3 chain's greedy drafts at batch 1 and 16, an
# EAGLE-2 tree's first level and expansion rounds (6, 3, 30), the target's greedy tokens
# of a plain step, a k = 3 verification, a tree and a verification at batch 16; k None:
# argmax_rows, else log_softmax_top_k.
TOP_K_SHAPES = [("draft argmax", 1, 12000, None), ("draft argmax", 16, 12000, None), ("tree level", 1, 12000, 6),
                ("tree round", 6, 12000, 6), ("target argmax", 1, 49152, None), ("target argmax", 4, 49152, None),
                ("target argmax", 31, 49152, None), ("target argmax", 64, 49152, None)]
PART_CHOICES = [(256, 1), (512, 1), (512, 2), (1024, 2), (1024, 4), (2048, 4), (2048, 8), (4096, 8)]


def _top_k_rows(dev, dtype) -> None:
    """kernels/top_k.py at each part size and warp count (its BLOCK, NUM_WARPS marked *),
    against torch's argmax where it replaces one."""
    offsets = torch.randint(0, 9, (12000,), device=dev)
    for name, rows, V, k in TOP_K_SHAPES:
        x = torch.randn(rows, V, device=dev, dtype=dtype)
        off = offsets if V == 12000 else None
        if k is None:
            line = f"{name} {rows:2d}x{V}: torch argmax {graphed_us(lambda: x.argmax(-1)):5.1f}"
        else:
            line = f"{name} {rows:2d}x{V} k={k}:"
        for block, warps in PART_CHOICES:
            if k is None:
                t = graphed_us(lambda: argmax_rows_triton(x, off, block=block, num_warps=warps))
            else:
                t = graphed_us(lambda: log_softmax_top_k_triton(x, k, off, block=block, num_warps=warps))
            mark = "*" if (block, warps) == (BLOCK, NUM_WARPS) else ""
            line += f"  {block}/{warps}{mark} {t:5.1f}"
        print(line)


# (name, weight rows, columns, gated): a one-layer EAGLE-3 head of Llama-3.1-8B's shape.
FP8_SHAPES = [("qkv", 6144, 8192, False), ("o_proj", 4096, 4096, False), ("gate_up", 14336, 4096, True),
              ("down_proj", 4096, 14336, False), ("lm_head", 32000, 4096, False), ("fc", 4096, 12288, False)]
FP8_TILINGS = [dict(BLOCK_N=bn, BLOCK_K=bk, num_warps=w, num_stages=st)
               for bn in (16, 32, 64, 128) for bk in (128, 256, 512) for w in (4, 8) for st in (3, 4)]


def fp8_tile_rows(dev="cuda") -> None:
    """Per product of FP8_SHAPES, one row: cuBLAS on bf16 weights, fp8_wide_tile's tiling,
    and the five fastest of FP8_TILINGS (those that fit the GPU's shared memory)."""
    from .linear import fp8_wide_tile, quantize_fp8

    print(torch.cuda.get_device_name(), "| fp8 weights, one row, us per call, CUDA-graph replay")
    for name, n, k, gated in FP8_SHAPES:
        w = torch.randn(2 * n if gated else n, k, device=dev, dtype=torch.bfloat16) * k ** -0.5
        q, scale = quantize_fp8(w)
        x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
        cublas = graphed_us(lambda: F.linear(x, w))
        own = fp8_wide_tile(w.shape[0], k)  # as tile_config: the weight's rows, gate and up for gate_up
        times = []
        for tile in FP8_TILINGS:
            try:
                times.append((graphed_us(lambda: fused_linear_triton(x, q, scale=scale, gated=gated, tile=tile)),
                              tile))
            except triton.runtime.errors.OutOfResources:
                continue
        mine = next(t for t, tile in times if tile == own)
        print(f"fp8 {name:9s} {w.shape[0]:5d}x{k}: cuBLAS bf16 {cublas:6.1f}  fp8_wide_tile {mine:6.1f} "
              f"({q.numel() / (mine * 1e3):4.0f} GB/s) {own}")
        for t, tile in sorted(times, key=lambda r: r[0])[:5]:
            print(f"    {t:6.1f} {tile}")


if __name__ == "__main__":
    import sys

    fp8_tile_rows() if sys.argv[1:] == ["--fp8"] else main()
