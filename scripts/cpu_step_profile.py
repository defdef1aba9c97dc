"""CPU cost of one target step (BENCHMARKS.md, "CPU"): the embedded SmolLM2 target,
fp32, one sequence with CACHED tokens in its cache, the engine's ModelRunner.

    .venv/bin/python scripts/cpu_step_profile.py [--threads 1] [--cached 150] [--repeats 30] [--profile]

Prints the weight bytes a token reads (layers + lm_head), the read bandwidth of a
large sum, the floor they give, and the median / min time of a step verifying T = 1
and T = 4 tokens (target forward + logits for those tokens). --profile also runs 10 T = 1
steps under torch.profiler: the matmuls' share of a step (aten::mm self time) and the
read bandwidth it implies for the weights. Run on an idle machine.
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
        for T in (1, 4):
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
            from torch.profiler import ProfilerActivity, profile

            ids, pos, steps = torch.tensor([[1]]), torch.tensor([[args.cached]]), 10
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(steps):
                    hidden, _ = runner.run(ids, pos, slots, args.cached + 1, ())
                    model.compute_logits(hidden)
            events = prof.key_averages()
            total_us = sum(e.self_cpu_time_total for e in events) / steps
            mm_us = sum(e.self_cpu_time_total for e in events if e.key == "aten::mm") / steps
            print(f"profiled T=1 step: {total_us / 1e3:.1f} ms, of it aten::mm {mm_us / 1e3:.1f} ms "
                  f"({total / mm_us / 1e3:.1f} GB/s of weights), everything else {(total_us - mm_us) / 1e3:.1f} ms")


if __name__ == "__main__":
    main()
