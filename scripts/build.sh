#!/usr/bin/env bash
# build.sh [release|asan]: configures (once) and builds a CMake preset with Ninja.
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-release}"
if [ ! -f "build/$preset/build.ninja" ]; then
  cmake --preset "$preset" >/dev/null
fi
cmake --build --preset "$preset"
