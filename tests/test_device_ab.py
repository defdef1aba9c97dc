"""scripts/device/ab.sh on a checkout that predates REV, as a GPU machine's can: the commits
come from the bundle scripts/device/commits.sh writes (.device/commits.bundle)."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


def _repo(path: Path) -> Path:
    """A repository holding the two device scripts and a file whose content names its commit."""
    (path / "scripts" / "device").mkdir(parents=True)
    for name in ("ab.sh", "commits.sh"):
        shutil.copy(ROOT / "scripts" / "device" / name, path / "scripts" / "device" / name)
    (path / ".gitignore").write_text(".device/\n")
    _git(path.parent, "init", "-q", path.name)
    for version in ("first", "second", "third"):
        (path / "version").write_text(version)
        _git(path, "add", "-A")
        _git(path, "commit", "-qm", version)
    return path


def _ab(checkout: Path, rev: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "scripts/device/ab.sh", rev, 'echo "$SIDE $ROUND $(cat version)"'],
                          cwd=checkout, capture_output=True, text=True)


def test_ab_takes_a_rev_the_checkout_lacks_from_the_carried_bundle(tmp_path):
    repo = _repo(tmp_path / "here")
    second = _git(repo, "rev-parse", "--short", "HEAD~1")
    # The machine's checkout: the first commit only, then the working tree's files copied over it.
    _git(repo, "branch", "-q", "machine", "HEAD~2")
    machine = tmp_path / "machine"
    subprocess.run(["git", "clone", "-q", "--no-local", "--single-branch", "--branch", "machine", str(repo),
                    str(machine)], check=True)
    (machine / "version").write_text("working tree")
    assert _ab(machine, second).returncode != 0  # git: invalid reference

    subprocess.run(["bash", "scripts/device/commits.sh"], cwd=repo, check=True, capture_output=True,
                   env={**os.environ, "COMMITS": "2"})
    (machine / ".device").mkdir()
    shutil.copy(repo / ".device" / "commits.bundle", machine / ".device" / "commits.bundle")
    try:
        run = _ab(machine, second)
    finally:
        shutil.rmtree("/tmp/ab-old", ignore_errors=True)  # ab.sh's worktree of the old side
    assert run.returncode == 0, run.stderr
    assert run.stdout.split("\n") == ["old 1 second", "new 1 working tree", "old 2 second", "new 2 working tree", ""]
