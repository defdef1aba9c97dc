"""`eagle-zoo bench`: the end-to-end speed-up of a draft head over plain decoding.

Every run with a draft decodes the prompts twice in one process, with the same prompts
and settings: speculatively, then plainly (the target alone). It prints the tokens/s of
both, their ratio (the speed-up), how many outputs are identical, and the mean
acceptance length (1 + accepted / drafts) with per-position rates. `--by-category`
breaks all of it down by the prompt set's `category` field. For a head with a reduced
draft vocabulary (EAGLE-3) it also prints the share of plain decoding's tokens outside
it, which no draft can match (what caps acceptance on, e.g., translation). `--test` checks the mean
acceptance length against the catalog's measured record for the run's setting
(eagle_zoo/catalog.py, SETTING_KEYS).

Defaults follow the usual acceptance setting: the 80 MT-bench questions (first turn,
chat template), greedy, k = 3.

vLLM's examples/offline_inference/spec_decode.py command lines run unchanged but for
model names: its flags are accepted (--method --num-spec-tokens --tp --draft-tp
--eagle-dir --model-dir --dataset-name --dataset-path --num-prompts --max-num-seqs --temp
--top-p --top-k --output-len --print-output --enforce-eager --max-model-len
--prompt-lookup-max/min --test; --enable-chunked-prefill is announced as without
effect), --dataset-path reads a local file (jsonl rows, or a JSON list such as ShareGPT's),
and a speculative run also prints the script's summary (total_num_output_tokens,
num_drafts, num_draft_tokens, num_accepted_tokens, mean acceptance length, acceptance at
each token position).
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Optional

DEFAULT_TARGET = "HuggingFaceTB/SmolLM2-135M-Instruct"
DEFAULT_RTOL = 0.02
# Prompt sets shipped in the package, by the name --dataset and catalog records use.
DATASETS = {"mt-bench": "data/mt_bench.jsonl", "dev": "data/dev.jsonl"}
DEFAULT_DATASET = "mt-bench"
# spec_decode.py's --dataset-name values that read --dataset-path (here: a local file).
FILE_DATASET_NAMES = ("hf", "custom", "sharegpt", "jsonl")
# Hub datasets of which the package ships a copy: read instead of downloading.
SHIPPED_HUB_DATASETS = {"philschmid/mt-bench": "mt-bench"}
ROLES = ("system", "user", "assistant")


def add_arguments(p):
    from .config.speculative import QUANTIZATIONS

    p.add_argument("--model", "--model-dir", dest="model", default=DEFAULT_TARGET, help="target model id or directory")
    p.add_argument("--method", default=None, help="eagle | eagle3 | ngram | draft_model (inferred when omitted)")
    p.add_argument("--draft", "--eagle-dir", dest="draft", default=None, help="draft head / model id or directory")
    p.add_argument("--num-spec-tokens", type=int, default=3)
    p.add_argument("--dataset", default=None,
                   help="prompt set: 'mt-bench' (the default: 80 first turns), 'dev' (the shipped dev set, "
                        "eagle_zoo/data/dev.jsonl) or a jsonl path whose rows hold 'messages' (a chat ending in a "
                        "user turn, sent whole), 'turns' (the first is sent) or 'prompt', and may hold 'category'")
    p.add_argument("--dataset-name", default=None,
                   help="as spec_decode.py: 'mt-bench' / 'dev' (shipped sets), or hf | custom | sharegpt | jsonl "
                        "with --dataset-path")
    p.add_argument("--dataset-path", default=None,
                   help="a local prompt file: jsonl rows with 'prompt', 'turns', 'messages' or ShareGPT "
                        "'conversations', or a JSON list of such rows (philschmid/mt-bench reads the shipped copy)")
    p.add_argument("--num-prompts", type=int, default=80)
    p.add_argument("--per-category", type=int, default=None,
                   help="take only the first N rows of each category of the prompt set (e.g. 10 of each of the dev "
                        "set's 11 categories); the catalog setting's dataset then says so")
    p.add_argument("--max-tokens", "--output-len", dest="max_tokens", type=int, default=256)
    p.add_argument("--temperature", "--temp", dest="temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0, help="0 or -1: off")
    p.add_argument("--tp", "--tensor-parallel-size", dest="tp", type=int, default=1,
                   help="tensor_parallel_size of the target (docs/tensor-parallel.md)")
    p.add_argument("--draft-tp", type=int, default=None, help="speculative_config draft_tensor_parallel_size")
    p.add_argument("--draft-quantization", choices=QUANTIZATIONS, default=None,
                   help="speculative_config quantization: fp8 weights for the draft's linear layers and lm_head "
                        "(CUDA only; eagle_zoo/models/quantization.py); with --perf, for every head of the tables, "
                        "the step-cost tables' random ones included")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="context length: prompt + output (default: the engine's, min(model's, 2048)); the dev "
                        "set's longest prompts need about 4096")
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    p.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                   help="launch each decode step before the previous one is read back, as LLM(async_scheduling=...);"
                        " default: on for a CUDA device, off on the CPU and with tensor parallelism; also "
                        "EAGLE_ZOO_ASYNC_SCHEDULING=0/1")
    p.add_argument("--prompt-lookup-max", type=int, default=None, help="ngram: longest n-gram looked up")
    p.add_argument("--prompt-lookup-min", type=int, default=None, help="ngram: shortest n-gram looked up")
    p.add_argument("--enable-chunked-prefill", action="store_true",
                   help="accepted for spec_decode.py command lines; no effect (prompts are prefilled whole)")
    p.add_argument("--max-num-seqs", type=int, default=None,
                   help="requests decoded together: the batch of catalog records (default: the engine's, 64 on a "
                        "GPU, 8 on the CPU)")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--device", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-iters", type=int, default=1,
                   help="timed rounds (default 1). With N > 1 the speculative and the plain engine are held "
                        "in memory together and each round times one pass of each, so that a slow spell of the "
                        "machine hits both; the pass of median time is reported (of an even number, the faster "
                        "middle one) and the JSON holds every pass's seconds. At batch 16 on a GPU a pass lasts "
                        "about a second, and passes of one engine varied by up to 1.7x within a run. With --perf: "
                        "the rounds of the throughput table, whose engines are held together at any N. N > 1 is "
                        "refused with --tp > 1 (two tensor-parallel engines cannot share the ranks)")
    p.add_argument("--print-output", action="store_true")
    p.add_argument("--by-category", action="store_true",
                   help="break the results down by the prompt set's 'category' field. Each category's prompts "
                        "are decoded and timed as a batch of their own (speculative, then plain), so a "
                        "category's tokens/s is its own; the totals add the categories' tokens and seconds. "
                        "At --max-num-seqs 1 this is the same as one batch of everything")
    p.add_argument("--plot", default=None, help="save a PNG of per-position acceptance rates here")
    p.add_argument("--json", dest="json_out", default=None, help="write the results as JSON here")
    p.add_argument("--test", action="store_true",
                   help="check the mean acceptance length against the catalog's measured record for this run's "
                        "setting (dataset, num_prompts, device, dtype, batch = --max-num-seqs, k, max_tokens, "
                        "temperature); exit 1 when it is off by more than --rtol, 2 when no record matches. "
                        "The speed-up is reported next to the record's, not checked")
    p.add_argument("--rtol", type=float, default=DEFAULT_RTOL)
    perf = p.add_argument_group("speed tables (--perf, see eagle_zoo/perf.py)")
    perf.add_argument("--perf", action="store_true",
                      help="run the speed tables instead of the acceptance benchmark, on the prompts --dataset, "
                           "--num-prompts and --per-category choose; the draft, sampling and batch options of the "
                           "acceptance benchmark are refused with it (the tables take --eagle / --eagle3, --ks, "
                           "--tree and --batch-sizes)")
    perf.add_argument("--eagle", default=None, help="EAGLE-1 head for the batch-1 table")
    perf.add_argument("--eagle3", default=None, help="EAGLE-3 head for the batch-1 and throughput tables")
    perf.add_argument("--ngram", action="store_true", help="add n-gram prompt lookup (min 2, max 4) rows")
    perf.add_argument("--ks", default="1,2,3,4,5",
                      help="speculative depths of the batch-1 table; '' for none (with --batch-sizes '' and no "
                           "head given --tree, only the step-cost tables run and the target is not loaded)")
    perf.add_argument("--batch-sizes", default="1,4,16,64", help="batch sizes of the throughput table; '' for none")
    perf.add_argument("--tput-k", type=int, default=3, help="k of the throughput table")
    perf.add_argument("--tput-waves", type=int, default=1,
                      help="throughput runs decode WAVES x batch size requests, max_num_seqs = batch size "
                           "(continuous batching keeps the batch full; more waves: longer, steadier runs)")
    perf.add_argument("--hf-prompts", type=int, default=0, help="prompts for the transformers generate peer (0: skip)")
    perf.add_argument("--perf-max-model-len", type=int, default=1024,
                      help="max_model_len of the batch-1 and throughput tables' engines (default 1024); the "
                           "step-cost tables' caches hold at least this many tokens, more where their timed steps "
                           "need them")
    perf.add_argument("--depth-schedule", default=None,
                      help='adaptive depth for an extra "adaptive" column of the throughput table: "auto" or a '
                           'JSON object like \'{"1": 3, "4": 1, "8": 0}\' (num_speculative_tokens_by_batch_size)')
    perf.add_argument("--spec-options", default=None,
                      help='JSON object merged into every EAGLE speculative_config, e.g. '
                           '\'{"enforce_eager": true}\'')
    perf.add_argument("--step-costs", default=None,
                      help="target shapes of the step-cost tables (random weights; eagle_zoo/perf_steps.py): "
                           "comma-separated from smollm2, 8b; default smollm2 on CUDA, none on the CPU; '' for none")
    perf.add_argument("--step-cost-steps", type=int, default=200, help="engine steps timed per step-cost row")
    perf.add_argument("--step-cost-batch", type=int, default=1,
                      help="requests decoding together in the step-cost tables (default 1)")
    perf.add_argument("--acceptance-profile", default=None,
                      help="per-position acceptance rates (e.g. 0.75,0.57,0.45) for the step-cost tables' projected "
                           "chain speed-up (labelled a projection)")
    perf.add_argument("--tree", default=None,
                      help="add an EAGLE-2 dynamic tree row per head to the batch-1 table: TOP_K,DEPTH,TOTAL_TOKENS "
                           "(e.g. 8,5,60; speculative_config tree); several shapes separated by ';' "
                           "(e.g. '8,5,60;4,4,24')")


def resolve_dataset_flags(args) -> None:
    """Fold spec_decode.py's --dataset-name / --dataset-path into --dataset (a shipped
    set's name or a local file)."""
    name, path = getattr(args, "dataset_name", None), getattr(args, "dataset_path", None)
    if name is None and path is None:
        return
    if args.dataset is not None:
        raise SystemExit("give --dataset, or spec_decode.py's --dataset-name / --dataset-path, not both")
    if path is not None:
        if name is not None and name not in FILE_DATASET_NAMES:
            raise SystemExit(f"--dataset-name {name} --dataset-path {path}: --dataset-path goes with --dataset-name "
                             f"{' | '.join(FILE_DATASET_NAMES)} (or give --dataset-name {' | '.join(DATASETS)} alone)")
        if Path(path).is_file():
            args.dataset = path
        elif path in SHIPPED_HUB_DATASETS:
            args.dataset = SHIPPED_HUB_DATASETS[path]
            print(f"--dataset-path {path}: reading the shipped copy, eagle_zoo/{DATASETS[args.dataset]} "
                  f"(nothing is downloaded)")
        else:
            raise SystemExit(f"--dataset-path {path}: no such local file; bench reads local prompt files (jsonl rows "
                             f"with 'prompt', 'turns', 'messages' or 'conversations', or a JSON list of them): "
                             f"download the dataset and pass its path")
        return
    if name in DATASETS:
        args.dataset = name
    elif name == "hf":  # spec_decode.py's default dataset-path is MT-bench
        args.dataset = DEFAULT_DATASET
    else:
        raise SystemExit(f"--dataset-name {name}: give a shipped set ({', '.join(DATASETS)}), or "
                         f"{' | '.join(FILE_DATASET_NAMES)} with --dataset-path <local file>")


