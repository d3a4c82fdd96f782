#!/usr/bin/env bash
# Builds the Specula image from Debian's packages alone: nothing is pulled from an image registry.
#
#   deploy/image/build.sh [--out DIR] [--binary source|DIR] [--runtime auto|buildah|none]
#                         [--march LEVEL] [--tag NAME] [--fresh]
#
# 1. mmdebstrap assembles two Debian bookworm root filesystems (tarballs): a build one with the
#    compilers and -dev packages, and a runtime one with only the shared libraries the binary
#    loads, python3 and matplotlib (the experiment report) and a user 65532.
# 2. Where buildah can run a build step, podman imports them as local base images
#    (localhost/specula-{build,runtime}-base:bookworm) and buildah builds deploy/image/Containerfile
#    (chroot isolation: a RUN step needs no OCI runtime): the build stage compiles, the runtime stage
#    takes the binary. The image then runs under podman where podman can run a container, else under
#    buildah's chroot isolation.
# 3. Where no container tool works (--runtime none forces it), the same two stages are done without
#    one: the binary is compiled in a chroot of the build root filesystem that mmdebstrap sets up,
#    and umoci writes an OCI image (the runtime root filesystem as one layer, the binary and report
#    script as a second) with the Containerfile's entrypoint, user and environment; its root
#    filesystem then runs in a chroot as user 65532.
# Either way the image ends as an OCI layout (DIR/oci, tag TAG) that is inspected: its files, size,
# entrypoint and user. It is never committed (DIR is under build/, which git ignores).
#
# Needs: root, mmdebstrap and umoci (apt install mmdebstrap umoci), podman and buildah for step 2
# (apt install podman buildah), network access to the Debian mirror; about 3 GB under DIR.
# --binary DIR takes DIR/specula and DIR/libspecula_cli.so instead of compiling: a build on Debian 12
# configured as compile.sh configures it (no MPI, no CUDA: the runtime has neither). Not part of CI.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
OUT="$ROOT/build/image"
BINARY=source
RUNTIME=auto
MARCH=x86-64-v3
TAG=latest
FRESH=0
SUITE=bookworm
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SECURITY="${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}"

# The compilers and libraries of scripts/install_deps.sh that the binary needs (no tests, no
# benchmarks, no CUDA, no MPI).
BUILD_PACKAGES=(
  build-essential cmake ninja-build pkg-config
  libabsl-dev nlohmann-json3-dev libicu-dev
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc libcpp-httplib-dev
  libssl-dev libboost-dev libhiredis-dev libxxhash-dev
)
# What `ldd` finds in the binary and its module, plus the report's Python (checked after the build:
# a missing library fails it).
RUNTIME_PACKAGES=(
  libabsl20220623 libbrotli1 libc-ares2 libcpp-httplib0.11 libgomp1 libgrpc++1.51 libgrpc29
  libhiredis0.14 libicu72 libprotobuf32 libre2-9 libssl3 libstdc++6 libxxhash0
  python3 python3-matplotlib
  # fonttools (matplotlib's) depends on "python3-scipy | python3-munkres"; naming munkres keeps out
  # scipy, which would bring pythran and with it g++ (the runtime root filesystem would double).
  python3-munkres
)
# The runtime image keeps licences but no manuals, documentation or translations.
SLIM=(
  --dpkgopt='path-exclude=/usr/share/man/*'
  --dpkgopt='path-exclude=/usr/share/locale/*'
  --dpkgopt='path-include=/usr/share/locale/locale.alias'
  --dpkgopt='path-exclude=/usr/share/doc/*'
  --dpkgopt='path-include=/usr/share/doc/*/copyright'
  --dpkgopt='path-exclude=/usr/share/info/*'
)

# The image's environment (the Containerfile's ENV, umoci's config where no container tool works).
IMAGE_ENV=(
  SPECULA_REPORT_SCRIPT=/usr/local/share/specula/experiments/report.py
  SPECULA_BINARY=/usr/local/bin/specula
  MPLCONFIGDIR=/tmp/matplotlib
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
)

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
die() { echo "[image] error: $*" >&2; exit 1; }
log() { echo "[image] $*" >&2; }

