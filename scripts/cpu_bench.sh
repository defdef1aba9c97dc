#!/usr/bin/env bash
# CPU speed table of BENCHMARKS.md (issue 5): SmolLM2-135M-Instruct fp32, batch 1,
# 10 MT-bench prompts, greedy, 128 new tokens: transformers generate on the same
# prompts, our plain decoding, n-gram, the shipped EAGLE-1 / EAGLE-3 heads (k=3).
# Run it on an otherwise idle machine.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/eagle-zoo bench --perf --device cpu --dtype float32 --num-prompts 10 --max-tokens 128 --ks 3 \
  --eagle eagle-zoo/EAGLE-SmolLM2-135M-Instruct --eagle3 eagle-zoo/EAGLE3-SmolLM2-135M-Instruct --ngram \
  --batch-sizes "" --hf-prompts 10 --json "${1:-cpu_perf.json}"
