#!/usr/bin/env bash
# A change's step costs before and after, in one call: the `--step-costs` tables (random
# weights, no GGUF) of commit REV and of the working tree through ab.sh (alternating twice).
# Each run warms up before it times; the first run also compiles the Triton kernels, so
# give the call ~4 minutes a shape. Needs .device/p00 carried (the wheels; setup.sh is run here).
#   bash scripts/device/step_costs_ab.sh REV [SHAPES]      (SHAPES: smollm2 (default), 8b, smollm2,8b)
#   BATCH=16 bash scripts/device/step_costs_ab.sh REV     (steps of 16 requests: --step-cost-batch; unset, batch 1)
#   MAX_MODEL_LEN=8192 bash scripts/device/step_costs_ab.sh REV   (caches of 8192 tokens: --perf-max-model-len;
#                                                     unset, what the timed steps need)
# Results: $OUT/steps-{old,new}-{1,2}.json, and each run's tables under its label.
set -u
cd "$(dirname "$0")/../.."
rev=${1:?usage: step_costs_ab.sh REV [SHAPES]}
export SHAPES=${2:-smollm2} BATCH=${BATCH:-} MAX_MODEL_LEN=${MAX_MODEL_LEN:-} SUMMARY=$PWD/scripts/device/step_costs_summary.py
bash scripts/device/setup.sh > /dev/null
bash scripts/device/ab.sh "$rev" 'json=$OUT/steps-$SIDE-$ROUND.json
  timeout 200 python3 -m eagle_zoo.cli bench --perf --step-costs "$SHAPES" ${BATCH:+--step-cost-batch "$BATCH"} ${MAX_MODEL_LEN:+--perf-max-model-len "$MAX_MODEL_LEN"} --tree 6,3,30 --ks "" --batch-sizes "" \
    --json "$json" > "$json.log" 2>&1 && python3 "$SUMMARY" "$json" "$SIDE $ROUND" \
  || { echo "$SIDE $ROUND failed: tail of $json.log"; tail -5 "$json.log"; }'
