#!/usr/bin/env bash
# Train the SmolLM2-135M-Instruct heads on one GPU: prompts, the target's answers, training.
#
#   scripts/train_smollm2_heads.sh TARGET_DIR [OUT]     (OUT defaults to $OUT)
#
# 0. prompts  SYNTH_PROMPTS self-instruct user turns the target writes (`eagle-zoo train
#             prompts`, at most SYNTH_SECONDS), mixed into the broad prompt set built from
#             SOURCES (`eagle-zoo train mix`: eleven categories, the dev set's records left out;
#             MIX_CAPS="translation=8000 classification=5000" caps categories; MIX_SEED picks
#             which prompts each capped category takes and their order, SYNTH_SEED the self-instruct ones).
# 1. data     the target's greedy answers (MAX_NEW_TOKENS), short prompts at GEN_BATCH rows and
#             long-context ones (summarization, retrieval QA; up to 4k tokens) at LONG_GEN_BATCH,
#             two processes side by side, each stopped after DATA_SECONDS.
# 2. train    the HEADS ("eagle eagle3", or one of them), side by side, TRAIN_SECONDS each:
#             EAGLE-3 with EAGLE3_LAYERS decoder layers (default 1), DRAFT_VOCAB draft tokens,
#             TTT_STEPS training-time-test steps, soft labels at LABEL_TEMPERATURE, EMA=DECAY
#             for a moving average of the weights; LR, EAGLE_TOKENS / EAGLE3_TOKENS per batch,
#             CACHE_FEATURES=1 keeps the target's features on the GPU (spilling to host memory).
#             INIT_DIR=DIR (or INIT_EAGLE / INIT_EAGLE3) starts from earlier heads.
# 3. save     $OUT/eagle (yuhuili EAGLE-1), $OUT/eagle3 (yuhuili EAGLE-3), $OUT/report.tar.gz
#             (logs, training records, data statistics).
# A run split over time-limited calls on one WORK: PAUSE_AT=UNIX_SECONDS (or STOP_AFTER=S of
# training) pauses with the state saved, RESUME=1 continues training on the same data;
# DATA_ONLY=1 stops after step 1. TRAIN_SECONDS is the whole run's (the schedule's horizon).
set -u
TARGET=${1:?usage: $0 TARGET_DIR [OUT]}
OUT=${2:-${OUT:?set OUT or pass an output directory as the second argument}}
REPO=$(cd "$(dirname "$0")/.." && pwd)
WORK=${WORK:-$(mktemp -d /tmp/eagle_zoo_train.XXXXXX)}
PY=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
DATA_SECONDS=${DATA_SECONDS:-150}
TRAIN_SECONDS=${TRAIN_SECONDS:-240}
# Rows decoded together by `train data` and `train prompts`: the static loop is host-bound
# at 1024 rows on an H200 (2048 rows make 2.5x the tokens a second).
GEN_BATCH=${GEN_BATCH:-2048}
SYNTH_BATCH=${SYNTH_BATCH:-$([ "$DEVICE" = cuda ] && echo 4096)}  # empty: the command's own default
MAX_NEW_TOKENS=${MAX_NEW_TOKENS:-256}
MAX_PROMPTS=${MAX_PROMPTS:-100000}
SETS="short long"  # the data directories step 1 writes under $WORK/data (short and long-context prompts)
EAGLE_TOKENS=${EAGLE_TOKENS:-32768}
EAGLE3_TOKENS=${EAGLE3_TOKENS:-16384}
DRAFT_VOCAB=${DRAFT_VOCAB:-12000}  # 24% of the vocabulary, as 32000 of Llama-3's 128256; lm_head 13.8 MB
TTT_STEPS=${TTT_STEPS:-4}
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

