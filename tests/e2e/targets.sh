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

# make install builds and copies what it installs (make test built it all
# already, so this is the copy): every program, the library, the headers, the
# man pages and zinf.pc land under PREFIX; a program runs from there; a
# program of the user's own compiles against the installed headers and links
# by pkg-config alone; make uninstall takes it all away again.
inst=$TMP/inst
run mk install PREFIX="$inst/usr"
expect_rc 0 "make install PREFIX=DIR"
want_bins=$(cd "$BIN" && ls zinf-*)
missing=$(for p in $want_bins; do [[ -x $inst/usr/bin/$p ]] || echo "$p"; done)
check "…installs every program of bin/ ($(wc -w <<<"$want_bins"))" test -z "$missing"
missing=$(for f in "$ROOT"/man/*.[157]; do
  [[ -f $inst/usr/share/man/man${f##*.}/${f##*/} ]] || echo "${f##*/}"; done)
check "…every man page, in its section" test -z "$missing"
check "…the library, the public headers and zinf.pc" bash -c \
  '[[ -f $1/usr/lib/libzinf.a && -f $1/usr/lib/pkgconfig/zinf.pc && -f $1/usr/include/zinf/util.hpp ]]' _ "$inst"
run "$inst/usr/bin/zinf-plan" --model gpt2-124m --json
check "…an installed program runs (zinf-plan from PREFIX/bin)" bash -c '[[ $1 == 0 && $2 == *zinf.plan/1* ]]' _ "$rc" "$out"
cat >"$TMP/user.cpp" <<'CPP'
#include <zinf/util.hpp>
#include <cstdio>
int main() { std::printf("%llu\n", static_cast<unsigned long long>(zinf::parse_size("4KiB"))); }
CPP
if command -v pkg-config >/dev/null; then
  pc=$(PKG_CONFIG_PATH=$inst/usr/lib/pkgconfig pkg-config --cflags --libs --static zinf 2>&1)
  # shellcheck disable=SC2086  # pkg-config's words
  run c++ "$TMP/user.cpp" $pc -o "$TMP/user"
  expect_rc 0 "a program of the user's own builds by pkg-config --cflags --libs --static zinf"
  run "$TMP/user"
  check "…and runs (parse_size(\"4KiB\") = 4096)" test "$out" = 4096
else
  skip "a program built against the installed library" "no pkg-config"
fi
run mk uninstall PREFIX="$inst/usr"
left=$(find "$inst" -type f 2>/dev/null)
check "make uninstall leaves no file of the install" test -z "$left"

if command -v clang++ >/dev/null; then
  SECONDS=0
  run mk fuzz-syntax FUZZ_SYNTAX=quick
  if [[ $rc == 0 ]]; then pass "make fuzz-syntax FUZZ_SYNTAX=quick: clang parses every header and the fuzz targets ($SECONDS s)"
  else fail "make fuzz-syntax FUZZ_SYNTAX=quick: clang parses every header and the fuzz targets" "exit $rc: $(grep -m 5 'error' <<<"$err$out")"; fi
else
  skip "make fuzz-syntax" "no clang++ (make deps installs it)"
fi
finish
