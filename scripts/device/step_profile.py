"""Where a batch-1 decode step of a SmolLM2-shaped model goes on the GPU.

Random bf16 weights in SmolLM2-135M's shape, or Llama-3-8B's with --shape 8b (no GGUF
needed, so it runs on a bare GPU machine). Prints, each the median of several timed runs
(CUDA events, after warm-up):
  graph      one replay of the captured target forward (the GPU time of the layers)
  runner     ModelRunner.run: input copies + replay + output clone
  logits     lm_head + greedy argmax
  step       one EngineCore step of plain decoding (everything: host work, sync, bookkeeping)
  steps      the mean step over many steps without syncs in between, with and without
             async_scheduling (the next step launched before this one is read back)
  kernels    the kernels of one eager forward (torch.profiler): count and GPU time by name
  host       with --host: cProfile of 100 engine steps of --strategy (plain, an EAGLE-3
             chain of k = 3 with a random head, or an EAGLE-2 tree 6,3,30) serving --batch
             requests (default 1): host time by function
With --prefill N it prints instead where one request's prefill goes: 20 requests of N random
prompt tokens and one output token each through an engine of --strategy, one at a time
(perf_steps.prefill_profile): the median and every wall time of the engine step that
prefills a request (the target's pass, the first token, the draft head's
on_prefill), host waits for the device a prefill, the kernels and GPU busy time of one
prefill (torch.profiler), and cProfile's host time by function over those prefills.
Usage: python3 scripts/device/step_profile.py [--shape smollm2|8b] [--steps 200] [--no-profiler]
       [--host [--strategy plain|chain|tree] [--batch B]]
       python3 scripts/device/step_profile.py --prefill N [--shape smollm2|8b] [--strategy plain|chain|tree]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from eagle_zoo.engine.core import EngineCore
from eagle_zoo.engine.graphs import GraphPool
from eagle_zoo.engine.sampling_params import SamplingParams
from eagle_zoo.perf_steps import DRAFT_VOCAB, PROFILE_TREE, SHAPES, copy_bandwidth, host_profile, prefill_profile, \
    random_eagle3_head, random_target


def cuda_ms(fn, reps: int, rounds: int = 5) -> float:
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / reps)
    return statistics.median(times)


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--shape", choices=("smollm2", "8b"), default="smollm2")
    ap.add_argument("--no-profiler", action="store_true")
    ap.add_argument("--host", action="store_true", help="cProfile 100 engine steps (host time by function)")
    ap.add_argument("--strategy", choices=("plain", "chain", "tree"), default="plain",
                    help="the engine step --host or --prefill profiles (chain k = 3, tree 6,3,30; a random "
                         "EAGLE-3 head)")
    ap.add_argument("--batch", type=int, default=1, help="requests the --host profile's steps serve")
    ap.add_argument("--prefill", type=int, metavar="N",
                    help="only profile the prefill of 20 requests of N prompt tokens each (host time by "
                         "function, kernels, per-request times)")
    args = ap.parse_args()
    if args.batch < 1 or (args.batch != 1 and not args.host):
        ap.error(f"--batch {args.batch}: the number of requests the --host profile's steps serve, 1 or more, "
                 "with --host")
    dev, dtype = torch.device("cuda"), torch.bfloat16
    shape = SHAPES[args.shape]
    model = random_target(shape, dtype, dev)
    if args.prefill is not None:
        print_prefill(model, args, dtype, dev)
        return
    engine = EngineCore(model, None, max_model_len=2048, max_num_seqs=1, dtype=dtype, device=dev,
                        graph_pool=GraphPool())
    runner = engine.runner
    ids = torch.randint(0, 1000, (1, 1), device=dev)
    pos = torch.full((1, 1), 300, device=dev)
    slots = torch.zeros(1, dtype=torch.long, device=dev)
    runner.run(ids, pos, slots, 2048)  # captures the T=1 graph
    graph = next(iter(runner.graphed.graphs.values()))[0]
    hidden, _ = runner.run(ids, pos, slots, 2048)
    graph_us = cuda_ms(graph.replay, 100) * 1e3
    weight_bytes = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "embed_tokens" not in n)
    floor_us = weight_bytes / copy_bandwidth(dev) * 1e6  # the floor: weight bytes / copy bandwidth
    print(f"graph   {graph_us:8.1f} us  (replay only; floor {floor_us:.1f} us for {weight_bytes / 1e9:.2f} GB of "
          f"weights: {graph_us / floor_us:.2f}x)")
    print(f"runner  {cuda_ms(lambda: runner.run(ids, pos, slots, 2048), 100) * 1e3:8.1f} us  (copies + replay + clone)")
    print(f"logits  {cuda_ms(lambda: model.compute_logits(hidden).argmax(-1), 100) * 1e3:8.1f} us  (lm_head + argmax)")

    prompt = torch.randint(0, 49152, (300,)).tolist()
    params = SamplingParams(temperature=0, max_tokens=6 * args.steps + 200, ignore_eos=True)
    engine.add_request(prompt, params)
    for _ in range(20):  # prefill + warm-up steps
        engine.step()
    per_step = []
    for _ in range(args.steps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        engine.step()
        per_step.append(time.perf_counter() - t)
    print(f"step    {statistics.median(per_step) * 1e6:8.1f} us  (median of {args.steps} engine steps; "
          f"{1 / statistics.median(per_step):.0f} tok/s)")

    def mean_step(async_scheduling: bool) -> float:
        engine.async_scheduling = async_scheduling
        for _ in range(10):
            engine.step()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(args.steps):
            engine.step()
        torch.cuda.synchronize()
        return (time.perf_counter() - t) / args.steps
    sync_s, async_s = mean_step(False), mean_step(True)
    engine.async_scheduling = False
    print(f"steps   {sync_s * 1e6:8.1f} us synchronous, {async_s * 1e6:.1f} us with async_scheduling "
          f"(means over {args.steps} steps: {1 / sync_s:.0f} vs {1 / async_s:.0f} tok/s)")

    if args.host:  # where the host time of a step goes (Python functions, by own time)
        head = random_eagle3_head(model, DRAFT_VOCAB[args.shape], dtype)
        print(host_profile(model, head, args.strategy, k=3, tree=PROFILE_TREE,
                           dtype=dtype, device=dev, steps=100, top=30, batch=args.batch))
    if args.no_profiler:
        return
    from torch.profiler import ProfilerActivity, profile

    def eager_forward():
        hidden, _ = runner.run(ids, pos, slots, 2048, cache_positions=pos)  # not graphed: kernels visible
        model.compute_logits(hidden[:, -1:]).argmax(-1)
    eager_forward()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        eager_forward()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    total = sum(e.device_time for e in kernels)
    print(f"kernels {len(kernels)} in one eager forward + logits, {total:.1f} us of GPU time "
          f"({len(kernels) / shape['num_hidden_layers']:.1f} a layer)")
    by_name: dict[str, list[float]] = {}
    for e in kernels:
        by_name.setdefault(e.name[:90], []).append(e.device_time)
    for name, ts in sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:25]:
        print(f"  {len(ts):4d} x {statistics.mean(ts):7.2f} us = {sum(ts):8.1f} us  {name}")


def print_prefill(model, args, dtype, dev) -> None:
    head = random_eagle3_head(model, DRAFT_VOCAB[args.shape], dtype)
    try:
        r = prefill_profile(model, head, args.strategy, prompt_tokens=args.prefill, k=3, tree=PROFILE_TREE, dtype=dtype,
                            device=dev, top=40)
    except ValueError as exc:
        raise SystemExit(f"--prefill {args.prefill}: {exc}") from None
    print(f"prefill {r['prefill_ms']:8.2f} ms  (median of {r['requests']} requests of {r['prompt_tokens']} prompt "
          f"tokens, {args.strategy}, one engine step each; {r['host_waits_per_prefill']:.1f} host waits for the "
          "device a prefill)")
    print("  per request: " + " ".join(f"{ms:.2f}" for ms in r["prefill_ms_all"]) + " ms")
    if "kernels" in r:
        print(f"  kernels {r['kernels']:.0f} a prefill, GPU busy {r['gpu_busy_us'] / 1e3:.2f} ms "
              f"(wall - busy: the device waiting for the host)")
        for name, us in r["top_kernels_us"].items():
            print(f"    {us:9.1f} us  {name}")
    print(r["profile"])


if __name__ == "__main__":
    main()
