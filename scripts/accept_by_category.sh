#!/usr/bin/env bash
# MT-bench acceptance of one head per question category (issue 6: where the heads fall
# short). The 80 shipped questions split into their 8 categories of 10, then for each
# `eagle-zoo bench` (first turn, chat template, greedy, k = 3, 256 new tokens, fp32, the
# 10 questions decoded together). CPU by default (about 4 minutes a head on 2 cores).
#   bash scripts/accept_by_category.sh [HEAD] [DEVICE]
#   HEAD defaults to eagle-zoo/EAGLE3-SmolLM2-135M-Instruct, DEVICE to cpu
set -euo pipefail
cd "$(dirname "$0")/.."
HEAD=${1:-eagle-zoo/EAGLE3-SmolLM2-135M-Instruct}
DEVICE=${2:-cpu}
PY=${PYTHON:-.venv/bin/python}
source scripts/lib/accept_row.sh
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$PY" - "$dir" <<'PY'
import json, sys
from importlib.resources import files
rows = [json.loads(l) for l in files("eagle_zoo").joinpath("data/mt_bench.jsonl").read_text().splitlines() if l.strip()]
for row in rows:
    with open(f"{sys.argv[1]}/{row['category']}.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")
PY
for c in writing roleplay reasoning math coding extraction stem humanities; do
  echo "$c: $(accept_row "$HEAD" "$dir/$c.jsonl" "$DEVICE")"
done
