#!/usr/bin/env bash
# check_code.sh: the layout and size rules of docs/architecture.md. The include direction of its
# table (scripts/check_layout.py), and no function over 80 lines in engine/, serving/, tools/, spec/,
# verify/, scheduler/ or draft/ (lizard, from PyPI: scripts/install_deps.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 scripts/check_layout.py
# -C and -a set past any real value: only the length (-L) is a rule here.
if ! python3 -m lizard -L 80 -C 100000 -a 1000 -w engine serving tools spec verify scheduler draft sim; then
  echo "check_code: functions over 80 lines (above); split them" >&2
  exit 1
fi
echo "functions: none over 80 lines in engine, serving, tools, spec, verify, scheduler, draft, sim"
