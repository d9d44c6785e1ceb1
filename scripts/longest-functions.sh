#!/usr/bin/env bash
# The longest functions of libzinf: lines (first to last, blank and comment
# lines included) and qualified name, longest first, from Universal Ctags'
# end lines over libzinf/src and libzinf/include (.cpp .hpp .cu .cuh); a
# lambda counts in the function around it, not on its own line.
#   scripts/longest-functions.sh [N] [REV]
# N: how many (10); REV: a commit to count instead of the work tree
# (read through git archive).
set -euo pipefail
n=${1:-10}
rev=${2:-}
root=$(cd "$(dirname "$0")/.." && pwd)
command -v ctags >/dev/null || { echo "longest-functions: needs Universal Ctags (apt-get install universal-ctags)" >&2; exit 69; }
src=$root
if [[ -n $rev ]]; then
  src=$(mktemp -d /var/tmp/zinf-longest-XXXXXX)
  trap 'rm -rf "$src"' EXIT
  git -C "$root" archive "$rev" libzinf | tar -x -C "$src"
fi
cd "$src"
find libzinf/src libzinf/include -type f \( -name '*.cpp' -o -name '*.hpp' -o -name '*.cu' -o -name '*.cuh' \) |
  sort |
  ctags -L - -x --langmap=c++:+.cu.cuh --c++-kinds=f --fields=+neZ --_xformat='%{scope}::%N	%n	%{end}	%F' -o - |
  awk -F'\t' '$1 !~ /__anon/ && $3 ~ /^[0-9]+$/ { sub(/^::/, "", $1); printf "%6d  %s  (%s:%d)\n", $3 - $2 + 1, $1, $4, $2 }' |
  sort -k1,1nr -k2,2 | head -n "$n"
