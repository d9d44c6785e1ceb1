#!/usr/bin/env bash
# Where the build's time goes: builds zinf from scratch in a folder of its own
# with every compile and link timed, then prints the slowest translation
# units, the slowest links and the totals, so the next slowdown is visible.
#
#   scripts/build-times.sh [--top N] [--keep DIR] [--jobs N] [MAKE-ARGS...]
#
#   --top N     how many of the slowest steps to list (default 15)
#   --keep DIR  build in DIR and keep it (default: a temporary folder, removed)
#   --jobs N    make -jN (default: every core)
#   MAKE-ARGS   targets and variables for make (default: `all tests`, what
#               `make test` builds), e.g. `all` or `NO_CUDA=1 all`
#
# The main build/ and bin/ are not touched. Wall time is the whole make;
# "CPU-seconds" adds up each step's own wall time, which on an idle machine is
# its CPU time: wall x cores below it means the build waits on a few long steps.
# Exit status: make's, or 64 for a bad option.
# (Internally: `build-times.sh --exec LOG CMD...` times one step; the Makefile
# runs every compile and link through $(LAUNCH).)
set -euo pipefail

if [[ ${1:-} == --exec ]]; then
  log=$2
  shift 2
  out=?
  args=("$@")
  for ((i = 0; i < ${#args[@]}; i++)); do
    [[ ${args[i]} == -o ]] && out=${args[i + 1]}
  done
  case $out in
  *.o | *.gch | *.pch) kind=compile ;;
  *) kind=link ;;
  esac
  start=${EPOCHREALTIME/,/.}
  rc=0
  "$@" || rc=$?
  end=${EPOCHREALTIME/,/.}
  printf '%s\t%s\t%s\n' "$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.2f", b - a }')" "$kind" "$out" >>"$log"
  exit $rc
fi

top=15 keep="" jobs=$(nproc 2>/dev/null || echo 1)
while (($#)); do
  case $1 in
  --top) top=${2:?--top needs a number}; shift 2 ;;
  --keep) keep=${2:?--keep needs a folder}; shift 2 ;;
  --jobs) jobs=${2:?--jobs needs a number}; shift 2 ;;
  -h | --help) sed -n '2,/^set /p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
  --*) echo "build-times.sh: unknown option $1 (see --help)" >&2; exit 64 ;;
  *) break ;;
  esac
done
[[ $top =~ ^[0-9]+$ && $jobs =~ ^[1-9][0-9]*$ ]] || { echo "build-times.sh: --top and --jobs take numbers" >&2; exit 64; }

cd "$(dirname "$0")/.."
root=$PWD
if [[ -n $keep ]]; then
  dir=$keep
  rm -rf "$dir"
  mkdir -p "$dir"
else
  dir=$(mktemp -d "${TMPDIR:-/tmp}/zinf-build-times.XXXXXX")
  trap 'rm -rf "$dir"' EXIT
fi
dir=$(cd "$dir" && pwd)
log=$dir/times.tsv
: >"$log"
(($#)) || set -- all tests

start=$SECONDS
rc=0
make --no-print-directory -j"$jobs" BUILD="$dir/build" BIN="$dir/bin" LAUNCH="$root/scripts/build-times.sh --exec $log" "$@" \
  >"$dir/make.log" 2>&1 || rc=$?
wall=$((SECONDS - start))
if ((rc != 0)); then
  echo "build-times.sh: make failed ($rc); its last lines:" >&2
  tail -n 20 "$dir/make.log" >&2
fi

strip() { sed "s|$dir/build/||; s|$dir/||"; }
echo "# slowest compiles (seconds, object)"
awk -F'\t' '$2 == "compile"' "$log" | sort -rn | head -n "$top" | awk -F'\t' '{ printf "%8.1f  %s\n", $1, $3 }' | strip
echo "# slowest links"
awk -F'\t' '$2 == "link"' "$log" | sort -rn | head -n 5 | awk -F'\t' '{ printf "%8.1f  %s\n", $1, $3 }' | strip
awk -F'\t' -v wall="$wall" -v jobs="$jobs" '
  $2 == "compile" { c += $1; nc++ } $2 == "link" { l += $1; nl++ }
  END {
    printf "# totals: %d compiles %.0f CPU-s, %d links %.0f CPU-s; wall %d s (%dm%02ds) at -j%d\n",
      nc, c, nl, l, wall, wall / 60, wall % 60, jobs
  }' "$log"
exit $rc
