"""The ``eagle-zoo`` command: maps each subcommand name to the module that does its job.

Modules are imported lazily, so ``eagle-zoo list`` does not pay for the engine. A
subcommand module provides ``add_arguments(parser)`` and ``run(args) -> int``, or, when
it serves several subcommands, ``add_arguments_<name>`` and ``run_<name>``.
"""
from __future__ import annotations

import argparse
import importlib
import sys
import textwrap
from dataclasses import dataclass


@dataclass(frozen=True)
class Subcommand:
    module: str
    summary: str  # one line, in `eagle-zoo --help`
    description: str  # the first paragraph of `eagle-zoo NAME --help`
    examples: tuple[str, ...] = ()


SMOL = "HuggingFaceTB/SmolLM2-135M-Instruct"
SMOL_E3 = "eagle-zoo/EAGLE3-SmolLM2-135M-Instruct"

SUBCOMMANDS = {
    "list": Subcommand(
        "eagle_zoo.catalog_cli", "list the catalog of published heads",
        "List the catalog: every published EAGLE / EAGLE-3 head eagle-zoo knows (registry.yaml "
        "and installed plugins), with its method, family, target, checkpoint format and, where "
        "a source gives it, its mean acceptance length.",
        ("eagle-zoo list", "eagle-zoo list --family qwen3 --method eagle3", "eagle-zoo list --target llama-3.1")),
    "info": Subcommand(
        "eagle_zoo.catalog_cli", "show one catalog entry",
        "Show every field of one catalog entry, including where its acceptance length was measured.",
        ("eagle-zoo info yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",)),
    "plugins": Subcommand(
        "eagle_zoo.catalog_cli", "list plugins, versions and what each registered",
        "List the loaded plugins (built-in and installed packages), their versions and the "
        "families, checkpoint formats, proposers and catalog entries each registered. "
        "EAGLE_ZOO_DISABLE_PLUGIN_AUTOLOAD=1 loads none of the installed packages; "
        "EAGLE_ZOO_PLUGINS=name,... only those named.",
        ("eagle-zoo plugins", "eagle-zoo plugins --all")),
    "convert": Subcommand(
        "converters.cli", "convert checkpoints (legacy vLLM, between formats)",
        ""),  # converters.cli writes its own description, examples and exit codes
    "bench": Subcommand(
        "eagle_zoo.bench", "speed-up over plain decoding and acceptance of a draft",
        "Decode a prompt set (MT-bench, the dev set or your own JSON lines) with a draft head and "
        "with plain decoding in the same process, and print both speeds, the speed-up, acceptance "
        "per draft position and how many outputs are identical; --by-category per category; "
        "--test checks acceptance against the catalog record of the same setting; --perf prints "
        "the speed tables of BENCHMARKS.md.",
        (f"eagle-zoo bench --draft {SMOL_E3} --num-prompts 80 --max-tokens 256 --max-num-seqs 80 "
         "--device cpu --dtype float32 --test",
         f"eagle-zoo bench --perf --device cpu --dtype float32 --num-prompts 10 --max-tokens 128 --ks 3 "
         f"--eagle3 {SMOL_E3} --batch-sizes ''")),
    "serve": Subcommand(
        "eagle_zoo.serve.cli", "OpenAI-compatible server",
        "Serve a target model, with or without speculative decoding, over an OpenAI-compatible "
        "HTTP API (/v1/chat/completions, /v1/completions, /v1/models, /health, /metrics); "
        "docs/serving.md.",
        (f"eagle-zoo serve {SMOL} --port 8000 --speculative-config '{{\"model\": \"{SMOL_E3}\"}}'",)),
    "train": Subcommand(
        "eagle_zoo.train.cli", "train an EAGLE / EAGLE-3 head",
        "Train a head for your own target in steps: mix (broad prompts and a held-apart dev set from "
        "a sources directory), prompts (the target writes user turns), data (the target answers them), "
        "then eagle or eagle3 (the head); docs/training.md.",
        ("eagle-zoo train mix --help", "eagle-zoo train prompts --help", "eagle-zoo train data --help",
         "eagle-zoo train eagle3 --help")),
    "demo": Subcommand(
        "eagle_zoo.demo", "the main job on the embedded default target",
        "Decode one prompt of each kind (chat, writing, code, math, translation, summarization, ...) "
        "on the embedded SmolLM2-135M-Instruct target with the shipped EAGLE-3 head and with plain "
        "decoding, and print per prompt and overall the acceptance, both speeds, the speed-up and "
        "whether the outputs are identical (what `make demo` runs).",
        ("eagle-zoo demo", "eagle-zoo demo -k 3 --max-tokens 128")),
    "diagnose": Subcommand(
        "eagle_zoo.tools.diagnose", "where an EAGLE-3 head's drafts fail, by step, confidence and set",
        "Replay an EAGLE-3 head's drafting chain over the default target's own greedy answers "
        "and report, per draft step, its accuracy, the draft vocabulary's coverage, the "
        "acceptance length from every position and along the engine's walk, and step-0 "
        "accuracy by the target's confidence; per prompt set and, with --by-category, per "
        "category.",
        ("eagle-zoo diagnose", "eagle-zoo diagnose --prompts mt-bench my_prompts.jsonl --num 100 --misses 20",
         "eagle-zoo diagnose --head ./my-eagle3-head --by-category --out-of-vocab 15")),
    "vocab-coverage": Subcommand(
        "eagle_zoo.tools.vocab_coverage", "how much of the target's MT-bench output a draft vocabulary covers",
        "Decode the 80 MT-bench first turns with the default target and report the share of "
        "answer tokens an EAGLE-3 head's draft vocabulary holds (an upper bound on its "
        "acceptance rate), by category, with the most frequent tokens outside it.",
        ("eagle-zoo vocab-coverage", "eagle-zoo vocab-coverage --head ./my-eagle3-head --max-tokens 128")),
    "openers": Subcommand(
        "eagle_zoo.tools.openers", "request openers for `eagle-zoo train prompts --openers-file`",
        "Write request openers (one a line: request kinds x subjects of many fields, role play, "
        "code / math / extraction starters, and '*' for a free row) to standard output, for "
        "`eagle-zoo train prompts --openers-file`, so self-instruct prompts cover more topics.",
        ("eagle-zoo openers --num 60000 --seed 0 > openers.txt",
         "eagle-zoo openers --num 60000 --constraint-share 0.3 --starter-share 0.5 > openers.txt")),
}

