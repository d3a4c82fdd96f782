#!/bin/sh
# Compiles `specula` and its module (libspecula_cli.so) for the image, stripped, into /out. Run inside
# the build root filesystem: by the Containerfile's build stage, or by build.sh's chroot when no
# container runtime works. The sources are at /src, xgrammar's at /xgrammar.
#   MARCH: the kernels' SIMD level (-march); x86-64-v3 (AVX2, FMA) by default.
# CPU only (no CUDA in the image), no MPI (one rank per pod), no tests or benchmarks.
set -eu
MARCH="${MARCH:-x86-64-v3}"
cmake -S /src -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release \
  "-DCMAKE_CXX_FLAGS_RELEASE=-O3 -march=$MARCH -DNDEBUG" \
  "-DCMAKE_C_FLAGS_RELEASE=-O3 -march=$MARCH -DNDEBUG" \
  -DSPECULA_CUDA=OFF -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON \
  -DSPECULA_BUILD_TESTS=OFF -DSPECULA_BUILD_BENCH=OFF -DSPECULA_XGRAMMAR_DIR=/xgrammar
cmake --build /build --target specula specula_cli
mkdir -p /out
strip -o /out/specula /build/specula
strip -o /out/libspecula_cli.so /build/libspecula_cli.so
