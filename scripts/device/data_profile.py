"""Where the training data's generation time goes (`eagle-zoo train data --backend static`).

The ninth session's EAGLE-3 round went through its 12.6M tokens 23 times in 930 s of
training: data, not steps, is now the limit (BENCHMARKS.md), and the data is made on
the same GPU at ~31,600 generated tokens a second per process (two processes side by
side, batch 1024). This measures the static loop (eagle_zoo.train.generate) on a random
SmolLM2-shaped target, no GGUF needed: each batch size in turn, greedy and sampled
(T 0.7, top-p 0.9, as scripts/train_smollm2_heads.sh), every row decoding all
--new-tokens (no EOS), then torch.profiler over a short run: the GPU's busy share says
whether a larger batch (host-bound) or faster kernels (GPU-bound) would help.
Usage: python3 scripts/device/data_profile.py [--batches 1024,2048,4096] [--new-tokens 256]
       [--shape smollm2|tiny] (tiny: a 4-layer model, for a check on the CPU)
"""
from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import torch

from eagle_zoo.engine.model_loader import load_model
from eagle_zoo.train.generate import generate_batch
from train_profile import TINY, profile, write_target  # the same random target shapes, the same kernel table
from step_profile import SMOLLM2

NO_EOS = [-1]  # no token id matches: every row decodes all new tokens


def prompts_like_the_data(batch: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """Prompt lengths of the regenerated answers' prompts (40-200 tokens)."""
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(rng.randrange(40, 201))] for _ in range(batch)]


def run(model, prompts, new_tokens: int, temperature: float, device: torch.device) -> float:
    """Generated tokens a second of one generate_batch call (synchronised)."""
    generator = torch.Generator(device=device).manual_seed(0)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    answers = generate_batch(model, prompts, max_new_tokens=new_tokens, eos_token_ids=NO_EOS,
                             temperature=temperature, top_p=0.9 if temperature else 1.0, generator=generator,
                             device=device, dtype=torch.bfloat16)
    sync()
    return sum(len(a) for a in answers) / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1024,2048,4096", help="comma-separated batch sizes (rows generated together)")
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--shape", choices=("smollm2", "tiny"), default="smollm2")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args()
    shape, device = (SMOLLM2 if args.shape == "smollm2" else TINY), torch.device(args.device)
    with tempfile.TemporaryDirectory() as tmp:
        model = load_model(str(write_target(Path(tmp), shape)), torch.bfloat16, device).model
        for batch in (int(b) for b in args.batches.split(",") if b):
            prompts = prompts_like_the_data(batch, shape["vocab_size"])
            run(model, prompts[:8], 4, 0.0, device)  # warm-up: allocator, kernel compilation
            for temperature in (0.0, 0.7):
                rate = run(model, prompts, args.new_tokens, temperature, device)
                print(f"batch {batch}, {'greedy' if temperature == 0 else 'sampled'}: {rate:,.0f} generated tokens/s")
            if device.type == "cuda":  # a prefill and 31 sampled decode steps
                profile(lambda: run(model, prompts, 32, 0.7, device), 32, args.top, f"steps (prefill, then decode) of {batch} rows")


if __name__ == "__main__":
    main()