while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT="$(realpath -m "$2")"; shift 2 ;;
    --binary) BINARY="$2"; [ "$2" = source ] || BINARY="$(realpath "$2")"; shift 2 ;;
    --runtime) RUNTIME="$2"; shift 2 ;;
    --march) MARCH="$2"; shift 2 ;;
    --tag) TAG="$2"; shift 2 ;;
    --fresh) FRESH=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$1' (--help lists them)" ;;
  esac
done
case "$RUNTIME" in auto|buildah|none) ;; *) die "--runtime must be auto, buildah or none, got '$RUNTIME'" ;; esac
[ "$(id -u)" -eq 0 ] || die "run as root (mmdebstrap's root mode and umoci's unpack keep file owners)"
for tool in mmdebstrap umoci python3; do
  command -v "$tool" >/dev/null || die "$tool is missing (apt install mmdebstrap umoci)"
done
if [ "$BINARY" != source ]; then
  for f in specula libspecula_cli.so; do
    [ -f "$BINARY/$f" ] || die "--binary: $BINARY/$f is missing"
  done
fi

START=$SECONDS
mkdir -p "$OUT/rootfs"
SOURCES=("deb $MIRROR $SUITE main" "deb $MIRROR $SUITE-updates main" "deb $SECURITY $SUITE-security main")

