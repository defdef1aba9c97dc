"""Where a batch-1 decode step goes, phase by phase: plain, an EAGLE chain, an EAGLE-2 tree.

Each phase is the device-only function the engine captures (whole-row form), timed on
its own: on CUDA captured into a CUDA graph and replayed (median of CUDA-event timed
runs), with its kernel count from one eager call under torch.profiler; on the CPU timed
eagerly (a dry run of this script). Then the mean engine step over many steps (graphs,
no syncs between steps), with and without async_scheduling, and tokens per step.

    python3 scripts/device/step_breakdown.py --model MODEL --head HEAD [--k 3] [--tree 8,5,60]

Phases:
  plain         target forward (T = 1) + lm_head + argmax
  chain draft   the K-token drafting loop (EagleProposer._draft_chain)
  chain verify  target forward (T = K + 1) + lm_head + greedy verification
  chain catchup the padded catch-up (EagleProposer._catch_up)
  tree draft    the drafting rounds and tree selection (TreeEagleProposer.propose_tree)
  tree verify   the target over every node + lm_head (tree_verify.target_tree_pass)
  tree finish   greedy acceptance, cache compaction, the head's catch-up
  tree step     all of it as the engine captures it (tree_verify.whole_row_greedy_step)
The phases run on the state of a real sequence (a prompt decoded for a few steps); their
writes leave garbage in that sequence's caches, which is fine for timing only.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from eagle_zoo import LLM, SamplingParams
from eagle_zoo.bench import load_prompts
from eagle_zoo.engine import tree_verify
from eagle_zoo.engine.verify import verify_greedy


def measure(fn, device: torch.device, reps: int = 50) -> tuple[float, int]:
    """(median microseconds of one call, kernels of one eager call; -1 on the CPU)."""
    if device.type != "cuda":
        fn()
        times = []
        for _ in range(5):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return statistics.median(times) * 1e6, -1
    from torch.profiler import ProfilerActivity, profile

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    kernels = sum(e.device_type == torch.autograd.DeviceType.CUDA for e in prof.events())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(reps):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / reps)
    return statistics.median(times), kernels


def engine_steps(llm, prompt, steps: int, async_scheduling: bool) -> tuple[float, float]:
    """(mean microseconds per engine step, tokens per step) over ``steps`` steps of one request."""
    engine = llm.engine
    engine.async_scheduling = async_scheduling
    seq = engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=10 * steps + 100, ignore_eos=True))
    for _ in range(10):
        engine.step()
    if engine.device.type == "cuda":
        torch.cuda.synchronize()
    n0, t = len(seq.output_token_ids), time.perf_counter()
    for _ in range(steps):
        engine.step()
    if engine.device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t
    tokens = len(seq.output_token_ids) - n0  # with async scheduling: one step behind, the same count
    engine.abort(seq.request_id)
    while engine.has_unfinished():
        engine.step()
    return seconds / steps * 1e6, tokens / steps


def state_of_one_sequence(llm, prompt):
    """(the request, slots [1], base [1], last [1]) of a request decoded for a few steps,
    left running."""
    engine = llm.engine
    seq = engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=512, ignore_eos=True))
    for _ in range(4):
        engine.step()
    dev = engine.device
    as_tensor = lambda v: torch.tensor([v], device=dev)  # noqa: E731
    return seq, as_tensor(seq.slot), as_tensor(seq.num_cached), as_tensor(seq.last_token_id)


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    ap.add_argument("--head", required=True, help="an EAGLE or EAGLE-3 head (directory or catalog id)")
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--tree", default="8,5,60", help="TOP_K,DEPTH,TOTAL_TOKENS")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--max-model-len", type=int, default=1024)
    args = ap.parse_args()
    top_k, depth, total = (int(v) for v in args.tree.split(","))
    prompt_text = load_prompts(None, 1)[0]
    rows = []

    def row(config, phase, fn, device):
        us, kernels = measure(fn, device)
        rows.append((config, phase, us, kernels))
        print(f"{config:8s} {phase:14s} {us:9.1f} us  {kernels if kernels >= 0 else '-':>5} kernels", flush=True)

    def make(spec):
        return LLM(args.model, speculative_config=spec, device=args.device, dtype=args.dtype,
                   max_model_len=args.max_model_len, max_num_seqs=1)

    chain = {"model": args.head, "num_speculative_tokens": args.k}
    tree = {"model": args.head, "tree": {"top_k": top_k, "depth": depth, "total_tokens": total}}
    steps = {}
    for config, spec in (("plain", None), ("chain", chain), ("tree", tree)):
        llm = make(spec)
        engine, dev = llm.engine, llm.engine.device
        _, prompt = llm._encode({"prompt": llm.apply_chat_template([{"role": "user", "content": prompt_text}])})
        seq, slots, base, last = state_of_one_sequence(llm, prompt)
        runner, target, aux_ids = engine.runner, engine.target, engine.aux_layer_ids
        if config == "plain":
            pos = base.view(1, 1)
            row(config, "step graph", lambda: target.compute_logits(
                runner.forward_full_length(last.view(1, 1), pos, slots, aux_ids)[0]).argmax(-1), dev)
        elif config == "chain":
            proposer, k = engine.proposer, args.k
            b = base.view(1, 1)
            drafts = proposer._draft_chain(None, b, slots, k)
            ids = torch.cat([last.view(1, 1), drafts], dim=1)
            positions = b + torch.arange(k + 1, device=dev)

            def verify():
                hidden, aux = runner.forward_full_length(ids, positions, slots, aux_ids)
                return verify_greedy(target.compute_logits(hidden), drafts, None), hidden, aux
            (tokens, accepted), hidden, aux = verify()
            inputs = tuple(aux) if proposer.method == "eagle3" else (hidden,)
            row(config, "draft", lambda: proposer._draft_chain(None, b, slots, k), dev)
            row(config, "verify", verify, dev)
            row(config, "catchup", lambda: proposer._catch_up(tokens, positions, slots, accepted.view(-1, 1),
                                                               *inputs), dev)
        else:
            proposer = engine.proposer
            drafted = proposer.propose_tree(slots, base, last, None)
            hidden, aux, logits = tree_verify.target_tree_pass(engine, drafted, base, slots, None)

            def finish():
                tokens, accepted, path = tree_verify.accept_greedy(logits.argmax(-1), drafted)
                return tree_verify.finish_tree_step(engine, drafted, slots, base, None, tokens, accepted, path,
                                                    hidden, aux)
            row(config, "draft", lambda: proposer.propose_tree(slots, base, last, None), dev)
            row(config, "verify", lambda: tree_verify.target_tree_pass(engine, drafted, base, slots, None), dev)
            row(config, "finish", finish, dev)
            step = tree_verify.whole_row_greedy_step(engine)
            row(config, "whole step", lambda: step(last.view(1, 1), base.view(1, 1), slots), dev)
        engine.abort(seq.request_id)
        while engine.has_unfinished():
            engine.step()
        for async_scheduling in (False, True):
            us, per_step = engine_steps(llm, prompt, args.steps, async_scheduling)
            steps[(config, async_scheduling)] = (us, per_step)
            print(f"{config:8s} engine step{' (async)' if async_scheduling else '':8s} {us:9.1f} us  "
                  f"{per_step:.2f} tokens a step, {per_step / us * 1e6:.0f} tok/s", flush=True)
        del llm
    print("summary (engine steps):")
    for (config, async_scheduling), (us, per_step) in steps.items():
        print(f"  {config}{' async' if async_scheduling else ''}: {us:.1f} us a step, {per_step:.2f} tokens, "
              f"{per_step / us * 1e6:.0f} tok/s")


if __name__ == "__main__":
    main()
