"""GPU smoke test before training: the engine's CUDA path on the real target.

Plain greedy decoding with CUDA graphs must equal eager decoding; n-gram speculative
decoding must equal plain. Prints tokens/s of each (batch 1, a few prompts)."""
import time

import torch

from eagle_zoo import LLM, SamplingParams

TARGET = "HuggingFaceTB/SmolLM2-135M-Instruct"
prompts = ["Write a haiku about the sea.", "List the planets of the solar system, in order.",
           "Explain what a hash table is in two sentences."]
convs = [[{"role": "user", "content": p}] for p in prompts]
params = SamplingParams(temperature=0, max_tokens=128)


def run(label, **kw):
    llm = LLM(model=TARGET, **kw)
    llm.chat(convs[:1], SamplingParams(temperature=0, max_tokens=8))
    outs, tokens, seconds = [], 0, 0.0
    for c in convs:
        torch.cuda.synchronize(); t = time.perf_counter()
        o = llm.chat([c], params)
        torch.cuda.synchronize(); seconds += time.perf_counter() - t
        outs += o
        tokens += len(o[0].outputs[0].token_ids)
    print(f"{label}: {tokens / seconds:.1f} tok/s", flush=True)
    return [o.outputs[0].token_ids for o in outs], llm


for dtype in ("bfloat16", "float32"):
    eager, _ = run(f"{dtype} eager", dtype=dtype, enforce_eager=True)
    graphs, _ = run(f"{dtype} graphs", dtype=dtype)
    ngram, llm = run(f"{dtype} ngram k=3", dtype=dtype,
                     speculative_config={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
                                         "prompt_lookup_min": 2})
    m = llm.engine.metrics
    print(f"{dtype}: graphs == eager: {graphs == eager}; ngram == plain: {ngram == graphs}; "
          f"ngram mean acceptance {m.mean_acceptance_length:.2f}", flush=True)
print("smoke done")
