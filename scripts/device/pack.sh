#!/usr/bin/env bash
# Prepares .device/ (git-ignored) for a GPU session: the GGUF in five parts, the
# wheels the GPU image lacks, the training prompts. `pack.sh --pristine` only refreshes
# .device/pristine: the committed versions of the files modified in the working tree,
# which env.sh puts back on the GPU machine so uncommitted edits never run there.
set -euo pipefail
cd "$(dirname "$0")/../.."
rm -rf .device/pristine && mkdir -p .device/pristine
git diff --name-only HEAD | while read -r f; do
  git cat-file -e "HEAD:$f" 2>/dev/null && mkdir -p ".device/pristine/$(dirname "$f")" && git show "HEAD:$f" > ".device/pristine/$f"
done
[ "${1:-}" = --pristine ] && { echo "pristine: $(find .device/pristine -type f | wc -l) files"; exit 0; }
gguf=$(.venv/bin/python -c "import eagle_zoo.default_target as d; print(d.gguf_path())")
rm -rf .device/a .device/b .device/c .device/d .device/e .device/tp && mkdir -p .device/a/whl .device/b .device/c .device/d .device/e
# Five parts: every call also carries the repo's working tree (41 MB since the two-layer
# EAGLE-3 head), 64 MiB in all; parts a and b also carry the wheels and the prompts (3 MB each).
split -b 20000000 "$gguf" .device/gguf.part.
for p in a b c d e; do mv .device/gguf.part.a$p .device/$p/; done
[ ! -e .device/gguf.part.af ] || { echo "the GGUF needs more than five parts of 20 MB: change the split above"; exit 1; }
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .device/a/whl pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 gguf==0.19.0
cp ../shared/data/train_prompts.jsonl .device/b/
# .device/tp: what the tensor-parallel run needs without the GGUF (tokenizer files, wheels)
mkdir -p .device/tp/tokenizer && cp -r .device/a/whl .device/tp/
tok=$(.venv/bin/python -c "from eagle_zoo.default_target import resolve_default as r; print(r('HuggingFaceTB/SmolLM2-135M-Instruct'))")
cp "$tok"/tokenizer.json "$tok"/tokenizer_config.json .device/tp/tokenizer/
du -sh .device/*