def dataset_name(dataset: Optional[str]) -> str:
    """The name a run's prompt set goes by in reports and catalog records: a shipped set's
    name, else the path as given."""
    return DEFAULT_DATASET if dataset is None else dataset


def package_files():
    """The installed package's files (shipped prompt sets live under data/)."""
    return resources.files("eagle_zoo")


def shipped_dataset(name: str):
    """The package's file of a shipped prompt set (see DATASETS), or None where this
    installation does not have it."""
    resource = package_files().joinpath(DATASETS[name])
    return resource if resource.is_file() else None


def _read_dataset(dataset: Optional[str]) -> tuple[str, str]:
    """(text, source) of a prompt set: a shipped one by name, else a jsonl file."""
    name = dataset_name(dataset)
    if name in DATASETS:
        resource = shipped_dataset(name)
        if resource is None:
            raise SystemExit(f"--dataset {name}: eagle_zoo/{DATASETS[name]} is not in this installation; "
                             f"pass the path of a jsonl prompt set instead")
        return resource.read_text(encoding="utf-8"), f"{name} (eagle_zoo/{DATASETS[name]})"
    path = Path(name)
    if not path.is_file():
        raise SystemExit(f"--dataset {name}: no such file (or give a shipped set: {', '.join(DATASETS)})")
    try:
        return path.read_text(encoding="utf-8"), str(path)
    except UnicodeDecodeError as exc:
        raise SystemExit(f"--dataset {name}: not UTF-8 text ({exc}); give a JSON-lines prompt set") from None