DESCRIPTION = """\
eagle-zoo: a zoo of EAGLE / EAGLE-3 speculative-decoding draft heads and an engine
that serves them. Find a head in the catalog, benchmark it, serve it, convert or
train one. Everything runs offline; the default target is SmolLM2-135M-Instruct."""


def examples_epilog(lines: tuple[str, ...]) -> str:
    return "examples:\n" + "\n".join(f"  {line}" for line in lines) if lines else ""


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser; ``only`` names the one subcommand whose arguments are added
    (None: all of them; "": none, enough for the top-level help)."""
    parser = argparse.ArgumentParser(
        prog="eagle-zoo", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=examples_epilog(("eagle-zoo list --method eagle3", f"eagle-zoo bench --draft {SMOL_E3} --by-category",
                          f"eagle-zoo serve {SMOL} --speculative-config '{{\"model\": \"{SMOL_E3}\"}}'"))
        + "\n\n`eagle-zoo COMMAND --help` describes each command.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, cmd in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=cmd.summary, description=textwrap.fill(cmd.description or cmd.summary, 78),
                           epilog=examples_epilog(cmd.examples), formatter_class=argparse.RawDescriptionHelpFormatter)
        if only is None or only == name:
            _entry(cmd.module, "add_arguments", name)(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and argv[0] in SUBCOMMANDS else None
    parser = build_parser(only=command or "")
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return int(_entry(SUBCOMMANDS[args.command].module, "run", args.command)(args) or 0)
    except Exception as exc:
        if not is_user_error(exc):
            raise  # a bug: its traceback is what to report
        print(f"eagle-zoo {args.command}: error: {exc}", file=sys.stderr)
        return 2


def is_user_error(exc: BaseException) -> bool:
    """Whether ``exc`` reports bad input, in a message that names it and the fix, rather than
    a bug: the library raises ValueError (and its own subclasses) for a bad option, value,
    file or checkpoint, the OS errors of a missing or occupied path, and a few RuntimeErrors
    of its own (a hub id that cannot be resolved, a plugin, the default target, a head that
    needs its target), and an unknown catalog id. The command line prints these as one line
    and exits 2."""
    from .catalog import UnknownCatalogId
    from .default_target import DefaultTargetError
    from .hub import HubError
    from .models.heads import HeadNeedsTargetError
    from .plugins import PluginError

    return isinstance(exc, (ValueError, NotImplementedError, FileNotFoundError, FileExistsError, NotADirectoryError,
                            IsADirectoryError, PermissionError, HubError, PluginError, DefaultTargetError,
                            HeadNeedsTargetError, UnknownCatalogId))


def _entry(module_name: str, kind: str, command: str):
    module = importlib.import_module(module_name)
    return getattr(module, f"{kind}_{command.replace('-', '_')}", None) or getattr(module, kind)


if __name__ == "__main__":
    sys.exit(main())
