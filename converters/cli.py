"""`eagle-zoo convert <conversion> SRC -o OUT`: the argparse side. Each conversion is
(plan builder, its own options); everything else (dry run, --force, the atomic write,
exit codes) is shared."""
from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
import traceback
from pathlib import Path

from . import average, eagle3, files, legacy
from .errors import EXIT_CODES_HELP, EXIT_OK, EXIT_UNEXPECTED, ConvertError, OutputExistsError, exit_code_for

CONVERSIONS = {
    "legacy": "yuhuili EAGLE-1 head -> vLLM < 0.7 layout (adds the target's lm_head)",
    "to-speculators": "yuhuili EAGLE-3 head -> speculators eagle3",
    "to-yuhuili": "speculators eagle3 head -> yuhuili EAGLE-3",
    "to-safetensors": "pickled .bin checkpoint -> safetensors (unpickled weights_only)",
    "shard": "checkpoint -> sharded safetensors with model.safetensors.index.json",
    "unshard": "sharded checkpoint -> one model.safetensors",
    "average": "heads of one config and draft vocabulary -> their weighted mean (checkpoint averaging)",
}

EXAMPLES = {
    "legacy": "eagle-zoo convert legacy yuhuili/EAGLE-LLaMA3-Instruct-8B --target meta-llama/Meta-Llama-3-8B-Instruct -o ./eagle-legacy",
    "to-speculators": "eagle-zoo convert to-speculators yuhuili/EAGLE3-LLaMA3.1-Instruct-8B "
                      "--verifier meta-llama/Llama-3.1-8B-Instruct -o ./eagle3-speculators",
    "to-yuhuili": "eagle-zoo convert to-yuhuili ./eagle3-speculators -o ./eagle3-yuhuili",
    "to-safetensors": "eagle-zoo convert to-safetensors ./head-with-pytorch_model.bin -o ./head-safetensors",
    "shard": "eagle-zoo convert shard ./head -o ./head-sharded --max-shard-size 500MB",
    "unshard": "eagle-zoo convert unshard ./head-sharded -o ./head-one-file",
    "average": "eagle-zoo convert average ./head-a --with ./head-b ./head-c --weights 2,1,1 -o ./head-mean",
}


def _epilog(*names: str) -> str:
    return "examples (add --dry-run to see the plan first):\n" + "\n".join(
        f"  {EXAMPLES[n]}" for n in names) + "\n\n" + EXIT_CODES_HELP


def _options(p: argparse.ArgumentParser, name: str) -> None:
    if name == "legacy":
        p.add_argument("--target", required=True, metavar="TARGET",
                       help="the target model the head was trained for (directory or hub id); only its lm_head is read")
    elif name == "to-speculators":
        p.add_argument("--verifier", required=True, metavar="NAME_OR_PATH",
                       help="the target model, written as speculators_config.verifier.name_or_path")
        p.add_argument("--verifier-architectures", nargs="+", metavar="ARCH",
                       help="default: the verifier's config.json if local, else the head's architecture without 'Eagle3'")
        p.add_argument("--speculative-tokens", type=int, default=3, metavar="K",
                       help="proposal_methods[0].speculative_tokens (default 3)")
    elif name == "to-yuhuili":
        p.add_argument("--architecture", metavar="ARCH",
                       help="head architecture to write (default: LlamaForCausalLMEagle3 for llama layers)")
    elif name == "average":
        p.add_argument("--with", dest="others", nargs="+", required=True, metavar="HEAD",
                       help="the other head(s) to average with SRC (directories or hub ids)")
        p.add_argument("--weights", metavar="W,W,...",
                       help="one weight per head, SRC first (normalized to sum to 1; default: equal); a "
                            "negative one extrapolates: 1.5,-0.5 is SRC + 0.5 (SRC - HEAD) (write "
                            "--weights=-1,2 when the first is negative)")
    elif name == "shard":
        p.add_argument("--max-shard-size", default="5GB", metavar="SIZE",
                       help="largest shard, e.g. 5GB (default), 500MB, 2GiB")


