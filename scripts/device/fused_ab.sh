#!/usr/bin/env bash
# Issue 7: a speed switch on and off in one call, on the real target: by default
# EAGLE_ZOO_TRITON_LINEAR (the few-row linear kernel and fused Llama layers,
# kernels/linear.py, eagle_zoo/models/fused_layer.py); AB_VAR=EAGLE_ZOO_STEP_GRAPHS for the
# whole-step CUDA graphs (EAGLE drafting loop, catch-up, greedy tree steps);
# AB_VAR=EAGLE_ZOO_ASYNC_SCHEDULING SETTINGS="0 1" for async scheduling. After
# setup.sh x7 and train.sh, or with .device/last carried): batch 1, 10 MT-bench prompts,
# 256 tokens, bf16: plain, EAGLE-1 / EAGLE-3 k=3 chains and EAGLE-2 trees (8, 5, 60),
# each with its identity to plain decoding. Heads: HEADS (default: the shipped ones).
# TREE: tree shapes, ';'-separated (default 8,5,60), e.g. TREE="8,5,60;4,4,24;6,3,30".
set -u
cd "$(dirname "$0")/../.."
source scripts/device/env.sh
python3 -c "from eagle_zoo.default_target import resolve_default as r; print(r('$TARGET'))" > /dev/null || exit 1
H=${HEADS:-plugins/eagle-zoo-smollm2-heads/eagle_zoo_smollm2_heads/heads}
VAR=${AB_VAR:-EAGLE_ZOO_TRITON_LINEAR}
for v in ${SETTINGS:-1 0}; do
  echo "== $VAR=$v"
  env "$VAR=$v" timeout ${AB_TIMEOUT:-200} python3 -m eagle_zoo.cli bench --perf --model "$TARGET" \
    --eagle "$H/eagle" --eagle3 "$H/eagle3" --max-tokens 256 --num-prompts ${PROMPTS:-10} --ks 3 --batch-sizes "" \
    --tree "${TREE:-8,5,60}" --json "$OUT/perf-$VAR-$v.json" 2>&1 | grep -v "it/s\]" | grep -v -i warn \
    || echo "perf bench ($VAR=$v) failed or timed out (rows so far above)"
done
