#!/usr/bin/env bash
# GPU call 3, right after train.sh: continue the training run to TRAIN_SECONDS in all
# (same knobs as train.sh), then measure the heads' acceptance on MT-bench (80 prompts,
# k=3, greedy, 256 tokens, fp32 so the numbers match CPU runs).
set -u
cd "$(dirname "$0")/../.."
source scripts/device/env.sh
dir=$(python3 -c "from eagle_zoo.default_target import resolve_default as r; print(r('$TARGET'))") || exit 1
export WORK=/root/m/work
RESUME=1 TRAIN_SECONDS=${TRAIN_SECONDS:-540} TTT_STEPS=${TTT_STEPS:-4} \
  bash scripts/train_smollm2_heads.sh "$dir" /root/m/train_prompts.jsonl /root/m/heads
cp -r /root/m/heads/. "$OUT"/
for m in eagle eagle3; do
  timeout ${BENCH_TIMEOUT:-110} python3 -m eagle_zoo.cli bench --model "$TARGET" --draft "/root/m/heads/$m" \
    --num-spec-tokens 3 --num-prompts 80 --max-tokens 256 --max-num-seqs 80 --dtype float32 \
    --json "$OUT/accept_$m.json" --plot "$OUT/accept_$m.png" 2>&1 | grep -v "it/s\]" | tail -25 \
    || echo "acceptance bench $m failed"
done
ls -la "$OUT"
