#!/usr/bin/env bash
# Builds the libFuzzer targets (the `fuzz` preset: clang-14, ASan + UBSan) and runs each one in
# turn over a corpus made of the committed seeds (fuzz/seeds/TARGET) and seeds made from real files
# (fuzz/make_seeds.py: models/, the SmolLM2 GGUF's metadata, tests/data, the example
# specs and chat templates). Prints a table of executions, seconds and exec/s per target; exits 1 if
# any target reports a crash, a leak, a timeout, running out of memory or a sanitizer error.
#
#   bash scripts/fuzz.sh [--seconds N | --runs N] [--build-only | --no-build] [--preset fuzz|asan] [TARGET...]
#
# Default: --seconds 30, every target, SPECULA_FUZZ_PARALLEL (default nproc) at a time. --preset asan
# uses the targets that the asan preset builds beside the test suite (the same flags, glue at -O0;
# .ci/run does this, to build the sanitized tree once); the default `fuzz` preset builds only the
# targets, all at -O1. With B = build/PRESET: logs go to B/logs/TARGET.log, inputs that fail to
# B/artifacts/TARGET/ (minimize one with: B/fuzz/TARGET -minimize_crash=1 -runs=100000 FILE). The
# corpus under B/corpus/TARGET is rebuilt from the seeds on each run, so counts do not depend on
# earlier runs. SPECULA_FUZZ_JOBS sets the build's -j (default 2).
set -euo pipefail
cd "$(dirname "$0")/.."

mode=seconds
amount=30
targets=()
build=1
run=1
preset=fuzz
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-only) run=0; shift ;;
    --no-build) build=0; shift ;;
    --seconds) mode=seconds; amount="$2"; shift 2 ;;
    --runs) mode=runs; amount="$2"; shift 2 ;;
    --preset) preset="$2"; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown flag $1" >&2; exit 2 ;;
    *) targets+=("${1%_fuzz}_fuzz"); shift ;;
  esac
done
if [[ "$preset" != fuzz && "$preset" != asan ]]; then
  echo "fuzz.sh: --preset is fuzz or asan, got '$preset'" >&2
  exit 2
fi
if ! [[ "$amount" =~ ^[0-9]+$ ]] || [[ "$amount" -le 0 ]]; then
  echo "fuzz.sh: --$mode needs a positive integer, got '$amount'" >&2
  exit 2
fi

# Per target: the longest input (bytes) and the dictionary (fuzz/dict/NAME.dict, or -).
declare -A MAX_LEN=(
  [llama2c_fuzz]=8192 [safetensors_fuzz]=16384 [gguf_fuzz]=65536 [hf_config_fuzz]=8192
  [hf_tokenizer_fuzz]=16384 [llama2c_tokenizer_fuzz]=8192 [chat_template_fuzz]=16384
  [jsonl_request_fuzz]=4096 [http_request_fuzz]=4096 [grpc_request_fuzz]=1024 [experiment_spec_fuzz]=4096
  [auth_header_fuzz]=512 [constraint_fuzz]=8192)
declare -A DICT=(
  [llama2c_fuzz]=- [safetensors_fuzz]=safetensors [gguf_fuzz]=gguf [hf_config_fuzz]=hf_config
  [hf_tokenizer_fuzz]=hf_tokenizer [llama2c_tokenizer_fuzz]=- [chat_template_fuzz]=chat_template
  [jsonl_request_fuzz]=request [http_request_fuzz]=request [grpc_request_fuzz]=- [experiment_spec_fuzz]=experiment_spec
  [auth_header_fuzz]=auth_header [constraint_fuzz]=constraint)
ALL=(llama2c_fuzz safetensors_fuzz gguf_fuzz hf_config_fuzz hf_tokenizer_fuzz llama2c_tokenizer_fuzz
     jsonl_request_fuzz http_request_fuzz grpc_request_fuzz experiment_spec_fuzz chat_template_fuzz auth_header_fuzz
     constraint_fuzz)