def _conversation(row, where: str) -> list[dict]:
    """The chat a row sends: its 'messages', its first 'turns' entry or its 'prompt'."""
    if "messages" in row:
        messages = row["messages"]
        if not isinstance(messages, list) or not messages:
            raise SystemExit(f"{where}: 'messages' must be a non-empty list of {{\"role\", \"content\"}} messages")
        for j, m in enumerate(messages):
            if not (isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str)):
                raise SystemExit(f"{where}: messages[{j}] must be {{\"role\": {' | '.join(ROLES)}, "
                                 f"\"content\": a string}}; got {m!r}")
        if messages[-1]["role"] != "user":
            raise SystemExit(f"{where}: the last message must be the user's (the turn to answer), "
                             f"not {messages[-1]['role']!r}; drop the trailing turn")
        return [{"role": m["role"], "content": m["content"]} for m in messages]
    if isinstance(row.get("conversations"), list):  # ShareGPT: the first human turn
        first = next((t for t in row["conversations"] if isinstance(t, dict) and t.get("from") in ("human", "user")),
                     None)
        if first is None or not isinstance(first.get("value"), str):
            raise SystemExit(f"{where}: 'conversations' has no {{\"from\": \"human\", \"value\": a string}} turn")
        return [{"role": "user", "content": first["value"]}]
    prompt = row["turns"][0] if isinstance(row.get("turns"), list) and row["turns"] else row.get("prompt")
    if not isinstance(prompt, str):
        raise SystemExit(f"{where}: expected a 'messages' list, a 'turns' list or a string 'prompt' field")
    return [{"role": "user", "content": prompt}]


def load_prompt_rows(dataset: Optional[str], num_prompts: int, per_category: Optional[int] = None) -> list[dict]:
    """The first ``num_prompts`` rows of a prompt set (MT-bench when ``dataset`` is None;
    see --dataset) as {"prompt": the last user turn, "category": the row's or None,
    "messages": the chat sent to the target}; with ``per_category``, only the first that
    many rows of each category count."""
    text, source = _read_dataset(dataset)
    rows, taken = [], {}
    for where, row in _records(text, source):
        if len(rows) == num_prompts:
            break
        if not isinstance(row, dict):
            raise SystemExit(f"{where}: expected a JSON object, got {type(row).__name__}")
        messages = _conversation(row, where)
        category = row.get("category")
        if per_category is not None:
            if taken.get(category, 0) == per_category:
                continue
            taken[category] = taken.get(category, 0) + 1
        rows.append({"prompt": messages[-1]["content"], "category": category, "messages": messages})
    return rows


def _records(text: str, source: str):
    """(where, parsed row) of a jsonl file, or of a JSON list (ShareGPT's files)."""
    if text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SystemExit(f"{source}: not valid JSON ({exc.msg}, line {exc.lineno})") from None
        for i, row in enumerate(rows):
            yield f"{source} item {i}", row
        return
    for i, line in enumerate(text.splitlines()):
        if not line.strip():
            continue
        where = f"{source} line {i + 1}"
        try:
            yield where, json.loads(line)
        except json.JSONDecodeError as exc:
            raise SystemExit(f"{where}: not valid JSON ({exc.msg})") from None


