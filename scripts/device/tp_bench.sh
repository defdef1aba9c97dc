#!/usr/bin/env bash
# Tensor parallelism on the nvidia-h200-x2 kind (2 H200s of one host).
#
#   bash scripts/device/tp_bench.sh            all parts: more than one 10-minute call
#   PARTS="smol write" bash scripts/device/tp_bench.sh, then PARTS=tp, then PARTS=examples
#   (files under /root/m survive between calls while the machine stays warm)
#
# smol     SmolLM2-135M plain, TP 1, batch 1 and 16; then TP 2, which must fail with the
#          clear error (9 attention heads do not split over 2 ranks)
# write    a random-weight Llama-3-8B-shaped target (SmolLM2 vocabulary and tokenizer)
#          and random EAGLE-1 / EAGLE-3 heads for it, under /root/m/tp (SHAPE=1b: smaller)
# tp       that target plain, TP 1 vs TP 2, batch 1 and 16 (CUDA graphs; EAGER=1: eager)
# examples two multi-GPU speculative setups on that target at TP 2: EAGLE with draft
#          TP 1 and EAGLE-3 with draft TP 2
# With the GGUF: after pack.sh's setup.sh chain, the first call carries the last part
# (env.sh joins it). Without it (the random-weight parts only), one call carrying
# .device/p00 (pack.sh's wheels and tokenizer):
#   TP_ONLY=1 PARTS="write tp examples" bash scripts/device/tp_bench.sh
# Results: /root/m/tp/results.jsonl (copied to $OUT) and a markdown table at the end.
# The TP workers can outlive a killed shell: redirect to a file, not a pipe, e.g.
#   timeout -k 5 520 bash scripts/device/tp_bench.sh > /tmp/tp.log 2>&1; tail -c 10000 /tmp/tp.log
set -uo pipefail
cd "$(dirname "$0")/../.."
if [ "${TP_ONLY:-0}" = 1 ]; then  # no GGUF: the wheels and the tokenizer from .device/p00
  mkdir -p /root/m/site /root/m/tokenizer
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /root/m/site .device/p00/whl/*.whl
  gunzip -c .device/p00/tokenizer/tokenizer.json.gz > /root/m/tokenizer/tokenizer.json
  cp .device/p00/tokenizer/tokenizer_config.json /root/m/tokenizer/
  export TOKENIZER=/root/m/tokenizer PYTHONPATH=/root/m/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
else
  source scripts/device/env.sh
fi
PARTS=${PARTS:-"smol write tp examples"}
SHAPE=${SHAPE:-8b}
TP=/root/m/tp
RES=$TP/results.jsonl
mkdir -p $TP
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
      timeout 400 $B write $TP/$SHAPE --shape $SHAPE ${TOKENIZER:+--tokenizer $TOKENIZER} ;;
    tp)
      for tp in 1 2; do timeout 500 $B bench $TP/$SHAPE/target --label "llama-$SHAPE-random" --tp $tp --json $RES $eager; done ;;
    examples)
      timeout 300 $B example $TP/$SHAPE/target --tp 2 \
        --spec "{\"model\": \"$TP/$SHAPE/eagle\", \"draft_tensor_parallel_size\": 1, \"num_speculative_tokens\": 2, \"method\": \"eagle\"}"
      timeout 300 $B example $TP/$SHAPE/target --tp 2 \
        --spec "{\"model\": \"$TP/$SHAPE/eagle3\", \"draft_tensor_parallel_size\": 2, \"num_speculative_tokens\": 2, \"method\": \"eagle3\"}" ;;
  esac
done
[ -f $RES ] && $B report $RES
[ -f $RES ] && [ -n "${OUT:-}" ] && cp $RES "$OUT/"  # comes back with the call
