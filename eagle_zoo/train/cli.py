"""`eagle-zoo train`: make training data, train an EAGLE-1 or EAGLE-3 head, save it.

    eagle-zoo train mix    --sources DIR --train-out train.jsonl --dev-out dev.jsonl (broad prompts)
    eagle-zoo train prompts --target T --num 20000 --out synth.jsonl   (self-instruct prompts)
    eagle-zoo train data   --target T --prompts prompts.jsonl --out data/
    eagle-zoo train eagle  --target T --data data/ --out heads/eagle
    eagle-zoo train eagle3 --target T --data data/ --out heads/eagle3

See docs/training.md.
"""
from __future__ import annotations

import argparse
import json
import sys
import textwrap
import time
from pathlib import Path

import torch

from .save import FORMATS, parse_size, save_head


def _step(sub, name: str, summary: str, description: str, examples: tuple[str, ...], aliases=()):
    """One step's parser, its --help with a description and examples like every command's."""
    from ..cli import examples_epilog

    return sub.add_parser(name, help=summary, aliases=list(aliases),
                          description=textwrap.fill(description, 78, break_on_hyphens=False),
                          epilog=examples_epilog(examples), formatter_class=argparse.RawDescriptionHelpFormatter)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="train_command", metavar="STEP", required=True)
    d = _step(sub, "data", "regenerate answers to prompts with the target (training data)",
              "The target answers every prompt (greedy, or sampled with --temperature); the token ids and a "
              "loss mask of the answer tokens are saved in --out for `train eagle` / `train eagle3`.",
              ("eagle-zoo train data --target smollm2 --prompts train.jsonl --out data/greedy",
               "eagle-zoo train data --target smollm2 --prompts train.jsonl --temperature 0.7 --seed 1 "
               "--out data/sampled"))
    d.add_argument("--target", required=True, help="target model: directory or id (default: SmolLM2-135M-Instruct)")
    d.add_argument("--prompts", required=True, help="JSON lines with \"prompt\" (text) or \"prompt_token_ids\"")
    d.add_argument("--out", required=True, help="output directory (data.safetensors + meta.json)")
    d.add_argument("--max-prompts", type=int, help="use only the first N prompts")
    d.add_argument("--max-new-tokens", type=int, default=256)
    d.add_argument("--max-prompt-len", type=int, default=1024, help="skip longer (templated) prompts")
    d.add_argument("--temperature", type=float, default=0.0, help="0: greedy; > 0: sampled")
    d.add_argument("--top-p", type=float, default=1.0)
    d.add_argument("--batch-size", type=int, help="sequences generated together (default 256 on CUDA, 16 on CPU)")
    d.add_argument("--backend", choices=("engine", "static"), default="engine",
                   help="engine: the bundled LLM engine; static: a plain fixed-batch loop (faster for bulk "
                        "generation on a GPU)")
    d.add_argument("--max-seconds", type=float, help="start no new batch after this many seconds")
    _common(d)

    m = _step(sub, "mix", "broad training prompts and the held-apart dev set from a sources directory",
              "Builds prompts of eleven categories (chat, writing, roleplay, coding, math, extraction, "
              "classification, translation, summarization, closed-book QA, retrieval QA) from the openly "
              "licensed files of a sources directory, split into training prompts and a dev set that share no "
              "source record. Benchmark prompts are refused.",
              ("eagle-zoo train mix --sources plugins/eagle-zoo-smollm2-heads/training-data "
               "--train-out train.jsonl --dev-out dev.jsonl",
               "eagle-zoo train mix --sources DIR --train-out train.jsonl --cap translation=8000 "
               "--add self_instruct.jsonl"))
    m.add_argument("--sources", required=True, help="directory with train_prompts, questions, multilingual_sentences "
                                                    "and long_passages (.jsonl.gz; its README records the licenses)")
    m.add_argument("--train-out", required=True, help="training prompts (JSON lines with category and sources)")
    m.add_argument("--dev-out", help="dev set (JSON lines); compare it with the shipped one to check a build")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--dev-per-category", type=int, default=30)
    m.add_argument("--cap", action="append", default=[], metavar="CATEGORY=N",
                   help="at most N training prompts of CATEGORY (repeatable), e.g. --cap translation=8000")
    m.add_argument("--add", action="append", default=[], metavar="FILE",
                   help="more training prompts (JSON lines, e.g. `train prompts` output) mixed in evenly; "
                        "checked against the benchmark like the rest")
    m.add_argument("--long-out", metavar="FILE",
                   help="write the long-context categories (summarization, retrieval_qa) here instead of "
                        "--train-out: they are generated with a smaller batch")

    g = _step(sub, "prompts", "self-instruct prompts: the target writes user turns (to widen the data)",
              "A chat model given its chat template up to the start of a user turn writes a plausible user "
              "message; sampled many times, these are prompts spread like the requests it was tuned on. "
              "Kept are messages that end the turn, have --min-words words and are new.",
              ("eagle-zoo train prompts --target smollm2 --num 20000 --out self_instruct.jsonl",
               "eagle-zoo train prompts --target smollm2 --num 20000 --openers-file openers.txt "
               "--out self_instruct.jsonl"))
    g.add_argument("--target", required=True, help="target model (a chat model with a chat template)")
    g.add_argument("--out", required=True, help="output JSON lines (what `train data --prompts` reads)")
    g.add_argument("--num", type=int, default=10000, help="distinct prompts to make")
    g.add_argument("--mix", help="a prompts file to interleave with the new prompts (a, b, a, b, ...) in --out")
    g.add_argument("--mix-every", type=int, default=1,
                   help="new prompts per --mix prompt in --out (2: a, a, b, a, a, b, ...)")
    g.add_argument("--max-new-tokens", type=int, default=128, help="longest user message (longer ones are dropped)")
    g.add_argument("--temperature", type=float, default=1.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--min-words", type=int, default=3, help="drop shorter messages")
    g.add_argument("--batch-size", type=int, help="rows generated together (default 1024 on CUDA, 16 on CPU)")
    g.add_argument("--max-seconds", type=float, help="start no new batch after this many seconds")
    steer = g.add_mutually_exclusive_group()
    steer.add_argument("--openers", help="comma-separated words each user message starts with, one per row in turn "
                                         "(e.g. \"Explain,Write a,Compare\"; steers the kind of request; * is a free "
                                         "row, the target's own first word: \"*,Explain,*,Write a\")")
    steer.add_argument("--openers-file", help="as --openers, one opener a line (for openers with commas, or "
                                              "thousands of them: e.g. `eagle-zoo openers`'s); blank lines skipped")
    _common(g)

    for method, help_text, description in (
            ("eagle", "train an EAGLE-1 head",
             "Train an EAGLE-1 head (one decoder layer that predicts the target's next hidden state from "
             "its last one and the next token) on `train data` output or on prompts, and save it in the "
             "layouts --format names."),
            ("eagle3", "train an EAGLE-3 head (TTT)",
             "Train an EAGLE-3 head (reads three target layers, drafts over a reduced vocabulary; "
             "training-time test over --ttt-steps drafting steps) on `train data` output or on prompts, "
             "and save it in the layouts --format names.")):
        p = _step(sub, method, help_text, description,
                  (f"eagle-zoo train {method} --target smollm2 --data data/greedy data/sampled "
                   f"--out heads/{method} --epochs 3",
                   f"eagle-zoo train {method} --target meta-llama/Llama-3.2-1B-Instruct --prompts train.jsonl "
                   f"--out heads/{method} --format {','.join(FORMATS[method])}"),
                  aliases=["eagle1"] if method == "eagle" else [])
        p.set_defaults(method=method)
        p.add_argument("--target", required=True, help="target model: directory or id")
        src = p.add_mutually_exclusive_group(required=True)
        src.add_argument("--data", nargs="+", help="directories written by `eagle-zoo train data`")
        src.add_argument("--prompts", help="prompts JSON lines: make the data first (greedy answers, as "
                                           "`eagle-zoo train data`; kept in <out>.data and reused)")
        p.add_argument("--max-prompts", type=int, help="with --prompts: use only the first N")
        p.add_argument("--max-new-tokens", type=int, default=256, help="with --prompts: answer length")
        p.add_argument("--out", required=True, help="head directory (with several --format: one subdirectory each)")
        p.add_argument("--format", default=None,
                       help=f"comma-separated layouts; {method}: {', '.join(FORMATS[method])} (default: the first)")
        p.add_argument("--steps", type=int, help="optimizer steps (default: --epochs over the data)")
        p.add_argument("--epochs", type=float, default=1.0)
        p.add_argument("--max-seconds", type=float, help="stop training after this many seconds (in all, over resumes; "
                                                          "also the learning-rate schedule's horizon)")
        p.add_argument("--stop-after-seconds", type=float,
                       help="pause after N seconds of training in this process (counted from its first step: loading the "
                            "target and building the feature cache come first and are not counted): the state and "
                            "the head are saved, --resume continues (to split one run over several time-limited jobs)")
        p.add_argument("--pause-at", type=float, metavar="UNIX_SECONDS",
                       help="pause like --stop-after-seconds once the clock passes this time (e.g. $(date +%%s) + 540): "
                            "a job with a hard time limit ends on time however long loading and the feature cache took")
        p.add_argument("--stop-file", help="end training early once this file exists (checked before every step): "
                                           "the head is saved as at the end of its time budget")
        p.add_argument("--token-budget", type=int, default=16384, help="padded tokens per batch")
        p.add_argument("--cache-features", action="store_true",
                       help="run the target over the data once and keep its features on the device instead of "
                            "running it every step (memory: tokens x hidden size x 2 bytes, x4 for eagle3; "
                            "what does not fit in 60%% of the free GPU memory spills to host memory)")
        p.add_argument("--max-len", type=int, default=2048, help="truncate sequences to this many tokens")
        p.add_argument("--val-share", type=float, default=0.0,
                       help="hold out this share of the prompts (e.g. 0.01; both answers of a prompt) and log the "
                            "losses and accuracies on them every --val-every steps and at the end")
        p.add_argument("--val-every", type=int, default=500, help="steps between held-out measurements")
        p.add_argument("--lr", type=float, default=3e-4)
        p.add_argument("--warmup-steps", type=int)
        p.add_argument("--min-lr-ratio", type=float, default=0.1)
        p.add_argument("--weight-decay", type=float, default=0.0)
        p.add_argument("--grad-clip", type=float, default=0.5)
        p.add_argument("--ttt-steps", type=int, help="unrolled drafting steps (training-time test; default 7 for "
                                                     "eagle3, 1 for eagle as its published recipe)")
        p.add_argument("--ttt-decay", type=float, default=0.8, help="loss weight of step i: decay**i")
        p.add_argument("--ema", type=float, metavar="DECAY",
                       help="save the exponential moving average of the weights instead of the last step's: "
                            "avg = DECAY * avg + (1 - DECAY) * weights after each step, from the weights training "
                            "starts from (e.g. 0.9998; --val-share measures both at the end)")
        if method == "eagle":
            p.add_argument("--noise", type=float, default=0.2, help="uniform input-feature noise (0 = off)")
            p.add_argument("--save-embeddings", action="store_true",
                           help="also store embed_tokens (the target's copy, as yuhuili heads do); by default "
                                "the loader shares the target's")
        else:
            p.add_argument("--draft-vocab-size", type=int, help="draft vocabulary (default min(32000, vocab))")
            p.add_argument("--aux-layers", help="three target layer ids, e.g. 2,15,27 (default 2,N//2,N-3)")
            p.add_argument("--head-layers", type=int,
                           help="decoder layers of the head (default: the --init-from head's, else 1 as published "
                                "heads); more than the --init-from head's grows it: its layers first, the new ones "
                                "starting as identities")
            p.add_argument("--label-temperature", type=float, default=1.0,
                           help="soft labels softmax(target logits / T) (default 1, the published recipe); "
                                "T < 1 sharpens them towards the target's argmax, which is all a greedy "
                                "draft is judged on")
            p.add_argument("--reselect-draft-vocab", action="store_true",
                           help="with --init-from: choose the draft vocabulary from this data, as a fresh head "
                                "does (size: --draft-vocab-size or the init head's); shared tokens keep their "
                                "trained rows, new ones take the target's rows mapped into the head's space")
        p.add_argument("--num-speculative-tokens", type=int, default=3, help="default K written to speculators configs")
        p.add_argument("--target-name", help="the target as speculators configs name it (default: --target), "
                                             "e.g. a hub id when --target is a local directory")
        p.add_argument("--max-shard-size", default="14MB", help="largest weight file (e.g. 14MB, 2GB)")
        p.add_argument("--save-dtype", choices=("bfloat16", "float32"), default="bfloat16")
        p.add_argument("--state-dir", help="resumable training state (default: <out>.state)")
        p.add_argument("--resume", action="store_true", help="continue from the state in --state-dir")
        p.add_argument("--init-from", metavar="HEAD",
                       help="start from this head's weights instead of a random init (a directory or catalog / hub "
                            "id eagle_zoo.load reads; eagle3: its draft vocabulary and aux layers too); optimizer, "
                            "schedule and data start fresh. A state loaded by --resume wins over it")
        p.add_argument("--save-every", type=int, default=500, help="write the training state every N steps")
        p.add_argument("--log-every", type=int, default=20)
        p.add_argument("--no-verify", action="store_true", help="skip reloading the saved head to check it")
        _common(p)


def _common(p) -> None:
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:1 ... (default: cuda when available)")
    p.add_argument("--dtype", default="auto", help="target / compute dtype: bfloat16 or float32 (auto: bf16 on CUDA)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def run(args) -> int:
    if args.train_command == "data":
        return _run_data(args)
    if args.train_command == "prompts":
        return _run_prompts(args)
    if args.train_command == "mix":
        return _run_mix(args)
    return _run_train(args)


def _run_mix(args) -> int:
    import collections

    from .prompt_mix import CATEGORIES, LONG_CATEGORIES, MixSettings, build_mix, write_jsonl

    caps = {}
    for item in args.cap:
        cat, _, n = item.partition("=")
        if cat not in CATEGORIES or not n.isdigit():
            raise SystemExit(f"--cap {item}: expected CATEGORY=N with CATEGORY one of {', '.join(CATEGORIES)}")
        caps[cat] = int(n)
    from .data import read_prompts

    extra = [read_prompts(path, option="--add") for path in args.add]  # fail on a bad file before building anything
    train, dev = build_mix(args.sources, MixSettings(seed=args.seed, dev_per_category=args.dev_per_category),
                           train_caps=caps, extra=extra)
    counts = collections.Counter(r.get("category", "other") for r in train)
    print(f"{len(train)} training prompts: " + ", ".join(f"{c} {n}" for c, n in sorted(counts.items())))
    if args.long_out:
        write_jsonl([r for r in train if r.get("category") in LONG_CATEGORIES], args.long_out)
        train = [r for r in train if r.get("category") not in LONG_CATEGORIES]
        print(f"{args.long_out}: {sum(counts[c] for c in LONG_CATEGORIES)} long-context prompts")
    write_jsonl(train, args.train_out)
    print(f"{args.train_out}: {len(train)} prompts")
    if args.dev_out:
        write_jsonl(dev, args.dev_out)
        print(f"{args.dev_out}: {len(dev)} dev prompts, {args.dev_per_category} per category")
    return 0


def _run_data(args) -> int:
    from .data import GenerateSettings, generate_data, read_prompts
    from .trainer import resolve_device, resolve_dtype

    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    settings = GenerateSettings(
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
        batch_size=args.batch_size or (256 if device.type == "cuda" else 16), seed=args.seed,
        max_prompt_len=args.max_prompt_len, max_seconds=args.max_seconds, backend=args.backend)
    records = read_prompts(args.prompts, args.max_prompts)
    start = time.monotonic()
    data = generate_data(args.target, records, settings, device, dtype, progress=not args.no_progress)
    data.meta["prompts"] = str(args.prompts)
    data.save(args.out)
    seconds = time.monotonic() - start
    answers = int(data.loss_mask.sum())
    print(f"wrote {len(data)} sequences ({int(data.input_ids.numel()):,} tokens, {answers:,} generated) to "
          f"{args.out} in {seconds:.1f} s ({answers / max(seconds, 1e-9):,.0f} generated tok/s)"
          + ("; stopped by the time budget" if data.meta.get("stopped_by_time_budget") else ""))
    return 0 if len(data) else 1


def _run_prompts(args) -> int:
    from .data import read_prompts
    from .synthesize import SynthesizeSettings, interleave, synthesize_prompts, write_prompts
    from .trainer import resolve_device, resolve_dtype

    if args.num < 1:
        raise SystemExit(f"--num {args.num}: give at least 1")
    if args.temperature <= 0:
        raise SystemExit(f"--temperature {args.temperature}: self-instruct prompts need sampling (> 0)")
    if args.mix_every < 1:
        raise SystemExit(f"--mix-every {args.mix_every}: give at least 1")
    mix = read_prompts(args.mix, option="--mix") if args.mix else []  # fail on a bad file before generating anything
    device = resolve_device(args.device)
    settings = SynthesizeSettings(
        num=args.num, max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
        batch_size=args.batch_size or (1024 if device.type == "cuda" else 16), min_words=args.min_words,
        seed=args.seed, max_seconds=args.max_seconds,
        openers=read_openers(args))
    records, stats = synthesize_prompts(args.target, settings, device, resolve_dtype(args.dtype, device))
    write_prompts(interleave(records, mix, take=[args.mix_every, 1]) if mix else records, args.out)
    print(f"wrote {len(records)} self-instruct prompts" + (f" interleaved with {len(mix)} from {args.mix}" if mix else "")
          + f" to {args.out} in {stats['seconds']} s ({json.dumps(stats)})")
    return 0 if records else 1


def read_openers(args) -> tuple:
    """--openers (comma-separated) or --openers-file (one a line) -> the openers, in order."""
    if args.openers:
        return tuple(o.strip() for o in args.openers.split(",") if o.strip())
    if not args.openers_file:
        return ()
    try:
        lines = Path(args.openers_file).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise SystemExit(f"--openers-file {args.openers_file}: cannot read it ({e})") from None
    openers = tuple(line.strip() for line in lines if line.strip())
    if not openers:
        raise SystemExit(f"--openers-file {args.openers_file}: no opener in it (one a line; * is a free row)")
    return openers


def settings_from_args(args):
    from .trainer import TrainSettings

    aux = getattr(args, "aux_layers", None)
    if isinstance(aux, str):
        try:
            aux = [int(x) for x in aux.split(",")]
        except ValueError:
            raise SystemExit(f"--aux-layers {args.aux_layers!r}: give three comma-separated integers") from None
    return TrainSettings(
        method=args.method, target=args.target, data=list(args.data), steps=args.steps, epochs=args.epochs,
        max_seconds=args.max_seconds, stop_after_seconds=args.stop_after_seconds, pause_at=args.pause_at, stop_file=args.stop_file, token_budget=args.token_budget, max_len=args.max_len, lr=args.lr,
        warmup_steps=args.warmup_steps, min_lr_ratio=args.min_lr_ratio, weight_decay=args.weight_decay,
        grad_clip=args.grad_clip, noise=getattr(args, "noise", 0.2), ttt_steps=args.ttt_steps,
        ttt_decay=args.ttt_decay, draft_vocab_size=getattr(args, "draft_vocab_size", None),
        aux_layers=aux, init_from=getattr(args, "init_from", None),
        head_layers=getattr(args, "head_layers", None), seed=args.seed, device=args.device, dtype=args.dtype,
        state_dir=args.state_dir or f"{str(args.out).rstrip('/')}.state", resume=args.resume,
        save_every=args.save_every, log_every=args.log_every, progress=not args.no_progress,
        cache_features=getattr(args, "cache_features", False),
        reselect_draft_vocab=getattr(args, "reselect_draft_vocab", False),
        label_temperature=getattr(args, "label_temperature", 1.0),
        val_share=getattr(args, "val_share", 0.0), val_every=getattr(args, "val_every", 500),
        ema=args.ema)


def output_dirs(method: str, formats: str | None, out) -> dict[str, Path]:
    """Format -> directory: --out itself for one format, --out/<format> for several."""
    names = [f.strip() for f in (formats or FORMATS[method][0]).split(",") if f.strip()]
    bad = [f for f in names if f not in FORMATS[method]]
    if bad or not names:
        raise SystemExit(f"--format {formats!r}: {method} heads can be saved as {', '.join(FORMATS[method])}")
    out = Path(out)
    return {names[0]: out} if len(names) == 1 else {f: out / f for f in names}


def _run_train(args) -> int:
    from .save import check_output_dir, check_shard_limit, export_tensors
    from .trainer import Trainer

    method = args.method
    dirs = output_dirs(method, args.format, args.out)
    for out in dirs.values():  # before the data and the training, not after them
        check_output_dir(out)
    if args.prompts:
        args.data = [_make_data(args)]
    try:
        max_shard = parse_size(args.max_shard_size)
    except Exception as exc:  # converters' ConvertError: the message names the option
        raise SystemExit(str(exc)) from None
    save_dtype = getattr(torch, args.save_dtype)
    trainer = Trainer(settings_from_args(args))
    skip = _skip(method, args)
    # Fail now, not after training, when a tensor cannot fit one file.
    check_shard_limit(export_tensors(trainer.head, trainer.mapping, skip, save_dtype), max_shard)
    failed = None
    try:
        result = trainer.run()
    except Exception as exc:  # keep what was learnt: save the head as it is, then report the failure
        if trainer.step == 0:
            raise
        failed, result = exc, trainer.result()
        result.info["partial"] = True
    for fmt, out in dirs.items():
        save_head(result.head, result.flat_config, fmt, out, mapping=trainer.mapping, skip=skip, dtype=save_dtype,
                  max_shard_size=max_shard, target_name=args.target_name or str(args.target),
                  num_speculative_tokens=args.num_speculative_tokens, info=result.info)
        files = sorted(p.name for p in out.iterdir())
        size = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
        print(f"saved {fmt} head to {out} ({size / 1e6:.1f} MB: {', '.join(files)})")
        if not args.no_verify:
            try:
                err = verify_saved(out, result.head, trainer.target.model, method, save_dtype, trainer.autocast)
                print(f"  reloaded through eagle_zoo.load: max |logit difference| {err:.2e}")
            except Exception as exc:  # the head is saved either way; say what failed
                print(f"  WARNING: reloading {out} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
    if failed is not None:
        print(f"training failed at step {trainer.step} ({type(failed).__name__}: {failed}); the head saved is "
              f"from that step", file=sys.stderr)
        return 1
    return 0


def _make_data(args) -> str:
    """One-command training: regenerate the answers once into <out>.data."""
    from .data import DATA_FILE, GenerateSettings, generate_data, read_prompts
    from .trainer import resolve_device, resolve_dtype

    out = Path(f"{str(args.out).rstrip('/')}.data")
    if (out / DATA_FILE).is_file():
        print(f"using the training data already in {out}")
        return str(out)
    device = resolve_device(args.device)
    settings = GenerateSettings(max_new_tokens=args.max_new_tokens, batch_size=256 if device.type == "cuda" else 16,
                                seed=args.seed)
    data = generate_data(args.target, read_prompts(args.prompts, args.max_prompts), settings, device,
                         resolve_dtype(args.dtype, device), progress=not args.no_progress)
    data.meta["prompts"] = str(args.prompts)
    data.save(out)
    print(f"wrote {len(data)} sequences ({int(data.loss_mask.sum()):,} generated tokens) to {out}")
    return str(out)


def _skip(method: str, args) -> tuple[str, ...]:
    from .build import shared_modules

    shared = shared_modules(method)
    if method == "eagle" and getattr(args, "save_embeddings", False):
        shared = tuple(s for s in shared if s != "embed_tokens")
    return shared


@torch.no_grad()
def verify_saved(out, head, target, method: str, save_dtype: torch.dtype, autocast: bool = False) -> float:
    """Reload ``out`` through eagle_zoo.load and compare its logits with ``head``'s
    (weights rounded to the saved dtype) on a few positions. Returns the largest
    absolute difference; raises when the reload is off."""
    import copy

    from ..loading import load

    device = target.embed_tokens.weight.device
    loaded = load(str(out), target=target, device=device, dtype=torch.float32).head
    ref = copy.deepcopy(head)
    for name in ("embed_tokens", "lm_head"):  # compare against the very same shared modules
        if getattr(loaded, name) is getattr(target, name, None):
            setattr(ref, name, getattr(target, name))
    for p in ref.parameters():
        if p.is_floating_point() and p.data_ptr() not in _shared_ptrs(target):
            p.data = p.data.to(save_dtype).float()
    gen = torch.Generator().manual_seed(0)
    T = 8
    ids = torch.randint(0, head.vocab_size, (2, T), generator=gen).to(device)
    pos = torch.arange(T, device=device).expand(2, T)
    H_in = head.fc.weight.shape[1] if method == "eagle3" else head.fc.weight.shape[1] - head.config.hidden_size
    feats = torch.randn(2, T, H_in, generator=gen).to(device)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
        out_logits = []
        for h in (ref, loaded):
            x = h.combine_hidden_states(feats) if method == "eagle3" else feats
            out_logits.append(h.compute_logits(h(ids, pos, x)).float())
    a, b = out_logits
    finite = torch.isfinite(a)
    if not torch.equal(finite, torch.isfinite(b)):
        raise ValueError(f"{out}: the reloaded head drafts a different vocabulary")
    err = float((a[finite] - b[finite]).abs().max())
    if err > 1e-3 * max(1.0, float(a[finite].abs().max())):
        raise ValueError(f"{out}: reloaded logits differ by {err:.3e} from the trained head's")
    return err


def _shared_ptrs(target) -> set:
    return {p.data_ptr() for p in target.parameters()}
