"""scripts/device/identity_random.py: the check BENCHMARKS.md's "Losslessness" rows come
from, on the CPU's float32 paths and on CUDA in bfloat16 (the engine's default dtype
there), where every step must be batch invariant too."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def identity_rows(device: str, dtype: str, tokens: int) -> list[str]:
    run = subprocess.run([sys.executable, "scripts/device/identity_random.py", "--shape", "smollm2", "--device", device,
                          "--dtype", dtype, "--tokens", str(tokens)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, OMP_NUM_THREADS="2"))
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [line for line in run.stdout.splitlines() if "identical to plain decoding" in line]
    assert [row.split(":")[0] for row in rows] == ["chain k=3, batch 16", "tree 6,3,30, batch 1", "chain k=3, batch 1"]
    return rows


@pytest.mark.slow
def test_speculative_steps_on_the_cpu_in_float32_give_plain_decodings_tokens():
    rows = identity_rows("cpu", "float32", 8)
    assert all(" 16/16 " in rows[0] and " 4/4 " in row for row in rows[1:]), rows


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_speculative_steps_on_cuda_in_bfloat16_give_plain_decodings_tokens():
    rows = identity_rows("cuda", "bfloat16", 64)
    assert all(" 16/16 " in rows[0] and " 4/4 " in row for row in rows[1:]), rows
