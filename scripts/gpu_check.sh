#!/usr/bin/env bash
# Runs on a lent GPU machine from the pack that scripts/gpu_pack.sh made here: the GPU tests, the
# whole suite, the GPU benchmarks, HF transformers on the same weights and an ncu breakdown of one
# decode step. Each stage is bounded in time and logs to $OUT (or ./gpu_out); the command line
# names the stages, in order:
#
#   scripts/gpu_check.sh probe gpu bench hf ncu suite
#
# Stages: probe (device, CPU, libraries), gpu (ctest -L gpu, one GPU: -LE multigpu), bench (bench/gpu_bench,
# $SPECULA_BENCH_FILTER and $SPECULA_BENCH_ARGS passed on), variants
# (decode steps under the SPECULA_CUDA_* knobs, cuBLAS-only included), hf
# (bench/hf_generate_bench.py), some (ctest -R $SPECULA_CTEST_REGEX), ncu (per-kernel times of decode steps at batch 1), suite (ctest
# without the gpu label), fidelity (bench/sim_fidelity.sh gpu-1b: the simulator against ONLINE runs on
# this GPU, $SPECULA_FIDELITY_REQUESTS requests a run, 2 repeats; packed as $out/fidelity.tar.gz),
# calibrate (`specula experiment calibrate` of the llama-3.2-1b shape on this GPU), cpu-fidelity
# (bench/sim_fidelity.sh tinystories on two of this host's cores, as the 2-core VMs have but without
# their co-tenants: the CPU fidelity bounds on a machine whose speed holds still; packed as
# $out/cpu-fidelity.tar.gz). SPECULA_CHECK_DEADLINE (seconds, default 570) stops starting stages
# that would run past it.
set -uo pipefail
cd "$(dirname "$0")/.."
here=$PWD
out=${OUT:-$here/gpu_out}
mkdir -p "$out"
start=$(date +%s)
deadline=${SPECULA_CHECK_DEADLINE:-570}
src=$(cat .devpack/source_dir)
build=build/dev

