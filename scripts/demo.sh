#!/usr/bin/env bash
# demo.sh: installs dependencies, builds, and runs the quickstart experiment
# (experiments/specs/quickstart.textproto: no speculation, a draft model and n-gram lookup at k = 4
# and adaptive k, at batch 1, 8 and 32, on the TinyStories pair in ../shared/models), then writes
# its report with plots and prints where it is. About a minute on 2 cores after the build.
# demo.sh MODEL [TOKENIZER]: generates text from that model instead.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
bash scripts/build.sh release
if [ $# -ge 1 ]; then
  tokenizer_args=()
  if [ $# -ge 2 ]; then tokenizer_args=(--tokenizer "$2"); fi
  echo "== greedy generation on $1" >&2
  build/release/specula generate --model "$1" "${tokenizer_args[@]}" --prompt "Once upon a time" --max-tokens 200
  echo "== sampled generation (temperature 0.8, top-p 0.9, seed 1)" >&2
  build/release/specula generate --model "$1" "${tokenizer_args[@]}" \
    --prompt "One day, a little dog" --max-tokens 120 --temperature 0.8 --top-p 0.9 --seed 1
  exit 0
fi
out="${SPECULA_DEMO_OUT:-/tmp/specula-quickstart}"
echo "== quickstart experiment -> $out" >&2
build/release/specula experiment run experiments/specs/quickstart.textproto --out "$out" --force
report=$(build/release/specula experiment report "$out")
echo "== best configuration per batch size (from $report)" >&2
sed -n '/^## Best configuration/,/^## /p' "$report" | sed '$d'
echo "== the report, with its plots: $report" >&2
