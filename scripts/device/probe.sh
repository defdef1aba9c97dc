#!/usr/bin/env bash
# First call of a lease (carry .device/a): setup.sh, then what the next data round's
# settings depend on, all on random weights (no GGUF needed):
#   - the training GPU tests (no host sync in a step, with the forward, cached and spilled
#     features)
#   - data_profile.py: generated tokens/s of the static loop by batch size -> GEN_BATCH /
#     SYNTH_BATCH (host-bound if a larger batch gives more tokens a second)
#   - train_profile.py: an EAGLE-3 step with the forward, cached and half-spilled features
# Each part is time-boxed so the call ends well inside the device tool's 600 s.
set -u
cd "$(dirname "$0")/../.."
bash scripts/device/setup.sh > /tmp/setup.log 2>&1 || { tail -20 /tmp/setup.log; exit 1; }
export PYTHONPATH=/root/m/site:$PWD PYTHONUNBUFFERED=1
timeout 150 python3 -m pytest -q -m gpu tests/test_train.py 2>&1 | tail -4
cd scripts/device
timeout 150 python3 data_profile.py --top 6 2>&1 | grep -v "Writing model shards"
timeout 180 python3 train_profile.py --method eagle3 --cache-features --spill 0.5 --steps 8 --top 6 2>&1 \
  | grep -v "Writing model shards"
