#!/usr/bin/env bash
# Packs a CUDA build for a GPU machine that lacks this project's build dependencies (the lent
# device machines have CUDA and PyTorch but no Abseil or ICU, and no network): the built programs
# and CTest files and the shared libraries they load that are not glibc, libstdc++ or CUDA's, into
# .devpack/ (git-ignored; the test models travel with the tree, in models/). scripts/gpu_check.sh
# runs there from that pack.
#
#   cmake -S . -B build/dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPECULA_CUDA=ON \
#     -DCMAKE_CUDA_ARCHITECTURES=90 "-DCMAKE_CXX_FLAGS_RELEASE=-O3 -march=x86-64-v3 -DNDEBUG" \
#     "-DCMAKE_C_FLAGS_RELEASE=-O3 -march=x86-64-v3 -DNDEBUG"
#   ninja -C build/dev && scripts/gpu_pack.sh build/dev [PROGRAM...]
#
# PROGRAMs (paths under the build directory, e.g. tests/gpu_tests bench/gpu_bench) pack those
# programs alone, with the libraries they load: the whole build (~105 MB with ICU's 30 MB of data)
# is over the 64 MiB that travels to the device machine. NCCL (213 MB) never goes: the machine's
# Python packages carry it (gpu_check.sh finds it there).
#
# -march=x86-64-v3 (AVX2), because the GPU machine's CPU is not this one.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/dev}
shift || true
only=("$@")
[[ -f $build/CTestTestfile.cmake ]] || { echo "gpu_pack: $build is not a configured build directory" >&2; exit 2; }
rm -rf .devpack
mkdir -p .devpack/lib .devpack/cudart
# The build tree's CTest files and programs, at their paths (ctest runs them by absolute path, so
# gpu_check.sh recreates this checkout's path there).
find "$build" \( -name 'CTestTestfile.cmake' -o -name '*_include.cmake' -o -name '*_tests.cmake' \) ! -path '*/CMakeFiles/*' -print0 |
  xargs -0 -I{} install -D -m 644 {} ".devpack/{}"
bins=()
while IFS= read -r -d '' f; do
  file -b "$f" | grep -q 'ELF 64-bit.*\(executable\|shared object\)' || continue
  if ((${#only[@]})); then
    # The named programs, and the CUDA module that they load (dlopen).
    keep=0
    for p in "${only[@]}"; do [[ $f == "$build/$p" ]] && keep=1; done
    [[ $f == */libspecula_cuda.so ]] && keep=1
    ((keep)) || continue
  fi
  bins+=("$f")
done < <(find "$build" -type f -perm -u+x ! -path '*/CMakeFiles/*' -print0)
for f in "${bins[@]}"; do
  install -D "$f" ".devpack/$f"
  # Keep the CUDA module's line info for ncu; the rest only needs symbols.
  [[ $f == *libspecula_cuda.so ]] || strip --strip-debug ".devpack/$f"
done
# Shared libraries: everything but glibc, libstdc++/libgcc (newer there) and CUDA's own (the
# machine's toolkit is used; cudart goes in a fallback folder, same major version).
for f in "${bins[@]}"; do ldd "$f" 2>/dev/null | awk '/=> \//{print $3}'; done | sort -u | while read -r lib; do
  base=$(basename "$lib")
  case $base in
    libc.so*|libm.so*|libmvec.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libstdc++*|libgcc_s*) ;;
    libcublas*|libcuda.so*|libnccl*) ;;
    libcudart*) cp -L "$lib" .devpack/cudart/ ;;
    *) cp -L "$lib" .devpack/lib/ ;;
  esac
done
echo "$PWD" > .devpack/source_dir
du -sh .devpack
