"""Read bandwidth of one-row float32 matmuls on this CPU (BENCHMARKS.md, "CPU"): SmolLM2's
four layer shapes (qkv, o_proj, gate_up, down_proj) x 30 distinct random weights, so that
they stream from memory as in a decode step, through torch's F.linear, torch on a
column-major copy of each weight (the fallback's one-row path, models/layers.py) and
kernels/cpu_decode.py; and the bandwidth of a sum over 256 MiB for scale.

    .venv/bin/python scripts/cpu_gemv_bench.py [--threads 2]
Run on an idle machine; each figure is the best of 7 passes.
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from eagle_zoo.kernels import cpu_decode

SHAPES = [(1728, 576), (576, 576), (3072, 576), (576, 1536)]  # (out, in) of one layer's weights
LAYERS = 30


def best_of(fn, passes: int = 7) -> float:
    times = []
    for _ in range(passes):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    weights = [(torch.randn(*s), torch.randn(1, s[1])) for _ in range(LAYERS) for s in SHAPES]
    column_major = [w.t().contiguous() for w, _ in weights]
    nbytes = sum(w.numel() * 4 for w, _ in weights)
    src = torch.randn(256 * 2**20 // 4)
    print(f"threads {args.threads}; sum of 256 MiB: {src.numel() * 4 / best_of(src.sum) / 1e9:.1f} GB/s")
    del src
    runs = {"torch F.linear (row-major weight)": lambda: [F.linear(x, w) for w, x in weights],
            "torch x @ column-major copy": lambda: [x @ c for (_, x), c in zip(weights, column_major)]}
    if cpu_decode.available():
        runs["kernels/cpu_decode.py few_row_linear"] = lambda: [cpu_decode.few_row_linear(x, w) for w, x in weights]
    for name, fn in runs.items():
        fn()
        s = best_of(fn)
        print(f"{name:40s} {s * 1e3:6.1f} ms for {nbytes / 1e6:.0f} MB: {nbytes / s / 1e9:5.1f} GB/s")


if __name__ == "__main__":
    main()
