#!/usr/bin/env bash
# GPU speed tables (issue 7; PART=tables, the default, or PART=lossless80), after setup.sh x7 and with .device/last (+ .device/pristine)
# carried, or in a lease where train.sh already ran: bf16, batch 1 on the 80 MT-bench
# prompts (transformers on 2, plain, EAGLE-1 / EAGLE-3 chains k = 1..5, trees 8,5,60 and 6,3,30),
# throughput at batch 1, 4, 16, 64 with and without speculation plus the adaptive
# depth schedule, the 8B-shaped decode step against its floor. Heads: the shipped ones
# (HEADS=/root/m/heads for freshly trained ones).
set -u
cd "$(dirname "$0")/../.."
source scripts/device/env.sh
python3 -c "from eagle_zoo.default_target import resolve_default as r; print(r('$TARGET'))" || exit 1
# The plugin package is not installed there: its head directories are read directly.
H=${HEADS:-plugins/eagle-zoo-smollm2-heads/eagle_zoo_smollm2_heads/heads}
E1=$H/eagle E3=$H/eagle3
case ${PART:-tables} in
  tables)    # batch-1 chains and trees on 80 prompts (issue 7), throughput, adaptive depth, 8B floor
    ARGS="--num-prompts 80 --ks 1,2,3,4,5 --batch-sizes 1,4,16,64 --tput-waves 3 --tree '8,5,60;6,3,30' --depth-schedule auto --hf-prompts 2 --floor" ;;
  lossless80)  # issue 7 item 6: bf16 greedy identity to plain decoding on all 80 MT-bench prompts
    ARGS="--num-prompts 80 --ks 3 --batch-sizes '' --tree 8,5,60" ;;
esac
# Rows are printed as measured (perf.py), so a timeout keeps every row before it.
eval timeout ${PERF_TIMEOUT:-540} python3 -m eagle_zoo.cli bench --perf --model "$TARGET" --eagle "$E1" --eagle3 "$E3" \
  --max-tokens 256 $ARGS --json "$OUT/perf-${PART:-tables}.json" 2>&1 | grep -v "it/s\]" \
  || echo "perf bench failed or timed out (rows measured so far are above)"