def _build(args):
    if args.conversion == "legacy":
        return legacy.plan(args.src, args.target)
    if args.conversion == "to-speculators":
        return eagle3.to_speculators(args.src, args.verifier, args.verifier_architectures, args.speculative_tokens)
    if args.conversion == "to-yuhuili":
        return eagle3.to_yuhuili(args.src, args.architecture)
    if args.conversion == "average":
        return average.plan(args.src, args.others, args.weights)
    if args.conversion == "to-safetensors":
        return files.to_safetensors(args.src)
    if args.conversion == "shard":
        return files.shard(args.src, args.max_shard_size)
    return files.unshard(args.src)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.description = (
        "Convert EAGLE / EAGLE-3 checkpoints between published layouts (docs/converting.md).\n"
        "Output is written to a temporary directory beside OUT and renamed into place when\n"
        "complete."
    )
    parser.epilog = _epilog("to-speculators", "average")
    sub = parser.add_subparsers(dest="conversion", metavar="CONVERSION", required=True)
    for name, help_text in CONVERSIONS.items():
        p = sub.add_parser(name, help=help_text, description=help_text, epilog=_epilog(name),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("src", metavar="SRC", help="checkpoint directory or hub id" + (" (or one .bin file)" if name == "to-safetensors" else ""))
        p.add_argument("-o", "--output", required=True, type=Path, metavar="OUT", help="output directory (must not exist unless --force)")
        _options(p, name)
        p.add_argument("--dry-run", action="store_true", help="print the plan (tensors kept, renamed, added, dropped) and write nothing")
        p.add_argument("--force", action="store_true", help="replace OUT if it exists (only once the new one is complete)")
        p.add_argument("--quiet", action="store_true", help="no progress bar")


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """`kill` cleans up like Ctrl-C does (the temporary directory is removed) and exits as
    interrupted. The KeyboardInterrupt is raised wherever the main thread is; raised inside
    an extension's call back into Python (safetensors building a tensor, say), it can come
    out as that extension's own error, so any error after the signal counts as the signal."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = False

    def interrupt(signum, frame):
        nonlocal received
        received = True
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    except Exception as exc:
        if received:
            raise KeyboardInterrupt from exc
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(args: argparse.Namespace) -> int:
    prog = f"eagle-zoo convert {args.conversion}"
    try:
        out = args.output.expanduser().absolute()
        if out.exists() and not args.force and not args.dry_run:
            raise OutputExistsError(f"{out} exists; pass --force to replace it, or choose another -o")
        plan = _build(args)
        if plan.src.resolve().is_relative_to(out.resolve()):
            raise ConvertError(f"-o {out} holds the source {plan.src}; replacing it would delete the source: write elsewhere")
        if args.dry_run:
            print(plan.describe(out))
            print("dry run: nothing written")
            return EXIT_OK
        with _sigterm_as_interrupt():
            plan.execute(out, force=args.force, progress=False if args.quiet else None)
        size = sum(t.nbytes for t in plan.tensors)
        print(f"{prog}: wrote {out} ({len(plan.tensors)} tensors in {len(plan.groups)} file(s), {size} bytes)")
        return EXIT_OK
    except BaseException as exc:  # the CLI boundary: every failure becomes a message + exit code
        code = exit_code_for(exc)
        if code is None:
            if isinstance(exc, (SystemExit, GeneratorExit)):
                raise
            if isinstance(exc, OSError):
                print(f"{prog}: error: {exc}", file=sys.stderr)
            else:
                traceback.print_exc()
                print(f"{prog}: unexpected error (a bug; please report it with the traceback above): {exc}", file=sys.stderr)
            return EXIT_UNEXPECTED
        print(f"{prog}: error: {exc}" if str(exc) else f"{prog}: interrupted; nothing written", file=sys.stderr)
        return code
