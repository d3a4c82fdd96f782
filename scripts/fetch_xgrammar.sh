#!/usr/bin/env bash
# Fetches xgrammar's source distribution (its C++ core is the grammar engine of constrain/) into the
# scripts' cache, never into the repository, and unpacks it there:
#   $SPECULA_DEPS_CACHE (default ~/.cache/specula)/xgrammar-0.2.9/
# Pinned by version and SHA-256; cmake/xgrammar.cmake builds its own static target over the sources.
# Idempotent: an unpacked tree with its stamp is kept. Prints the source directory on stdout.
set -euo pipefail

VERSION=0.2.9
SHA256=87b466bca2475e29bb0323abc62c6c33cbcbcff47e5fb800a3e2099ac9620b90
CACHE="${SPECULA_DEPS_CACHE:-$HOME/.cache/specula}"
SDIST="$CACHE/xgrammar-$VERSION.tar.gz"
DIR="$CACHE/xgrammar-$VERSION"

if [ -f "$DIR/.specula-unpacked" ]; then
  echo "$DIR"
  exit 0
fi
mkdir -p "$CACHE"
if ! { [ -f "$SDIST" ] && echo "$SHA256  $SDIST" | sha256sum --check --status; }; then
  echo "[fetch_xgrammar] pip download xgrammar==$VERSION (source distribution) -> $CACHE" >&2
  python3 -m pip download -q --no-deps --no-binary xgrammar -d "$CACHE" "xgrammar==$VERSION" >&2
  if ! echo "$SHA256  $SDIST" | sha256sum --check --status; then
    echo "[fetch_xgrammar] $SDIST: SHA-256 is not $SHA256" >&2
    exit 1
  fi
fi
# Unpack beside the cache and move into place, so an interrupted run leaves no half tree behind.
tmp="$(mktemp -d "$CACHE/.xgrammar.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
tar -xzf "$SDIST" -C "$tmp"
touch "$tmp/xgrammar-$VERSION/.specula-unpacked"
rm -rf "$DIR"
mv "$tmp/xgrammar-$VERSION" "$DIR"
echo "[fetch_xgrammar] unpacked $DIR" >&2
echo "$DIR"
