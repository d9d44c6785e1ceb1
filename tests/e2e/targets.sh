#!/usr/bin/env bash
# Every make target the Makefile's header documents still builds, cheaply
# enough for make test (issue 29, finding 14: `make fuzz` no longer built on
# Debian 12's clang 14, __builtin_cpu_supports("x86-64-v4") in util/cpu.hpp,
# and nothing said so until a fuzz campaign was due). `make test` itself
# builds `all` and the tests; here each documented target's rules must
# resolve (make -n: no missing file, no missing rule), and every header of
# the library must parse with clang (make fuzz-syntax FUZZ_SYNTAX=quick:
# clang -fsyntax-only with the fuzz build's flags, a stamp a file, so a second
# run only parses what changed), and the fuzz targets too where the tests'
# build did not compile them with clang already (its FAST_CXX); the full
# fuzz-syntax also parses the 28 library files make fuzz links, 70 CPU-s from
# a clean clone.
# The reproduction: put __builtin_cpu_supports("x86-64-v4") back in
# libzinf/src/util/cpu.hpp and this fails, naming the file.
source "$(dirname "$0")/lib.bash"
cd "$ROOT" || exit 1
# Outside make test's own make: no jobserver or flags of the parent.
mk() { nice -n 10 env -u MAKEFLAGS -u MAKELEVEL -u MFLAGS make --no-print-directory "$@"; }

targets=$(sed -n '/^$/q; s/^#   make \([a-z][a-z-]*\).*/\1/p' Makefile | sort -u)
check "the Makefile's header documents targets ($(echo $targets))" test -n "$targets"
for t in $targets; do
  [[ $t == test ]] && continue # (make -n test would dry-run every suite's build: the run itself is this)
  run mk -n "$t"
  if [[ $rc == 0 ]]; then pass "make -n $t: its rules resolve"
  else fail "make -n $t: its rules resolve" "exit $rc: ${err:0:600}"; fi
done

if command -v clang++ >/dev/null; then
  SECONDS=0
  run mk fuzz-syntax FUZZ_SYNTAX=quick
  if [[ $rc == 0 ]]; then pass "make fuzz-syntax FUZZ_SYNTAX=quick: clang parses every header and the fuzz targets ($SECONDS s)"
  else fail "make fuzz-syntax FUZZ_SYNTAX=quick: clang parses every header and the fuzz targets" "exit $rc: $(grep -m 5 'error' <<<"$err$out")"; fi
else
  skip "make fuzz-syntax" "no clang++ (make deps with --fuzz installs it)"
fi
finish
