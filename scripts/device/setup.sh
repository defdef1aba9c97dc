#!/usr/bin/env bash
# GPU setup calls: whatever part of .device/ the call carries -> /root/m
# (GGUF parts, the wheels the GPU image lacks, the training prompts). The repo itself
# (54.6 MB with the EAGLE-1 head set aside, which every call now needs) travels with every
# call, so the GGUF travels in the parts pack.sh makes (thirteen of 7.6 MB): setup calls
# (.device/a .. .device/l) made back to back, and the first working call carries
# .device/last; env.sh joins the parts.
set -euo pipefail
mkdir -p /root/m/site
for part in .device/*/gguf.part.*; do [ -f "$part" ] && cp "$part" /root/m/; done
for f in .device/*/train_prompts.jsonl; do [ -f "$f" ] && cp "$f" /root/m/; done
# the head a round starts from, when pack.sh --init sent it as a part of its own
if [ -d .device/init/eagle3 ]; then mkdir -p /root/m/init && rm -rf /root/m/init/eagle3 && cp -r .device/init/eagle3 /root/m/init/; fi
if compgen -G ".device/a/whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /root/m/site .device/a/whl/*.whl
  nvidia-smi --query-gpu=name,memory.total --format=csv
fi
ls -la /root/m
echo "setup done"
