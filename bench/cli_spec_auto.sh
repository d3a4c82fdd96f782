#!/usr/bin/env bash
# cli_spec_auto.sh [ROUNDS]: wall-clock throughput of `specula generate --prompts-file` with 32
# prompts and --max-num-seqs 32, without speculation and with --num-spec-tokens auto (draft model:
# the real tinystories pair; and n-gram), the runs alternating. Throughput is generated tokens over
# the whole process's wall time (startup and auto's cost measurement included); each setting's best
# round is reported, as interference from other tenants only slows a run. Needs a release build.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-7}"
specula=build/release/specula
models="${SPECULA_MODELS_DIR:-../shared/models}/tinystories"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
starts=("Once upon a time" "Lily and Ben" "The little dog" "One day, Tom" "There was a big tree" "Sue had a red ball"
        "The sun was hot" "Mom said")
for i in $(seq 0 31); do
  printf '{"id": %d, "prompt": "%s", "max_tokens": 200}\n' "$i" "${starts[$((i % 8))]}"
done > "$dir/prompts.jsonl"
common=(generate --model "$models/stories260K.bin" --tokenizer "$models/tok512.bin" --prompts-file "$dir/prompts.jsonl"
        --max-num-seqs 32 --ignore-eos --no-progress)
declare -A args=(
  [off]=""
  [auto_draft]="--spec-method draft --draft-model $models/llama2xs.bin --num-spec-tokens auto"
  [auto_ngram]="--spec-method ngram --num-spec-tokens auto")
declare -A best
for r in $(seq 1 "$rounds"); do
  for name in off auto_draft auto_ngram; do
    start=$(date +%s.%N)
    # shellcheck disable=SC2086
    "$specula" "${common[@]}" ${args[$name]} > "$dir/$name.jsonl" 2> "$dir/$name.err"
    end=$(date +%s.%N)
    tokens=$(python3 -c 'import json,sys; print(sum(len(json.loads(l)["token_ids"]) for l in open(sys.argv[1])))' "$dir/$name.jsonl")
    tps=$(python3 -c "print($tokens / ($end - $start))")
    if [ -z "${best[$name]:-}" ] || python3 -c "import sys; sys.exit(0 if $tps > ${best[$name]} else 1)"; then best[$name]=$tps; fi
  done
done
for name in auto_draft auto_ngram; do
  printf '%-10s %8.0f tok/s against %8.0f without speculation: %.3fx  (%s)\n' "$name" "${best[$name]}" "${best[off]}" \
    "$(python3 -c "print(${best[$name]} / ${best[off]})")" "$(grep -o 'steps without speculation: [^)]*)' "$dir/$name.err")"
done
