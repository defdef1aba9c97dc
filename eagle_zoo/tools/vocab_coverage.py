"""`eagle-zoo vocab-coverage`: how much of the target's own MT-bench output an EAGLE-3
head's draft vocabulary covers.

A position whose target token is outside the draft vocabulary is always rejected, so the
coverage caps the acceptance rate. The embedded SmolLM2 target answers the 80 MT-bench
first turns greedily (chat template, fp32); then the share of the answer tokens in the
head's draft vocabulary (t2d), overall and by category, the most frequent tokens outside
it, and, for comparison, the coverage of the draft vocabulary joined with every token id
below N (BPE ids roughly follow frequency).
"""
from __future__ import annotations

import argparse
import json
from collections import Counter
from importlib.resources import files

import torch


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--head", default="eagle-zoo/EAGLE3-SmolLM2-135M-Instruct",
                    help="EAGLE-3 head for the default target: catalog id, hub id or directory "
                         "(default: %(default)s)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (default: %(default)s)")
    ap.add_argument("--max-tokens", type=int, default=256, help="answer length (default: %(default)s)")


def run(args: argparse.Namespace) -> int:
    if args.max_tokens < 1:
        raise SystemExit("eagle-zoo vocab-coverage: --max-tokens must be at least 1")

    from eagle_zoo import load
    from eagle_zoo.bench import DEFAULT_TARGET
    from eagle_zoo.engine.llm import LLM
    from eagle_zoo.engine.sampling_params import SamplingParams

    rows = [json.loads(line) for line in files("eagle_zoo").joinpath("data/mt_bench.jsonl").read_text().splitlines()
            if line.strip()]
    # The head first: only its draft vocabulary is read (no target needed), and a wrong
    # --head is then found before minutes of decoding, not after.
    head = load(args.head, dtype=torch.float32).head
    if getattr(head, "t2d", None) is None:
        raise SystemExit(f"eagle-zoo vocab-coverage: --head {args.head}: no draft vocabulary (t2d): it drafts "
                         "over the whole target vocabulary; pass an EAGLE-3 head")
    t2d = head.t2d.cpu()
    llm = LLM(model=DEFAULT_TARGET, device=args.device, dtype="float32", max_num_seqs=len(rows))
    outs = llm.chat([[{"role": "user", "content": r["turns"][0]}] for r in rows],
                    SamplingParams(temperature=0, max_tokens=args.max_tokens))
    per_row = [torch.tensor(o.outputs[0].token_ids, dtype=torch.long) for o in outs]
    tokens = torch.cat(per_row)
    print(f"{tokens.numel()} output tokens; draft vocabulary of {int(t2d.sum())} covers "
          f"{float(t2d[tokens].float().mean()):.2%}")
    by_category: dict[str, list[torch.Tensor]] = {}
    for r, ids in zip(rows, per_row):
        by_category.setdefault(r["category"], []).append(ids)
    for category, parts in by_category.items():
        ids = torch.cat(parts)
        print(f"  {category:<11} {ids.numel():5d} tokens, {float(t2d[ids].float().mean()):.2%} covered")
    outside = Counter(tokens[~t2d[tokens]].tolist())
    tokenizer = llm.tokenizer
    print(f"outside: {sum(outside.values())} tokens, {len(outside)} distinct, "
          f"{sum(1 for n in outside.values() if n == 1)} seen once; most frequent: "
          + ", ".join(f"{tokenizer.decode([t])!r} {n}" for t, n in outside.most_common(15)))
    for n in (16000, 24000, 32000):
        joined = t2d | (torch.arange(t2d.numel()) < n)
        print(f"draft vocabulary + ids < {n}: {int(joined.sum())} tokens cover {float(joined[tokens].float().mean()):.2%}")
    return 0
