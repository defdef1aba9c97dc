"""Where a CPU decode step goes: the embedded target answering `make demo`'s prompts of the
given categories with the shipped EAGLE-3 head at k drafts and plainly, in alternating
rounds, each engine decode step timed whole and each C++ call of kernels/cpu_decode.py
inside it (time.perf_counter around the call, summed over a step); prints per engine the
median over steps of each, and of the step's time outside the C++ calls (host work).

    OMP_NUM_THREADS=2 python scripts/cpu_step_parts.py [--categories chat,writing] [--k 3] [--rounds 3]
"""
from __future__ import annotations

import argparse
import collections
import statistics
import time

from eagle_zoo.bench import DEFAULT_TARGET
from eagle_zoo.demo import MAX_MODEL_LEN, MAX_TOKENS, SHIPPED_HEAD, demo_rows
from eagle_zoo.engine import core
from eagle_zoo.engine.llm import LLM
from eagle_zoo.engine.sampling_params import SamplingParams
from eagle_zoo.kernels import cpu_decode

CALLS = ("llama_stack_rows", "few_row_linear_int8", "few_row_linear", "eagle3_draft_rows", "eagle3_catch_up_rows",
         "eagle3_layer_rows", "llama_layer_rows", "rms_norm_rows", "cache_attention")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--categories", default="chat,writing", help="dev-set categories of make demo's prompts")
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()

    call_seconds: dict[str, float] = collections.defaultdict(float)
    for name in CALLS:
        def timed(*a, _call=getattr(cpu_decode, name), _name=name, **kw):
            start = time.perf_counter()
            try:
                return _call(*a, **kw)
            finally:
                call_seconds[_name] += time.perf_counter() - start
        setattr(cpu_decode, name, timed)
    steps: dict[str, list[dict]] = collections.defaultdict(list)
    engine = {"label": None}
    decode = core.EngineCore._decode

    def timed_decode(self, seqs):
        call_seconds.clear()
        start = time.perf_counter()
        out = decode(self, seqs)
        if engine["label"] is not None:
            steps[engine["label"]].append(dict(call_seconds, step=time.perf_counter() - start))
        return out
    core.EngineCore._decode = timed_decode

    wanted = args.categories.split(",")
    rows = [r for r in demo_rows()[1] if r["category"] in wanted]
    if not rows:
        raise SystemExit(f"--categories {args.categories}: no demo prompt of these categories")
    spec = LLM(model=DEFAULT_TARGET, max_model_len=MAX_MODEL_LEN,
               speculative_config={"model": SHIPPED_HEAD, "num_speculative_tokens": args.k})
    plain = LLM(model=DEFAULT_TARGET, max_model_len=MAX_MODEL_LEN)
    for llm in (spec, plain):  # warm-up
        llm.chat([r["messages"] for r in rows], SamplingParams(temperature=0, max_tokens=2))
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    for _ in range(args.rounds):
        for label, llm in ((f"k = {args.k}", spec), ("plain", plain)):
            engine["label"] = label
            for row in rows:
                llm.chat([row["messages"]], params)
            engine["label"] = None
    for label, recorded in steps.items():
        names = [n for n in ("step",) + CALLS if any(n in d for d in recorded)]
        cells = [f"{n} {statistics.median(d.get(n, 0.0) for d in recorded) * 1e3:.2f}" for n in names]
        host = statistics.median(d["step"] - sum(v for n, v in d.items() if n != "step") for d in recorded)
        print(f"{label}: {len(recorded)} steps, medians in ms: {', '.join(cells)}; outside the C++ calls {host * 1e3:.2f}")


if __name__ == "__main__":
    main()
