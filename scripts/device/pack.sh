#!/usr/bin/env bash
# Prepares .device/ (git-ignored) for a GPU session: the GGUF in parts, the
# wheels the GPU image lacks, the training prompts. `pack.sh --pristine` only refreshes
# .device/pristine: the committed versions of the files modified in the working tree,
# which env.sh puts back on the GPU machine so uncommitted edits never run there.
set -euo pipefail
cd "$(dirname "$0")/../.."
rm -rf .device/pristine && mkdir -p .device/pristine
# (files deleted from the working tree are left out: an EAGLE-3-only round sets the EAGLE-1
# head aside to make room, scripts/device/README.md, and must not carry it back in here)
git diff --name-only --diff-filter=d HEAD | while read -r f; do
  git cat-file -e "HEAD:$f" 2>/dev/null && mkdir -p ".device/pristine/$(dirname "$f")" && git show "HEAD:$f" > ".device/pristine/$f"
done
[ "${1:-}" = --pristine ] && { echo "pristine: $(find .device/pristine -type f | wc -l) files"; exit 0; }
# `pack.sh --init DIR`: DIR is the EAGLE-3 head a round starts from, set aside out of the
# tree with the EAGLE-1 head (both `mv`ed to /tmp/aside/): it travels as its own setup part,
# .device/init (setup.sh puts it in /root/m/init/eagle3; round.env's INIT_DIR=/root/m/init),
# with the prompts. The tree is then ~2 MB, so the GGUF goes in two parts: two setup.sh
# calls (.device/a, .device/init) before the working call that carries .device/last, and
# room in a call for a head of six layers (60 MB).
init=""
if [ "${1:-}" = --init ]; then
  init=${2:?"pack.sh --init DIR: DIR, the EAGLE-3 head to start from (e.g. /tmp/aside/eagle3)"}
  [ -f "$init/config.json" ] || { echo "pack.sh --init $init: no config.json there (expected an EAGLE-3 head directory)"; exit 1; }
  heads=plugins/eagle-zoo-smollm2-heads/eagle_zoo_smollm2_heads/heads
  [ -e $heads/eagle ] || [ -e $heads/eagle3 ] \
    && { echo "pack.sh --init: set both shipped heads aside first (mv $heads/eagle $heads/eagle3 /tmp/aside/)"; exit 1; }
fi
gguf=$(.venv/bin/python -c "import eagle_zoo.default_target as d; print(d.gguf_path())")
# Every call also carries the repo's working tree (70 MB since the six-layer EAGLE-3
# head), 64 MiB in all, so the GGUF travels in as many parts as that leaves room for:
# none with that tree, two of 49 MB with both shipped heads set aside. Parts
# go to .device/a, .device/b, ... (setup.sh calls; a also carries the wheels, b the
# prompts: 3.6 MB at most; with --init, .device/init carries the prompts), the last to .device/last, which the first working call carries.
# (du skips, and complains of, tracked files set aside: the total counts what travels)
tree=$( (git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- 2>/dev/null || true) | tail -1 | cut -f1)
room=$((64 * 1048576 - 1000000 - tree - 3600000))
[ "$room" -gt 2000000 ] || { echo "the working tree ($((tree / 1000000)) MB) leaves no room for GGUF parts in a 64-MiB call"; exit 1; }
size=$(stat -c %s "$gguf")
count=$(((size + room - 1) / room))
letters=(a b c d e f g h i j k l m n o p q r s t u v w x y z)
[ "$count" -le 26 ] || { echo "$count parts: more than setup.sh calls can be named (a .. z)"; exit 1; }
parts=("${letters[@]:0:count-1}" last)
rm -rf .device/[a-z] .device/last .device/tp
split -n ${#parts[@]} "$gguf" .device/gguf.part.  # gguf.part.aa, ab, ...: in the order of parts
i=0
for f in .device/gguf.part.*; do mkdir -p ".device/${parts[i]}" && mv "$f" ".device/${parts[i]}/"; i=$((i + 1)); done
mkdir -p .device/a/whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .device/a/whl pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 gguf==0.19.0
rm -rf .device/init
if [ -n "$init" ]; then
  mkdir -p .device/init/eagle3 && cp "$init"/* .device/init/eagle3/ && cp ../shared/data/train_prompts.jsonl .device/init/
  echo "init: $(du -sh .device/init | cut -f1) (setup.sh with .device/init too)"
else
  cp ../shared/data/train_prompts.jsonl .device/b/
fi
# .device/tp: what the tensor-parallel run needs without the GGUF (tokenizer files, wheels)
mkdir -p .device/tp/tokenizer && cp -r .device/a/whl .device/tp/
tok=$(.venv/bin/python -c "from eagle_zoo.default_target import resolve_default as r; print(r('HuggingFaceTB/SmolLM2-135M-Instruct'))")
cp "$tok"/tokenizer.json "$tok"/tokenizer_config.json .device/tp/tokenizer/
du -sh .device/*
# A call carries the working tree and one part (plus .device/pristine): check they fit
echo "${#parts[@]} parts: setup.sh with each of .device/${parts[0]} .. .device/${parts[count-2]}, then .device/last"
part=$(for p in "${parts[@]}" ${init:+init}; do du -sb ".device/$p"; done | sort -n | tail -1 | cut -f1)
echo "working tree $((tree / 1000000)) MB + largest part $((part / 1000000)) MB of the 64 MiB a call carries"
[ $((tree + part)) -lt $((64 * 1048576 - 1000000)) ] || { echo "too large for one call: split the GGUF into more parts above"; exit 1; }