[[ ${#targets[@]} -eq 0 ]] && targets=("${ALL[@]}")
for t in "${targets[@]}"; do
  [[ -n "${MAX_LEN[$t]:-}" ]] || { echo "fuzz.sh: unknown target '$t' (${ALL[*]})" >&2; exit 2; }
done

build_start=$(date +%s)
if [[ $build == 1 ]]; then
  [[ -f "build/$preset/build.ninja" ]] || cmake --preset "$preset" >/dev/null
  cmake --build --preset "$preset" -j "${SPECULA_FUZZ_JOBS:-2}" --target "${targets[@]}"
fi
build_s=$(( $(date +%s) - build_start ))
[[ $run == 1 ]] || exit 0

B="build/$preset"
for t in "${targets[@]}"; do
  [[ -x "$B/fuzz/$t" ]] || { echo "fuzz.sh: $B/fuzz/$t is not built (run without --no-build)" >&2; exit 2; }
done
rm -rf "$B/seeds_generated"
python3 fuzz/make_seeds.py "$B/seeds_generated" >/dev/null
mkdir -p "$B/logs"

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

# One target: its log, and a result row in $B/rows/TARGET.
run_target() {
  local t="$1"
  local corpus="$B/corpus/$t" artifacts="$B/artifacts/$t" log="$B/logs/$t.log"
  rm -rf "$corpus" "$artifacts"
  mkdir -p "$corpus" "$artifacts"
  for d in "fuzz/seeds/$t" "$B/seeds_generated/$t"; do
    [[ -d "$d" ]] && cp "$d"/* "$corpus"/
  done
  local nseeds
  nseeds=$(find "$corpus" -type f | wc -l)
  local args=(-rss_limit_mb=4096 -timeout=30 -max_len="${MAX_LEN[$t]}" -print_final_stats=1
              -artifact_prefix="$artifacts/")
  [[ "${DICT[$t]}" != - ]] && args+=(-dict="fuzz/dict/${DICT[$t]}.dict")
  if [[ $mode == runs ]]; then args+=(-runs="$amount"); else args+=(-max_total_time="$amount"); fi
  echo "[fuzz] $t: $nseeds seeds, ${args[*]}" >&2
  local start rc=0
  start=$(date +%s%N)
  "$B/fuzz/$t" "${args[@]}" "$corpus" >"$log" 2>&1 || rc=$?
  local secs execs result=ok
  secs=$(awk -v a="$start" -v b="$(date +%s%N)" 'BEGIN { printf "%.1f", (b - a) / 1e9 }')
  # The final stats, or after a crash the last status line ("#1234 ...").
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  [[ -n "$execs" ]] || execs=$(grep -oE '^#[0-9]+' "$log" | tail -1 | tr -d '#')
  execs=${execs:-0}
  if [[ $rc -ne 0 ]] || grep -qE '^==[0-9]+==ERROR|runtime error:|^SUMMARY: |deadly signal|ALARM: working on the last Unit' "$log"; then
    if grep -q 'ERROR: LeakSanitizer' "$log"; then result=LEAK
    elif grep -q 'runtime error:' "$log"; then result=UBSAN
    elif grep -qE 'ERROR: libFuzzer: timeout|ALARM: working on the last Unit' "$log"; then result=TIMEOUT
    elif grep -qE 'out-of-memory|ERROR: libFuzzer: out-of-memory|allocation-size-too-big' "$log"; then result=OOM
    elif grep -q 'ERROR: AddressSanitizer' "$log"; then result=ASAN
    else result="CRASH(rc=$rc)"
    fi
    {
      echo "[fuzz] $t: $result; the report (all of it in $log):"
      grep -E -m 12 -A 14 '^==[0-9]+==ERROR|runtime error:|ERROR: libFuzzer|ALARM' "$log" | head -40 || tail -30 "$log"
      ls "$artifacts"/* 2>/dev/null | sed 's/^/[fuzz]   input: /' || true
    } >&2
  fi
  awk -v t="$t" -v n="$execs" -v s="$secs" -v r="$result" \
    'BEGIN { printf "%-24s %12d %9.1f %10.0f  %s\n", t, n, s, n / (s > 0 ? s : 1), r }' >"$B/rows/$t"
}

# Targets run SPECULA_FUZZ_PARALLEL at a time (default: one per core); each is one process.
parallel="${SPECULA_FUZZ_PARALLEL:-$(nproc)}"
rm -rf "$B/rows"
mkdir -p "$B/rows"
running=0
for t in "${targets[@]}"; do
  if [[ $running -ge $parallel ]]; then
    wait -n || true
    running=$((running - 1))
  fi
  run_target "$t" &
  running=$((running + 1))
done
wait
failed=0
rows=()
for t in "${targets[@]}"; do
  row=$(cat "$B/rows/$t" 2>/dev/null || printf '%-24s %12s %9s %10s  %s' "$t" - - - "NO RESULT")
  [[ "$row" == *"  ok" ]] || failed=1
  rows+=("$row")
done

echo
echo "Fuzzing ($mode $amount per target, $parallel at a time; build ${build_s} s; $(lscpu | grep -o 'avx512[a-z]*' | head -1 | grep -q . && echo AVX-512 || echo AVX2), $(nproc) cores)"
printf '%-24s %12s %9s %10s  %s\n' target executions seconds exec/s result
for r in "${rows[@]}"; do echo "$r"; done
exit $failed
