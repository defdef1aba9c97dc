#!/usr/bin/env bash
# A training call on the GPU machine: scripts/train_smollm2_heads.sh with the recipe in
# scripts/device/recipe.env, its state in /root/m/work (kept while the machine is warm).
# CALL_SECONDS=N pauses training N - 30 s after the call began, whatever the data and the
# loads took, so the call ends in time; RESUME=1 continues on the same data. The heads so
# far come back in $OUT every call.
set -u
START_EPOCH=$(date +%s)
cd "$(dirname "$0")/../.."
source scripts/device/env.sh
source scripts/device/recipe.env
dir=$(python3 -c "from eagle_zoo.default_target import resolve_default as r; print(r('$TARGET'))") || exit 1
export WORK=/root/m/work
[ -n "${CALL_SECONDS:-}" ] && export PAUSE_AT=$((START_EPOCH + CALL_SECONDS - 30))
bash scripts/train_smollm2_heads.sh "$dir" /root/m/heads
cp -r /root/m/heads/. "$OUT"/
ls -la "$OUT" "$OUT"/*
