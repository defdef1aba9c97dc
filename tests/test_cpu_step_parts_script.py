"""scripts/cpu_step_parts.py, where BENCHMARKS.md's CPU step breakdown comes from: it runs,
times every decode step of both engines with their C++ calls, and names a bad option."""
from __future__ import annotations

import functools
import re

import pytest

from eagle_zoo.kernels import cpu_decode
from script_runs import run_repo_script

run_script = functools.partial(run_repo_script, "cpu_step_parts.py")


@pytest.mark.skipif(not cpu_decode.available(), reason="kernels/cpu_decode.py could not be built here")
def test_it_times_the_steps_of_both_engines_and_their_cpp_calls():
    run = run_script("--categories", "chat", "--k", "2", "--rounds", "1")
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.strip().splitlines()
    assert [line.split(":")[0] for line in lines] == ["k = 2", "plain"], lines
    for line in lines:
        assert int(re.search(r": (\d+) steps", line).group(1)) > 0, line
        assert "step " in line and "llama_stack_rows " in line and "outside the C++ calls" in line, line
    for head_call in ("eagle3_draft_rows ", "eagle3_catch_up_rows "):  # the head drafts and catches up only there
        assert head_call in lines[0] and head_call not in lines[1], lines


def test_a_category_without_a_demo_prompt_is_named():
    run = run_script("--categories", "no-such-kind")
    assert run.returncode != 0 and "--categories no-such-kind: no demo prompt of these categories" in run.stderr
