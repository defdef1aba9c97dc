#!/usr/bin/env bash
# Before / after on the GPU in one call: the GPU kernel tests, then the same batch-1
# speed rows (plain, EAGLE-1 and EAGLE-3 chains, k = 3, 10 MT-bench prompts, 256 tokens,
# bf16) for the code in .device/before (eagle_zoo/ and kernels/ of an older commit:
# `bash scripts/device/ab.sh --pack COMMIT` here) and for this tree.
# After setup.sh x7; carry .device/last, .device/before (and .device/pristine).
set -u
cd "$(dirname "$0")/../.."
if [ "${1:-}" = --pack ]; then
  rm -rf .device/before && mkdir -p .device/before
  git archive "${2:?commit}" eagle_zoo kernels | tar -x -C .device/before
  echo "before: $(git log -1 --format='%h %s' "$2")"; exit 0
fi
source scripts/device/env.sh
python3 -c "from eagle_zoo.default_target import resolve_default as r; print(r('$TARGET'))" || exit 1
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py -m gpu 2>&1 | tail -4
H=$PWD/plugins/eagle-zoo-smollm2-heads/eagle_zoo_smollm2_heads/heads
for side in before after; do
  # `python -m` puts the working directory first on sys.path: run each side from its tree
  path=$PWD; [ $side = before ] && path=$PWD/.device/before
  echo "== $side"
  (cd "$path" && PYTHONPATH=$path:/root/m/site timeout ${AB_TIMEOUT:-200} python3 -m eagle_zoo.cli bench --perf --model "$TARGET" \
    --eagle $H/eagle --eagle3 $H/eagle3 --num-prompts 10 --max-tokens 256 --ks 3 --batch-sizes "${AB_BATCHES:-}" \
    --json "$OUT/ab-$side.json" > "$OUT/ab-$side.log" 2>&1)
  grep '^{"' "$OUT/ab-$side.log" || tail -20 "$OUT/ab-$side.log"
done
