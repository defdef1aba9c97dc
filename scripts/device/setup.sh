#!/usr/bin/env bash
# GPU setup calls: whatever part of .device/ the call carries -> /root/m
# (GGUF parts, the wheels the GPU image lacks, the training prompts). The repo itself
# (55.8 MB with the shipped heads) travels with every call, so the GGUF travels in the
# parts pack.sh makes (fifteen of 6.5 MB): setup calls (.device/a .. .device/n) made back to
# back, and the first working call carries .device/last; env.sh joins the parts.
set -euo pipefail
mkdir -p /root/m/site
for part in .device/*/gguf.part.*; do [ -f "$part" ] && cp "$part" /root/m/; done
for f in .device/*/train_prompts.jsonl; do [ -f "$f" ] && cp "$f" /root/m/; done
if compgen -G ".device/a/whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /root/m/site .device/a/whl/*.whl
  nvidia-smi --query-gpu=name,memory.total --format=csv
fi
ls -la /root/m
echo "setup done"