def load_prompts(dataset: Optional[str], num_prompts: int) -> list[str]:
    """The rows' last user turns (callers that send a single user message)."""
    return [row["prompt"] for row in load_prompt_rows(dataset, num_prompts)]


@dataclass
class GroupResult:
    """One timed batch: all the prompts, or one category's."""
    category: Optional[str]
    num_prompts: int
    generated_tokens: int
    seconds: float
    num_drafts: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    outputs: list[list[int]] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    num_draft_tokens: int = 0
    # Time in which some request of the batch was in its prefill (scheduled, no first token
    # yet) and in which some request was decoding (first token to finish): unions of the
    # requests' intervals, so requests run one after another add up and concurrent ones
    # count once. Speculation changes the decoding; the prefill is the same work for both.
    first_token_seconds: float = 0.0
    decode_seconds: float = 0.0
    pass_seconds: list[float] = field(default_factory=list)  # every timed pass's (measure_rounds)

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        """Tokens after each request's first, over the decoding time."""
        return (self.generated_tokens - self.num_prompts) / self.decode_seconds if self.decode_seconds > 0 else 0.0

    @classmethod
    def total(cls, groups: list["GroupResult"]) -> "GroupResult":
        """The groups as one (they ran one after another, so their times add up)."""
        return cls(category="overall", num_prompts=sum(g.num_prompts for g in groups),
                   generated_tokens=sum(g.generated_tokens for g in groups),
                   seconds=sum(g.seconds for g in groups),
                   num_drafts=sum(g.num_drafts for g in groups),
                   num_accepted_tokens=sum(g.num_accepted_tokens for g in groups),
                   first_token_seconds=sum(g.first_token_seconds for g in groups),
                   decode_seconds=sum(g.decode_seconds for g in groups))

    @property
    def mean_first_token_seconds(self) -> float:
        """Time to first token a request, from its scheduling (its prefill; vLLM counts from
        arrival, which also holds the wait for a free slot)."""
        return self.first_token_seconds / self.num_prompts if self.num_prompts else 0.0

    @property
    def mean_acceptance_length(self) -> Optional[float]:
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else None


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
    groups: list[GroupResult] = field(default_factory=list)
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.seconds if self.seconds > 0 else 0.0

    @classmethod
    def from_groups(cls, groups: list[GroupResult], method=None, draft=None) -> "BenchResult":
        """Totals over the groups: tokens and seconds add up, acceptance pools the drafts."""
        drafts = sum(g.num_drafts for g in groups)
        per_pos = [sum(p) for p in _zip_longest(g.accepted_per_pos for g in groups)]
        return cls(
            method=method, draft=draft,
            num_prompts=sum(g.num_prompts for g in groups),
            generated_tokens=sum(g.generated_tokens for g in groups),
            seconds=sum(g.seconds for g in groups),
            mean_acceptance_length=(1 + sum(g.num_accepted_tokens for g in groups) / drafts) if drafts else None,
            acceptance_rates=[a / drafts for a in per_pos] if drafts else [],
            outputs=[o for g in groups for o in g.outputs],
            groups=groups,
            num_drafts=drafts,
            num_draft_tokens=sum(g.num_draft_tokens for g in groups),
            num_accepted_tokens=sum(g.num_accepted_tokens for g in groups),
            accepted_per_pos=per_pos,
        )

    def summary(self) -> dict:
        """The JSON report's view (no token ids)."""
        return {"method": self.method, "draft": self.draft, "num_prompts": self.num_prompts,
                "generated_tokens": self.generated_tokens, "seconds": self.seconds,
                "tokens_per_second": self.tokens_per_second,
                "mean_acceptance_length": self.mean_acceptance_length,
                "acceptance_rates": self.acceptance_rates,
                "num_drafts": self.num_drafts, "num_draft_tokens": self.num_draft_tokens,
                "num_accepted_tokens": self.num_accepted_tokens}

    def spec_decode_summary(self) -> str:
        """The summary spec_decode.py prints after a speculative run."""
        d = self.num_drafts
        lines = ["-" * 50, f"total_num_output_tokens: {self.generated_tokens}", f"num_drafts: {d}",
                 f"num_draft_tokens: {self.num_draft_tokens}", f"num_accepted_tokens: {self.num_accepted_tokens}",
                 f"mean acceptance length: {1 + self.num_accepted_tokens / d if d else 1:.2f}", "-" * 50]
        lines += [f"acceptance at token {i}: {a / d if d else 0:.2f}" for i, a in enumerate(self.accepted_per_pos)]
        return "\n".join(lines)


def _zip_longest(lists) -> list[tuple[int, ...]]:
    lists = list(lists)
    width = max((len(x) for x in lists), default=0)
    return [tuple(x[i] if i < len(x) else 0 for x in lists) for i in range(width)]


def group_rows(rows: list[dict], by_category: bool) -> list[tuple[Optional[str], list[dict]]]:
    """[(category, rows)] in order of each category's first row; one group of all rows
    without ``by_category``. Rows without a category form the group "(none)"."""
    if not by_category:
        return [(None, rows)]
    groups: dict[str, list[dict]] = {}
    for row in rows:
        category = row.get("category")
        groups.setdefault("(none)" if category is None else str(category), []).append(row)
    return list(groups.items())


