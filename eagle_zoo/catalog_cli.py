"""`eagle-zoo list`, `eagle-zoo info ID` and `eagle-zoo plugins`: read-only views of
what the plugins registered (the catalog of heads, and the plugins themselves)."""
from __future__ import annotations

import argparse

from .catalog import ENTRY_FIELDS, METHODS, find_entry
from .plugins import get_registry


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


# -- list ------------------------------------------------------------------------
def add_arguments_list(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--family", help="only heads served by this family (llama, qwen3, ...)")
    parser.add_argument("--method", choices=METHODS, help="only eagle or eagle3 heads")
    parser.add_argument("--target", help="only heads whose target id contains this text (case-insensitive)")


def run_list(args: argparse.Namespace) -> int:
    reg = get_registry()  # a registry that cannot be built: eagle_zoo/cli.py prints its error
    entries = [
        e for e in reg.catalog.values()
        if (args.family is None or e.family == args.family)
        and (args.method is None or e.method == args.method)
        and (args.target is None or args.target.lower() in e.target.lower())
    ]
    if not entries:
        families = sorted({e.family for e in reg.catalog.values()})
        print(f"no catalog entry matches these filters (families: {', '.join(families)})")
        return 0
    entries.sort(key=lambda e: (e.family, e.method, e.id.lower()))
    rows = [("ID", "METHOD", "FAMILY", "TARGET", "FORMAT", "ACCEPT", "SPEEDUP")]
    rows += [
        (e.id, e.method, e.family, e.target, e.format,
         "-" if e.headline_acceptance is None else f"{e.headline_acceptance:g}",
         "-" if e.headline_speedup is None else f"{e.headline_speedup:.2f}x")
        for e in entries
    ]
    print(_table(rows))
    print(f"\n{len(entries)} of {len(reg.catalog)} heads. `eagle-zoo info ID` shows where ACCEPT "
          f"(mean acceptance length) and SPEEDUP (over plain decoding) were measured.")
    return 0


# -- info ------------------------------------------------------------------------
def add_arguments_info(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", metavar="ID", help="catalog id, e.g. yuhuili/EAGLE3-LLaMA3.1-Instruct-8B")


def run_info(args: argparse.Namespace) -> int:
    # A registry that cannot be built, an unknown id: eagle_zoo/cli.py prints the error.
    entry = find_entry(get_registry().catalog, args.id)
    width = max(len(f) for f in ENTRY_FIELDS)
    for name in ENTRY_FIELDS:
        value = getattr(entry, name)
        if name == "measured":
            lines = [record.describe() for record in value] or ["-"]
            print(f"{name.ljust(width)}  " + f"\n{' ' * (width + 2)}".join(lines))
            continue
        print(f"{name.ljust(width)}  {'-' if value in (None, '') else value}")
    return 0


# -- plugins ---------------------------------------------------------------------
def add_arguments_plugins(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--all", action="store_true", help="list every registered name, not a sample")


def _summary(names: list[str], everything: bool) -> str:
    if everything or len(names) <= 6:
        return ", ".join(names)
    return f"{', '.join(names[:4])}, ... ({len(names)} in all)"


def run_plugins(args: argparse.Namespace) -> int:
    reg = get_registry()  # a registry that cannot be built: eagle_zoo/cli.py prints its error
    for info in sorted(reg.plugins.values(), key=lambda p: (p.source != "builtin", p.name)):
        print(f"{info.name}  {info.version}  ({info.source})")
        if not info.registered:
            print("    (registered nothing)")
        for kind, names in sorted(info.registered.items()):
            print(f"    {kind}: {_summary(names, getattr(args, 'all', False))}")
    return 0
