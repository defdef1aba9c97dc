"""scripts/cpu_draft_confidence.py, where BENCHMARKS.md's choice of the CPU drafts'
stopping threshold comes from: it runs plain and each threshold in rounds with identical
outputs, and names a bad option."""
from __future__ import annotations

import functools
import re

import pytest

from eagle_zoo.kernels import cpu_decode
from script_runs import run_repo_script

run_script = functools.partial(run_repo_script, "cpu_draft_confidence.py")


@pytest.mark.skipif(not cpu_decode.available(), reason="kernels/cpu_decode.py could not be built here")
def test_it_compares_thresholds_with_plain_decoding_in_rounds():
    run = run_script("--categories", "writing", "--per-category", "1", "--values", "0,0.5", "--rounds", "1",
                     "--max-tokens", "24")
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.strip().splitlines()
    assert lines[0].startswith("round 1: plain ") and len(lines) == 2, lines
    assert re.fullmatch(r"1 prompts, k = 3, median speed-up over 1 rounds: 0.0: [\d.]+x, 0.5: [\d.]+x", lines[1]), lines


@pytest.mark.parametrize("args, message", [
    (("--values", "0,1.5"), "--values 0,1.5: each threshold must lie in [0, 1)"),
    (("--categories", "no-such-kind"), "--categories: no dev-set category no-such-kind"),
])
def test_bad_options_are_named(args, message):
    run = run_script(*args)
    assert run.returncode != 0 and message in run.stderr, run.stderr[-2000:]
