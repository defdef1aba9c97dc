"""`make demo`: what speculative decoding buys on the embedded default target, on
whatever device is here.

1. the catalog's heads for the target (`eagle-zoo list --target SmolLM2`);
2. SmolLM2-135M-Instruct answers prompts of different kinds, one request at a time:
   one prompt of each category of the dev set (eagle_zoo/data/dev.jsonl) when the
   package ships it, else the built-in prompts below (chat, writing, code, math,
   translation, summarization). Each prompt is decoded with the shipped EAGLE-3 head
   (n-gram prompt lookup when no head is installed) and then plainly, back to back, so
   both see the machine in the same state, in three rounds (--num-iters) of which the
   pass of median time counts;
3. per prompt: category, acceptance length, seconds to the first token (the prompt's
   prefill; with a head also the head's pass over the prompt), speculative and plain
   tokens/s after the first token and their ratio (what speculation speeds up), the
   end-to-end ratio and identical outputs; then the same over all prompts.
"""
from __future__ import annotations

import argparse
import sys

from .bench import DATASETS, DEFAULT_TARGET, BenchResult, GroupResult, draft_vocabulary, format_share, \
    aligned_table, load_prompt_rows, measure_rounds, share_outside, shipped_dataset, warm_up

SHIPPED_HEAD = "eagle-zoo/EAGLE3-SmolLM2-135M-Instruct"
MAX_TOKENS = 96
# Drafts a step. On a GPU a step of this small target is bound by its kernel launches, so
# verifying 4 drafts costs little more than 1 token: k = 4 is the shipped head's GPU
# setting, chosen on the dev set (BENCHMARKS.md). On a 2-core CPU the C++ kernels' products
# for three tokens cost about what one token's do (their weight prefetch), while each draft
# costs the head's pass: k = 3, also chosen on the dev set (BENCHMARKS.md, "The shipped
# EAGLE-3 head on the dev set (CPU)"); -k overrides.
CUDA_K, CPU_K = 4, 3
DEV_CANDIDATES = 5  # per category, the demo takes the shortest of the dev set's first five
MAX_MODEL_LEN = 4096  # the dev set's long-context prompts reach ~3.6k tokens
# A prompt's decoding lasts a second or two, in which a shared machine's load can move its
# speed by a fifth: each prompt's speed-up is the median of three rounds.
NUM_ITERS = 3

# Used when the package has no dev set: one prompt of each kind.
BUILTIN_PROMPTS = [
    {"category": "chat", "messages": [
        {"role": "user", "content": "I'm planning a picnic this weekend. Any tips?"},
        {"role": "assistant", "content": "Pick a shady spot, pack food that keeps well, and bring water and a blanket."},
        {"role": "user", "content": "What food would you suggest for four people?"}]},
    {"category": "writing", "prompt": "Write a short story about a lighthouse keeper who finds a message in a bottle."},
    {"category": "code", "prompt": "Write a Python function that returns the n-th Fibonacci number, with a docstring."},
    {"category": "math", "prompt": "A shop sells pens at 3 dollars each. Tom buys 7 pens and pays with a 50 dollar "
                                   "bill. How much change does he get? Explain step by step."},
    {"category": "translation", "prompt": "Translate into French: The weather is nice today, so we will walk "
                                          "to the market and buy fresh bread."},
    {"category": "summarization", "prompt": "Summarize in two sentences: The city council met on Monday to "
                                            "discuss the new park. Residents asked for more trees, a playground "
                                            "and longer opening hours. The council agreed to plant fifty trees "
                                            "this year and to build the playground next spring, but kept the "
                                            "opening hours as they are because of the cost of staff."},
]


def add_arguments(p):
    p.add_argument("--num-prompts", type=int, default=None, help="at most this many prompts (default: all)")
    p.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    p.add_argument("--num-speculative-tokens", "-k", type=int,
                   help=f"drafts a step (default: {CUDA_K} on a GPU, {CPU_K} on the CPU)")
    p.add_argument("--draft", default=SHIPPED_HEAD, help="catalog id or directory of the head")
    p.add_argument("--num-iters", type=int, default=NUM_ITERS,
                   help=f"rounds per prompt, each decoding it speculatively, then plainly; the pass of median "
                        f"time of each is reported (default {NUM_ITERS}; bench's --num-iters)")


def demo_rows(limit=None) -> tuple[str, list[dict]]:
    """(where the prompts come from, one row per category)."""
    if shipped_dataset("dev") is not None:
        by_category: dict[str, list[dict]] = {}
        for row in load_prompt_rows("dev", 10 ** 9):
            by_category.setdefault(row["category"], []).append(row)
        # The shortest of each category's first few: the demo's time goes to decoding, not to
        # prefilling a 3k-token retrieval prompt on two cores.
        rows = [min(group[:DEV_CANDIDATES], key=_prompt_chars) for group in by_category.values()]
        source = f"one prompt of each category of the dev set (eagle_zoo/{DATASETS['dev']})"
    else:
        rows = [{"category": r["category"],
                 "messages": r.get("messages") or [{"role": "user", "content": r["prompt"]}]}
                for r in BUILTIN_PROMPTS]
        rows = [dict(r, prompt=r["messages"][-1]["content"]) for r in rows]
        source = "built-in prompts of different kinds"
    return source, rows[:limit]


