#!/usr/bin/env bash
# GPU call 1: part one of the GGUF, the wheels, the prompts -> /root/m.
set -euo pipefail
mkdir -p /root/m/site
cp .device/a/gguf.part.aa .device/a/train_prompts.jsonl /root/m/
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /root/m/site .device/a/whl/*.whl
nvidia-smi --query-gpu=name,memory.total --format=csv
echo "setup done"
