#!/usr/bin/env bash
# Prepares .device/ (git-ignored) for a chain of GPU calls: the embedded target's GGUF cut
# into parts .device/p00, p01, ... that each fit in one call beside the working tree (a
# call carries 64 MiB in all), and in p00 also the wheels the GPU image lacks (whl/) and
# SmolLM2's tokenizer (tokenizer/, for tp_bench.sh's TP_ONLY=1). Prints the chain to run.
#
#   bash scripts/device/pack.sh        (PYTHON=... for an interpreter other than .venv's)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
gguf=$("$PY" -c "import eagle_zoo.default_target as d; print(d.gguf_path())")
tree=$( (git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- 2>/dev/null || true) | tail -1 | cut -f1)
room=$((64 * 1048576 - 5000000 - tree))  # 5 MB for the wheels, the tokenizer and slack
[ "$room" -gt 8000000 ] || { echo "pack.sh: the working tree ($((tree / 1000000)) MB) leaves no room for GGUF parts"; exit 1; }
count=$(( ($(stat -c %s "$gguf") + room - 1) / room ))
rm -rf .device && mkdir -p .device
split -n "$count" -d "$gguf" .device/gguf.part.
for f in .device/gguf.part.*; do n=${f##*.}; mkdir -p ".device/p$n" && mv "$f" ".device/p$n/"; done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .device/p00/whl pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 gguf==0.19.0
# The tokenizer of the converted target (converted here once if it is not cached yet).
tok=$("$PY" -c "from eagle_zoo.default_target import resolve_default as r; print(r('HuggingFaceTB/SmolLM2-135M-Instruct'))")
mkdir -p .device/p00/tokenizer
gzip -c "$tok/tokenizer.json" > .device/p00/tokenizer/tokenizer.json.gz
cp "$tok/tokenizer_config.json" .device/p00/tokenizer/
du -sh .device/p*
last=$(printf 'p%02d' $((count - 1)))
echo "working tree $((tree / 1000000)) MB; $count parts. Chain (each call right after the one before):"
for ((i = 0; i < count - 1; i++)); do printf '  bash scripts/device/setup.sh      carry .device/p%02d\n' "$i"; done
echo "  then the first working call (train.sh, bench.sh, tp_bench.sh, ...) carries .device/$last;"
echo "  later calls need no carry while the machine stays warm"