def warm_up(llm, conversations: list[list[dict]], batch: int = 1) -> None:
    """Untimed requests, so that neither engine of a comparison pays one-off costs inside
    its timed run: every prompt's prefill and first decode step once (the first prefill of
    a new prompt length costs more, once per process: Triton's kernel variants on CUDA,
    about half as long again on the CPU; the engine timed first would pay for what the
    second reuses); and on CUDA, requests that stop one after another walk the
    running batch down from ``batch`` to 1, capturing every CUDA-graph bucket on the way."""
    from .engine.sampling_params import SamplingParams

    if llm.device.type == "cuda":
        convs = (conversations * batch)[:batch]
        llm.chat(convs, [SamplingParams(temperature=0, max_tokens=8 + 4 * i, ignore_eos=True) for i in range(batch)])
    llm.chat(conversations, SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    llm.engine.metrics.reset()


def measure(llm, groups: list[tuple[Optional[str], list[dict]]], params, use_tqdm: bool = False,
            num_iters: int = 1) -> list[GroupResult]:
    """Decode each group of rows as one timed batch (llm.chat), ``num_iters`` times (see
    measure_rounds)."""
    return measure_rounds([llm], groups, params, use_tqdm, num_iters)[0]


def measure_rounds(llms: list, groups: list[tuple[Optional[str], list[dict]]], params, use_tqdm: bool = False,
                   num_iters: int = 1) -> list[list[GroupResult]]:
    """For each engine, each group of rows decoded as one timed batch (llm.chat), in
    ``num_iters`` rounds; a round times every engine once, one after the other, so that
    a spell of slow machine hits the engines of a comparison alike. Of a group's passes
    the one of median time is kept (of an even number, the faster middle one), with the
    engine's acceptance counters of that pass; ``pass_seconds`` holds every pass's time."""
    if num_iters < 1:
        raise ValueError(f"measure: num_iters={num_iters}; time at least one pass")
    passes = [[[] for _ in groups] for _ in llms]
    for _ in range(num_iters):
        for llm, per_group in zip(llms, passes):
            for group, kept in zip(groups, per_group):
                kept.append(_timed_pass(llm, *group, params, use_tqdm))
    return [[_median_pass(group_passes) for group_passes in per_group] for per_group in passes]


def _median_pass(passes: list[GroupResult]) -> GroupResult:
    kept = sorted(passes, key=lambda g: g.seconds)[(len(passes) - 1) // 2]
    kept.pass_seconds = [g.seconds for g in passes]
    return kept


def _timed_pass(llm, category: Optional[str], rows: list[dict], params, use_tqdm: bool) -> GroupResult:
    llm.engine.metrics.reset()
    start = time.perf_counter()
    outs = llm.chat([row["messages"] for row in rows], params, use_tqdm=use_tqdm)
    seconds = time.perf_counter() - start
    timed = [o.metrics for o in outs if o.metrics is not None]
    m = llm.engine.metrics
    return GroupResult(
        category=category, num_prompts=len(rows),
        generated_tokens=sum(len(o.outputs[0].token_ids) for o in outs), seconds=seconds,
        num_drafts=m.num_drafts, num_accepted_tokens=m.num_accepted_tokens, num_draft_tokens=m.num_draft_tokens,
        accepted_per_pos=list(m.num_accepted_tokens_per_pos),
        outputs=[list(o.outputs[0].token_ids) for o in outs],
        texts=[o.outputs[0].text for o in outs],
        first_token_seconds=covered([(r.first_scheduled_time, r.first_token_time) for r in timed]),
        decode_seconds=covered([(r.first_token_time, r.finished_time) for r in timed]),
    )


def covered(intervals: list[tuple[Optional[float], Optional[float]]]) -> float:
    """Seconds covered by the union of (start, end) intervals; those with an end missing
    (a request that failed before its first token) are left out."""
    total, reach = 0.0, None
    for start, end in sorted((a, b) for a, b in intervals if a is not None and b is not None):
        if reach is None or start > reach:
            total, reach = total + end - start, end
        elif end > reach:
            total, reach = total + end - reach, end
    return total


def build_llm(args, speculative_config):
    from .engine.llm import LLM

    kwargs = dict(dtype=args.dtype, device=args.device, seed=args.seed,
                  tensor_parallel_size=getattr(args, "tp", 1), enforce_eager=getattr(args, "enforce_eager", False),
                  async_scheduling=args.async_scheduling)
    if args.max_num_seqs:
        kwargs["max_num_seqs"] = args.max_num_seqs
    if getattr(args, "max_model_len", None):
        kwargs["max_model_len"] = args.max_model_len
    return LLM(model=args.model, speculative_config=speculative_config, **kwargs)


def free_memory(device) -> None:
    """Collect a dropped engine before the next is built (two targets need not fit
    together); the caller deletes its last reference first."""
    gc.collect()
    if device.type == "cuda":
        import torch

        torch.cuda.empty_cache()


def run_setting(args, llm, num_prompts: int) -> dict:
    """The run's setting in the catalog's terms (eagle_zoo/catalog.py, SETTING_KEYS)."""
    spec = llm.speculative_config
    return {
        "dataset": dataset_name(args.dataset) + (f" ({args.per_category} per category)"
                                                 if getattr(args, "per_category", None) else ""),
        "num_prompts": num_prompts,
        "device": llm.device.type,
        "dtype": str(llm.dtype).removeprefix("torch."),
        "batch": llm.engine.scheduler.num_slots,
        "k": spec.num_speculative_tokens if spec is not None else 0,
        "max_tokens": args.max_tokens,
        "temperature": float(args.temperature),
    }


def draft_vocabulary(llm) -> Optional["torch.Tensor"]:
    """[target vocab] bool on the CPU: the target ids the head can draft, where its draft
    vocabulary leaves some out (an EAGLE-3 head's t2d); else None. A target token outside
    it ends every accepted run that reaches it, whatever the head predicts."""
    head = getattr(getattr(llm.engine, "proposer", None), "head", None)
    t2d = getattr(head, "t2d", None)
    if t2d is None or bool(t2d.all()):
        return None
    return t2d.detach().cpu()


def share_outside(outputs: list[list[int]], in_vocab) -> Optional[float]:
    """The share of the tokens in ``outputs`` that ``in_vocab`` leaves out (None without
    tokens)."""
    import torch

    tokens = [t for out in outputs for t in out]
    if not tokens:
        return None
    return float((~in_vocab[torch.tensor(tokens)]).sum()) / len(tokens)


def identical(spec: list[GroupResult], plain: list[GroupResult]) -> list[int]:
    """Per group, how many outputs are token for token the same."""
    return [sum(a == b for a, b in zip(s.outputs, p.outputs)) for s, p in zip(spec, plain)]


def compare(spec: BenchResult, plain: BenchResult, in_vocab=None) -> dict:
    """Speed-up and identical outputs, overall and per group; with ``in_vocab``
    (draft_vocabulary), also the share of plain decoding's tokens the head cannot draft."""
    same = identical(spec.groups, plain.groups)
    rows = []
    for s, p, n in zip(spec.groups, plain.groups, same):
        row = {"category": s.category, "num_prompts": s.num_prompts,
               "mean_acceptance_length": s.mean_acceptance_length,
               "spec_tokens_per_second": s.tokens_per_second,
               "plain_tokens_per_second": p.tokens_per_second,
               "speedup": s.tokens_per_second / p.tokens_per_second if p.tokens_per_second else None,
               "identical_outputs": n,
               "spec_generated_tokens": s.generated_tokens, "spec_seconds": s.seconds,
               "plain_generated_tokens": p.generated_tokens, "plain_seconds": p.seconds,
               "spec_pass_seconds": s.pass_seconds, "plain_pass_seconds": p.pass_seconds, **phases(s, p)}
        if in_vocab is not None:
            row["outside_draft_vocab"] = share_outside(p.outputs, in_vocab)
        rows.append(row)
    result = {
        "speedup": spec.tokens_per_second / plain.tokens_per_second if plain.tokens_per_second else None,
        **phases(GroupResult.total(spec.groups), GroupResult.total(plain.groups)),
        "identical_outputs": sum(same),
        "num_prompts": spec.num_prompts,
        "by_category": rows,
    }
    if in_vocab is not None:
        result["outside_draft_vocab"] = share_outside(plain.outputs, in_vocab)
    return result


def phases(spec: GroupResult, plain: GroupResult) -> dict:
    """The two phases of a request apart: time to first token (the prefill, the same work
    for both engines) and decoding alone (what speculation speeds up)."""
    s, p = spec.decode_tokens_per_second, plain.decode_tokens_per_second
    return {"spec_first_token_ms": 1000 * spec.mean_first_token_seconds,
            "plain_first_token_ms": 1000 * plain.mean_first_token_seconds,
            "spec_decode_tokens_per_second": s, "plain_decode_tokens_per_second": p,
            "decode_speedup": s / p if p else None}


def _fmt(value, spec: str, none: str = "-") -> str:
    return none if value is None else format(value, spec)


def format_share(share: Optional[float]) -> str:
    return "-" if share is None else f"{100 * share:.1f}%"


def category_table(comparison: dict) -> str:
    coverage = "outside_draft_vocab" in comparison
    header = ("category", "prompts", "accept", "spec tok/s", "plain tok/s", "speed-up", "identical") \
        + (("not draftable",) if coverage else ())
    lines = [header]
    for r in comparison["by_category"]:
        lines.append((str(r["category"]), str(r["num_prompts"]), _fmt(r["mean_acceptance_length"], ".3f"),
                      _fmt(r["spec_tokens_per_second"], ".1f"), _fmt(r["plain_tokens_per_second"], ".1f"),
                      _fmt(r["speedup"], ".2f") + "x", f"{r['identical_outputs']}/{r['num_prompts']}")
                     + ((format_share(r["outside_draft_vocab"]),) if coverage else ()))
    return aligned_table(lines)


def aligned_table(lines: list[tuple[str, ...]]) -> str:
    """Rows of cells in columns: the first left-aligned, the others right-aligned."""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths)))
                     for line in lines)


