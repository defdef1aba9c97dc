"""The EAGLE proposer's drafting loop and catch-up as one CUDA graph each, and the greedy
tree step as one graph, on the GPU: outputs and acceptance must equal the eager engine's
and the step-by-step forms' (each head pass its own graph, lm_heads and argmaxes launched
from Python; tree steps eager), and the speed of each at batch 1. Tiny random target and heads (tests/engine_fixtures.py): a
step of them is nearly all launch and host overhead, which is what the graphs remove.

Usage: python3 scripts/device/draft_graph_check.py [--dtype float32|bfloat16] [--device cpu]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
import checkpoint_factory as cf  # noqa: E402
import engine_fixtures as ef  # noqa: E402
from eagle_zoo import LLM, SamplingParams  # noqa: E402


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def run(target, spec, mode, prompts, dtype, max_tokens, device="cuda"):
    # stepwise: graphs pass by pass (EAGLE_ZOO_STEP_GRAPHS=0, read when the engine is built)
    os.environ["EAGLE_ZOO_STEP_GRAPHS"] = "0" if mode == "stepwise" else "1"
    llm = LLM(str(target), speculative_config=spec, device=device, dtype=dtype, max_model_len=256,
              max_num_seqs=4, enforce_eager=mode == "eager")
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    llm.generate([{"prompt_token_ids": prompts[0]}], params)  # warm-up: captures the graphs
    outs, tokens, seconds = [], 0, 0.0
    for p in prompts:
        sync()
        t = time.perf_counter()
        o = llm.generate([{"prompt_token_ids": p}], params)[0]
        sync()
        seconds += time.perf_counter() - t
        outs.append(o.outputs[0].token_ids)
        tokens += len(o.outputs[0].token_ids)
    m = llm.engine.metrics
    accept = m.mean_acceptance_length if spec else None
    return outs, tokens / seconds, accept


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--device", default="cuda", help="cpu: a dry run of this script (no graphs)")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp())
    kind = ef.kind_of("llama")
    # A bigram-like target and a head that predicts it (tests/engine_fixtures.py): high
    # acceptance, so the catch-up gathers at every accepted count; EAGLE-3: a random head.
    target = ef.write_target(root / "target", kind, edit=ef.bigram_edit())
    prompts = ef.random_prompts((20, 31, 44, 25), cf.TINY["vocab_size"], seed=5)
    plain, tps, _ = run(target, None, "graphs", prompts, args.dtype, args.max_tokens, args.device)
    print(f"plain (graphs): {tps:.1f} tok/s", flush=True)
    ok = True
    for method in ("eagle", "eagle3"):
        head = (ef.write_bigram_eagle_head(root / method, target) if method == "eagle"
                else ef.write_head(root / method, kind, method))
        for label, shape in (("k=3", {"num_speculative_tokens": 3}),
                             ("tree 4,3,16", {"tree": {"top_k": 4, "depth": 3, "total_tokens": 16}})):
            spec = {"method": method, "model": str(head), **shape}
            results = {mode: run(target, spec, mode, prompts, args.dtype, args.max_tokens, args.device)
                       for mode in ("eager", "stepwise", "graphs")}
            for mode, (outs, tps, accept) in results.items():
                same = sum(a == b for a, b in zip(outs, plain))
                print(f"{method} {label} {mode:8s}: {tps:8.1f} tok/s, acceptance {accept:.3f}, identical to plain "
                      f"{same}/{len(plain)}", flush=True)
                ok &= same == len(plain) and outs == results["eager"][0]
    print("ALL IDENTICAL" if ok else "MISMATCH")


if __name__ == "__main__":
    main()