say "target $TARGET, out $OUT, work $WORK, device $DEVICE"
HEADS=${HEADS:-eagle eagle3}
trains() { [[ " $HEADS " == *" $1 "* ]]; }
for h in $HEADS; do  # checked before the data is made; an earlier call's exit codes are dropped
  case $h in eagle|eagle3) rm -f "$WORK/logs/$h.rc" ;; *) say "HEADS: unknown head '$h' (use eagle and/or eagle3)"; exit 2 ;; esac
done

if [ "$RESUME" = 1 ]; then
  DATA=()
  for d in $SETS; do [ -f "$WORK/data/$d/data.safetensors" ] && DATA+=("$WORK/data/$d"); done
  [ ${#DATA[@]} -gt 0 ] || { say "RESUME=1: no data in $WORK/data; run without RESUME first"; exit 1; }
  say "resuming training on ${DATA[*]}"
else
# -- 0. prompts: self-instruct user turns the target writes, mixed into the broad prompt set --
SOURCES=${SOURCES:-$REPO/plugins/eagle-zoo-smollm2-heads/training-data}
add=()
if [ "$SYNTH_PROMPTS" -gt 0 ]; then
  ez train prompts --target "$TARGET" --num "$SYNTH_PROMPTS" --out "$WORK/self_instruct.jsonl" \
    --device "$DEVICE" --max-seconds "$SYNTH_SECONDS" --max-new-tokens 128 --seed "${SYNTH_SEED:-0}" \
    ${SYNTH_BATCH:+--batch-size "$SYNTH_BATCH"} 2>&1 | tee "$WORK/logs/prompts.log"
  [ -s "$WORK/self_instruct.jsonl" ] && add=(--add "$WORK/self_instruct.jsonl") || say "self-instruct prompts failed: the mix alone"
fi
caps=(); for c in ${MIX_CAPS:-}; do caps+=(--cap "$c"); done
ez train mix --sources "$SOURCES" --seed "${MIX_SEED:-0}" --train-out "$WORK/prompts.short.jsonl" --long-out "$WORK/prompts.long.jsonl" \
  ${caps[@]+"${caps[@]}"} ${add[@]+"${add[@]}"} 2>&1 | tee "$WORK/logs/mix.log" || exit 1

# -- 1. data: greedy answers, short and long-context prompts side by side --------------------
common_data=(--target "$TARGET" --max-prompts "$MAX_PROMPTS" --max-new-tokens "$MAX_NEW_TOKENS"
             --backend static --device "$DEVICE" --max-seconds "$DATA_SECONDS" --no-progress --temperature 0)
job data-short ez train data "${common_data[@]}" --prompts "$WORK/prompts.short.jsonl" --out "$WORK/data/short" \
  --max-prompt-len 1024 --batch-size "$GEN_BATCH"
job data-long ez train data "${common_data[@]}" --prompts "$WORK/prompts.long.jsonl" --out "$WORK/data/long" \
  --max-prompt-len 4096 --batch-size "${LONG_GEN_BATCH:-128}"
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
common_train=(--target "$TARGET" --data "${DATA[@]}" --device "$DEVICE" --epochs 1000 --max-len "${MAX_LEN:-4400}"
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
for d in $SETS; do cp "$WORK/data/$d/meta.json" "$WORK/report/data-$d-meta.json" 2>/dev/null; done
cp "$WORK/heads/eagle/eagle_zoo_training.json" "$WORK/report/eagle-training.json" 2>/dev/null
cp "$WORK/heads/eagle3/yuhuili-eagle3/eagle_zoo_training.json" "$WORK/report/eagle3-training.json" 2>/dev/null
cp "$WORK/heads/eagle3/speculators-eagle3/config.json" "$WORK/report/eagle3-speculators-config.json" 2>/dev/null
tar -czf "$OUT/report.tar.gz" -C "$WORK" report
say "done in $((SECONDS - START)) s; files in $OUT:"
find "$OUT" -type f -printf '  %p %s bytes\n'
for h in $HEADS; do [ "$(rc "$h")" = 0 ] || exit 1; done
