"""`eagle-zoo bench --perf`: decoding speed, each table from one run.

Tables (all greedy, MT-bench first turns, chat template):
  batch 1: transformers `generate` (peer), our plain decoding, EAGLE / EAGLE-3 chains
           for k in --ks (and EAGLE-2 dynamic trees with --tree TOP_K,DEPTH,TOTAL_TOKENS[;...]),
           with mean acceptance length and speed-up over plain;
  throughput at several batch sizes with and without speculation (and, with
           --depth-schedule, with K chosen per step from the batch size);
  step costs (--step-costs SHAPES, eagle_zoo/perf_steps.py): where an engine step's time
           goes for plain, chain and tree steps on random-weight targets, at batch 1 or
           --step-cost-batch;
  greedy losslessness: speculative outputs equal to plain outputs, per prompt;
Timing: warm-up first (graph buckets, every prompt's prefill), torch.cuda.synchronize around
the batch-1 runs, one run each; a throughput row's engines are held together and timed
in --num-iters alternating rounds, the median pass reported (bench.measure_rounds).
"""
from __future__ import annotations

import json
import time
import traceback
from pathlib import Path

import torch

from .bench import dataset_name, load_prompt_rows, measure_rounds, warm_up


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed_generate(llm, conversations, params):
    _sync()
    start = time.perf_counter()
    outs = llm.chat(conversations, params)
    _sync()
    seconds = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    return outs, tokens, seconds


def batch1(llm, conversations, params):
    """Requests one after another (batch 1); returns outputs, tokens/s."""
    outs, tokens, seconds = [], 0, 0.0
    for conv in conversations:
        o, t, s = timed_generate(llm, [conv], params)
        outs += o
        tokens += t
        seconds += s
    return outs, tokens / seconds


