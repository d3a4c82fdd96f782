#!/usr/bin/env bash
# expect_error.sh REGEX CMD...: passes when CMD exits with status 1 (an error, not a crash or
# signal) and its stderr matches REGEX (grep -E).
regex="$1"; shift
err=$("$@" 2>&1 >/dev/null); rc=$?
if [ "$rc" -ne 1 ]; then
  echo "expected exit status 1, got $rc"; echo "$err"; exit 1
fi
if ! grep -qE -- "$regex" <<<"$err"; then
  echo "stderr does not match /$regex/:"; echo "$err"; exit 1
fi
echo "ok: $err"
