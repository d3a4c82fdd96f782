#!/usr/bin/env bash
# demo.sh [MODEL [TOKENIZER]]: installs dependencies, builds, and generates text.
# Default model: ../shared/models/tinystories/stories260K.bin with its tok512.bin tokenizer.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
bash scripts/build.sh release
models="${SPECULA_MODELS_DIR:-../shared/models}"
model="${1:-$models/tinystories/stories260K.bin}"
tokenizer_args=()
if [ $# -ge 2 ]; then
  tokenizer_args=(--tokenizer "$2")
elif [ $# -eq 0 ]; then
  tokenizer_args=(--tokenizer "$models/tinystories/tok512.bin")
fi
echo "== greedy generation on $model" >&2
build/release/specula generate --model "$model" "${tokenizer_args[@]}" \
  --prompt "Once upon a time" --max-tokens 200
echo "== sampled generation (temperature 0.8, top-p 0.9, seed 1)" >&2
build/release/specula generate --model "$model" "${tokenizer_args[@]}" \
  --prompt "One day, a little dog" --max-tokens 120 --temperature 0.8 --top-p 0.9 --seed 1
