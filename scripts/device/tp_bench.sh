#!/usr/bin/env bash
# Tensor parallelism on the nvidia-h200-x2 kind (2 H200s of one host); after setup.sh
# (carry .device/a) and with .device/b carried (env.sh joins the GGUF).
#
#   bash scripts/device/tp_bench.sh            all parts: more than one 10-minute call
#   PARTS="smol write" bash scripts/device/tp_bench.sh, then PARTS=tp, then PARTS=examples
#   (files under /root/m survive between calls while the lease stays warm)
#
# smol     SmolLM2-135M plain, TP 1, batch 1 and 16; then TP 2, which must fail with the
#          clear error (9 attention heads do not split over 2 ranks)
# write    a random-weight Llama-3-8B-shaped target (SmolLM2 vocabulary and tokenizer)
#          and random EAGLE-1 / EAGLE-3 heads for it, under /root/m/tp (SHAPE=1b: smaller)
# tp       that target plain, TP 1 vs TP 2, batch 1 and 16 (CUDA graphs; EAGER=1: eager)
# examples the seed's two multi-GPU examples as written, model names changed:
#          EAGLE with draft TP 1 and EAGLE-3 with draft TP 2, target TP 2
# Without the GGUF (one call, carry .device/tp: tokenizer files + wheels):
#   TP_ONLY=1 PARTS="write tp examples" bash scripts/device/tp_bench.sh   (carry .device/tp .device/pristine)
# Results: /root/m/tp/results.jsonl and a markdown table at the end (for BENCHMARKS.md).
set -uo pipefail
if [ "${TP_ONLY:-0}" = 1 ]; then  # no GGUF: the wheels and the tokenizer from .device/tp
  mkdir -p /root/m/site
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /root/m/site .device/tp/whl/*.whl
  [ -d .device/pristine ] && cp -r .device/pristine/. ./  # committed code only (see pack.sh)
  export TOKENIZER=$PWD/.device/tp/tokenizer PYTHONPATH=/root/m/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
else
  source scripts/device/env.sh
fi
PARTS=${PARTS:-"smol write tp examples"}
SHAPE=${SHAPE:-8b}
OUT=/root/m/tp
RES=$OUT/results.jsonl
mkdir -p $OUT
nvidia-smi --query-gpu=index,name,memory.total --format=csv
eager=${EAGER:+--eager}
B="python3 scripts/device/tp_bench.py"

for part in $PARTS; do
  echo "== $part"
  case $part in
    smol)
      timeout 300 $B bench "$TARGET" --label SmolLM2-135M --tp 1 --json $RES $eager
      timeout 120 $B bench "$TARGET" --label SmolLM2-135M --tp 2 --json $RES $eager 2>&1 | tail -3 ;;
    write)
      timeout 400 $B write $OUT/$SHAPE --shape $SHAPE ${TOKENIZER:+--tokenizer $TOKENIZER} ;;
    tp)
      for tp in 1 2; do timeout 500 $B bench $OUT/$SHAPE/target --label "llama-$SHAPE-random" --tp $tp --json $RES $eager; done ;;
    examples)
      timeout 300 $B example $OUT/$SHAPE/target --tp 2 \
        --spec "{\"model\": \"$OUT/$SHAPE/eagle\", \"draft_tensor_parallel_size\": 1, \"num_speculative_tokens\": 2, \"method\": \"eagle\"}"
      timeout 300 $B example $OUT/$SHAPE/target --tp 2 \
        --spec "{\"model\": \"$OUT/$SHAPE/eagle3\", \"draft_tensor_parallel_size\": 2, \"num_speculative_tokens\": 2, \"method\": \"eagle3\"}" ;;
  esac
done
[ -f $RES ] && $B report $RES