# The build's absolute paths: recreate this checkout's path on this machine.
if [[ $here != "$src" && ! -e $src ]]; then mkdir -p "$(dirname "$src")" && ln -s "$here" "$src"; fi
# The packed build, unless this is the machine that built it.
[[ -f $build/CMakeCache.txt ]] || { mkdir -p build && rm -rf "$build" && cp -r ".devpack/$build" "$build"; }
cublas=$(find /usr/local/cuda*/ /opt /usr/lib -name 'libcublas.so.13' 2>/dev/null | head -1)
# NCCL is not packed (213 MB): the machine's Python packages (nvidia-nccl) carry it.
nccl=$(find /usr/local/cuda*/ /opt /usr/lib -name 'libnccl.so.2' 2>/dev/null | head -1)
export LD_LIBRARY_PATH=$here/.devpack/lib:${cublas:+$(dirname "$cublas"):}${nccl:+$(dirname "$nccl"):}/usr/local/cuda/lib64:$here/.devpack/cudart${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export TMPDIR=${TMPDIR:-/tmp}
model=$TMPDIR/specula_bench/llama-3.2-1b-bf16

left() { echo $(( deadline - ($(date +%s) - start) )); }
stage() {  # stage NAME SECONDS COMMAND...: runs COMMAND under a time limit, logged to $out/NAME.log
  local name=$1 limit=$2; shift 2
  local l; l=$(left)
  if (( l < 20 )); then echo "== $name: skipped, $l s left" | tee -a "$out/summary.txt"; return; fi
  (( limit > l )) && limit=$l
  echo "== $name (limit $limit s)"
  local t0; t0=$(date +%s)
  timeout -k 5 "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  echo "== $name: rc $rc in $(( $(date +%s) - t0 )) s" | tee -a "$out/summary.txt"
}

for s in "$@"; do
  case $s in
    probe) stage probe 30 bash -c "nvidia-smi; nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.total --format=csv;
             grep -m1 'model name' /proc/cpuinfo; grep -o 'avx512[a-z_0-9]*' /proc/cpuinfo | sort -u | tr '\n' ' '; echo;
             echo pwd=$here src=$src cublas=$cublas nccl=$nccl; which ctest ncu nsys python3; nvcc --version | tail -1;
             for f in $build/specula $build/libspecula_cuda.so $build/tests/gpu_tests; do ldd \$f | grep -E 'not found|cublas|cudart'; done" ;;
    gpu) stage gpu 300 ctest --test-dir "$build" -L gpu -LE multigpu -V --timeout 240 ;;
    bench) stage bench 300 "$build/bench/gpu_bench" --benchmark_out="$out/gpu_bench.json" --benchmark_out_format=json \
             ${SPECULA_BENCH_FILTER:+--benchmark_filter=$SPECULA_BENCH_FILTER} ${SPECULA_BENCH_ARGS:-} ;;
    # Decode steps at batch 1 and 8 under each CUDA knob setting, one process each.
    # Names: g(emv) f(use) a(ttention blocks per SM); the first setting again last, for the drift.
    variants) i=0; IFS=';' read -ra list <<< "${SPECULA_VARIANTS:-1 1 8;1 0 8;1 1 2;1 0 2;0 0 8;1 1 8}"
      for v in "${list[@]}"; do
        read -r g f a <<< "$v"; i=$((i + 1))
        SPECULA_CUDA_GEMV=$g SPECULA_CUDA_FUSE=$f SPECULA_CUDA_ATTN_BLOCKS_PER_SM=$a stage "v${i}_g${g}_f${f}_a${a}" 60 \
          "$build/bench/gpu_bench" --benchmark_filter='DecodeStep/batch:(1|8)/graphs:1'
      done ;;
    hf) stage hf 200 python3 bench/hf_generate_bench.py "$model" --batch 1 8 32 64 ;;
    # Kernel durations only (one pass each) of about one decode step launched op by op.
    ncu) stage ncu 150 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum \
             --launch-skip 1000 --launch-count 230 --print-summary per-kernel "$build/bench/gpu_bench" \
             --benchmark_filter='DecodeStep/batch:1/graphs:0' --benchmark_min_time=0.05 ;;
    # Two OpenMP threads per test: 16 test processes each spinning 16 threads stalled the run.
    suite) OMP_NUM_THREADS=2 stage suite 400 ctest --test-dir "$build" -LE gpu -j 8 --output-on-failure --timeout 300 ;;
    # Part of the suite: the tests whose names match $SPECULA_CTEST_REGEX.
    some) OMP_NUM_THREADS=2 stage some 200 ctest --test-dir "$build" -R "${SPECULA_CTEST_REGEX:-.}" -LE gpu -j 8 --output-on-failure ;;
    # A step-cost calibration of the llama-3.2-1b shape (bf16, random weights) on this GPU: $out/gpu-1b-cost.json.
    calibrate) [[ -f $model/config.json ]] || "$build/specula" make-model --shape llama-3.2-1b --dtype bf16 --out "$model" > /dev/null
      stage calibrate 200 "$build/specula" experiment calibrate --model "$model" --device cuda --out "$out/gpu-1b-cost.json" --no-progress ;;
    fidelity) rm -rf "$TMPDIR/fidelity"
      SPECULA_BIN=$here/$build/specula SPECULA_FIDELITY_AFTER=0 stage fidelity 480 \
        bash bench/sim_fidelity.sh "$TMPDIR/fidelity" gpu-1b "${SPECULA_FIDELITY_REQUESTS:-240}" 2
      tar -czf "$out/fidelity.tar.gz" -C "$TMPDIR" fidelity ;;
    cpu-fidelity) rm -rf "$TMPDIR/cpu-fidelity"
      OMP_NUM_THREADS=2 SPECULA_BIN=$here/$build/specula stage cpu-fidelity 300 \
        taskset -c 2,3 bash bench/sim_fidelity.sh "$TMPDIR/cpu-fidelity" tinystories 400
      tar -czf "$out/cpu-fidelity.tar.gz" -C "$TMPDIR" cpu-fidelity ;;
    *) echo "gpu_check: unknown stage '$s'" >&2; exit 2 ;;
  esac
done
echo "== total $(( $(date +%s) - start )) s"
cat "$out/summary.txt"
for f in "$out"/*.log; do echo "--- $(basename "$f") (tail)"; tail -n "${SPECULA_TAIL_LINES:-25}" "$f"; done | tail -c 9000
