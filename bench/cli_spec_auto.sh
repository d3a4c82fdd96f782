#!/usr/bin/env bash
# cli_spec_auto.sh [ROUNDS] [MAX_TOKENS]: wall-clock throughput of `specula generate --prompts-file`
# with 32 prompts and --max-num-seqs 32, without speculation and with --num-spec-tokens auto (draft
# model: the real tinystories pair; and n-gram). Throughput is generated tokens over the whole
# process's wall time (startup and auto's cost measurement included). Each round runs the three
# settings back to back, in a different order each round; the ratios reported are the medians of
# each round's ratio (this machine's runs of one setting vary by +-10%, and a ratio of two
# settings' best rounds swung as much), next to each setting's median and best tok/s. Needs a
# release build.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-15}"
max_tokens="${2:-400}"  # stories260K's context is 512
specula=build/release/specula
models="${SPECULA_MODELS_DIR:-../shared/models}/tinystories"
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
  [auto_draft]="--spec-method draft --draft-model $models/llama2xs.bin --num-spec-tokens auto"
  [auto_ngram]="--spec-method ngram --num-spec-tokens auto")
names=(off auto_draft auto_ngram)
: > "$dir/results.txt"
for r in $(seq 1 "$rounds"); do
  for j in 0 1 2; do
    name=${names[$(((j + r) % 3))]}
    start=$(date +%s.%N)
    # shellcheck disable=SC2086
    "$specula" "${common[@]}" ${args[$name]} > "$dir/$name.jsonl" 2> "$dir/$name.err"
    end=$(date +%s.%N)
    tokens=$(python3 -c 'import json,sys; print(sum(len(json.loads(l)["token_ids"]) for l in open(sys.argv[1])))' "$dir/$name.jsonl")
    echo "$r $name $(python3 -c "print($tokens / ($end - $start))")" >> "$dir/results.txt"
  done
done
python3 - "$dir/results.txt" <<'PY'
import statistics, sys
tps = {}
for line in open(sys.argv[1]):
    r, name, v = line.split()
    tps.setdefault(name, {})[int(r)] = float(v)
off = tps["off"]
print("off        median %8.0f tok/s, best %8.0f" % (statistics.median(off.values()), max(off.values())))
for name in ("auto_draft", "auto_ngram"):
    ratios = [tps[name][r] / off[r] for r in off]
    print("%-10s median %8.0f tok/s, best %8.0f; against no speculation: median of the rounds' ratios %.3fx (range %.2f-%.2f)"
          % (name, statistics.median(tps[name].values()), max(tps[name].values()), statistics.median(ratios),
             min(ratios), max(ratios)))
PY
for name in auto_draft auto_ngram; do
  echo "$name, last run: $(grep -o 'steps without speculation: .*' "$dir/$name.err")"
done
