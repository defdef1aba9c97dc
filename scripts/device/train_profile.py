"""Where a training step of the SmolLM2 heads goes (no GGUF needed: random target weights).

A random bf16 target in SmolLM2-135M's shape (saved by transformers into a temporary
directory) and random token data shaped like the regenerated answers (a prompt of
40-200 tokens, then up to 256 assistant tokens) go through eagle_zoo.train's Trainer
with the settings of scripts/train_smollm2_heads.sh (EAGLE-3: token budget 16384, 4
training-time-test steps, draft vocabulary 12000; EAGLE-1: 32768, 3 steps). Prints:
  step      wall time of a whole optimisation step (median, synchronised), tokens/s
  phases    GPU time of the target's forward, the head's forward + loss, backward and
            AdamW inside one step (CUDA events)
  kernels   torch.profiler over a few steps: GPU time by kernel name, and the GPU's
            busy fraction (kernel time / wall time)
Usage: python3 scripts/device/train_profile.py [--method eagle3|eagle|both] [--steps 12]
       [--budgets 16384,65536] (token budgets to run instead of the recipe's, each in turn)
       [--cache-features] (each also with the target's features cached, --cache-features)
       [--spill 0.5] (each also with that share of the cached features in host memory)
       [--shape smollm2|tiny] (tiny: a 4-layer model, for a check on the CPU)
A step's time includes making its batch (with a cache, gathering the batch's features).
"""
from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from eagle_zoo.train.data import TokenData
from eagle_zoo.train.trainer import Trainer, TrainSettings
from step_profile import SMOLLM2  # this directory's decode-step profile: the same random target shape

TINY = dict(SMOLLM2, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=2048)
# (token budget, TTT steps, draft vocabulary) as scripts/train_smollm2_heads.sh trains them
RECIPES = {"eagle3": (16384, 4, 12000), "eagle": (32768, 3, None)}


def write_target(root: Path, shape: dict) -> Path:
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**shape, initializer_range=0.05)).to(torch.bfloat16)
    model.save_pretrained(root / "target", safe_serialization=True)
    return root / "target"


def write_data(root: Path, vocab: int, sequences: int) -> Path:
    rng = random.Random(0)
    seqs = []
    for _ in range(sequences):
        prompt, answer = rng.randrange(40, 200), rng.randrange(64, 257)
        ids = [rng.randrange(3, vocab) for _ in range(prompt + answer)]
        seqs.append((ids, [0] * prompt + [1] * answer))
    TokenData.from_sequences(seqs, {"vocab_size": vocab}).save(root / "data")
    return root / "data"


def wall_time(fn, cuda: bool) -> float:
    """Seconds fn takes, the GPU's queued work included when ``cuda``."""
    if cuda:
        torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - t


def phases(trainer: Trainer) -> dict:
    """GPU time (ms) of each part of one step, by CUDA events around the pieces the
    trainer calls (the target's forward is timed through a wrapper around it)."""
    events = {}
    target = trainer.target.model
    forward = target.forward

    def timed_forward(*a, **k):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = forward(*a, **k)
        end.record()
        events["target forward"] = (start, end)
        return out

    target.forward = timed_forward
    batch = trainer.next_batch()
    marks = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
    try:
        marks[0].record()
        loss, _, _ = trainer._loss(batch)
        marks[1].record()
        loss.backward()
        marks[2].record()
        trainer.optimizer.step()
        trainer.optimizer.zero_grad(set_to_none=True)
        marks[3].record()
    finally:
        del target.forward
    torch.cuda.synchronize()
    # with --cache-features the target does not run in a step: its share is 0 (the cache's
    # gather of the batch's features falls under "head forward + loss")
    fwd = events["target forward"][0].elapsed_time(events["target forward"][1]) if events else 0.0
    return {"target forward": fwd, "head forward + loss": marks[0].elapsed_time(marks[1]) - fwd,
            "backward": marks[1].elapsed_time(marks[2]), "AdamW": marks[2].elapsed_time(marks[3])}


