"""`eagle-zoo bench`: acceptance benchmark for a draft head on a target.

Defaults follow the usual acceptance setting: the 80 MT-bench questions (first turn,
chat template), greedy, k = 3. Prints mean acceptance length (1 + accepted/drafts),
per-position acceptance rates and tokens/s; `--test` checks the mean acceptance
length against the value recorded for the head in the catalog.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Optional

DEFAULT_TARGET = "HuggingFaceTB/SmolLM2-135M-Instruct"
DEFAULT_RTOL = 0.02


def add_arguments(p):
    p.add_argument("--model", default=DEFAULT_TARGET, help="target model id or directory")
    p.add_argument("--method", default=None, help="eagle | eagle3 | ngram | draft_model (inferred when omitted)")
    p.add_argument("--draft", "--eagle-dir", dest="draft", default=None, help="draft head / model id or directory")
    p.add_argument("--num-spec-tokens", type=int, default=3)
    p.add_argument("--dataset", default=None, help="jsonl with MT-bench-style 'turns' or 'prompt' (default: MT-bench)")
    p.add_argument("--num-prompts", type=int, default=80)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--max-num-seqs", type=int, default=None, help="requests decoded together (default: all, capped by the engine)")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--device", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--print-output", action="store_true")
    p.add_argument("--compare-plain", action="store_true", help="also run plain decoding and report the speed-up")
    p.add_argument("--plot", default=None, help="save a PNG of per-position acceptance rates here")
    p.add_argument("--json", dest="json_out", default=None, help="write the results as JSON here")
    p.add_argument("--test", action="store_true", help="assert the mean acceptance length against the catalog")
    p.add_argument("--rtol", type=float, default=DEFAULT_RTOL)
    perf = p.add_argument_group("speed tables (--perf, see eagle_zoo/perf.py)")
    perf.add_argument("--perf", action="store_true", help="run the speed tables instead of the acceptance benchmark")
    perf.add_argument("--eagle", default=None, help="EAGLE-1 head for the batch-1 table")
    perf.add_argument("--eagle3", default=None, help="EAGLE-3 head for the batch-1 and throughput tables")
    perf.add_argument("--ngram", action="store_true", help="add n-gram prompt lookup (min 2, max 4) rows")
    perf.add_argument("--ks", default="1,2,3,4,5", help="speculative depths of the batch-1 table")
    perf.add_argument("--batch-sizes", default="1,4,16,64")
    perf.add_argument("--tput-k", type=int, default=3, help="k of the throughput table")
    perf.add_argument("--tput-waves", type=int, default=1,
                      help="throughput runs decode WAVES x batch size requests, max_num_seqs = batch size "
                           "(continuous batching keeps the batch full; more waves: longer, steadier runs)")
    perf.add_argument("--hf-prompts", type=int, default=0, help="prompts for the transformers generate peer (0: skip)")
    perf.add_argument("--perf-max-model-len", type=int, default=1024)
    perf.add_argument("--floor", action="store_true", help="time an 8B-shaped decode step against the bandwidth floor")
    perf.add_argument("--depth-schedule", default=None,
                      help='adaptive depth for an extra "adaptive" column of the throughput table: "auto" or a '
                           'JSON object like \'{"1": 3, "4": 1, "8": 0}\' (num_speculative_tokens_by_batch_size)')
    perf.add_argument("--spec-options", default=None,
                      help='JSON object merged into every EAGLE speculative_config, e.g. '
                           '\'{"disable_padded_drafter_batch": true}\'')
    perf.add_argument("--tree", default=None,
                      help="add an EAGLE-2 dynamic tree row per head to the batch-1 table: TOP_K,DEPTH,TOTAL_TOKENS "
                           "(e.g. 8,5,60; speculative_config tree); several shapes separated by ';' "
                           "(e.g. '8,5,60;4,4,24')")


def load_prompt_rows(dataset: Optional[str], num_prompts: int) -> list[dict]:
    """The first ``num_prompts`` rows of a jsonl prompt set (the shipped MT-bench copy when
    ``dataset`` is None) as {"prompt": first turn or "prompt", "category": the row's or None}."""
    if dataset is None:
        text = resources.files("eagle_zoo").joinpath("data/mt_bench.jsonl").read_text()
        source = "MT-bench (package data)"
    else:
        path = Path(dataset)
        if not path.is_file():
            raise SystemExit(f"--dataset {dataset}: no such file")
        text, source = path.read_text(), str(path)
    rows = []
    for i, line in enumerate(l for l in text.splitlines() if l.strip()):
        row = json.loads(line)
        prompt = row["turns"][0] if "turns" in row else row.get("prompt")
        if not isinstance(prompt, str):
            raise SystemExit(f"{source} line {i + 1}: expected a 'turns' or a string 'prompt' field")
        rows.append({"prompt": prompt, "category": row.get("category")})
    return rows[:num_prompts]


def load_prompts(dataset: Optional[str], num_prompts: int) -> list[str]:
    return [row["prompt"] for row in load_prompt_rows(dataset, num_prompts)]


@dataclass
class BenchResult:
    method: Optional[str]
    draft: Optional[str]
    num_prompts: int
    generated_tokens: int
    seconds: float
    mean_acceptance_length: Optional[float] = None
    acceptance_rates: list[float] = field(default_factory=list)
    outputs: list[list[int]] = field(default_factory=list)

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.seconds if self.seconds > 0 else 0.0


def run_once(args, speculative_config, prompts) -> tuple[BenchResult, object]:
    from .engine.llm import LLM
    from .engine.sampling_params import SamplingParams

    kwargs = dict(dtype=args.dtype, device=args.device, seed=args.seed)
    if args.max_num_seqs:
        kwargs["max_num_seqs"] = args.max_num_seqs
    llm = LLM(model=args.model, speculative_config=speculative_config, **kwargs)
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed)
    conversations = [[{"role": "user", "content": p}] for p in prompts]
    llm.chat(conversations[:1], SamplingParams(temperature=0, max_tokens=4))  # warm-up, not timed
    llm.engine.metrics.reset()
    start = time.perf_counter()
    outs = llm.chat(conversations, params, use_tqdm=True)
    seconds = time.perf_counter() - start
    m = llm.engine.metrics
    spec = speculative_config is not None
    result = BenchResult(
        method=llm.speculative_config.method if spec else None,
        draft=llm.speculative_config.model if spec else None,
        num_prompts=len(prompts),
        generated_tokens=sum(len(o.outputs[0].token_ids) for o in outs),
        seconds=seconds,
        mean_acceptance_length=m.mean_acceptance_length if spec else None,
        acceptance_rates=m.acceptance_rate_per_pos if spec else [],
        outputs=[o.outputs[0].token_ids for o in outs],
    )
    if args.print_output:
        for p, o in zip(prompts, outs):
            print(f"--- {p[:80]!r}\n{o.outputs[0].text}\n")
    return result, llm


