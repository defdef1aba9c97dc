"""How CPU_MIN_DRAFT_PROB (eagle_zoo/engine/proposers.py) was chosen, and checked: decoding
speed on the CPU of the shipped EAGLE-3 head at several floors and k, against plain
decoding in the same process, one request at a time, 96 new tokens, greedy. Every setting
runs once a round, after that round's plain run.

--prompts tuning (the floor was chosen on these): two dev-set prompts of each category
from its sixth on, under 1,500 characters (so summarization and retrieval drop out).
--prompts first3: the dev set's first three of each category (33; bench --per-category 3).
--prompts demo: make demo's eleven (the shortest of each category's first five).

    python3 scripts/cpu_draft_floor.py [--prompts tuning] [--floors 0,0.2,0.3,0.4] [--ks 2,3] [--rounds 2]
"""
import argparse
import json

import eagle_zoo.engine.proposers as proposers
from eagle_zoo import LLM, SamplingParams, bench
from eagle_zoo.demo import demo_rows

TARGET = "HuggingFaceTB/SmolLM2-135M-Instruct"
HEAD = "eagle-zoo/EAGLE3-SmolLM2-135M-Instruct"


def prompts(which: str) -> list[dict]:
    if which == "first3":
        return [{"messages": row["messages"]} for row in bench.load_prompt_rows("dev", 33, per_category=3)]
    if which == "demo":
        return [{"messages": row["messages"]} for row in demo_rows()[1]]
    rows = bench.load_prompt_rows("dev", 330)
    by_category: dict[str, list[dict]] = {}
    for row in rows:
        by_category.setdefault(row["category"], []).append(row)
    return [{"messages": row["messages"]} for rows in by_category.values()
            for row in [r for r in rows[5:] if len(json.dumps(r["messages"])) < 1500][:2]]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", choices=("tuning", "first3", "demo"), default="tuning")
    p.add_argument("--floors", default="0,0.2,0.3,0.4")
    p.add_argument("--ks", default="2,3")
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    groups = [(None, prompts(args.prompts))]
    params = SamplingParams(temperature=0, max_tokens=96)
    common = dict(device="cpu", dtype="float32", max_num_seqs=1, max_model_len=4096)
    plain_llm = LLM(TARGET, **common)
    specs = {k: LLM(TARGET, speculative_config={"model": HEAD, "num_speculative_tokens": k}, **common)
             for k in map(int, args.ks.split(","))}
    conversations = [row["messages"] for row in groups[0][1]]
    for llm in (plain_llm, *specs.values()):
        bench.warm_up(llm, conversations)  # one-off costs (first prefill of each length) untimed
    print(f"{len(groups[0][1])} prompts")
    for rnd in range(1, args.rounds + 1):
        plain = bench.measure(plain_llm, groups, params)[0]
        print(f"round {rnd}: plain {plain.decode_tokens_per_second:.1f} tokens/s decoding", flush=True)
        for k, llm in specs.items():
            for floor in map(float, args.floors.split(",")):
                proposers.CPU_MIN_DRAFT_PROB = floor
                spec = bench.measure(llm, groups, params)[0]
                print(f"round {rnd}: k = {k}, floor {floor}: acceptance {spec.mean_acceptance_length:.3f}, "
                      f"{spec.decode_tokens_per_second:.1f} tokens/s decoding, "
                      f"{spec.decode_tokens_per_second / plain.decode_tokens_per_second:.2f}x; end to end "
                      f"{plain.seconds / spec.seconds:.2f}x; identical {spec.outputs == plain.outputs}", flush=True)


if __name__ == "__main__":
    main()
