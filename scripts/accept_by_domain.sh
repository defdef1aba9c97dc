#!/usr/bin/env bash
# Acceptance of one head by prompt domain (issue 6: is the gap to the MT-bench goal the
# head or the data?). Ten prompts each, decoded together with `eagle-zoo bench` (chat
# template, greedy, k = 3, 256 new tokens, fp32):
#   gsm8k-train, gpteacher-codegen, gpteacher-roleplay   the last 10 of each source in the
#                                                        training prompt file (the domains
#                                                        the heads were trained on)
#   self-instruct    10 user turns the target writes (`eagle-zoo train prompts`, seed 7),
#                    the distribution of the heads' self-instruct data, not its prompts
#   openers          the same with --openers (explanations, comparisons, writing tasks)
#   mt-bench         the first 10 MT-bench questions of the shipped copy
# CPU by default (~1 minute a domain on 2 cores).
#   bash scripts/accept_by_domain.sh TRAIN_PROMPTS.jsonl [HEAD] [DEVICE]
set -euo pipefail
cd "$(dirname "$0")/.."
PROMPTS=${1:?usage: $0 TRAIN_PROMPTS.jsonl [HEAD] [DEVICE]   (e.g. ../shared/data/train_prompts.jsonl)}
HEAD=${2:-eagle-zoo/EAGLE3-SmolLM2-135M-Instruct}
DEVICE=${3:-cpu}
PY=${PYTHON:-.venv/bin/python}
source scripts/lib/accept_row.sh
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$PY" - "$PROMPTS" "$dir" <<'PY'
import json, sys
from collections import defaultdict
from importlib.resources import files
by_source = defaultdict(list)
for line in open(sys.argv[1]):
    if line.strip():
        row = json.loads(line)
        by_source[row["source"]].append(row["prompt"])
for source, prompts in by_source.items():
    with open(f"{sys.argv[2]}/{source}.jsonl", "w") as f:
        f.writelines(json.dumps({"prompt": p}) + "\n" for p in prompts[-10:])
mt = [l for l in files("eagle_zoo").joinpath("data/mt_bench.jsonl").read_text().splitlines() if l.strip()]
open(f"{sys.argv[2]}/mt-bench.jsonl", "w").write("\n".join(mt[:10]) + "\n")
PY
synth() {  # synth NAME ARGS...: 10 self-instruct prompts of seed 7
  local name=$1; shift
  "$PY" -m eagle_zoo.cli train prompts --target smollm2 --out "$dir/$name.all" --device "$DEVICE" \
    --max-new-tokens 128 --seed 7 --no-progress "$@" > /dev/null
  head -10 "$dir/$name.all" > "$dir/$name.jsonl"
}
synth self-instruct --num 24 --batch-size 32
synth openers --num 16 --batch-size 16 --openers "Explain,Write a,Describe,Compare,Summarize,Imagine,Discuss,How does"
for c in gsm8k-train gpteacher-codegen gpteacher-roleplay self-instruct openers mt-bench; do
  [ -f "$dir/$c.jsonl" ] || continue
  echo "$c: $(accept_row "$HEAD" "$dir/$c.jsonl" "$DEVICE")"
done