def expected_acceptance(draft: Optional[str]) -> float:
    from .plugins import get_registry

    entry = get_registry().catalog.get(draft) if draft else None
    if entry is None or entry.acceptance_length is None:
        raise SystemExit(
            f"--test: no acceptance length is recorded in the catalog for {draft!r}; "
            "record one in its catalog entry or drop --test"
        )
    return float(entry.acceptance_length)


def acceptance_figure(rates: list[float], title: str):
    """A bar per draft position (1..k, integer ticks) with its rate written above it.
    The title may hold line breaks: a hub id and a target's name side by side do not fit
    the figure's width on one line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    positions = list(range(1, len(rates) + 1))
    fig, ax = plt.subplots(figsize=(5, 3.6))
    ax.bar(positions, rates, color="#3b7dd8")
    ax.set_xticks(positions)
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance rate")
    ax.set_ylim(0, 1)
    ax.set_title(title, fontsize=8)
    for pos, r in zip(positions, rates):
        ax.text(pos, r + 0.02, f"{r:.2f}", ha="center", fontsize=8)
    fig.tight_layout()
    return fig


def save_plot(rates: list[float], path: str, title: str) -> None:
    import matplotlib.pyplot as plt

    fig = acceptance_figure(rates, title)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_title(result: BenchResult, target: str, k: int) -> str:
    return (f"{result.draft}\non {target}\n"
            f"k={k}, mean acceptance length {result.mean_acceptance_length:.3f}")


def run(args) -> int:
    if args.perf:
        from .perf import run_perf

        return run_perf(args)
    prompts = load_prompts(args.dataset, args.num_prompts)
    spec = None
    if args.method or args.draft:
        spec = {"num_speculative_tokens": args.num_spec_tokens}
        if args.method:
            spec["method"] = args.method
        if args.draft:
            spec["model"] = args.draft
    result, _ = run_once(args, spec, prompts)
    report = {"speculative": result.__dict__ | {"tokens_per_second": result.tokens_per_second}}
    report["speculative"].pop("outputs")
    print(f"target: {args.model}  prompts: {len(prompts)}  max_tokens: {args.max_tokens}  "
          f"temperature: {args.temperature}")
    if spec is not None:
        print(f"method: {result.method}  draft: {result.draft}  k: {args.num_spec_tokens}")
        print(f"mean acceptance length: {result.mean_acceptance_length:.3f}")
        print("acceptance rate per position: " + ", ".join(f"{r:.3f}" for r in result.acceptance_rates))
    print(f"generated tokens: {result.generated_tokens}  time: {result.seconds:.2f}s  "
          f"tokens/s: {result.tokens_per_second:.1f}")
    if args.compare_plain and spec is not None:
        plain, _ = run_once(args, None, prompts)
        report["plain"] = {"tokens_per_second": plain.tokens_per_second, "seconds": plain.seconds,
                           "generated_tokens": plain.generated_tokens}
        same = sum(a == b for a, b in zip(result.outputs, plain.outputs))
        report["identical_outputs"] = same
        print(f"plain decoding tokens/s: {plain.tokens_per_second:.1f}  speed-up: "
              f"{result.tokens_per_second / max(plain.tokens_per_second, 1e-9):.2f}x  "
              f"identical outputs: {same}/{len(prompts)}")
    if args.plot and result.acceptance_rates:
        save_plot(result.acceptance_rates, args.plot, plot_title(result, args.model, args.num_spec_tokens))
        print(f"plot: {args.plot}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=2))
    if args.test:
        if spec is None:
            raise SystemExit("--test needs a draft head (--draft)")
        expected = expected_acceptance(result.draft)
        got = result.mean_acceptance_length
        ok = abs(got - expected) <= args.rtol * expected
        print(f"--test: mean acceptance length {got:.3f} vs catalog {expected:.3f} "
              f"(rtol {args.rtol}): {'PASS' if ok else 'FAIL'}")
        return 0 if ok else 1
    return 0


if __name__ == "__main__":
    from .cli import main

    sys.exit(main(["bench", *sys.argv[1:]]))
