"""Tilings of kernels/linear.py against cuBLAS, per weight shape, on the GPU.

For SmolLM2-135M's and Llama-3-8B's projections (with the prologue / epilogue each one
gets in eagle_zoo/models/fused_layer.py), time one call at M rows inside a CUDA graph of
50 calls (launch gaps included, as in a decode step) for each candidate tiling, and
cuBLAS F.linear with the separate eager ops it replaces. Prints microseconds per call.
Usage: python3 scripts/device/linear_sweep.py [--rows 1,4]
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from eagle_zoo.kernels.activation import silu_and_mul
from eagle_zoo.kernels.linear import fused_linear_triton, tile_config
from eagle_zoo.kernels.norm import rms_norm

SHAPES = {  # name: (weight rows, K, norm prologue, gated, residual)
    "smol.qkv": (960, 576, True, False, False),
    "smol.o": (576, 576, False, False, True),
    "smol.gate_up": (3072, 576, True, True, False),
    "smol.down": (576, 1536, False, False, True),
    "smol.lm_head": (49152, 576, False, False, False),
    "8b.qkv": (6144, 4096, True, False, False),
    "8b.o": (4096, 4096, False, False, True),
    "8b.gate_up": (28672, 4096, True, True, False),
    "8b.down": (4096, 14336, False, False, True),
    "8b.lm_head": (128256, 4096, False, False, False),
}
TILINGS = [(16, 64, 4, 3), (16, 128, 4, 3), (16, 256, 4, 2), (16, 256, 4, 3), (16, 512, 4, 2), (32, 128, 4, 3),
           (32, 256, 4, 3), (32, 256, 8, 3), (64, 128, 4, 3), (64, 256, 8, 3), (16, 128, 2, 4), (128, 128, 8, 3)]


def graph_us(fn, calls: int = 50, reps: int = 5) -> float:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    best = float("inf")
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        best = min(best, a.elapsed_time(b) * 1e3 / calls)
    return best


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,4")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    args = ap.parse_args()
    dt = torch.bfloat16
    for name in args.shapes.split(","):
        n, k, norm, gated, res = SHAPES[name]
        w = torch.randn(n, k, device="cuda", dtype=dt) / k ** 0.5
        nw = torch.ones(k, device="cuda", dtype=dt) if norm else None
        for m in (int(r) for r in args.rows.split(",")):
            x = torch.randn(m, k, device="cuda", dtype=dt)
            out_n = n // 2 if gated else n
            r = torch.randn(m, out_n, device="cuda", dtype=dt) if res else None

            def eager():
                y = rms_norm(x, nw, 1e-5) if norm else x
                y = F.linear(y, w)
                y = silu_and_mul(y) if gated else y
                return y + r if res else y
            row = [f"{name:13s} M={m:<3d} cuBLAS+ops {graph_us(eager):6.1f}"]
            best = None
            for bn, bk, warps, stages in TILINGS:
                cfg = dict(BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, num_stages=stages)
                try:
                    t = graph_us(lambda: fused_linear_triton(x, w, norm_weight=nw, eps=1e-5, gated=gated,
                                                             residual=r, config=cfg))
                except Exception as exc:  # a tiling that does not compile (registers, shared memory)
                    row.append(f"{bn}/{bk}/{warps}/{stages}: {type(exc).__name__}")
                    continue
                row.append(f"{bn}/{bk}/{warps}/{stages} {t:6.1f}")
                if best is None or t < best[0]:
                    best = (t, (bn, bk, warps, stages))
            cur = tile_config(n, k)
            row.append(f"| best {best[1]} {best[0]:.1f}; current {tuple(cur.values())}")
            print("  ".join(row), flush=True)
        del w


if __name__ == "__main__":
    main()
