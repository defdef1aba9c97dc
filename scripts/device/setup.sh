#!/usr/bin/env bash
# One setup call on the GPU machine: copies the GGUF part and wheels this call carries
# (.device/pNN from pack.sh) to /root/m, which lasts while the machine stays warm.
set -euo pipefail
mkdir -p /root/m/site
for part in .device/*/gguf.part.*; do [ -f "$part" ] && cp "$part" /root/m/; done
if compgen -G ".device/*/whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /root/m/site .device/*/whl/*.whl
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
ls -la /root/m
