"""The ``eagle-zoo`` command. Each subcommand lives in the module that does its job;
this file only maps names to those modules (imported lazily, so ``eagle-zoo list``
does not pay for the engine).

A subcommand module provides ``add_arguments(parser)`` and ``run(args) -> int``, or,
when it serves several subcommands, ``add_arguments_<name>`` and ``run_<name>``.
"""
from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMANDS = {
    "list": ("eagle_zoo.catalog_cli", "list the catalog of published heads"),
    "info": ("eagle_zoo.catalog_cli", "show one catalog entry"),
    "plugins": ("eagle_zoo.catalog_cli", "list plugins, versions and what each registered"),
    "convert": ("converters.cli", "convert checkpoints (legacy vLLM, between formats)"),
    "bench": ("eagle_zoo.bench", "speed-up over plain decoding and acceptance of a draft"),
    "serve": ("eagle_zoo.serve.cli", "OpenAI-compatible server"),
    "train": ("eagle_zoo.train.cli", "train an EAGLE / EAGLE-3 head"),
    "demo": ("eagle_zoo.demo", "the shipped head's speed-up on the embedded default target"),
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eagle-zoo", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if only is None or only == name:
            _entry(module, "add_arguments", name)(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and argv[0] in SUBCOMMANDS else None
    parser = build_parser(only=command or "")
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return int(_entry(SUBCOMMANDS[args.command][0], "run", args.command)(args) or 0)


def _entry(module_name: str, kind: str, command: str):
    module = importlib.import_module(module_name)
    return getattr(module, f"{kind}_{command}", None) or getattr(module, kind)


if __name__ == "__main__":
    sys.exit(main())
