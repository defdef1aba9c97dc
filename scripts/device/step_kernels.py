"""The kernels of one batch-1 decode step in order, per step strategy (plain, an EAGLE-3 chain
of k = 3, an EAGLE-2 tree 6,3,30), random weights of a shape (no GGUF needed).

Each strategy's whole-step CUDA graph (engine/graphs.py, StepGraph) is replayed 20 times
under torch.profiler, each replay from the same inputs. Printed per strategy: the kernels
a replay, the median span of a replay, then every kernel of the step in launch order with
its mean duration (us), the mean gap since the kernel before it ended (negative: it
started earlier, which programmatic dependent launch allows) and the running total; and
the same summed by kernel name. Where a step's time goes, phase by phase
(BENCHMARKS.md, "Step costs").
Usage: python3 scripts/device/step_kernels.py [--shape smollm2|8b] [--replays 20]
"""
from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from eagle_zoo import perf_steps

STRATEGIES = {"plain": {}, "chain": {"k": 3}, "tree": {"tree": perf_steps.PROFILE_TREE}}


def step_graph(engine, strategy: str):
    """(graph, its input_ids and positions buffers) of the strategy's step graph at batch 1."""
    owner = {"plain": engine.greedy_target_graph, "chain": engine.chain_step_graph,
             "tree": engine.tree_step_graph}[strategy]
    entry = next(e for key, e in owner.graphs.items() if key[0] == 1)
    graph, (ids, pos, _, _) = entry[0], entry[1]
    return graph, ids, pos


@torch.inference_mode()
def timeline(graph, inputs: list[torch.Tensor], replays: int) -> list:
    """The device's kernels of ``replays`` replays, each from the same inputs (a step graph
    feeds its next replay), in start order; copies left out."""
    saved = [(t, t.clone()) for t in inputs]

    def replay():
        for t, s in saved:
            t.copy_(s)
        graph.replay()
    for _ in range(3):
        replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            replay()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
               and "memcpy" not in e.name.lower()]
    return sorted(kernels, key=lambda e: e.time_range.start)


def report(strategy: str, kernels: list, replays: int) -> None:
    n = len(kernels) // replays
    runs = [kernels[i * n:(i + 1) * n] for i in range(replays)]
    spans = sorted(r[-1].time_range.end - r[0].time_range.start for r in runs)
    print(f"=== {strategy}: {len(kernels) / replays:.1f} kernels a replay, median span {spans[replays // 2]:.1f} us")
    total, by_name = 0.0, {}
    for j in range(n):
        dur = sum(r[j].time_range.end - r[j].time_range.start for r in runs) / replays
        gap = sum(r[j].time_range.start - r[j - 1].time_range.end for r in runs) / replays if j else 0.0
        total += dur + gap
        name = runs[0][j].name[:70]
        print(f"{j:4d} {dur:7.2f} {gap:6.2f} {total:8.1f}  {name}")
        count, d, g = by_name.get(name, (0, 0.0, 0.0))
        by_name[name] = (count + 1, d + dur, g + gap)
    print("--- by name: count, us, gap us")
    for name, (count, d, g) in sorted(by_name.items(), key=lambda kv: -kv[1][1] - kv[1][2]):
        print(f"{count:4d} {d:8.1f} {g:7.1f}  {name}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", choices=tuple(perf_steps.SHAPES), default="smollm2")
    ap.add_argument("--replays", type=int, default=20)
    args = ap.parse_args()
    dev, dtype = torch.device("cuda"), torch.bfloat16
    shape = perf_steps.SHAPES[args.shape]
    target = perf_steps.random_target(shape, dtype, dev)
    head = perf_steps.random_eagle3_head(target, perf_steps.DRAFT_VOCAB.get(args.shape, shape["vocab_size"]), dtype)
    for strategy, kw in STRATEGIES.items():
        engine, seqs = perf_steps.warm_engine(target, head, strategy, kw.get("k", 3), kw.get("tree"), dtype, dev,
                                              steps=100, batch=1, max_model_len=1280)
        graph, ids, pos = step_graph(engine, strategy)
        report(strategy, timeline(graph, [ids, pos], args.replays), args.replays)
        perf_steps.finish_engine(engine, seqs)
        del engine
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
