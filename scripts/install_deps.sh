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
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc libcpp-httplib-dev
  libssl-dev openssl  # TLS files checked at startup (serving/tls_files.cc); test certificates
  libboost-dev  # the HTTP server: Boost.Beast and Asio (header-only)
  libopenmpi-dev openmpi-bin
  # The shared KV block store (kvstore/): hiredis 0.14's client (only kvstore/redis_store.cc), xxHash
  # for the stored blocks' checksums, and the redis-server its tests start on their own sockets (never
  # the system's service).
  libhiredis-dev libxxhash-dev redis-server
  # The fleet behind a load balancer (scripts/fleet.sh, deploy/nginx/): Debian's open-source nginx. Where
  # the machine runs services, the package may start its own on port 80; the fleet leaves it alone.
  nginx
  clang-14 libclang-rt-14-dev llvm-14  # libFuzzer targets (the fuzz preset); llvm-symbolizer
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

# Python tooling: the numpy reference implementation used by the parity tests, and the clients the
# serving tests drive a real `specula serve` with (grpcio with its stub generator, health and
# reflection clients; the official openai client; the Prometheus text parser).
pip_install() {
  echo "[install_deps] pip install $*" >&2
  python3 -m pip install -q "$@" || python3 -m pip install -q --break-system-packages "$@"
}
python3 -c "import numpy" >/dev/null 2>&1 || pip_install numpy
# The experiment report's plots (`specula experiment report`).
python3 -c "import matplotlib" >/dev/null 2>&1 || pip_install matplotlib
# The reference renderer of the chat template tests (what transformers' apply_chat_template uses).
python3 -c "import jinja2" >/dev/null 2>&1 || pip_install jinja2
python3 -c "import grpc, grpc_tools, grpc_health, grpc_reflection, openai, prometheus_client" >/dev/null 2>&1 ||
  pip_install grpcio grpcio-tools grpcio-health-checking grpcio-reflection openai prometheus-client
# llama.cpp's GGUF reader/writer: the dequantization reference and the F32 / Q8_0 conversions.
python3 -c "import gguf" >/dev/null 2>&1 || pip_install gguf
# The GGUF tokenizer tests' reference: transformers' GGUF tokenizer conversion on HF tokenizers (no torch).
python3 -c "import transformers, tokenizers, gguf" >/dev/null 2>&1 || pip_install transformers tokenizers gguf
# The structured-output tests' independent checker of outputs against their schemas.
python3 -c "import jsonschema" >/dev/null 2>&1 || pip_install jsonschema
# deploy/k8s's manifests checked offline against Kubernetes' schemas (tests/deploy); pinned, since
# its bundled schemas move with its releases.
python3 -c "import kubernetes_validate" >/dev/null 2>&1 || pip_install kubernetes-validate==1.37.0
# The CRD kinds (ServiceMonitor, ScaledObject) and kustomization files against deploy/k8s/schemas/;
# pinned like the above. PyYAML: deploy/k8s/render.py, which renders the overlays.
python3 -c "import check_jsonschema" >/dev/null 2>&1 || pip_install check-jsonschema==0.39.0
python3 -c "import yaml" >/dev/null 2>&1 || pip_install pyyaml
# The function-length rule of scripts/check_code.sh.
python3 -c "import lizard" >/dev/null 2>&1 || pip_install lizard
bash "$(dirname "$0")/fetch_models.sh"
# xgrammar 0.2.9's sources (constrain/), unpacked in the cache; cmake/xgrammar.cmake builds them.
bash "$(dirname "$0")/fetch_xgrammar.sh" >/dev/null
