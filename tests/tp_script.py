"""A user's script as torchrun runs it, for tests/test_tensor_parallel.py.

    torchrun --standalone --nproc-per-node 2 tests/tp_script.py JOBS.json OUT_DIR

Every rank runs this whole file: for each job it builds the LLM with
tensor_parallel_size=2 (the process group comes from torchrun's environment),
generates, and writes what it got to OUT_DIR/rank<RANK>.json. At exit, after the
engine's own teardown, it writes the gloo threads still running to
OUT_DIR/threads-rank<RANK>.json (there should be none).
"""
import atexit
import json
import os
import sys

import torch

from eagle_zoo import LLM, SamplingParams


def _record_gloo_threads():
    """Registered before the first LLM, so it runs after the engine's exit handler."""
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            names.append(open(f"/proc/self/task/{task}/comm").read().strip())
        except FileNotFoundError:  # a thread that ended meanwhile
            pass
    with open(os.path.join(sys.argv[2], f"threads-rank{os.environ['RANK']}.json"), "w") as f:
        json.dump([n for n in names if "gloo" in n], f)


atexit.register(_record_gloo_threads)
torch.set_num_threads(1)
jobs = json.loads(open(sys.argv[1]).read())
results = {}
for name, job in jobs.items():
    llm = LLM(job["target"], job.get("spec"), device="cpu", dtype="float32", tensor_parallel_size=2,
              max_model_len=job["max_model_len"], max_num_seqs=job["max_num_seqs"], seed=job.get("seed", 0))
    params = [SamplingParams(max_tokens=m, ignore_eos=True, **job.get("sampling", {"temperature": 0.0}))
              for m in job["max_tokens"]]
    outs = llm.generate([{"prompt_token_ids": p} for p in job["prompts"]], params)
    m = llm.engine.metrics
    results[name] = {
        "tokens": [o.outputs[0].token_ids for o in outs],
        "counters": [m.num_drafts, m.num_draft_tokens, m.num_accepted_tokens, list(m.num_accepted_tokens_per_pos)],
    }
    llm.shutdown()
with open(os.path.join(sys.argv[2], f"rank{os.environ['RANK']}.json"), "w") as f:
    json.dump(results, f)
