"""Tensor-parallel speed on one host (scripts/device/tp_bench.sh runs it on 2 H200s).

    python scripts/device/tp_bench.py write  OUT --shape 8b     random Llama target + heads
    python scripts/device/tp_bench.py bench  MODEL --tp 2 --json results.jsonl
    python scripts/device/tp_bench.py example TARGET --tp 2 --spec '{...}'
    python scripts/device/tp_bench.py report results.jsonl      markdown table

SmolLM2-135M-Instruct has 9 attention heads (3 kv heads): 2 ranks cannot split them, so
TP 2 is measured on random-weight Llama-shaped targets written here (bf16, SmolLM2's
tokenizer and vocabulary, so chat prompts work), and SmolLM2 is measured at TP 1 only.
Timing: warm-up first (graphs captured for every batch bucket used), synchronize around
timed regions, greedy, ignore_eos so every request makes exactly --max-tokens tokens.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

SHAPES = {  # Llama-3.2-1B / Llama-3-8B layouts with SmolLM2's vocabulary ("tiny": a CPU smoke test)
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16),
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
               num_key_value_heads=8, head_dim=64),
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=8, head_dim=128),
}
SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"
DRAFT_VOCAB = 16384


def _randn(gen, *shape, std=0.02):
    return (torch.randn(*shape, generator=gen) * std).to(torch.bfloat16)


def _layer(gen, prefix, cfg, attn_in, norms):
    H, I = cfg["hidden_size"], cfg["intermediate_size"]
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    w = {f"{prefix}self_attn.q_proj.weight": _randn(gen, nh * hd, attn_in),
         f"{prefix}self_attn.k_proj.weight": _randn(gen, nkv * hd, attn_in),
         f"{prefix}self_attn.v_proj.weight": _randn(gen, nkv * hd, attn_in),
         f"{prefix}self_attn.o_proj.weight": _randn(gen, H, nh * hd),
         f"{prefix}mlp.gate_proj.weight": _randn(gen, I, H),
         f"{prefix}mlp.up_proj.weight": _randn(gen, I, H),
         f"{prefix}mlp.down_proj.weight": _randn(gen, H, I)}
    w.update({f"{prefix}{n}.weight": torch.ones(H, dtype=torch.bfloat16) for n in norms})
    return w


def write(args) -> None:
    """A random Llama target of --shape (transformers writes it) and random yuhuili-layout
    EAGLE-1 / EAGLE-3 heads for it, under OUT/{target,eagle,eagle3}."""
    from safetensors.torch import save_file
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from eagle_zoo.engine.model_loader import resolve_model_dir

    out = Path(args.out)
    # --tokenizer: a directory with SmolLM2's tokenizer files, so this part needs no GGUF
    tok = AutoTokenizer.from_pretrained(args.tokenizer or str(resolve_model_dir(SMOLLM2)))
    shape = SHAPES[args.shape]
    config = LlamaConfig(**shape, vocab_size=len(tok), max_position_embeddings=4096, rope_theta=500000.0,
                         tie_word_embeddings=False, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         torch_dtype="bfloat16")
    if not (out / "target" / "config.json").is_file():
        torch.manual_seed(0)
        with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
            model = LlamaForCausalLM(config).to(torch.bfloat16)  # transformers' init: N(0, 0.02)
        model.save_pretrained(out / "target", max_shard_size="5GB")
        tok.save_pretrained(out / "target")
        del model
    cfg = {**config.to_dict(), "num_hidden_layers": 1, "architectures": ["LlamaForCausalLM"]}
    for key in ("transformers_version", "_name_or_path", "torch_dtype", "dtype"):
        cfg.pop(key, None)
    gen = torch.Generator().manual_seed(1)
    H = shape["hidden_size"]
    heads = {
        # EAGLE-1 (LLaMA3 style): fc without bias, no input_layernorm; embed_tokens and
        # lm_head come from the target.
        "eagle": (cfg, {"fc.weight": _randn(gen, H, 2 * H),
                        **_layer(gen, "layers.0.", cfg, H, ("post_attention_layernorm",))}),
        "eagle3": ({**cfg, "architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": DRAFT_VOCAB},
                   {"fc.weight": _randn(gen, H, 3 * H), "norm.weight": torch.ones(H, dtype=torch.bfloat16),
                    "lm_head.weight": _randn(gen, DRAFT_VOCAB, H),
                    # draft vocab = the first DRAFT_VOCAB target ids
                    "d2t": torch.zeros(DRAFT_VOCAB, dtype=torch.long),
                    "t2d": torch.arange(config.vocab_size) < DRAFT_VOCAB,
                    **_layer(gen, "midlayer.", cfg, 2 * H, ("hidden_norm", "input_layernorm",
                                                            "post_attention_layernorm"))}),
    }
    for name, (head_cfg, weights) in heads.items():
        (out / name).mkdir(parents=True, exist_ok=True)
        (out / name / "config.json").write_text(json.dumps(head_cfg, indent=2))
        save_file(weights, str(out / name / "model.safetensors"), metadata={"format": "pt"})
    print(f"wrote {out}/target ({args.shape}), {out}/eagle, {out}/eagle3")


def bench(args) -> None:
    from eagle_zoo import LLM, SamplingParams
    from eagle_zoo.bench import load_prompts
    from eagle_zoo.perf import timed_generate

    convs = [[{"role": "user", "content": p}] for p in load_prompts(None, args.num_prompts)]
    batches = [int(b) for b in args.batch.split(",")]
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    t0 = time.perf_counter()
    llm = LLM(args.model, device=args.device, dtype="bfloat16" if args.device == "cuda" else "float32", tensor_parallel_size=args.tp,
              max_num_seqs=max(batches), max_model_len=1024, enforce_eager=args.eager)
    build_s = time.perf_counter() - t0
    try:
        for b in sorted(set(batches), reverse=True):  # capture every bucket a run will use
            llm.chat((convs * b)[:b], SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True))
        rows = []
        for b in batches:
            if b == 1:  # requests one after another
                tokens, seconds, outs = 0, 0.0, []
                for conv in convs:
                    o, t, s = timed_generate(llm, [conv], params)
                    outs, tokens, seconds = outs + o, tokens + t, seconds + s
            else:
                batch = (convs * ((b + len(convs) - 1) // len(convs)))[:b]
                outs, tokens, seconds = timed_generate(llm, batch, params)
            rows.append({"model": args.label or args.model, "tp": args.tp, "batch": b, "eager": args.eager,
                         "tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
                         "build_s": build_s,
                         "first_tokens": [o.outputs[0].token_ids[:32] for o in outs[: min(len(outs), 5)]]})
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "first_tokens"}), flush=True)
            if args.json:  # written at once: a hang or a kill later keeps what was measured
                with open(args.json, "a") as f:
                    f.write(json.dumps(rows[-1]) + "\n")
    finally:
        llm.shutdown()


def example(args) -> None:
    """vLLM's speculative-decoding example with tensor parallelism, as a user writes it, with the
    model names changed."""
    from eagle_zoo import LLM, SamplingParams

    prompts = ["The future of AI is"]
    sampling_params = SamplingParams(temperature=0.8, top_p=0.95)
    llm = LLM(model=args.target, tensor_parallel_size=args.tp, speculative_config=json.loads(args.spec))
    outputs = llm.generate(prompts, sampling_params)
    for output in outputs:
        prompt = output.prompt
        generated_text = output.outputs[0].text
        print(f"Prompt: {prompt!r}, Generated text: {generated_text!r}")
    print("metrics:", {m.name: m.value for m in llm.get_metrics() if not m.labels})
    llm.shutdown()


def report(args) -> None:
    rows = [json.loads(line) for line in open(args.json) if line.strip()]
    base = {(r["model"], r["batch"]): r["tokens_per_s"] for r in rows if r["tp"] == 1}
    print("| model | batch | TP | tokens/s | vs TP 1 |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        ref = base.get((r["model"], r["batch"]))
        rel = f"{r['tokens_per_s'] / ref:.2f}x" if ref else ""
        eager = " (eager)" if r.get("eager") else ""
        print(f"| {r['model']} | {r['batch']} | {r['tp']}{eager} | {r['tokens_per_s']:.1f} | {rel} |")
    by = {}
    for r in rows:
        by.setdefault((r["model"], r["batch"]), {})[r["tp"]] = r["first_tokens"]
    for (model, batch), runs in by.items():
        if 1 in runs and 2 in runs:
            same = sum(a == b for a, b in zip(runs[1], runs[2]))
            print(f"\n{model} batch {batch}: first 32 greedy tokens identical TP 1 vs TP 2 on {same}/{len(runs[1])} prompts")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument("out")
    w.add_argument("--shape", choices=sorted(SHAPES), default="8b")
    w.add_argument("--tokenizer", help="tokenizer directory (default: the embedded SmolLM2's)")
    b = sub.add_parser("bench")
    b.add_argument("model")
    b.add_argument("--label")
    b.add_argument("--tp", type=int, default=1)
    b.add_argument("--batch", default="1,16")
    b.add_argument("--num-prompts", type=int, default=10)
    b.add_argument("--max-tokens", type=int, default=128)
    b.add_argument("--eager", action="store_true")
    b.add_argument("--device", default="cuda")
    b.add_argument("--json")
    e = sub.add_parser("example")
    e.add_argument("target")
    e.add_argument("--tp", type=int, default=2)
    e.add_argument("--spec", required=True)
    r = sub.add_parser("report")
    r.add_argument("json")
    args = p.parse_args()
    {"write": write, "bench": bench, "example": example, "report": report}[args.cmd](args)


if __name__ == "__main__":
    main()
