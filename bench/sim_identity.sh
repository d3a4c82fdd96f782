#!/usr/bin/env bash
# Two builds of `specula simulate` on the same inputs, for a change that must not move the
# simulator's output: the replay of the committed ONLINE fixture (tests/fixtures/sim_online) and a
# 16-replica fleet on its calibration with fixed flags (speculation, preemptions, refusals). Prints
# one line per command, identical or differ, and exits 0 only if both are byte-identical (stdout)
# and both builds exit 0 on both.
#
#   bash bench/sim_identity.sh OLD_SPECULA NEW_SPECULA [OUT_DIR]
#   e.g. bash bench/sim_identity.sh /tmp/before/specula build/release/specula
#
# The commands run from the source tree with paths relative to it, so the cost file's description
# in the output is the same from any clone. OUT_DIR keeps each output (NAME.old.json, NAME.new.json,
# NAME.old.err, NAME.new.err); by default a temporary folder, removed at the end.
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: bash bench/sim_identity.sh OLD_SPECULA NEW_SPECULA [OUT_DIR]" >&2
  exit 2
fi
abs() { echo "$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"; }
old=$(abs "$1") new=$(abs "$2")
if [ $# -ge 3 ]; then
  out=$(mkdir -p "$3" && cd "$3" && pwd)
else
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
fi
cd "$(dirname "$0")/.."
fixture=tests/fixtures/sim_online
validate=(simulate --validate "$fixture" --cost "$fixture/cost.json" --json)
fleet=(simulate --cost "$fixture/cost.json" --replicas 16 --request-rate 8000 --num-prompts 3000
       --input-len 32 --output-len 32 --len-spread 0.5 --max-num-seqs 16 --num-blocks 40 --max-queue-len 4
       --spec-method draft --num-spec-tokens 2 --acceptance 0.5,0.3 --acceptance-spread 10 --step-jitter
       --seed 7 --goodput "ttft:5 tpot:1" --per-replica --json)

# Runs one command with both builds; prints its line and returns 1 unless both exit 0 with the
# same stdout.
compare() {
  local name=$1 which bin rc failed=0
  shift
  for which in old new; do
    bin=$([ $which = old ] && echo "$old" || echo "$new")
    rc=0
    "$bin" "$@" >"$out/$name.$which.json" 2>"$out/$name.$which.err" || rc=$?
    if [ $rc != 0 ]; then
      echo "$name: the $which build exited $rc ($bin) $(tail -n 1 "$out/$name.$which.err")"
      failed=1
    fi
  done
  [ $failed = 0 ] || return 1
  if cmp -s "$out/$name.old.json" "$out/$name.new.json"; then
    echo "$name: identical ($(wc -c <"$out/$name.old.json") bytes)"
  else
    echo "$name: differ ($(cd "$out" && cmp "$name.old.json" "$name.new.json" 2>&1 | head -n 1))"
    return 1
  fi
}

status=0
compare validate "${validate[@]}" || status=1
compare fleet "${fleet[@]}" || status=1
exit $status
