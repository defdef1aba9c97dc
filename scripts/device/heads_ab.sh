#!/usr/bin/env bash
# Two draft heads on the same prompts in one call: `eagle-zoo bench ARGS` with --draft OLD,
# then NEW, twice (old, new, old, new), so both share the machine and its minutes; each run
# times its own plain decoding beside its head. How a trained head is judged against the
# shipped one before it ships (docs/training.md: on the dev set, never on a benchmark).
#   bash scripts/device/heads_ab.sh OLD_HEAD NEW_HEAD BENCH_ARGS...
# e.g. after train.sh (the GGUF in place; env.sh is sourced here):
#   bash scripts/device/heads_ab.sh plugins/eagle-zoo-smollm2-heads/eagle_zoo_smollm2_heads/heads/eagle \
#     /root/m/heads/eagle --method eagle --num-spec-tokens 3 --dataset dev --per-category 10 \
#     --num-prompts 110 --by-category --max-tokens 256 --max-num-seqs 1 --max-model-len 4096
# Results: $OUT/heads-{old,new}-{1,2}.json, each run's speed-up and acceptance lines here.
# RUN_SECONDS (default 150) bounds each run. ENV=0 skips env.sh (a machine with the
# target installed, e.g. a CPU check with --device cpu).
set -u
cd "$(dirname "$0")/../.."
old=${1:?usage: heads_ab.sh OLD_HEAD NEW_HEAD BENCH_ARGS...} new=${2:?usage: heads_ab.sh OLD_HEAD NEW_HEAD BENCH_ARGS...}
shift 2
[ "${ENV:-1}" = 1 ] && source scripts/device/env.sh
: "${OUT:?set OUT (the folder the results go to)}"
for head in "$old" "$new"; do
  [ -f "$head/config.json" ] || { echo "heads_ab.sh: no head at $head (no config.json)"; exit 1; }
done
for round in 1 2; do
  for side in old new; do
    head=$old; [ $side = new ] && head=$new
    log=$OUT/heads-$side-$round.log
    timeout "${RUN_SECONDS:-150}" python3 -m eagle_zoo.cli bench --model HuggingFaceTB/SmolLM2-135M-Instruct \
      --draft "$head" "$@" --json "$OUT/heads-$side-$round.json" > "$log" 2>&1 || echo "$side $round: exit $?"
    echo "== $side $round ($head)"
    grep -i "^mean acceptance length:\|speed-up" "$log" | head -2
    rm -f "$log"
  done
done
