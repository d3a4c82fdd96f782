#!/usr/bin/env bash
# Installs every build, test and tooling dependency of Specula on a fresh Debian 12 machine.
# Idempotent: skips apt when all packages are already present.
set -euo pipefail

APT_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config
  libomp-dev
  libabsl-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libicu-dev
  python3 python3-pip
)

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "[install_deps] apt-get install ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Python tooling: the numpy reference implementation used by the parity tests.
if ! python3 -c "import numpy" >/dev/null 2>&1; then
  echo "[install_deps] pip install numpy" >&2
  python3 -m pip install -q numpy || python3 -m pip install -q --break-system-packages numpy
fi
