#!/usr/bin/env bash
# GPU speed tables through `eagle-zoo bench --perf`, bf16, the 80 MT-bench prompts, 256 tokens.
#   PART=tables (default)  batch-1 chains k = 1..5 and trees 8,5,60 and 6,3,30 for EAGLE-1 and
#                          EAGLE-3, transformers generate on 2 prompts, plain decoding,
#                          throughput at batch 1, 4, 16, 64 with and without speculation and
#                          the adaptive depth schedule (the median of 3 alternating rounds:
#                          single passes at batch 16 vary by up to 1.7x), and first the step-cost tables (random-weight
#                          SmolLM2- and Llama-3.1-8B-shaped targets, the 8B plain step against
#                          its weight-read floor; chain k = 3, tree 6,3,30;
#                          PROFILE: the per-position acceptance of their projection, by default
#                          the shipped EAGLE-3 head's on the dev set)
#   PART=lossless80        bf16 greedy outputs against plain decoding on all 80 prompts (k = 3
#                          and one tree)
# Needs the GGUF: after pack.sh's setup.sh chain, the first call carries the last part (or
# train.sh ran earlier in the same warm machine). Heads: the shipped ones, or HEADS=DIR
# holding eagle/ and eagle3/ (/root/m/heads after train.sh). Results: $OUT/perf-PART.json.
set -u
cd "$(dirname "$0")/../.."
source scripts/device/env.sh
python3 -c "from eagle_zoo.default_target import resolve_default as r; print(r('$TARGET'))" || exit 1
# The plugin package is not installed on the GPU machine: its head directories are read directly.
H=${HEADS:-plugins/eagle-zoo-smollm2-heads/eagle_zoo_smollm2_heads/heads}
E1=$H/eagle E3=$H/eagle3
case ${PART:-tables} in
  tables)    # step costs, batch-1 chains and trees, throughput, adaptive depth
    ARGS="--num-prompts 80 --ks 1,2,3,4,5 --batch-sizes 1,4,16,64 --tput-waves 3 --num-iters 3 --tree '6,3,30;8,5,60' --depth-schedule auto --hf-prompts 2 --step-costs smollm2,8b --acceptance-profile ${PROFILE:-0.749,0.572,0.452}" ;;
  lossless80)  # bf16 greedy identity to plain decoding on all 80 prompts
    ARGS="--num-prompts 80 --ks 3 --batch-sizes '' --tree 8,5,60" ;;
esac
# Rows are printed as measured (perf.py), so a timeout keeps every row before it.
eval timeout ${PERF_TIMEOUT:-540} python3 -m eagle_zoo.cli bench --perf --model "$TARGET" --eagle "$E1" --eagle3 "$E3" \
  --max-tokens 256 $ARGS --json "$OUT/perf-${PART:-tables}.json" 2>&1 | grep -v "it/s\]" \
  || echo "perf bench failed or timed out (rows measured so far are above)"
