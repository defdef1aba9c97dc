#!/usr/bin/env bash
# Train the SmolLM2-135M-Instruct EAGLE-1 and EAGLE-3 heads on one H200 in ~7 minutes.
#
#   scripts/train_smollm2_heads.sh TARGET_DIR PROMPTS.jsonl [OUT]     (OUT defaults to $OUT)
#
# 0. prompts (SYNTH_PROMPTS > 0) the target writes that many self-instruct user turns
#           (`eagle-zoo train prompts`), interleaved with PROMPTS: chat and writing
#           requests besides the file's math, code and role play.
# 1. data   the target regenerates answers (chat template, 256 new tokens): greedy
#           over all prompts and sampled (T=0.7, top-p 0.9) over the same prompts with
#           another seed (SPLIT_GREEDY=1: greedy over each half of the prompts), two
#           processes side by side on the GPU, each time-boxed.
# 2. train  EAGLE-1 and EAGLE-3 (TTT, 7 steps, draft vocab 12000) side by side (HEADS), each
#           time-boxed; a failure in one leaves the other alone.
# 3. save   $OUT/eagle  yuhuili EAGLE-1 (config.json, model.safetensors)
#           $OUT/eagle3 yuhuili EAGLE-3 (config.json, 2 shards + index)
#           $OUT/report.tar.gz  logs, training records, data stats, the speculators
#           layout's config.json (its weights are the eagle3 ones renamed: rebuild it
#           with `eagle-zoo convert to-speculators`, see docs/training.md)
# Only 8 files come back from the GPU machine: that is why the layout above is lean.
# Everything else (data, full outputs, resumable states) stays in $WORK.
#
# Knobs (environment): DATA_SECONDS TRAIN_SECONDS DEVICE PYTHON WORK GEN_BATCH SYNTH_BATCH
# EAGLE_TOKENS EAGLE3_TOKENS MAX_LEN MAX_NEW_TOKENS MAX_PROMPTS DRAFT_VOCAB TTT_STEPS
# SYNTH_PROMPTS SYNTH_SECONDS SYNTH_SEED LR (SYNTH_SEED: another seed, other self-instruct prompts)
# VAL_SHARE VAL_EVERY: --val-share (default 0.01 of the prompts held out), --val-every (1000 steps)
# SYNTH_OPENERS: comma-separated first words of the self-instruct user turns, one per row in
# turn (`train prompts --openers`), e.g. "Explain,Write a,Describe,Compare,Summarize,Imagine";
# an opener of * is a free row (no opener): "*,Explain,*,Write a" steers half the rows.
# SYNTH_OPENERS_FILE=PATH: `--openers-file PATH` (one opener a line) instead of SYNTH_OPENERS.
# SYNTH_TOPICS=1: that file made here by scripts/topic_openers.py (request kinds x subjects of
# every field, every SYNTH_FREE_EVERY-th line (default 3) a free row; seed SYNTH_SEED), 1.5 lines
# per prompt asked for, since some rows are dropped (16% in the thirteenth session); SYNTH_CONSTRAINTS=0.3:
# that share of its whole subject requests ends with a requirement ("Keep it under 200 words.");
# SYNTH_STARTERS=0.5: that share of its non-free lines are code, math, reasoning and extraction
# starters (--starter-share, default 0.25; MT-bench's confident misses are code and numbers).
# SYNTH_EVERY: self-instruct prompts per prompt of PROMPTS in the mix (`--mix-every`, default 1).
# SPLIT_GREEDY=1: the second data process answers greedily too, on the other half of the
# prompts (odd rows to data/greedy, even rows to data/greedy2) instead of sampling answers
# to the same prompts: twice the distinct prompts in the same time, every answer of the
# kind greedy benchmarks decode (eleventh session: 89,896 prompts, 24.4M tokens in 224 s).
# EAGLE1_TTT_STEPS (EAGLE-1 training-time test: 1 = the published EAGLE-1 recipe, the default).
# CACHE_FEATURES=1: --cache-features (the target's features computed once, kept on the GPU;
# 54 GiB for EAGLE-3 on 12.6M tokens, so with HEADS=eagle3 or eagle alone; beyond 60% of the
# free GPU memory the rest spills to host memory).
# HEADS: the heads step 2 trains, "eagle eagle3" (default: side by side) or one of them:
# each alone trains 1.76-1.94x the steps a second it gets side by side (BENCHMARKS.md, eighth
# session), so a head can have the GPU to itself, e.g. HEADS=eagle3 first, then
# RESUME=1 HEADS=eagle on the same WORK.
# Warm start (continue training shipped or earlier heads on new data): INIT_EAGLE=HEAD
# and/or INIT_EAGLE3=HEAD (a head directory or catalog id, e.g.
# eagle-zoo/EAGLE3-SmolLM2-135M-Instruct) pass --init-from HEAD to that job;
# INIT_DIR=DIR (an earlier OUT) is the default for both: DIR/eagle and DIR/eagle3.
# DRAFT_VOCAB must then equal the EAGLE-3 head's draft vocabulary (12000 for ours), unless
# RESELECT_VOCAB=1 (--reselect-draft-vocab: the draft vocabulary chosen from this data).
# LABEL_TEMPERATURE=T: --label-temperature T for the EAGLE-3 head (soft labels softmax(logits / T);
# default 1, the published recipe; T < 1 sharpens them towards the target's argmax, eagle3.py).
# EAGLE3_LAYERS=N: --head-layers N for the EAGLE-3 head (default: INIT_EAGLE3's layers, three for
# the shipped head since the fifteenth session; 1 without it); more than INIT_EAGLE3's grows
# it, its new layers starting as identities.
# EMA=DECAY: --ema DECAY for the EAGLE-3 head: the head saved (and sent back by every call,
# paused or not) is the moving average of its weights from INIT_EAGLE3's, not the last step's
# (eagle_zoo/train/averaging.py); the held-out log measures both at the end.
# One run split over several time-limited jobs (same WORK each time):
#   STOP_AFTER=300 ...   steps 0-2, training paused after 300 s of training (state kept);
#                        the loads and the feature cache before the first step come on top
#   PAUSE_AT=UNIX_SECONDS  as STOP_AFTER, but at a time of the clock: loads and cache included
#                        (scripts/device/train.sh sets it from CALL_SECONDS)
#   RESUME=1 ...         training only, continued from the saved state, then step 3
# TRAIN_SECONDS is the whole run's training time (the learning-rate schedule's horizon).
# DATA_ONLY=1: steps 0-1 only (the data stays in $WORK; RESUME=1 trains on it).
# STOP_FILE=PATH: training ends early (heads saved, as at TRAIN_SECONDS) once PATH exists.
set -u
TARGET=${1:?usage: $0 TARGET_DIR PROMPTS.jsonl [OUT]}
PROMPTS=${2:?usage: $0 TARGET_DIR PROMPTS.jsonl [OUT]}
OUT=${3:-${OUT:?set OUT or pass an output directory as the third argument}}
REPO=$(cd "$(dirname "$0")/.." && pwd)
WORK=${WORK:-$(mktemp -d /tmp/eagle_zoo_train.XXXXXX)}
PY=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
DATA_SECONDS=${DATA_SECONDS:-150}
TRAIN_SECONDS=${TRAIN_SECONDS:-240}
# Rows decoded together by `train data` (each of the two processes) and by `train prompts`
# (one process): the static loop is host-bound at 1024 rows (data_profile.py on the H200:
# 2048 rows 2.5x the tokens a second, 4096 greedy 3.9x), BENCHMARKS.md, tenth session.
GEN_BATCH=${GEN_BATCH:-2048}
SYNTH_BATCH=${SYNTH_BATCH:-$([ "$DEVICE" = cuda ] && echo 4096)}  # empty: the command's own default
MAX_NEW_TOKENS=${MAX_NEW_TOKENS:-256}
MAX_PROMPTS=${MAX_PROMPTS:-100000}
EAGLE_TOKENS=${EAGLE_TOKENS:-32768}
EAGLE3_TOKENS=${EAGLE3_TOKENS:-16384}
DRAFT_VOCAB=${DRAFT_VOCAB:-12000}  # 24% of the vocabulary, as 32000 of Llama-3's 128256; lm_head 13.8 MB
TTT_STEPS=${TTT_STEPS:-7}
EAGLE1_TTT_STEPS=${EAGLE1_TTT_STEPS:-1}
SYNTH_PROMPTS=${SYNTH_PROMPTS:-0}
SYNTH_SECONDS=${SYNTH_SECONDS:-60}
LR=${LR:-1e-3}
VAL_SHARE=${VAL_SHARE:-0.01}  # prompts held out of training, measured every VAL_EVERY steps ("held out" lines)
RESUME=${RESUME:-0}
STOP_AFTER=${STOP_AFTER:-}
INIT_DIR=${INIT_DIR:-}
INIT_EAGLE=${INIT_EAGLE:-${INIT_DIR:+$INIT_DIR/eagle}}
INIT_EAGLE3=${INIT_EAGLE3:-${INIT_DIR:+$INIT_DIR/eagle3}}
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p "$OUT" "$WORK/logs"
START=$SECONDS
say() { printf '[%4ds] %s\n' $((SECONDS - START)) "$*"; }

