"""How the CPU one-call drafts' stopping threshold (engine/proposers.py
CPU_DRAFT_MIN_CONFIDENCE) trades drafts against speed: the embedded target answering dev-set
prompts (the first --per-category of each category after --skip, or of --categories only)
with the shipped EAGLE-3 head at up to --k drafts, fp32 on the CPU, one request at a time.
Each round runs plain decoding, then the speculative engine once per --values threshold;
prints per round each threshold's decoding speed-up over that round's plain run (each
request's first token to its last, prefill left out) and at the end the median over
rounds. Every run's outputs must equal plain decoding's.

    OMP_NUM_THREADS=2 python scripts/cpu_draft_confidence.py [--values 0,0.2,0.35,0.5] [--per-category 2]
        [--skip 0] [--rounds 3] [--k 3] [--max-tokens 96] [--categories chat,writing]
"""
from __future__ import annotations

import argparse
import statistics

from eagle_zoo.bench import DEFAULT_TARGET, load_prompt_rows
from eagle_zoo.demo import MAX_MODEL_LEN, MAX_TOKENS, SHIPPED_HEAD
from eagle_zoo.engine.llm import LLM
from eagle_zoo.engine.sampling_params import SamplingParams


def dev_rows(per_category: int, skip: int, categories: list[str] | None) -> list[dict]:
    by_category: dict[str, list[dict]] = {}
    for row in load_prompt_rows("dev", 10 ** 9, per_category + skip):
        by_category.setdefault(row["category"], []).append(row)
    if categories is not None:
        unknown = sorted(set(categories) - set(by_category))
        if unknown:
            raise SystemExit(f"--categories: no dev-set category {', '.join(unknown)} "
                             f"(there are {', '.join(sorted(by_category))})")
        by_category = {c: by_category[c] for c in categories}
    return [row for group in by_category.values() for row in group[skip:]]


def decode(llm: LLM, rows: list[dict], params: SamplingParams) -> tuple[float, list[list[int]]]:
    """(decoding tokens/s over the rows, each row's output ids)."""
    seconds = tokens = 0.0
    outputs = []
    for row in rows:
        out = llm.chat([row["messages"]], params, use_tqdm=False)[0]
        seconds += out.metrics.finished_time - out.metrics.first_token_time
        tokens += len(out.outputs[0].token_ids) - 1
        outputs.append(out.outputs[0].token_ids)
    return tokens / seconds, outputs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--values", default="0,0.2,0.35,0.5", help="thresholds in [0, 1), comma-separated")
    p.add_argument("--per-category", type=int, default=2)
    p.add_argument("--skip", type=int, default=0, help="dev-set rows of each category left out first")
    p.add_argument("--categories", default=None, help="dev-set categories (default: all)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    args = p.parse_args()
    values = [float(v) for v in args.values.split(",")]
    if not all(0 <= v < 1 for v in values):
        raise SystemExit(f"--values {args.values}: each threshold must lie in [0, 1)")
    rows = dev_rows(args.per_category, args.skip, args.categories and args.categories.split(","))

    common = dict(max_model_len=MAX_MODEL_LEN, device="cpu", dtype="float32", max_num_seqs=1)
    plain = LLM(model=DEFAULT_TARGET, **common)
    spec = LLM(model=DEFAULT_TARGET, speculative_config={"model": SHIPPED_HEAD, "num_speculative_tokens": args.k},
               **common)
    proposer = spec.engine.proposer
    if proposer.cpu_head is None:
        raise SystemExit("the shipped head's drafts do not run as one C++ call here (kernels/cpu_decode.py "
                         "not built?): the threshold has nothing to change")
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    speed_ups: dict[float, list[float]] = {v: [] for v in values}
    for round_ in range(args.rounds):
        plain_rate, want = decode(plain, rows, params)
        for value in values:
            proposer.cpu_min_confidence = value
            rate, got = decode(spec, rows, params)
            if got != want:
                raise SystemExit(f"threshold {value}: outputs differ from plain decoding's")
            speed_ups[value].append(rate / plain_rate)
        print(f"round {round_ + 1}: plain {plain_rate:.1f} tokens/s; "
              + ", ".join(f"{v}: {speed_ups[v][-1]:.3f}x" for v in values), flush=True)
    print(f"{len(rows)} prompts, k = {args.k}, median speed-up over {args.rounds} rounds: "
          + ", ".join(f"{v}: {statistics.median(speed_ups[v]):.3f}x" for v in values))


if __name__ == "__main__":
    main()
