# Sourced by scripts/accept_by_*.sh. accept_row HEAD FILE DEVICE prints "LENGTH R1, R2, R3":
# the mean acceptance length and per-position rates of `eagle-zoo bench` on the 10 prompts
# of FILE decoded together (chat template, greedy, k = 3, 256 new tokens, fp32). Needs $PY.
accept_row() {
  "$PY" -m eagle_zoo.cli bench --draft "$1" --dataset "$2" --num-prompts 10 --max-tokens 256 \
    --max-num-seqs 10 --num-spec-tokens 3 --device "$3" --dtype float32 2>&1 | tr '\r' '\n' \
    | grep -E "mean acceptance length|acceptance rate per position" | sed 's/.*: //' | paste -sd ' '
}