def catalog_entry(draft: Optional[str]):
    """The catalog entry of a draft id, or None."""
    from .plugins import get_registry

    return get_registry().catalog.get(draft) if draft else None


def catalog_check(draft: Optional[str], setting: dict) -> tuple[Optional[object], str]:
    """(the measured record matching ``setting``, "") or (None, why there is none)."""
    from .catalog import format_setting

    entry = catalog_entry(draft)
    if entry is None:
        return None, (f"--test: {draft!r} is not a catalog id, so nothing is recorded for it; "
                      f"pass a catalogued head as --draft or drop --test")
    record = entry.find_measured(setting)
    if record is not None:
        return record, ""
    recorded = "\n".join(f"  {format_setting(r.setting)}" for r in entry.measured)
    if not recorded:
        recorded = "  (none"
        if entry.acceptance_length is not None:
            recorded += f"; a published acceptance_length {entry.acceptance_length:g} ({entry.acceptance_setting}) " \
                        f"has no structured setting to compare with"
        recorded += ")"
    return None, (f"--test: no measured record of {draft} matches this run's setting\n"
                  f"  run:      {format_setting(setting)}\n"
                  f"recorded settings (the catalog entry's 'measured' list):\n{recorded}\n"
                  f"Run with a recorded setting (--dataset, --num-prompts, --device, --dtype, --max-num-seqs, "
                  f"--num-spec-tokens, --max-tokens, --temperature), or add a record for this one.")


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


