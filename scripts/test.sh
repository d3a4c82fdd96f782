#!/usr/bin/env bash
# test.sh [--asan]: installs dependencies, builds, and runs the whole test suite with CTest.
# --asan builds and runs the suite under AddressSanitizer + UndefinedBehaviorSanitizer instead
# (clang-14; the asan preset also builds the fuzz targets, which scripts/fuzz.sh --preset asan runs).
set -euo pipefail
cd "$(dirname "$0")/.."
preset=release
if [ "${1:-}" = "--asan" ]; then preset=asan; fi
bash scripts/install_deps.sh
bash scripts/build.sh "$preset"
ctest --preset "$preset" -j "$(nproc)"
