"""EAGLE-3 heads against each other and plain decoding in `make demo`'s setting (batch 1,
greedy, the demo's prompts, one request at a time), all engines in one process, each
warmed up, then ROUNDS rounds in which every engine decodes the prompts once, in the
order given (BENCHMARKS.md, twentieth session: give the heads in both orders, on this
2-core CPU the engine that runs first in a round ran ~10% slower).

    .venv/bin/python scripts/demo_ab.py NAME=HEAD [NAME=HEAD ...] [--rounds 3] [-k 2]
        e.g. old=/tmp/old4 new=eagle-zoo/EAGLE3-SmolLM2-135M-Instruct
"""
from __future__ import annotations

import argparse

from eagle_zoo.bench import DEFAULT_TARGET, BenchResult, measure
from eagle_zoo.demo import MAX_TOKENS, demo_rows
from eagle_zoo.engine.llm import LLM
from eagle_zoo.engine.sampling_params import SamplingParams


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("heads", nargs="+", help="NAME=HEAD: a name for the table and an EAGLE-3 head (directory or id)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("-k", "--num-speculative-tokens", type=int, default=2)
    p.add_argument("--num-prompts", type=int, default=None, help="at most this many of the demo's prompts")
    p.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    args = p.parse_args()
    heads = dict(h.split("=", 1) for h in args.heads if "=" in h)
    if len(heads) != len(args.heads) or "plain" in heads:
        p.error("give each head as NAME=HEAD, each NAME once and other than 'plain' (plain decoding's row)")
    groups = [(row["category"], [row]) for row in demo_rows(args.num_prompts)[1]]  # one request at a time
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    llms = {name: LLM(model=DEFAULT_TARGET, speculative_config={
        "model": head, "method": "eagle3", "num_speculative_tokens": args.num_speculative_tokens})
        for name, head in heads.items()}
    llms["plain"] = LLM(model=DEFAULT_TARGET)
    for llm in llms.values():
        llm.chat([[{"role": "user", "content": "Hi"}]], SamplingParams(temperature=0, max_tokens=4))
    for r in range(args.rounds):
        tps = {name: BenchResult.from_groups(measure(llm, groups, params)).tokens_per_second
               for name, llm in llms.items()}
        print(f"round {r}: " + ", ".join(f"{n} {v:.1f} tok/s" for n, v in tps.items()) + " | "
              + ", ".join(f"{n}/plain {tps[n] / tps['plain']:.2f}x" for n in heads), flush=True)


if __name__ == "__main__":
    main()