# mmdebstrap NAME PACKAGES...: OUT/rootfs/NAME.tar, kept while its package list is unchanged.
rootfs() {
  local name="$1"; shift
  local tar="$OUT/rootfs/$name.tar" stamp="$OUT/rootfs/$name.stamp" want extra=()
  # The runtime's user is 65532, the Deployment's runAsUser (no shell, no home). It has no
  # byte-compiled Python (a fifth of its size): only the experiment report runs Python, and it
  # compiles what it imports in memory (about a second).
  if [ "$name" = runtime ]; then
    extra=("${SLIM[@]}"
      --customize-hook='echo "specula:x:65532:65532:specula:/nonexistent:/usr/sbin/nologin" >> "$1/etc/passwd"'
      --customize-hook='echo "specula:x:65532:" >> "$1/etc/group"'
      --customize-hook='find "$1/usr/lib/python3" "$1/usr/lib/python3.11" -name __pycache__ -prune -exec rm -rf {} +')
  fi
  want="$SUITE $MIRROR $* ${extra[*]}"
  if [ "$FRESH" -eq 0 ] && [ -f "$tar" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
    log "$name root filesystem: kept $tar"
    return
  fi
  log "$name root filesystem: mmdebstrap $SUITE ($# packages and their dependencies) -> $tar"
  rm -f "$stamp"
  nice mmdebstrap --mode=root --variant=essential --include="$(IFS=,; echo "$*")" "${extra[@]}" \
    "$SUITE" "$tar" "${SOURCES[@]}"
  echo "$want" > "$stamp"
}

# The build context: the working tree's files (tracked and untracked, not ignored) as src/,
# xgrammar's sources as xgrammar/, a binary built elsewhere as prebuilt/ (--binary DIR).
stage_context() {
  local ctx="$OUT/context"
  rm -rf "$ctx"
  mkdir -p "$ctx/src" "$ctx/xgrammar" "$ctx/prebuilt"
  # A tracked file deleted in the working tree is skipped (--ignore-failed-read), as git would.
  (cd "$ROOT" && git ls-files -z --cached --others --exclude-standard |
     tar --null -T - --ignore-failed-read -cf - 2>/dev/null) | tar -xf - -C "$ctx/src"
  local xg
  xg="$(bash "$ROOT/scripts/fetch_xgrammar.sh")"
  cp -a "$xg/." "$ctx/xgrammar/"
  if [ "$BINARY" != source ]; then
    strip -o "$ctx/prebuilt/specula" "$BINARY/specula"
    strip -o "$ctx/prebuilt/libspecula_cli.so" "$BINARY/libspecula_cli.so"
  fi
}

# buildah, where it can run a step in a chroot of the runtime base (RUN needs that); podman imports
# the bases. Prints how the image will run: podman (a container), buildah (chroot isolation).
container_tool() {
  [ "$RUNTIME" != none ] && command -v podman >/dev/null && command -v buildah >/dev/null || return 1
  podman import -q "$OUT/rootfs/runtime.tar" "localhost/specula-runtime-base:$SUITE" >/dev/null || return 1
  local c ok=1
  c="$(buildah from -q "localhost/specula-runtime-base:$SUITE")" || return 1
  buildah run --isolation chroot "$c" /bin/true >/dev/null 2>&1 || ok=0
  buildah rm "$c" >/dev/null
  [ "$ok" -eq 1 ] || return 1
  if podman run --rm --network=none "localhost/specula-runtime-base:$SUITE" /bin/true >/dev/null 2>&1; then
    echo podman
  else
    echo buildah
  fi
}

# run_image COMMAND ARGS...: a command in the image, as its user, in a container or a chroot.
run_image() {
  local image="localhost/specula:$TAG"
  if [ "$RUN_WITH" = podman ]; then
    podman run --rm --network=none --entrypoint "$1" "$image" "${@:2}"
    return
  fi
  local c rc=0
  c="$(buildah from -q "$image")"
  buildah run --isolation chroot --user 65532:65532 "$c" -- "$@" || rc=$?
  buildah rm "$c" >/dev/null
  return "$rc"
}

# The checks that the image runs: the binary, its module (serve), the report's Python.
smoke() {
  "$@" /usr/local/bin/specula --help | sed -n 1p
  "$@" /usr/local/bin/specula serve --help | sed -n 1p
  "$@" python3 -c 'import os, matplotlib; print("uid", os.getuid(), "matplotlib", matplotlib.__version__, "report", os.environ["SPECULA_REPORT_SCRIPT"])'
}

build_with_buildah() {
  log "buildah: importing the build root filesystem; building deploy/image/Containerfile"
  podman import -q "$OUT/rootfs/build.tar" "localhost/specula-build-base:$SUITE" >/dev/null
  local from=build
  [ "$BINARY" = source ] || from=prebuilt
  nice buildah build --isolation chroot -f "$ROOT/deploy/image/Containerfile" \
    --build-arg "BINARY_FROM=$from" --build-arg "MARCH=$MARCH" \
    -t "localhost/specula:$TAG" "$OUT/context"
  rm -rf "$OUT/oci"
  buildah push -q "localhost/specula:$TAG" "oci:$OUT/oci:$TAG"
  log "running it ($RUN_WITH)"
  smoke run_image
}

# No container runtime: compile in a chroot of the build root filesystem (mmdebstrap runs the
# hooks with /proc and /dev mounted), then write the OCI image with umoci.
build_without_runtime() {
  local bin="$OUT/binary"
  rm -rf "$bin"
  if [ "$BINARY" != source ]; then
    cp -a "$OUT/context/prebuilt" "$bin"
  else
    log "no container runtime: compiling in a chroot of a fresh build root filesystem"
    nice mmdebstrap --mode=root --variant=essential --include="$(IFS=,; echo "${BUILD_PACKAGES[*]}")" \
      --customize-hook="copy-in $OUT/context/src $OUT/context/xgrammar /" \
      --customize-hook="chroot \"\$1\" env MARCH=$MARCH sh /src/deploy/image/compile.sh" \
      --customize-hook="copy-out /out $OUT" \
      "$SUITE" /dev/null "${SOURCES[@]}"
    mv "$OUT/out" "$bin"
  fi
  log "umoci: the runtime root filesystem as a layer, the binary and report script as a second"
  local layout="$OUT/oci" bundle="$OUT/bundle"
  rm -rf "$layout" "$bundle"
  umoci init --layout "$layout"
  umoci new --image "$layout:$TAG"
  umoci unpack --image "$layout:$TAG" "$bundle"
  tar --xattrs --xattrs-include='*' -xf "$OUT/rootfs/runtime.tar" -C "$bundle/rootfs"
  umoci repack --refresh-bundle --image "$layout:$TAG" --history.created_by "mmdebstrap $SUITE runtime" "$bundle"
  install -m 0755 "$bin/specula" "$bin/libspecula_cli.so" "$bundle/rootfs/usr/local/bin/"
  install -d "$bundle/rootfs/usr/local/share/specula/experiments"
  install -m 0644 "$OUT/context/src/experiments/"*.py "$bundle/rootfs/usr/local/share/specula/experiments/"
  umoci repack --image "$layout:$TAG" --history.created_by "specula binary and report script" "$bundle"
  # The Containerfile's runtime stage, line for line.
  umoci config --image "$layout:$TAG" \
    --config.entrypoint /usr/local/bin/specula --config.cmd --help \
    --config.user 65532:65532 --config.workingdir /tmp \
    "${IMAGE_ENV[@]/#/--config.env=}" \
    --config.exposedports 8000/tcp --config.exposedports 50051/tcp
  umoci gc --layout "$layout"
  rm -rf "$bundle"
  # Not a container: the image's root filesystem in a chroot (with its own /proc, where the binary
  # finds its module) as user 65532, with the image's environment.
  log "running its root filesystem in a chroot as user 65532"
  umoci unpack --image "$layout:$TAG" "$bundle" >/dev/null
  smoke in_chroot "$bundle/rootfs"
  rm -rf "$bundle"
}

in_chroot() {
  local rootfs="$1"; shift
  unshare --pid --fork --mount-proc="$rootfs/proc" \
    chroot --userspec=65532:65532 "$rootfs" env -i "${IMAGE_ENV[@]}" "$@"
}

# The OCI layout's files, size, entrypoint and user, whichever path wrote it.
inspect() {
  local layout="$OUT/oci" bundle="$OUT/inspect"
  rm -rf "$bundle"
  umoci unpack --image "$layout:$TAG" "$bundle" >/dev/null
  local missing
  missing="$(chroot "$bundle/rootfs" sh -c 'ldd /usr/local/bin/specula /usr/local/bin/libspecula_cli.so' | grep 'not found' || true)"
  [ -z "$missing" ] || die "libraries missing in the image: $missing"
  find "$bundle/rootfs" -xdev | sed "s|^$bundle/rootfs||" | sort > "$OUT/files.txt"
  python3 - "$layout" "$TAG" "$bundle/rootfs" "$OUT/files.txt" "$PATH_TAKEN" "$BINARY" \
    "$((SECONDS - START))" <<'EOF'
import json, os, subprocess, sys
layout, tag, rootfs, files, path, binary, seconds = sys.argv[1:]
def blob(digest):
    algo, hexd = digest.split(":")
    return os.path.join(layout, "blobs", algo, hexd)
index = json.load(open(os.path.join(layout, "index.json")))
desc = next(m for m in index["manifests"] if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag)
manifest = json.load(open(blob(desc["digest"])))
config = json.load(open(blob(manifest["config"]["digest"])))["config"]
layers = manifest["layers"]
du = lambda p: int(subprocess.run(["du", "-sb", p], capture_output=True, text=True).stdout.split()[0])
mb = lambda n: f"{n / 1e6:.1f} MB"
n_files = sum(1 for _ in open(files))
print("\n=== specula image ===")
print(f"path:         {path}")
print(f"binary:       {'compiled from this tree (compile.sh)' if binary == 'source' else binary}")
print(f"layout:       {layout}:{tag}")
print(f"entrypoint:   {json.dumps(config.get('Entrypoint'))}  cmd: {json.dumps(config.get('Cmd'))}")
print(f"user:         {config.get('User')}")
print(f"env:          {', '.join(e for e in config.get('Env', []) if e.startswith(('SPECULA', 'MPL')))}")
print(f"layers:       {len(layers)}: " + ", ".join(f"{mb(l['size'])} ({l['mediaType'].rsplit('.', 1)[-1]})" for l in layers))
print(f"image size:   {mb(sum(l['size'] for l in layers))} in its layers as stored; {mb(du(rootfs))} unpacked")
print(f"files:        {n_files} (list: {files})")
for f in ["/usr/local/bin/specula", "/usr/local/bin/libspecula_cli.so"]:
    print(f"              {f}: {mb(os.path.getsize(rootfs + f))}")
print(f"time:         {seconds} s")
EOF
  rm -rf "$bundle"
}

rootfs runtime "${RUNTIME_PACKAGES[@]}"
stage_context
if RUN_WITH="$(container_tool)"; then
  PATH_TAKEN="buildah build of the Containerfile, run with $RUN_WITH"
  [ "$RUN_WITH" = podman ] || PATH_TAKEN="$PATH_TAKEN (podman cannot run a container here)"
  rootfs build "${BUILD_PACKAGES[@]}"
  build_with_buildah
else
  [ "$RUNTIME" = buildah ] && die "buildah cannot run a build step here (buildah run --isolation chroot)"
  PATH_TAKEN="no container tool: OCI image written by umoci, run in a chroot"
  build_without_runtime
fi
inspect