def hf_generate_tps(model_dir, conversations, max_tokens, device, dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    tokens, seconds = 0, 0.0
    for conv in conversations:
        text = tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
        ids = tok(text, return_tensors="pt", add_special_tokens=False).input_ids.to(device)
        _sync()
        start = time.perf_counter()
        out = model.generate(ids, max_new_tokens=max_tokens, do_sample=False)
        _sync()
        seconds += time.perf_counter() - start
        tokens += out.shape[1] - ids.shape[1]
    del model
    return tokens / seconds


def _json_option(text: str, flag: str):
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SystemExit(f"{flag}: not valid JSON ({exc.msg} at column {exc.colno}): {text!r}") from None
    if not isinstance(value, dict):
        raise SystemExit(f"{flag}: expected a JSON object, got {text!r}")
    return value


def _tree_option(text: str) -> dict:
    """--tree TOP_K,DEPTH,TOTAL_TOKENS -> speculative_config's tree object."""
    try:
        top_k, depth, total = (int(x) for x in text.split(","))
    except ValueError:
        raise SystemExit(f"--tree: expected TOP_K,DEPTH,TOTAL_TOKENS (three integers, e.g. 8,5,60), got {text!r}") from None
    return {"top_k": top_k, "depth": depth, "total_tokens": total}


def _tree_options(text: str) -> list[tuple[str, dict]]:
    """--tree with one or more shapes separated by ';' (e.g. "8,5,60;4,4,24"): [(label, tree)]."""
    return [(part.strip(), _tree_option(part.strip())) for part in text.split(";") if part.strip()]


def run_perf(args) -> int:
    from .engine.llm import LLM
    from .engine.sampling_params import SamplingParams

    # The chats the acceptance benchmark sends for the same --dataset / --num-prompts /
    # --per-category (MT-bench: each first turn alone).
    conversations = [row["messages"] for row in load_prompt_rows(args.dataset, args.num_prompts, args.per_category)]
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    try:
        ks = [int(k) for k in args.ks.split(",") if k.strip()]
    except ValueError:
        raise SystemExit(f"--ks: expected comma-separated integers (or '' for none), got {args.ks!r}") from None
    heads = [h for h in (args.eagle, args.eagle3) if h]
    if args.ngram:  # prompt lookup rows beside the heads
        heads.append("ngram")
    report: dict = {"model": args.model, "dataset": dataset_name(args.dataset), "per_category": args.per_category,
                    "prompts": len(conversations), "max_tokens": args.max_tokens}
    extra = _json_option(args.spec_options, "--spec-options") if getattr(args, "spec_options", None) else {}
    if args.draft_quantization is not None:
        if "quantization" in extra:
            raise SystemExit("--draft-quantization and --spec-options' quantization both set the heads' quantization: "
                             "give one of them")
        extra["quantization"] = args.draft_quantization
    schedule = getattr(args, "depth_schedule", None)
    if schedule is not None and schedule != "auto":
        schedule = _json_option(schedule, "--depth-schedule")
    if extra or schedule is not None:
        report["spec_options"] = extra
        report["depth_schedule"] = schedule

    def make(spec=None, max_num_seqs=1):
        # Caches sized to the run: MT-bench prompts + 256 tokens fit in 1024.
        return LLM(model=args.model, speculative_config=spec, dtype=args.dtype, device=args.device,
                   max_num_seqs=max_num_seqs, max_model_len=args.perf_max_model_len, seed=args.seed,
                   async_scheduling=args.async_scheduling)

    def warm(llm, batch: int = 2):
        warm_up(llm, conversations, batch)
        if llm.engine.depth_schedule is not None:
            llm.engine.depth_schedule.steps_by_depth.clear()

    # Every row is printed and the JSON rewritten as soon as it is measured, and a
    # config that fails becomes a row with its error: a GPU run that times out or
    # trips over one option still returns every table measured before it.
    out_path = Path(args.json_out) if args.json_out else None

    def record(section: str, row: dict) -> None:
        report.setdefault(section, []).append(row)
        print(json.dumps({section: row}), flush=True)
        if out_path is not None:
            out_path.write_text(json.dumps(report, indent=2))

    def failed(section: str, label: dict, exc: Exception) -> None:
        traceback.print_exc()
        record(section, {**label, "error": f"{type(exc).__name__}: {exc}"})

    # -- step costs (random weights, before any real model is loaded) -----------
    if args.step_costs is None:
        args.step_costs = "smollm2" if torch.cuda.is_available() and args.device in (None, "cuda") else ""
    if args.step_costs:
        from .perf_steps import run_step_costs

        run_step_costs(args, record)
    batch_sizes = [int(b) for b in args.batch_sizes.split(",") if b.strip()]
    if not (ks or (heads and getattr(args, "tree", None)) or batch_sizes or args.hf_prompts):
        # Only the random-weight tables were asked for (--ks '' --batch-sizes '', no head
        # with --tree): the target is never loaded, so they run without its weights.
        return _finish(args, report, out_path)
    # -- batch 1 ---------------------------------------------------------------
    plain = make()
    warm(plain)
    plain_outs, plain_tps = batch1(plain, conversations, params)
    model_path, device, dtype = plain.model_path, plain.device, plain.dtype
    del plain
    if args.hf_prompts:
        try:
            hf_tps = hf_generate_tps(str(model_path), conversations[: args.hf_prompts], args.max_tokens,
                                     device, dtype)
            record("batch1", {"config": f"transformers generate ({args.hf_prompts} prompts)", "tokens_per_s": hf_tps})
        except Exception as exc:  # the peer row must not cost the engine's rows
            failed("batch1", {"config": "transformers generate"}, exc)
    record("batch1", {"config": "plain", "tokens_per_s": plain_tps})
    reference = [o.outputs[0].token_ids for o in plain_outs]
    lossless = report["lossless"] = {}
    trees = _tree_options(args.tree) if getattr(args, "tree", None) else []
    for head in heads:
        rows = [(k, None) for k in ks] + ([(None, t) for t in trees] if head != "ngram" else [])
        for k, tree in rows:  # k None: a --tree row
            spec = ({"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
                    if head == "ngram" else {"model": head, "num_speculative_tokens": k, **extra})
            if tree is not None:
                spec["tree"] = tree[1]
            label = f"{head} " + (f"k={k}" if k is not None else f"tree {tree[0]}")
            try:
                llm = make(spec)
                warm(llm)
                outs, tps = batch1(llm, conversations, params)
            except Exception as exc:
                failed("batch1", {"config": label}, exc)
                continue
            m = llm.engine.metrics
            same = sum(o.outputs[0].token_ids == r for o, r in zip(outs, reference))
            name = f"{llm.speculative_config.method} " + (f"k={k}" if k is not None else f"tree {tree[0]}")
            lossless[name] = f"{same}/{len(conversations)}"
            record("batch1", {"config": name, "tokens_per_s": tps, "speedup": tps / plain_tps,
                              "mean_acceptance_length": m.mean_acceptance_length, "identical_to_plain": same})
            del llm
    # -- throughput vs batch size ------------------------------------------------
    spec_head = args.eagle3 or args.eagle
    for bs in batch_sizes:
        n = bs * max(getattr(args, "tput_waves", 1), 1)
        convs = (conversations * ((n + len(conversations) - 1) // len(conversations)))[:n]
        row = {"batch": bs, "requests": n}
        configs = [("plain", None)]
        if spec_head is not None:
            fixed = {"model": spec_head, "num_speculative_tokens": args.tput_k, **extra}
            configs.append(("speculative", fixed))
            if schedule is not None:
                configs.append(("adaptive", {**fixed, "num_speculative_tokens_by_batch_size": schedule}))
        built = []  # (label, engine): held together, timed in alternating rounds
        for label, spec in configs:
            try:
                engine = make(spec, max_num_seqs=bs)
                warm(engine, bs)
                built.append((label, engine))
            except Exception as exc:
                traceback.print_exc()
                row[f"{label}_error"] = f"{type(exc).__name__}: {exc}"
        try:
            timed = measure_rounds([engine for _, engine in built], [(None, [{"messages": c} for c in convs])], params,
                                   num_iters=args.num_iters)
        except Exception as exc:
            traceback.print_exc()
            timed = []
            row["error"] = f"{type(exc).__name__}: {exc}"
        plain_tokens = None
        for (label, engine), [result] in zip(built, timed):
            row[label] = result.tokens_per_second
            row[f"{label}_pass_seconds"] = result.pass_seconds
            if label == "plain":
                plain_tokens = result.outputs
            elif plain_tokens is not None:  # bf16 batches may flip near-ties; reported, not asserted
                row[f"{label}_identical_to_plain"] = sum(a == b for a, b in zip(result.outputs, plain_tokens))
            if engine.engine.depth_schedule is not None:  # decode steps run at each K, over the timed passes
                row["adaptive_steps_by_k"] = dict(sorted(engine.engine.depth_schedule.steps_by_depth.items()))
        built = timed = engine = None  # freed before the next batch size's engines are built
        record("throughput", row)
    return _finish(args, report, out_path)


def _finish(args, report: dict, out_path) -> int:
    """The whole report, printed and written."""
    print(json.dumps(report, indent=2))
    if out_path is not None:
        out_path.write_text(json.dumps(report, indent=2))
    return 0