# Options only one of the two modes reads, with what the other mode takes instead.
ACCEPTANCE_ONLY = {
    "method": "--eagle / --eagle3 / --ngram", "draft": "--eagle / --eagle3", "num_spec_tokens": "--ks",
    "max_num_seqs": "--batch-sizes", "max_model_len": "--perf-max-model-len", "enforce_eager": None,
    "tp": None, "draft_tp": None, "temperature": None, "top_p": None, "top_k": None, "prompt_lookup_max": None,
    "prompt_lookup_min": None, "enable_chunked_prefill": None, "print_output": None, "by_category": None,
    "plot": None, "test": None, "rtol": None,
}
PERF_ONLY = ("eagle", "eagle3", "ngram", "ks", "batch_sizes", "tput_k", "tput_waves", "hf_prompts",
             "perf_max_model_len", "depth_schedule", "spec_options", "step_costs", "step_cost_steps",
             "step_cost_batch", "acceptance_profile", "tree")
# The acceptance benchmark's speculative_config options: without --draft or --method it
# decodes plainly and reads none of them.
DRAFT_ONLY = ("num_spec_tokens", "draft_tp", "draft_quantization", "prompt_lookup_max", "prompt_lookup_min")


def refuse_unused_options(args) -> None:
    """Stop on an option the chosen mode would not read: --perf's tables (greedy, their
    own heads, depths and batch sizes) take none of the acceptance benchmark's draft,
    sampling or batch options, and the acceptance benchmark none of the tables'."""
    defaults = argparse.ArgumentParser()
    add_arguments(defaults)
    defaults = vars(defaults.parse_args([]))
    if args.perf:
        unused, mode = ACCEPTANCE_ONLY, "the --perf speed tables"
    elif args.method or args.draft:
        unused, mode = dict.fromkeys(PERF_ONLY), "the acceptance benchmark (without --perf)"
    else:
        unused = dict.fromkeys(PERF_ONLY + DRAFT_ONLY)
        mode = "plain decoding (no --draft or --method: no speculative_config)"
    given = [dest for dest in unused if getattr(args, dest) != defaults[dest]]
    if not given:
        return
    flags = ", ".join("--" + dest.replace("_", "-") + (f" (with --perf: {unused[dest]})" if unused[dest] else "")
                      for dest in given)
    raise SystemExit(f"{flags}: not read by {mode}; drop {'it' if len(given) == 1 else 'them'}")


