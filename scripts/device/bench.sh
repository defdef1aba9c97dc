#!/usr/bin/env bash
# GPU call 3: acceptance of the trained heads (MT-bench 80, k=3, greedy, 256 tokens,
# fp32 so the numbers match CPU runs) and the speed tables (bf16).
set -u
cd "$(dirname "$0")/../.."
source scripts/device/env.sh
H=/root/m/heads
for m in eagle eagle3; do
  python3 -m eagle_zoo.cli bench --model "$TARGET" --draft "$H/$m" --num-spec-tokens 3 --num-prompts 80 \
    --max-tokens 256 --max-num-seqs 80 --dtype float32 --compare-plain \
    --json "$OUT/accept_$m.json" --plot "$OUT/accept_$m.png" || echo "acceptance bench $m failed"
done
python3 -m eagle_zoo.cli bench --perf --model "$TARGET" --eagle "$H/eagle" --eagle3 "$H/eagle3" --num-prompts 10 \
  --max-tokens 256 --ks 1,3,5 --batch-sizes 1,4,16,64 --hf-prompts 2 --floor --json "$OUT/perf.json" \
  || echo "perf bench failed"