def _prompt_chars(row: dict) -> int:
    return sum(len(m["content"]) for m in row["messages"])


def speculative_config(draft: str, k: int) -> dict:
    from .plugins import get_registry

    entry = get_registry().catalog.get(draft)
    if entry is None and draft == SHIPPED_HEAD:
        print(f"({SHIPPED_HEAD} is not installed: n-gram prompt lookup instead)")
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    spec = {"model": draft, "num_speculative_tokens": k}
    if entry is not None:
        spec["method"] = entry.method
    return spec


def run(args) -> int:
    if args.num_iters < 1:
        raise SystemExit(f"--num-iters {args.num_iters}: give at least 1 (rounds per prompt)")
    import torch

    from . import catalog_cli
    from .engine.llm import LLM
    from .engine.sampling_params import SamplingParams

    print("== eagle-zoo list --target SmolLM2 (the catalog's heads for the embedded default)")
    catalog_cli.run_list(argparse.Namespace(family=None, method=None, target="SmolLM2"))
    k = args.num_speculative_tokens or (CUDA_K if torch.cuda.is_available() else CPU_K)
    spec = speculative_config(args.draft, k)
    source, rows = demo_rows(args.num_prompts)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)

    spec_llm = LLM(model=DEFAULT_TARGET, speculative_config=spec, max_model_len=MAX_MODEL_LEN)
    plain_llm = LLM(model=DEFAULT_TARGET, max_model_len=MAX_MODEL_LEN)
    print(f"\n== {DEFAULT_TARGET} on {spec_llm.device.type} ({str(spec_llm.dtype).removeprefix('torch.')}), "
          f"greedy, {len(rows)} prompts one at a time ({source}), {args.max_tokens} new tokens, "
          f"the median of {args.num_iters} rounds each")
    print(f"speculative_config: {spec}")
    conversations = [row["messages"] for row in rows]
    warm_up(spec_llm, conversations)
    warm_up(plain_llm, conversations)
    spec_groups, plain_groups = [], []
    for row in rows:  # each prompt speculatively, then plainly, num_iters times
        spec_group, plain_group = measure_rounds([spec_llm, plain_llm], [(row["category"], [row])], params,
                                                 num_iters=args.num_iters)
        spec_groups += spec_group
        plain_groups += plain_group

    for row, s in zip(rows, spec_groups):
        turns = len(row["messages"])
        context = f" (the last of {turns} messages)" if turns > 1 else ""
        print(f"\n[{row['category']}]{context} > {row['prompt']}\n{s.texts[0].strip()}")
    print(f"\n== results (k={k}): decoding speed after the first token (the prompt's prefill), "
          f"then end to end")
    # With a reduced draft vocabulary (EAGLE-3): the share of plain decoding's tokens no
    # draft can match, which caps a prompt's acceptance whatever the head predicts.
    in_vocab = draft_vocabulary(spec_llm)

    def not_draftable(outputs: list[list[int]]) -> tuple[str, ...]:
        return () if in_vocab is None else (format_share(share_outside(outputs, in_vocab)),)

    header = ("category", "accept", "first token s", "spec tok/s", "plain tok/s", "speed-up", "end to end",
              "identical") + (("not draftable",) if in_vocab is not None else ())
    lines = [header]
    for s, p in zip(spec_groups, plain_groups):
        lines.append(_line(s.category, s, p, "y" if s.outputs == p.outputs else "n") + not_draftable(p.outputs))
    same = sum(s.outputs == p.outputs for s, p in zip(spec_groups, plain_groups))
    lines.append(_line("overall", GroupResult.total(spec_groups), GroupResult.total(plain_groups), f"{same}/{len(rows)}")
                 + not_draftable([o for p in plain_groups for o in p.outputs]))
    print(aligned_table(lines))
    spec_all = BenchResult.from_groups(spec_groups)
    if spec_all.acceptance_rates:
        print("acceptance rate per draft position: " + ", ".join(f"{r:.3f}" for r in spec_all.acceptance_rates))
    return 0 if same == len(rows) else 1


def _line(label, spec: GroupResult, plain: GroupResult, identical) -> tuple[str, ...]:
    accept = spec.mean_acceptance_length
    decode = _ratio(spec.decode_tokens_per_second, plain.decode_tokens_per_second)
    end_to_end = _ratio(spec.tokens_per_second, plain.tokens_per_second)
    return (str(label), "-" if accept is None else f"{accept:.3f}",
            f"{spec.first_token_seconds:.3f} / {plain.first_token_seconds:.3f}",
            f"{spec.decode_tokens_per_second:.1f}", f"{plain.decode_tokens_per_second:.1f}", decode, end_to_end,
            identical)


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "-"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m eagle_zoo.demo")
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
