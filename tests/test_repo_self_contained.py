"""The repository stands alone: no doc or source file refers to a path outside it.

Checked in every tracked *.md, *.py, *.sh, *.yaml, *.toml, *.cfg, *.json and Makefile:
- the shared folder beside the checkout, or the development machine's work tree;
- an absolute home directory of a user (under /home or /Users);
- a relative path whose parent steps climb above the repository root from the file's
  own directory (docs/x.md may link one level up to the README, not two);
- an upper-case markdown document name that no tracked file carries, i.e. a document
  that lives somewhere else.
Runtime locations such as ``~/.cache/...`` or the working directory a GPU helper
creates on the machine it runs on are not references to files and pass. (This file
spells its examples in pieces so that it passes its own check.)
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path, PurePosixPath

import pytest

ROOT = Path(__file__).resolve().parents[1]
SUFFIXES = {".md", ".py", ".sh", ".yaml", ".toml", ".cfg", ".json"}

# Built from pieces so that this file does not match its own patterns.
_UP = r"\.\./"
_OUTSIDE = [
    (re.compile(_UP + "shared" + r"\b"), "a sibling directory of the checkout"),
    (re.compile(r"(?<![\w.~-])/" + "work" + r"/"), "the development machine's work tree"),
    (re.compile(r"(?<![\w.~-])/(?:" + "home" + "|" + "Users" + r")/[A-Za-z_][\w.-]*"), "an absolute home directory"),
]
# A relative path starting with ../ that is not itself part of a longer path or a
# "..." ellipsis: preceded by neither a word character, a dot, a slash nor a $.
_RELATIVE = re.compile(r"(?<![\w./$~-])((?:" + _UP + r")+[\w.<>*-]*(?:/[\w.<>*-]+)*/?)")
_DOC_NAME = re.compile(r"(?<![\w/.-])([A-Z][A-Z0-9_-]*\.md)\b")


def tracked_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"not a git checkout ({exc}): the tracked files cannot be listed")
    names = [n for n in out.decode().split("\0") if n]
    return [ROOT / n for n in names if Path(n).suffix in SUFFIXES or Path(n).name == "Makefile"]


def escapes_root(relative_file: PurePosixPath, reference: str) -> bool:
    """Whether ``reference``, read from ``relative_file``'s directory, climbs above the root."""
    depth = len(relative_file.parent.parts)
    for part in PurePosixPath(reference).parts:
        if part == "..":
            depth -= 1
            if depth < 0:
                return True
        elif part != ".":
            depth += 1
    return False


def outside_references(relative_file: PurePosixPath, text: str, known_docs: set[str]) -> list[str]:
    """One line per reference to something outside the repository: 'file:line: ref (why)'."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        where = f"{relative_file}:{number}"
        for pattern, why in _OUTSIDE:
            found += [f"{where}: {m.group(0)!r} ({why})" for m in pattern.finditer(line)]
        for m in _RELATIVE.finditer(line):
            if escapes_root(relative_file, m.group(1)):
                found.append(f"{where}: {m.group(1)!r} (climbs above the repository root from {relative_file.parent}/)")
        for m in _DOC_NAME.finditer(line):
            if m.group(1) not in known_docs:
                found.append(f"{where}: {m.group(1)!r} (no tracked file has this name: a document outside the repository)")
    return found


def test_the_checker_finds_each_kind_of_outside_reference():
    docs = {"README.md", "BENCHMARKS.md"}
    here = PurePosixPath("docs/page.md")
    bad = {
        "see " + "../" + "shared/DESIGN.md": 1,
        "read " + "DESIGN" + ".md first": 1,
        "python at /" + "work/main/.venv/bin/python": 1,
        "cache in /" + "home/alice/models": 1,
        "cache in /" + "Users/bob/x and /" + "home/carol": 2,
        "[top](" + "../" * 2 + "README.md)": 1,  # docs/ -> two levels up is above the root
        "see " + "FACTS" + ".md": 1,
    }
    for text, count in bad.items():
        assert len(outside_references(here, text, docs)) == count, text
    good = ["[top](../README.md)", "~/.cache/eagle_zoo", "cd \"$(dirname \"$0\")/../..\"", "BENCHMARKS.md",
            "heads/eagle3/yuhuili-eagle3, .../speculators-eagle3", "a/b/../c", "eagle_zoo/work/x"]
    for text in good:
        assert outside_references(here, text, docs) == [], text
    assert escapes_root(PurePosixPath("plugins/p/README.md"), "../" * 2 + "README.md") is False
    assert escapes_root(PurePosixPath("plugins/p/README.md"), "../" * 3 + "README.md") is True
    assert escapes_root(PurePosixPath("Makefile"), "../x") is True


def test_no_tracked_doc_or_source_refers_outside_the_repository():
    files = tracked_files()
    known_docs = {f.name for f in files}
    offenders = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        offenders += outside_references(PurePosixPath(path.relative_to(ROOT).as_posix()), text, known_docs)
    assert not offenders, (
        f"{len(offenders)} reference(s) to paths outside the repository; write what is needed into the "
        "repository's own docs (docs/formats.md holds the checkpoint facts) or point at a file inside it:\n"
        + "\n".join(offenders))
