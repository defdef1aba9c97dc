"""`make demo`: the main job on the embedded default target, on whatever device is here.

1. the catalog and plugins (what the zoo knows);
2. SmolLM2-135M-Instruct answers a few MT-bench questions with speculative decoding,
   using the zoo's best head for it (an EAGLE-3 head from the catalog when one is
   installed, else n-gram prompt lookup), and plain decoding on the same prompts;
3. acceptance statistics, tokens/s of both, and whether the outputs are identical.
"""
from __future__ import annotations

import argparse
import sys
import time

from .bench import DEFAULT_TARGET, load_prompts

NUM_PROMPTS = 3
MAX_TOKENS = 96
# Drafts a step. On the GPU a step is bound by reading the weights, so verifying 3 drafts
# costs little more than 1 token; on a 2-core CPU each verified token adds ~3 ms to a ~21 ms
# step (scripts/cpu_step_profile.py --tokens 1,2,3,4), and with the acceptance of these
# writing questions K = 3 was no faster than plain decoding while K = 2 was (BENCHMARKS.md,
# CPU, eighth session). The answer depends on the machine: on the twenty-first session's
# (~6.5 ms a verified token on a ~31 ms step) K = 2 still beat K = 1 but neither beat plain
# decoding at batch 1 with the five-layer EAGLE-3 head; on the twenty-second's (AVX2 only,
# ~4 ms on a ~28 ms step) K = 2 gave 1.07x, and 0.99x to 1.11x with the six-layer head.
CUDA_K, CPU_K = 3, 2


def add_arguments(p):
    p.add_argument("--num-prompts", type=int, default=NUM_PROMPTS)
    p.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    p.add_argument("--num-speculative-tokens", "-k", type=int,
                   help=f"drafts a step (default: {CUDA_K} on a GPU, {CPU_K} on the CPU)")


def best_head_for(target: str):
    from .plugins import get_registry

    entries = [e for e in get_registry().catalog.values() if e.target == target]
    for method in ("eagle3", "eagle"):
        for e in entries:
            if e.method == method:
                return e
    return None


def timed_chat(llm, prompts, params):
    """One request at a time (batch 1, the latency setting speculative decoding is for;
    on this CPU a batch of 3 verifies 12 positions a step and speculation loses)."""
    start = time.perf_counter()
    outs = [llm.chat([[{"role": "user", "content": p}]], params)[0] for p in prompts]
    seconds = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    return outs, tokens / seconds


def run(args) -> int:
    import torch

    from . import catalog_cli
    from .engine.llm import LLM
    from .engine.sampling_params import SamplingParams

    print("== eagle-zoo list --target SmolLM2 (the catalog's heads for the embedded default)")
    catalog_cli.run_list(argparse.Namespace(family=None, method=None, target="SmolLM2"))
    entry = best_head_for(DEFAULT_TARGET)
    info_id = entry.id if entry is not None else "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
    print(f"\n== eagle-zoo info {info_id}")
    catalog_cli.run_info(argparse.Namespace(id=info_id))
    k = args.num_speculative_tokens or (CUDA_K if torch.cuda.is_available() else CPU_K)
    if entry is not None:
        spec = {"model": entry.id, "method": entry.method, "num_speculative_tokens": k}
    else:
        spec = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    prompts = load_prompts(None, args.num_prompts)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)

    print(f"\n== {DEFAULT_TARGET}, greedy, {len(prompts)} MT-bench questions one at a time, "
          f"{args.max_tokens} new tokens")
    print(f"speculative_config: {spec}")
    spec_llm = LLM(model=DEFAULT_TARGET, speculative_config=spec)
    spec_llm.chat([[{"role": "user", "content": "Hi"}]], SamplingParams(temperature=0, max_tokens=4))
    spec_llm.engine.metrics.reset()
    spec_outs, spec_tps = timed_chat(spec_llm, prompts, params)
    metrics = spec_llm.engine.metrics

    plain_llm = LLM(model=DEFAULT_TARGET)
    plain_llm.chat([[{"role": "user", "content": "Hi"}]], SamplingParams(temperature=0, max_tokens=4))
    plain_outs, plain_tps = timed_chat(plain_llm, prompts, params)

    for p, o in zip(prompts, spec_outs):
        print(f"\n> {p}\n{o.outputs[0].text.strip()}")
    same = sum(a.outputs[0].token_ids == b.outputs[0].token_ids for a, b in zip(spec_outs, plain_outs))
    print("\n== results")
    print(f"mean acceptance length: {metrics.mean_acceptance_length:.3f} (k={k})")
    print("acceptance rate per position: " + ", ".join(f"{r:.3f}" for r in metrics.acceptance_rate_per_pos))
    print(f"tokens/s speculative: {spec_tps:.1f}   plain: {plain_tps:.1f}   speed-up: {spec_tps / plain_tps:.2f}x")
    print(f"outputs identical to plain greedy decoding: {same}/{len(prompts)}")
    return 0 if same == len(prompts) else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m eagle_zoo.demo")
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
