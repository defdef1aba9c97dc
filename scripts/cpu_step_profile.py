"""CPU cost of one target step (BENCHMARKS.md, "CPU"): the embedded SmolLM2 target,
fp32, one sequence with CACHED tokens in its cache, the engine's ModelRunner.

    .venv/bin/python scripts/cpu_step_profile.py [--threads 1] [--cached 150] [--repeats 30] [--profile]
                                                 [--tokens 1,4]

Prints the weight bytes a token reads (layers + lm_head), the read bandwidth of a
large sum, the floor they give, and the median / min time of a step verifying T = 1
and T = 4 tokens (--tokens: other counts) (target forward + logits for those tokens). --profile also times 10 T = 1
steps by part: kernels/cpu_decode.py's one-call decoder layers and its matmuls outside
them, or with EAGLE_ZOO_CPU_KERNELS=0 aten::mm (torch.profiler). Run on an idle machine.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--cached", type=int, default=150)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--profile", action="store_true", help="matmul time of a T=1 step (torch.profiler)")
    p.add_argument("--tokens", default="1,4", help="comma-separated token counts T of the timed steps")
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    from eagle_zoo.engine.model_loader import load_model
    from eagle_zoo.engine.runner import ModelRunner
    from eagle_zoo.models.layers import one_row_copy_bytes

    loaded = load_model("HuggingFaceTB/SmolLM2-135M-Instruct", torch.float32, torch.device("cpu"))
    model = loaded.model
    layer_bytes = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "embed" not in n
                      and "lm_head" not in n)
    head = model.lm_head.weight
    head_bytes = head.numel() * head.element_size()
    total = layer_bytes + head_bytes

    src = torch.randn(256 * 2**20 // 4)  # 256 MiB, read once per sum
    reads = []
    for _ in range(10):
        t = time.perf_counter()
        src.sum()
        reads.append(time.perf_counter() - t)
    bandwidth = src.numel() * 4 / min(reads)  # bytes read per second
    del src

    runner = ModelRunner(model, 1, args.cached + 16, torch.float32, torch.device("cpu"))
    slots = torch.tensor([0])
    prompt = torch.randint(0, model.config.vocab_size, (1, args.cached))
    with torch.inference_mode():
        runner.run(prompt, torch.arange(args.cached).unsqueeze(0), slots, args.cached, ())
        print(f"threads {args.threads}; weights read per token: {total / 1e6:.0f} MB "
              f"(layers {layer_bytes / 1e6:.0f} MB + lm_head {head_bytes / 1e6:.0f} MB)")
        print(f"column-major copies for one-row matmuls: {one_row_copy_bytes() / 1e6:.0f} MB")
        print(f"read bandwidth (sum of 256 MiB): {bandwidth / 1e9:.1f} GB/s -> floor "
              f"{total / bandwidth * 1e3:.1f} ms a token")
        for T in [int(t) for t in args.tokens.split(",")]:
            ids = torch.randint(0, model.config.vocab_size, (1, T))
            pos = (args.cached + torch.arange(T)).unsqueeze(0)
            times = []
            for _ in range(args.repeats):
                t = time.perf_counter()
                hidden, _ = runner.run(ids, pos, slots, args.cached + T, ())
                model.compute_logits(hidden)
                times.append(time.perf_counter() - t)
            print(f"T={T}: median {statistics.median(times) * 1e3:.1f} ms, min {min(times) * 1e3:.1f} ms")
        if args.profile:
            profile_parts(runner, model, slots, args.cached, total)


def profile_parts(runner, model, slots, cached: int, weight_bytes: int, steps: int = 10) -> None:
    """Where a T=1 step goes: kernels/cpu_decode.py's calls timed around each (they are no
    aten ops): whole decoder layers (llama_layer_rows) and matmuls outside them
    (few_row_linear: the lm_head, or every layer of families without the one-call layer);
    with the kernels off, aten::mm's self time under torch.profiler. The step itself is
    timed without the profiler (which inflates small ops)."""
    from torch.profiler import ProfilerActivity, profile

    from eagle_zoo.kernels import cpu_decode

    ids, pos = torch.tensor([[1]]), torch.tensor([[cached]])

    def step():
        hidden, _ = runner.run(ids, pos, slots, cached + 1, ())
        model.compute_logits(hidden)

    spent = {"llama_layer_rows": [], "few_row_linear": []}
    originals = {name: getattr(cpu_decode, name) for name in spent}

    def timed(name):
        def call(*args):
            t = time.perf_counter()
            out = originals[name](*args)
            spent[name].append(time.perf_counter() - t)
            return out
        return call

    step_s = []
    for name in spent:
        setattr(cpu_decode, name, timed(name))
    try:
        for _ in range(steps):
            t = time.perf_counter()
            step()
            step_s.append(time.perf_counter() - t)
    finally:
        for name, fn in originals.items():
            setattr(cpu_decode, name, fn)
    step_ms = statistics.median(step_s) * 1e3
    layers_ms = sum(spent["llama_layer_rows"]) / steps * 1e3
    mm_ms = sum(spent["few_row_linear"]) / steps * 1e3
    if not spent["llama_layer_rows"] and not spent["few_row_linear"]:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                step()
        mm_ms = sum(e.self_cpu_time_total for e in prof.key_averages() if e.key == "aten::mm") / steps / 1e3
        print(f"T=1 step {step_ms:.1f} ms (median of {steps}): matmuls (aten::mm) {mm_ms:.1f} ms "
              f"({weight_bytes / mm_ms / 1e6:.1f} GB/s of weights), everything else {step_ms - mm_ms:.1f} ms")
        return
    print(f"T=1 step {step_ms:.1f} ms (median of {steps}): decoder layers in one C++ call each {layers_ms:.1f} ms, "
          f"kernels/cpu_decode.py matmuls outside them {mm_ms:.1f} ms, everything else "
          f"{step_ms - layers_ms - mm_ms:.1f} ms")

if __name__ == "__main__":
    main()