def run(args) -> int:
    if args.num_iters < 1:
        raise SystemExit(f"--num-iters {args.num_iters}: give at least 1 (timed rounds)")
    if args.num_iters > 1 and args.tp > 1 and not args.perf:
        # Rounds hold the speculative and the plain engine together; a tensor-parallel
        # engine owns the process's ranks (engine/parallel.py), so two cannot coexist.
        raise SystemExit(f"--num-iters {args.num_iters} with --tp {args.tp}: the rounds hold two engines at once, "
                         f"and two tensor-parallel engines cannot share the ranks; use --num-iters 1 with --tp")
    resolve_dataset_flags(args)
    if args.per_category is not None and args.per_category < 1:
        raise SystemExit(f"--per-category {args.per_category}: give at least 1 (rows of each category)")
    refuse_unused_options(args)
    if args.num_prompts < 1:
        raise SystemExit(f"--num-prompts {args.num_prompts}: give at least 1")
    for flag, path in (("--json", args.json_out), ("--plot", args.plot)):
        # Checked before the models load: the results are written after the whole run.
        if path and not Path(path).resolve().parent.is_dir():
            raise SystemExit(f"{flag} {path}: the directory {Path(path).resolve().parent} does not exist; "
                             f"create it or choose another path")
    if args.perf:
        from .perf import run_perf

        return run_perf(args)
    from .engine.sampling_params import SamplingParams, SamplingParamsError

    if args.enable_chunked_prefill:
        print("--enable-chunked-prefill: no effect here (prompts are prefilled whole; outputs are the same)")
    rows = load_prompt_rows(args.dataset, args.num_prompts, args.per_category)
    if args.per_category is not None and all(row["category"] is None for row in rows):
        raise SystemExit(f"--per-category: the rows of --dataset {dataset_name(args.dataset)} have no 'category' "
                         f"field; add one or use --num-prompts alone")
    if args.by_category and all(row["category"] is None for row in rows):
        raise SystemExit(f"--by-category: the rows of --dataset {dataset_name(args.dataset)} have no "
                         f"'category' field; add one or drop --by-category")
    groups = group_rows(rows, args.by_category)
    spec = None
    if args.method or args.draft:
        spec = {"num_speculative_tokens": args.num_spec_tokens}
        if args.method:
            spec["method"] = args.method
        if args.draft:
            spec["model"] = args.draft
        if args.draft_tp is not None:
            spec["draft_tensor_parallel_size"] = args.draft_tp
        if args.draft_quantization is not None:
            spec["quantization"] = args.draft_quantization
        for key in ("prompt_lookup_max", "prompt_lookup_min"):
            if getattr(args, key) is not None:
                spec[key] = getattr(args, key)
    elif args.test:
        raise SystemExit("--test needs a draft head (--draft)")
    if args.test and (args.top_p != 1.0 or args.top_k > 0):
        raise SystemExit("--test: the catalog's measured records have no top-p / top-k truncation; drop "
                         "--top-p / --top-k")
    try:
        params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                                max_tokens=args.max_tokens, seed=args.seed)
    except SamplingParamsError as exc:  # name the option, not the field it fills
        message = str(exc)
        for field in ("temperature", "top_p", "top_k", "max_tokens", "seed"):
            message = message.replace(f"SamplingParams.{field}", "--" + field.replace("_", "-"))
        raise SystemExit(message) from None

    llm = build_llm(args, spec)
    setting = run_setting(args, llm, len(rows))
    record = None
    if args.test:
        record, why = catalog_check(llm.speculative_config.model, setting)
        if record is None:
            print(why, file=sys.stderr)
            return 2
    conversations = [row["messages"] for _, group in groups for row in group]
    warm_up(llm, conversations, llm.engine.scheduler.num_slots)
    engines = [llm]
    if spec is not None and args.num_iters > 1:  # rounds alternate between both engines, held together
        engines.append(build_llm(args, None))
        warm_up(engines[1], conversations, engines[1].engine.scheduler.num_slots)
    timed = measure_rounds(engines, groups, params, use_tqdm=True, num_iters=args.num_iters)
    first = BenchResult.from_groups(
        timed[0], method=llm.speculative_config.method if spec else None,
        draft=llm.speculative_config.model if spec else None)
    in_vocab = draft_vocabulary(llm) if spec else None
    device = llm.device
    plain_groups = timed[1] if len(timed) > 1 else None
    for engine in engines:
        engine.shutdown()
    del llm, engines
    free_memory(device)
    if spec is not None and plain_groups is None:  # one pass each: one engine in memory at a time
        llm = build_llm(args, None)
        warm_up(llm, conversations, llm.engine.scheduler.num_slots)
        plain_groups = measure(llm, groups, params, use_tqdm=True)
        llm.shutdown()
        del llm
    plain = BenchResult.from_groups(plain_groups) if plain_groups is not None else None

    print(f"target: {args.model}  dataset: {setting['dataset']}  prompts: {len(rows)}  "
          f"max_tokens: {args.max_tokens}  temperature: {args.temperature}  device: {setting['device']}  "
          f"dtype: {setting['dtype']}  batch: {setting['batch']}"
          + (f"  timed rounds: {args.num_iters} (median pass reported)" if args.num_iters > 1 else ""))
    if args.print_output:
        for row, text in zip((r for _, g in groups for r in g), (t for g in first.groups for t in g.texts)):
            print(f"--- [{row['category']}] {row['prompt'][:80]!r}\n{text}\n")
    report = {"target": args.model, "setting": setting, "num_iters": args.num_iters}
    if plain is None:
        report["plain"] = first.summary()
        print(f"plain decoding: {first.generated_tokens} tokens in {first.seconds:.2f}s, "
              f"{first.tokens_per_second:.1f} tokens/s")
        if args.by_category:
            report["by_category"] = [{"category": g.category, "num_prompts": g.num_prompts,
                                      "plain_tokens_per_second": g.tokens_per_second,
                                      "plain_generated_tokens": g.generated_tokens, "plain_seconds": g.seconds}
                                     for g in first.groups]
            for g in first.groups:
                print(f"  {g.category}: {g.num_prompts} prompts, {g.tokens_per_second:.1f} tokens/s")
    else:
        comparison = compare(first, plain, in_vocab)
        report |= {"speculative": first.summary(), "plain": plain.summary()} | comparison
        print(f"method: {first.method}  draft: {first.draft}  k: {setting['k']}")
        print(f"mean acceptance length: {_fmt(first.mean_acceptance_length, '.3f')}  (per position: "
              + ", ".join(f"{r:.3f}" for r in first.acceptance_rates) + ")")
        print(f"speculative: {first.tokens_per_second:.1f} tokens/s  plain: {plain.tokens_per_second:.1f} "
              f"tokens/s  speed-up: {_fmt(comparison['speedup'], '.2f')}x  "
              f"identical outputs: {comparison['identical_outputs']}/{comparison['num_prompts']}")
        print(f"  ({first.generated_tokens} tokens in {first.seconds:.2f}s speculative, "
              f"{plain.generated_tokens} in {plain.seconds:.2f}s plain)")
        print(f"  first token (prefill): {comparison['spec_first_token_ms']:.1f} ms speculative, "
              f"{comparison['plain_first_token_ms']:.1f} ms plain a request; decoding alone: "
              f"{comparison['spec_decode_tokens_per_second']:.1f} vs {comparison['plain_decode_tokens_per_second']:.1f} "
              f"tokens/s, {_fmt(comparison['decode_speedup'], '.2f')}x")
        if in_vocab is not None:
            print(f"not draftable: {format_share(comparison['outside_draft_vocab'])} of plain decoding's tokens are "
                  f"outside the head's draft vocabulary ({int(in_vocab.sum()):,} of {len(in_vocab):,} ids)")
        print(first.spec_decode_summary())
        if args.by_category:
            print("by category (each category timed as a batch of its own):")
            print(category_table(comparison))
    if args.plot and first.acceptance_rates:
        save_plot(first.acceptance_rates, args.plot, plot_title(first, args.model, args.num_spec_tokens))
        print(f"plot: {args.plot}")
    status = 0
    if record is not None:
        got, expected = first.mean_acceptance_length, record.acceptance_length
        ok = got is not None and abs(got - expected) <= args.rtol * expected
        recorded_speedup = "" if record.speedup is None else f", recorded {record.speedup:.2f}x"
        print(f"--test: mean acceptance length {_fmt(got, '.3f')} vs catalog {expected:.3f} "
              f"(rtol {args.rtol}): {'PASS' if ok else 'FAIL'}; speed-up "
              f"{_fmt(report.get('speedup'), '.2f')}x{recorded_speedup} (reported, not checked)")
        report["test"] = {"record": record.__dict__, "passed": ok, "rtol": args.rtol}
        status = 0 if ok else 1
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=2))
    return status


if __name__ == "__main__":
    from .cli import main

    sys.exit(main(["bench", *sys.argv[1:]]))
