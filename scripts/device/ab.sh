#!/usr/bin/env bash
# A change before and after, in one call: CMD (one bash command line) run in a worktree of
# commit REV ("old") and in the working tree ("new"), alternating old, new, old, new, so
# both sides share the machine and its minutes. CMD runs from its tree's root with
# PYTHONPATH=/root/m/site:<that tree>, and sees SIDE (old / new) and ROUND (1 / 2) to name
# its outputs, e.g. $OUT/bench-$SIDE-$ROUND.json. The wheels must be installed already
# (setup.sh, or env.sh in CMD for what needs the GGUF).
#   bash scripts/device/ab.sh REV 'CMD'
set -u
cd "$(dirname "$0")/../.."
rev=${1:?usage: ab.sh REV CMD} cmd=${2:?usage: ab.sh REV CMD}
rm -rf /tmp/ab-old && git -c safe.directory='*' worktree prune
if ! git -c safe.directory='*' cat-file -e "$rev^{commit}" 2>/dev/null && [ -f .device/commits.bundle ]; then
  # The machine's checkout predates REV: the commits the call carried (commits.sh).
  git -c safe.directory='*' fetch -q .device/commits.bundle HEAD || exit 1
fi
git -c safe.directory='*' worktree add -f /tmp/ab-old "$rev" > /dev/null || exit 1
for ROUND in 1 2; do
  for SIDE in old new; do
    dir=$PWD; [ $SIDE = old ] && dir=/tmp/ab-old
    (cd "$dir" && export SIDE ROUND PYTHONPATH=/root/m/site:$dir && eval "$cmd") || echo "$SIDE $ROUND: exit $?"
  done
done
