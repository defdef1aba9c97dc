#!/usr/bin/env bash
# A change's step costs before and after, in one call: the `--step-costs` tables (random
# weights, no GGUF) of commit REV (checked out in a worktree) and of the working tree,
# alternating REV, tree, REV, tree, so both sides share the machine and its minutes. Each
# run warms up before it times; the first run also compiles the Triton kernels, so give the
# call ~4 minutes a shape. Needs .device/p00 carried (the wheels; setup.sh is run here).
#   bash scripts/device/step_costs_ab.sh REV [SHAPES]      (SHAPES: smollm2 (default), 8b, smollm2,8b)
# Results: $OUT/steps-{old,new}-{1,2}.json and one summary line per strategy and run.
set -u
cd "$(dirname "$0")/../.."
rev=${1:?usage: step_costs_ab.sh REV [SHAPES]} shapes=${2:-smollm2}
bash scripts/device/setup.sh > /dev/null
rm -rf /tmp/ab-old && git -c safe.directory='*' worktree prune
git -c safe.directory='*' worktree add -f /tmp/ab-old "$rev" > /dev/null || exit 1
for round in 1 2; do
  for side in old new; do
    dir=$PWD; [ $side = old ] && dir=/tmp/ab-old
    json=$OUT/steps-$side-$round.json
    (cd "$dir" && PYTHONPATH=/root/m/site:$dir timeout 200 python3 -m eagle_zoo.cli bench --perf \
      --step-costs "$shapes" --tree 6,3,30 --ks '' --batch-sizes '' --json "$json" > "$json.log" 2>&1) \
      || { echo "$side $round failed: tail of $json.log"; tail -5 "$json.log"; continue; }
    python3 - "$json" "$side $round" <<'PY'
import json, sys
for table in json.load(open(sys.argv[1]))["step_costs"]:
    for r in table.get("rows", []):
        graphs = ", ".join(f"{k} {v:.1f}" for k, v in r["graphs_us"].items())
        print(f"{sys.argv[2]} {table['shape']} {r['strategy']}: step {r['step_us']:.1f} us ({r['vs_plain']:.3f}x plain), "
              f"GPU busy {r['gpu_busy_us']:.1f}, host {r['host_us']:.1f}, {r['kernels']:.0f} kernels; {graphs}")
PY
  done
done
