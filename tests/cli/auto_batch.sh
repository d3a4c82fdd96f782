#!/usr/bin/env bash
# The CLI end to end: 32 prompts through `specula generate --prompts-file` without speculation and
# with --num-spec-tokens auto (draft model, n-gram and suffix) give the same greedy tokens per request, and
# the speculation summary is printed.
set -euo pipefail
specula="$1" models="$2"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
starts=("Once upon a time" "Lily and Ben" "The little dog" "One day, Tom" "There was a big tree" "Sue had a red ball"
        "The sun was hot" "Mom said")
for i in $(seq 0 31); do
  printf '{"id": %d, "prompt": "%s", "max_tokens": %d}\n' "$i" "${starts[$((i % 8))]}" $((40 + i))
done > "$dir/prompts.jsonl"
common=(--model "$models/stories260K.bin" --tokenizer "$models/tok512.bin" --prompts-file "$dir/prompts.jsonl"
        --max-num-seqs 32 --ignore-eos --no-progress)
tokens() { python3 -c 'import json, sys; print("\n".join(sorted(json.dumps([json.loads(l)["id"], json.loads(l)["token_ids"]]) for l in open(sys.argv[1]))))' "$1"; }
"$specula" generate "${common[@]}" > "$dir/plain.jsonl" 2> "$dir/plain.err"
[ "$(wc -l < "$dir/plain.jsonl")" -eq 32 ] || { echo "plain run wrote $(wc -l < "$dir/plain.jsonl") lines"; exit 1; }
for method in "--spec-method draft --draft-model $models/stories260K-draft.bin" "--spec-method ngram" "--spec-method suffix"; do
  # shellcheck disable=SC2086
  "$specula" generate "${common[@]}" $method --num-spec-tokens auto --max-spec-tokens 6 > "$dir/auto.jsonl" 2> "$dir/auto.err"
  if ! diff <(tokens "$dir/plain.jsonl") <(tokens "$dir/auto.jsonl") > /dev/null; then
    echo "$method: --num-spec-tokens auto changed the greedy tokens"; exit 1
  fi
  grep -q "speculation length: .*steps without speculation" "$dir/auto.err" || { echo "$method: no speculation summary"; cat "$dir/auto.err"; exit 1; }
done
echo "auto batch: same tokens as plain decoding for 32 prompts, draft, n-gram and suffix"
