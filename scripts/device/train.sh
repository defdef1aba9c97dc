#!/usr/bin/env bash
# GPU call 2 (carry .device/b): join + check the GGUF, convert it once, then start the
# SmolLM2 heads' training run (scripts/train_smollm2_heads.sh): self-instruct prompts,
# data, and the first STOP_AFTER seconds of training (default 200; STOP_AFTER= set empty:
# no pause, TRAIN_SECONDS in all). The run's state stays in
# /root/m/work; call 3 (train_more.sh) continues it. Heads so far come back via $OUT.
# DATA_ONLY=1: prompts and data only; RESUME=1 CALL_SECONDS=590: a training call that ends
# in time (the twelfth session's round, scripts/device/README.md).
set -u
START_EPOCH=$(date +%s)
cd "$(dirname "$0")/../.."
source scripts/device/env.sh
dir=$(python3 -c "from eagle_zoo.default_target import resolve_default as r; print(r('$TARGET'))") || exit 1
echo "target dir: $dir"
[ "${SMOKE:-0}" = 1 ] && { timeout 100 python3 scripts/device/smoke.py || echo "smoke test failed (above)"; }
export WORK=/root/m/work
# CALL_SECONDS=N: training pauses N - 30 s after this call began, whatever the data, the loads and
# the feature cache took (30 s for saving and copying the heads), so a call ends within N s
# (STOP_AFTER then defaults to none)
if [ -n "${CALL_SECONDS:-}" ]; then export PAUSE_AT=$(( START_EPOCH + CALL_SECONDS - 30 )); STOP_AFTER=${STOP_AFTER-}; fi
SYNTH_PROMPTS=${SYNTH_PROMPTS:-16000} SYNTH_SECONDS=${SYNTH_SECONDS:-50} DATA_SECONDS=${DATA_SECONDS:-140} \
TRAIN_SECONDS=${TRAIN_SECONDS:-540} STOP_AFTER=${STOP_AFTER-200} TTT_STEPS=${TTT_STEPS:-4} \
  bash scripts/train_smollm2_heads.sh "$dir" /root/m/train_prompts.jsonl /root/m/heads
cp -r /root/m/heads/. "$OUT"/
ls -la "$OUT" "$OUT"/*