# Run "$@" in the background, its output tagged and logged; its exit code lands in $WORK/logs/NAME.rc.
job() {
  local name=$1; shift
  ( "$@"; echo $? > "$WORK/logs/$name.rc" ) 2>&1 | sed -u "s/^/[$name] /" | tee -a "$WORK/logs/$name.log" &
}
rc() { cat "$WORK/logs/$1.rc" 2>/dev/null || echo 99; }
ez() { "$PY" -m eagle_zoo.cli "$@"; }

say "target $TARGET, prompts $PROMPTS, out $OUT, work $WORK, device $DEVICE"
HEADS=${HEADS:-eagle eagle3}
trains() { [[ " $HEADS " == *" $1 "* ]]; }
for h in $HEADS; do  # checked before the data is made; an earlier call's exit codes are dropped
  case $h in eagle|eagle3) rm -f "$WORK/logs/$h.rc" ;; *) say "HEADS: unknown head '$h' (use eagle and/or eagle3)"; exit 2 ;; esac
done

if [ "$RESUME" = 1 ]; then
  DATA=()
  for d in greedy greedy2 sampled; do [ -f "$WORK/data/$d/data.safetensors" ] && DATA+=("$WORK/data/$d"); done
  [ ${#DATA[@]} -gt 0 ] || { say "RESUME=1: no data in $WORK/data; run without RESUME first"; exit 1; }
  say "resuming training on ${DATA[*]}"
else
# -- 0. self-instruct prompts ------------------------------------------------------------------
if [ "$SYNTH_PROMPTS" -gt 0 ]; then
  if [ "${SYNTH_TOPICS:-0}" = 1 ] && [ -z "${SYNTH_OPENERS_FILE:-}" ]; then
    SYNTH_OPENERS_FILE=$WORK/openers.txt
    "$PY" "$REPO/scripts/topic_openers.py" --num $((SYNTH_PROMPTS * 3 / 2)) --free-every "${SYNTH_FREE_EVERY:-3}" \
      --seed "${SYNTH_SEED:-0}" --constraint-share "${SYNTH_CONSTRAINTS:-0}" --starter-share "${SYNTH_STARTERS:-0.25}" \
      > "$SYNTH_OPENERS_FILE" || exit 1
    say "SYNTH_TOPICS=1: $(wc -l < "$SYNTH_OPENERS_FILE") openers in $SYNTH_OPENERS_FILE"
  fi
  steer=(); [ -n "${SYNTH_OPENERS:-}" ] && steer=(--openers "$SYNTH_OPENERS")
  [ -n "${SYNTH_OPENERS_FILE:-}" ] && steer=(--openers-file "$SYNTH_OPENERS_FILE")
  ez train prompts --target "$TARGET" --num "$SYNTH_PROMPTS" --mix "$PROMPTS" --out "$WORK/prompts.jsonl" \
    --device "$DEVICE" --max-seconds "$SYNTH_SECONDS" --max-new-tokens 128 --seed "${SYNTH_SEED:-0}" ${SYNTH_BATCH:+--batch-size "$SYNTH_BATCH"} \
    ${steer[@]+"${steer[@]}"} --mix-every "${SYNTH_EVERY:-1}" 2>&1 | tee "$WORK/logs/prompts.log"
  [ -s "$WORK/prompts.jsonl" ] && PROMPTS="$WORK/prompts.jsonl" || say "self-instruct prompts failed: using $PROMPTS alone"
fi

# -- 1. data ---------------------------------------------------------------------------------
common_data=(--target "$TARGET" --prompts "$PROMPTS" --max-prompts "$MAX_PROMPTS" --max-new-tokens "$MAX_NEW_TOKENS"
             --max-prompt-len 768 --batch-size "$GEN_BATCH" --backend static --device "$DEVICE"
             --max-seconds "$DATA_SECONDS" --no-progress)
if [ "${SPLIT_GREEDY:-0}" = 1 ]; then
  # --prompts given twice: the later one wins, so each process reads its own half
  awk 'NR % 2 == 1' "$PROMPTS" > "$WORK/prompts.odd.jsonl"
  awk 'NR % 2 == 0' "$PROMPTS" > "$WORK/prompts.even.jsonl"
  say "SPLIT_GREEDY=1: $(wc -l < "$WORK/prompts.odd.jsonl") + $(wc -l < "$WORK/prompts.even.jsonl") prompts, both halves greedy"
  SETS="greedy greedy2"
  job data-greedy ez train data "${common_data[@]}" --prompts "$WORK/prompts.odd.jsonl" --out "$WORK/data/greedy" --temperature 0
  job data-greedy2 ez train data "${common_data[@]}" --prompts "$WORK/prompts.even.jsonl" --out "$WORK/data/greedy2" --temperature 0
else
  SETS="greedy sampled"
  job data-greedy ez train data "${common_data[@]}" --out "$WORK/data/greedy" --temperature 0
  job data-sampled ez train data "${common_data[@]}" --out "$WORK/data/sampled" --temperature 0.7 --top-p 0.9 --seed 1
fi
wait
DATA=()
for d in $SETS; do
  [ "$(rc data-$d)" = 0 ] && DATA+=("$WORK/data/$d") || say "data-$d failed (exit $(rc data-$d))"
done
[ ${#DATA[@]} -gt 0 ] || { say "no training data; stopping"; exit 1; }
say "data ready: ${DATA[*]}"
if [ "${DATA_ONLY:-0}" = 1 ]; then
  # a device call too short for data and training together: the data stays in $WORK
  say "DATA_ONLY=1: data in $WORK/data; train it with RESUME=1 on the same WORK"
  exit 0
fi
fi

# -- 2. training (the HEADS side by side; each is time-boxed) ---------------------------------
common_train=(--target "$TARGET" --data "${DATA[@]}" --device "$DEVICE" --epochs 1000 --max-len "${MAX_LEN:-1280}"
              --lr "$LR" --warmup-steps 50 --log-every 25 --save-every 200 --no-progress
              --val-share "$VAL_SHARE" --val-every "${VAL_EVERY:-1000}")
cache=(); [ "${CACHE_FEATURES:-0}" = 1 ] && cache=(--cache-features)
[ "$RESUME" = 1 ] && common_train+=(--resume)
[ -n "$STOP_AFTER" ] && common_train+=(--stop-after-seconds "$STOP_AFTER")
[ -n "${STOP_FILE:-}" ] && common_train+=(--stop-file "$STOP_FILE")
[ -n "${PAUSE_AT:-}" ] && common_train+=(--pause-at "$PAUSE_AT")
# train_head METHOD OUT TOKENS HEAD_CONFIG ARGS...: a run that dies before saving anything
# is retried once with half the token budget and no feature cache (the two memory-hungry
# settings: a cache larger than GPU + host memory is refused) for the time that is left.
train_head() {
  local method=$1 out=$2 tokens=$3 saved=$4 t0=$SECONDS; shift 4
  ez train "$method" "${common_train[@]}" ${cache[@]+"${cache[@]}"} --out "$out" --token-budget "$tokens" --max-seconds "$TRAIN_SECONDS" "$@"
  local code=$? left=$((TRAIN_SECONDS - (SECONDS - t0)))
  if [ $code -ne 0 ] && [ ! -f "$saved" ] && [ $left -ge 60 ]; then
    echo "failed with exit $code and saved nothing: retrying with --token-budget $((tokens / 2)), no feature cache, for $left s"
    ez train "$method" "${common_train[@]}" --out "$out" --token-budget $((tokens / 2)) --max-seconds $left "$@"
    code=$?
  fi
  return $code
}
trains eagle && job eagle train_head eagle "$WORK/heads/eagle" "$EAGLE_TOKENS" "$WORK/heads/eagle/config.json" \
  --ttt-steps "$EAGLE1_TTT_STEPS" ${INIT_EAGLE:+--init-from "$INIT_EAGLE"}
trains eagle3 && job eagle3 train_head eagle3 "$WORK/heads/eagle3" "$EAGLE3_TOKENS" "$WORK/heads/eagle3/yuhuili-eagle3/config.json" \
  --draft-vocab-size "$DRAFT_VOCAB" --ttt-steps "$TTT_STEPS" --format yuhuili-eagle3,speculators-eagle3 \
  --target-name HuggingFaceTB/SmolLM2-135M-Instruct ${INIT_EAGLE3:+--init-from "$INIT_EAGLE3"} \
  $([ "${RESELECT_VOCAB:-0}" = 1 ] && [ -n "$INIT_EAGLE3" ] && echo --reselect-draft-vocab) \
  ${EAGLE3_LAYERS:+--head-layers "$EAGLE3_LAYERS"} ${LABEL_TEMPERATURE:+--label-temperature "$LABEL_TEMPERATURE"} \
  ${EMA:+--ema "$EMA"}
wait
say "training finished: $(for h in $HEADS; do printf '%s exit %s ' "$h" "$(rc "$h")"; done)"

# -- 3. what comes back ----------------------------------------------------------------------
copy_head() {  # copy_head SRC DEST: config.json + weights only
  [ -f "$1/config.json" ] || { say "no head in $1"; return 1; }
  mkdir -p "$2" && cp "$1"/config.json "$1"/model*.safetensors* "$2"/ && say "$2: $(ls "$2" | tr '\n' ' ')"
}
# both heads, also one an earlier call on this WORK trained (HEADS=eagle3, then HEADS=eagle)
copy_head "$WORK/heads/eagle" "$OUT/eagle"
copy_head "$WORK/heads/eagle3/yuhuili-eagle3" "$OUT/eagle3"
mkdir -p "$WORK/report"
cp "$WORK"/logs/*.log "$WORK/report/" 2>/dev/null
for d in greedy greedy2 sampled; do cp "$WORK/data/$d/meta.json" "$WORK/report/data-$d-meta.json" 2>/dev/null; done
cp "$WORK/heads/eagle/eagle_zoo_training.json" "$WORK/report/eagle-training.json" 2>/dev/null
cp "$WORK/heads/eagle3/yuhuili-eagle3/eagle_zoo_training.json" "$WORK/report/eagle3-training.json" 2>/dev/null
cp "$WORK/heads/eagle3/speculators-eagle3/config.json" "$WORK/report/eagle3-speculators-config.json" 2>/dev/null
tar -czf "$OUT/report.tar.gz" -C "$WORK" report
say "done in $((SECONDS - START)) s; files in $OUT:"
find "$OUT" -type f -printf '  %p %s bytes\n'
for h in $HEADS; do [ "$(rc "$h")" = 0 ] || exit 1; done
