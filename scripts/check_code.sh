#!/usr/bin/env bash
# check_code.sh: the layout and size rules of docs/architecture.md, over every tracked source file
# outside tests/ and docs/:
# - the include direction of the layout table (scripts/check_layout.py);
# - no function over 80 lines (lizard, from PyPI: scripts/install_deps.sh installs it); lizard does
#   not read CUDA, so the .cu and .cuh files are checked through copies named as C++;
# - no file over 800 lines;
# - no tracked file outside docs/ reads the shared folder beside a checkout: a plain clone has
#   nothing beside it.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 scripts/check_layout.py
fail=0

mapfile -t sources < <(git ls-files -- ':!tests/' ':!docs/' |
  grep -E '\.(cc|h|c|cu|cuh|py|sh|proto|cmake)$|(^|/)CMakeLists\.txt$')
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
lizard_inputs=()
for f in "${sources[@]}"; do
  case $f in
    *.cu | *.cuh) mkdir -p "$tmp/$(dirname "$f")" && cp "$f" "$tmp/$f.cc" && lizard_inputs+=("$tmp/$f.cc") ;;
    *.cc | *.h | *.c | *.py) lizard_inputs+=("$f") ;;
  esac
done
# -C and -a set past any real value: only the length (-L) is a rule here.
if ! python3 -m lizard -L 80 -C 100000 -a 1000 -w "${lizard_inputs[@]}" | sed "s|$tmp/||; s|\.cu\.cc:|.cu:|; s|\.cuh\.cc:|.cuh:|"; then
  echo "check_code: functions over 80 lines (above); split them" >&2
  fail=1
fi

long=$(wc -l "${sources[@]}" | awk '$2 != "total" && $1 > 800 {print "  " $2 ": " $1 " lines"}')
if [ -n "$long" ]; then
  printf 'check_code: files over 800 lines; split them:\n%s\n' "$long" >&2
  fail=1
fi

shared=$(git grep -n -e '\.\./s[h]ared' -- ':!docs/' || true)
if [ -n "$shared" ]; then
  printf 'check_code: these lines name the folder beside the checkout, which a plain clone lacks (carry the file in the tree or fetch it):\n%s\n' "$shared" >&2
  fail=1
fi

[ "$fail" -eq 0 ] || exit 1
echo "check_code: layout kept; in ${#sources[@]} source files outside tests/ and docs/, no function over 80 lines, no file over 800, nothing read from beside the checkout"
