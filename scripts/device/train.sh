#!/usr/bin/env bash
# GPU call 2 (carry .device/b): join + check the GGUF, convert it once, smoke-test the
# engine's CUDA path, then train both SmolLM2 heads (scripts/train_smollm2_heads.sh).
# The heads stay in /root/m/heads for the benchmark call and come back through $OUT.
set -u
cd "$(dirname "$0")/../.."
source scripts/device/env.sh
dir=$(python3 -c "from eagle_zoo.default_target import resolve_default as r; print(r('$TARGET'))") || exit 1
echo "target dir: $dir"
timeout 100 python3 scripts/device/smoke.py || echo "smoke test failed (above)"
DATA_SECONDS=${DATA_SECONDS:-100} TRAIN_SECONDS=${TRAIN_SECONDS:-180} \
  bash scripts/train_smollm2_heads.sh "$dir" /root/m/train_prompts.jsonl /root/m/heads
cp -r /root/m/heads/. "$OUT"/
ls -la "$OUT" "$OUT"/*
