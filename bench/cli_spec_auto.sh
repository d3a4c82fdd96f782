#!/usr/bin/env bash
# cli_spec_auto.sh [ROUNDS] [MAX_TOKENS]: wall-clock throughput of `specula generate --prompts-file`
# with 32 prompts and --max-num-seqs 32, without speculation and with --num-spec-tokens auto (draft
# model: the real tinystories pair; and n-gram). Throughput is generated tokens over the whole
# process's wall time (startup and auto's cost measurement included). Each round runs each auto
# setting back to back with a run without speculation (the order alternating); the ratios
# reported are the medians over rounds of those adjacent runs' ratios (this machine's runs of one
# setting vary by +-10%, and a ratio of two settings' best rounds swung as much), next to each
# setting's median and best tok/s. Needs a release build.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-15}"
max_tokens="${2:-400}"  # stories260K's context is 512
specula=build/release/specula
models="${SPECULA_MODELS_DIR:-models}/tinystories"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
starts=("Once upon a time" "Lily and Ben" "The little dog" "One day, Tom" "There was a big tree" "Sue had a red ball"
        "The sun was hot" "Mom said")
for i in $(seq 0 31); do
  printf '{"id": %d, "prompt": "%s", "max_tokens": %d}\n' "$i" "${starts[$((i % 8))]}" "$max_tokens"
done > "$dir/prompts.jsonl"
common=(generate --model "$models/stories260K.bin" --tokenizer "$models/tok512.bin" --prompts-file "$dir/prompts.jsonl"
        --max-num-seqs 32 --ignore-eos --no-progress)
declare -A args=(
  [off]=""
  [auto_draft]="--spec-method draft --draft-model $models/stories260K-draft.bin --num-spec-tokens auto"
  [auto_ngram]="--spec-method ngram --num-spec-tokens auto")
# A round: each auto setting back to back with a run without speculation of its own, the two
# pairs and the runs within them in turn first.
run() {  # run ROUND NAME [LABEL]: appends "ROUND LABEL TOK/S" (LABEL defaults to NAME)
  local start end tokens
  start=$(date +%s.%N)
  # shellcheck disable=SC2086
  "$specula" "${common[@]}" ${args[$2]} > "$dir/$2.jsonl" 2> "$dir/$2.err"
  end=$(date +%s.%N)
  tokens=$(python3 -c 'import json,sys; print(sum(len(json.loads(l)["token_ids"]) for l in open(sys.argv[1])))' "$dir/$2.jsonl")
  echo "$1 ${3:-$2} $(python3 -c "print($tokens / ($end - $start))")" >> "$dir/results.txt"
}
: > "$dir/results.txt"
for r in $(seq 1 "$rounds"); do
  pairs=(auto_draft auto_ngram)
  if [ $((r % 2)) -eq 0 ]; then pairs=(auto_ngram auto_draft); fi
  for name in "${pairs[@]}"; do
    if [ $(((r / 2) % 2)) -eq 0 ]; then run "$r" off "off_$name"; run "$r" "$name"; else run "$r" "$name"; run "$r" off "off_$name"; fi
  done
done
python3 - "$dir/results.txt" <<'PY'
import statistics, sys
tps = {}
for line in open(sys.argv[1]):
    r, name, v = line.split()
    tps.setdefault(name, {})[int(r)] = float(v)
offs = list(tps["off_auto_draft"].values()) + list(tps["off_auto_ngram"].values())
print("off        median %8.0f tok/s, best %8.0f" % (statistics.median(offs), max(offs)))
for name in ("auto_draft", "auto_ngram"):
    off = tps["off_" + name]  # the runs paired with this setting's
    ratios = [tps[name][r] / off[r] for r in off]
    print("%-10s median %8.0f tok/s, best %8.0f; against no speculation: median of the rounds' ratios %.3fx (range %.2f-%.2f)"
          % (name, statistics.median(tps[name].values()), max(tps[name].values()), statistics.median(ratios),
             min(ratios), max(ratios)))
PY
for name in auto_draft auto_ngram; do
  echo "$name, last run: $(grep -o 'steps without speculation: .*' "$dir/$name.err")"
done
