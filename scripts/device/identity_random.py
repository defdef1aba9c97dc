"""Greedy speculative output against plain decoding, token for token, on a random-weight
target of a shape (no GGUF needed): an EAGLE-3 chain (k = 3, a random one-layer head) at
batch 1 and at batch 16, and an EAGLE-2 tree (6, 3, 30) at batch 1, each beside plain
decoding at the same batch, on random prompts. Random weights leave the target's top two
logits close, so any bit a product rounds differently in a verification than in a plain
step soon changes a token: this checks that the engine's steps are batch invariant at
that shape (BENCHMARKS.md, "Losslessness").
Usage: python3 scripts/device/identity_random.py [--shape 8b|smollm2] [--tokens 64] [--device cuda] [--dtype bfloat16]
       [--draft-quantization fp8]  (the head's weights as speculative_config quantization="fp8" makes them)
"""
from __future__ import annotations

import argparse

import torch

from eagle_zoo import perf_steps
from eagle_zoo.config.speculative import QUANTIZATIONS
from eagle_zoo.engine.sampling_params import SamplingParams

CASES = [("chain", None, 16), ("tree", perf_steps.PROFILE_TREE, 1), ("chain", None, 1)]  # strategy, tree, batch


def decode(target, head, strategy, tree, batch, prompts, tokens, device, dtype) -> list[list[int]]:
    engine = perf_steps.strategy_engine(target, head, strategy, 3, tree, dtype, device, 512, batch)
    seqs = [engine.add_request(p, SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)) for p in prompts]
    while engine.has_unfinished():
        engine.step()
    del engine
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return [list(seq.output_token_ids) for seq in seqs]


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", choices=sorted(perf_steps.SHAPES), default="8b")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--device", default="cuda", help="cpu: the same check of the CPU paths (slow for 8b)")
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    ap.add_argument("--draft-quantization", choices=QUANTIZATIONS, default=None)
    args = ap.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    target = perf_steps.random_target(perf_steps.SHAPES[args.shape], dtype, device)
    head = perf_steps.random_eagle3_head(target, perf_steps.DRAFT_VOCAB[args.shape], dtype)
    if args.draft_quantization:
        from eagle_zoo.models.quantization import quantize_fp8_

        quantize_fp8_(head, keep=list(target.parameters()))
    rng = torch.Generator().manual_seed(5)
    vocab = target.config.vocab_size
    prompts = [torch.randint(0, vocab, (int(torch.randint(50, 250, (1,), generator=rng)),), generator=rng).tolist()
               for _ in range(16)]
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(where, f"shape {args.shape}, {args.dtype}, head {args.draft_quantization or args.dtype}, "
          f"{args.tokens} tokens a prompt", flush=True)
    for strategy, tree, batch in CASES:
        n = max(batch, 4)
        plain = decode(target, head, "plain", None, batch, prompts[:n], args.tokens, device, dtype)
        spec = decode(target, head, strategy, tree, batch, prompts[:n], args.tokens, device, dtype)
        same = sum(a == b for a, b in zip(plain, spec))
        first = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None) for a, b in zip(plain, spec)]
        name = f"tree {','.join(map(str, tree.values()))}" if tree else "chain k=3"
        print(f"{name}, batch {batch}: {same}/{n} identical to plain decoding; first differing token "
              f"{[f for f in first if f is not None] or 'none'}", flush=True)


if __name__ == "__main__":
    main()
