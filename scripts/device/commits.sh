#!/usr/bin/env bash
# The latest commits as a git bundle, .device/commits.bundle (git-ignored), for ab.sh on a
# GPU machine whose checkout predates them: a call brings the working tree's files, not new
# commits. Carry the bundle in the call that runs ab.sh (or step_costs_ab.sh); ab.sh fetches
# from it when REV is not there. The machine's checkout must hold the bundle's base,
# HEAD~COMMITS (default 60).
#   bash scripts/device/commits.sh     then carry .device/commits.bundle
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .device
git bundle create -q .device/commits.bundle "HEAD~${COMMITS:-60}..HEAD"
ls -la .device/commits.bundle
