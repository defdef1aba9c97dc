#!/usr/bin/env bash
# One long GPU job over several device calls, with no resume in between (a resumed
# training run builds its feature cache again: ~35-45 s a call).
#   detach.sh start SECONDS CMD...   copy the repo to /root/m/repo, run CMD there in a
#                                    process session of its own (it outlives this call;
#                                    the lease stays warm while the next call follows
#                                    within 30 s), then follow it like `wait`
#   detach.sh wait SECONDS           follow its log until it ends or SECONDS pass
#   detach.sh stop                   create /root/m/stop, the job's STOP_FILE: training
#                                    ends at its next step and saves its heads as at the
#                                    end of TRAIN_SECONDS; then wait up to 120 s
# When the job has ended, /root/m/heads (its OUT) and the job's log are copied to $OUT.
set -u
cd "$(dirname "$0")/../.."
JOB=/root/m/job
follow() {  # follow SECONDS: print the log as it grows, until the job ends or SECONDS pass
  local end=$((SECONDS + $1)) seen=0 n
  while :; do
    n=$(wc -l < "$JOB.log" 2>/dev/null || echo 0)
    [ "$n" -gt "$seen" ] && sed -n "$((seen + 1)),${n}p" "$JOB.log" && seen=$n
    [ -f "$JOB.rc" ] && break
    [ $SECONDS -ge $end ] && { echo "[detach] still running after $1 s"; return 0; }
    sleep 5
  done
  echo "[detach] job ended with exit $(cat "$JOB.rc")"
  cp -r /root/m/heads/. "$OUT"/ 2>/dev/null
  cp "$JOB.log" "$OUT/job.log"
  find "$OUT" -type f -printf '  %p %s bytes\n'
}
case "${1:-}" in
  start)
    secs=${2:?usage: detach.sh start SECONDS CMD...}; shift 2
    [ -f "$JOB.rc" ] || [ ! -f "$JOB.log" ] || { echo "[detach] a job is already running"; exit 1; }
    rm -rf /root/m/repo "$JOB.rc" /root/m/stop && mkdir -p /root/m/repo \
      && tar -cf - --exclude=./.git --exclude=./.venv . | tar -xf - -C /root/m/repo
    (cd /root/m/repo && OUT=/root/m/job-out STOP_FILE=/root/m/stop setsid nohup bash -c '"$@"; echo $? > '"$JOB.rc" detached "$@" \
       > "$JOB.log" 2>&1 < /dev/null &)
    echo "[detach] started: $*"
    follow "$secs" ;;
  wait) follow "${2:?usage: detach.sh wait SECONDS}" ;;
  stop)
    touch /root/m/stop && echo "[detach] /root/m/stop created"
    follow 120 ;;
  *) echo "usage: detach.sh start SECONDS CMD... | wait SECONDS | stop"; exit 2 ;;
esac
