"""One of the repository's scripts/ run as BENCHMARKS.md's commands run it: from the
repository root, two threads (the tests of the scripts its CPU tables come from)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_repo_script(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, f"scripts/{script}", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env=dict(os.environ, OMP_NUM_THREADS="2"))