def profile(fn, steps: int, top: int, what: str = "steps") -> None:
    """torch.profiler over fn(), which runs ``steps`` steps: wall time, GPU kernel time and
    busy share, then the ``top`` kernels by GPU time a step."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        wall = wall_time(fn, cuda=True)
    rows = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy = sum(e.self_device_time_total for e in rows) / 1e6
    print(f"  profiled {steps} {what}: wall {wall * 1e3:.0f} ms, kernels {busy * 1e3:.0f} ms "
          f"(GPU busy {busy / wall:.0%}), {sum(e.count for e in rows) / steps:.0f} kernels a step")
    for e in sorted(rows, key=lambda e: -e.self_device_time_total)[:top]:
        print(f"  {e.self_device_time_total / 1e3 / steps:8.2f} ms/step {e.count // steps:5d}x  {e.key[:110]}")


def run(method: str, target: Path, data: Path, args, budget: int = 0, cache: str = "") -> None:
    """One trainer's steps; cache: "" (the target's forward every step), "cached" (all
    features on the device) or "spilled" (--spill of the rows in host memory)."""
    from eagle_zoo.train import feature_cache

    on_device = feature_cache.rows_on_device
    if cache == "spilled":
        feature_cache.rows_on_device = lambda total, row_bytes, device: int(total * (1 - args.spill))
    recipe_budget, ttt, draft_vocab = RECIPES[method]
    if args.shape == "tiny":
        recipe_budget, draft_vocab = recipe_budget // 8, draft_vocab and 512
    budget = budget or recipe_budget
    s = TrainSettings(method=method, target=str(target), data=[str(data)], epochs=1000, token_budget=budget,
                      max_len=1280, lr=5e-4, warmup_steps=5, ttt_steps=ttt, draft_vocab_size=draft_vocab,
                      device=args.device, log_every=10**9, save_every=0, progress=False, cache_features=bool(cache))
    built = time.perf_counter()
    try:
        trainer = Trainer(s, log=print if cache else (lambda *a: None))
    finally:
        feature_cache.rows_on_device = on_device
    if cache:
        print(f"  trainer with the feature cache ready in {time.perf_counter() - built:.1f} s")
    for _ in range(3):  # warm-up: allocator, autotuning
        trainer.train_step(trainer.next_batch())
    times, tokens = [], []

    def one_step():  # the batch too: with a cache, next_batch gathers its features
        batch = trainer.next_batch()
        tokens.append(int(batch.input_ids.numel()))
        trainer.train_step(batch)

    for _ in range(args.steps):
        times.append(wall_time(one_step, args.device == "cuda"))
    step = statistics.median(times)
    label = {"": "", "cached": ", cached features", "spilled": f", cached features, {args.spill:.0%} in host memory"}
    print(f"{method} (token budget {budget}{label[cache]}): step {step * 1e3:.1f} ms median of {args.steps} ({min(times) * 1e3:.1f}-{max(times) * 1e3:.1f}), "
          f"{statistics.mean(tokens):.0f} padded tokens a step, {sum(tokens) / sum(times):,.0f} tokens/s")
    if args.device != "cuda":
        return
    split = [phases(trainer) for _ in range(3)]
    print("  phases (GPU ms): " + ", ".join(f"{k} {statistics.median(p[k] for p in split):.1f}" for k in split[0]))
    if not args.no_profiler:
        profile(lambda: [trainer.train_step(trainer.next_batch()) for _ in range(3)], 3, args.top)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--method", choices=("eagle3", "eagle", "both"), default="both")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--shape", choices=("smollm2", "tiny"), default="smollm2")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--sequences", type=int, default=2000)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--budgets", default="", help="comma-separated token budgets (default: the recipe's)")
    ap.add_argument("--cache-features", action="store_true", help="also run each with --cache-features")
    ap.add_argument("--spill", type=float, default=0.0,
                    help="also a run with the features cached and this share of them in host memory")
    ap.add_argument("--no-profiler", action="store_true")
    args = ap.parse_args()
    shape = SMOLLM2 if args.shape == "smollm2" else TINY
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        target, data = write_target(root, shape), write_data(root, shape["vocab_size"], args.sequences)
        budgets = [int(b) for b in args.budgets.split(",") if b] or [0]
        for method in (("eagle3", "eagle") if args.method == "both" else (args.method,)):
            for budget in budgets:
                caches = [""] + (["cached"] if args.cache_features else []) + (["spilled"] if args.spill else [])
                for cache in caches:
                    run(method, target, data, args, budget, cache)


if __name__ == "__main__":
    main()
