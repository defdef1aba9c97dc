#!/usr/bin/env bash
# Prepares .device/ (git-ignored) for a GPU session: the GGUF in two parts, the
# wheels the GPU image lacks, the training prompts.
set -euo pipefail
cd "$(dirname "$0")/../.."
gguf=$(.venv/bin/python -c "import eagle_zoo.default_target as d; print(d.gguf_path())")
rm -rf .device && mkdir -p .device/a/whl .device/b
split -b 50000000 "$gguf" .device/gguf.part.
mv .device/gguf.part.aa .device/a/ && mv .device/gguf.part.ab .device/b/
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .device/a/whl pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 gguf==0.19.0
cp ../shared/data/train_prompts.jsonl .device/a/
du -sh .device/a .device/b
