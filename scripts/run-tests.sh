#!/usr/bin/env bash
# Runs every test suite and ends with one line "N passed, N failed[, N skipped]"
# that sums them all; exits non-zero when anything failed.
#   unit: build/tests/test_* (Boost.Test), one per library module
#   mpi:  build/tests/mpi_* (Boost.Test) under mpirun -np 2 and -np 4,
#         oversubscribed; a case fails when it fails on any rank
#   e2e:  tests/e2e/*.sh (shell; pipes the programs), each printing
#         "# e2e-result PASSED FAILED SKIPPED" as its last line
# Each suite runs under a timeout, so a hang is a failure, never a stuck CI;
# a slow machine is not (see limit_of).
#   sanitized: build/san-<sanitizer>/tests/*, named "(san-<sanitizer>)"; the
#         Makefile says which (ZINF_SANITIZED), so a binary left there by
#         `make sanitize` never runs stale
# The Makefile may name the suites instead (make test SANITIZE=...):
# ZINF_UNIT_TESTS, ZINF_MPI_TESTS (binaries), ZINF_E2E=0 (no e2e suites).
#
# Suites run ZINF_TEST_JOBS at a time (default: two per core, at most 16). Most
# of a suite's time is spent waiting (on fsync, on mpirun's start, on a child
# program): on 2 cores, under the same load, one at a time took 762 s, two 535 s
# and four 355 s. Each suite's output is held and printed whole when it ends, with its
# tally; the longest suites start first (their last times are kept in
# build/test-times; without it, e2e, then MPI, then unit). ZINF_TEST_JOBS=1
# runs them one by one, in order, as before (scripts/gpu-check.sh does, so that
# its figures are of one suite at a time).
set -u
cd "$(dirname "$0")/.."

unit_timeout=${ZINF_UNIT_TIMEOUT:-600}
e2e_timeout=${ZINF_E2E_TIMEOUT:-900}
# The suites' times in one make test-run on a loaded 2-core VM, committed
# (they order a clean clone's first run, below, and size the timeouts).
declare -A committed_secs=()
if [[ -r tests/suite-times ]]; then
  while IFS=$'\t' read -r secs key; do [[ $secs =~ ^[0-9]+$ ]] && committed_secs[$key]=$secs; done <tests/suite-times
fi
# limit_of KIND ARGS...: the suite's timeout in seconds: 600 s (unit, MPI)
# or 900 s (e2e), or ten times its committed time where that is more. At
# 180 s and 300 s, beside a second build on that VM, e2e/targets (23 s
# committed, compiling) ran out of its 300, test_engine (92 s) took 169 s
# of its 180 and e2e/crash (57 s) 227 s of its 300: a slower machine
# failed on time alone. With more load still, e2e/shard (116 s) took 839
# s and test_engine 505 s. A hang still ends within 20 minutes.
# ZINF_UNIT_TIMEOUT or ZINF_E2E_TIMEOUT, when set, is every suite's of
# that kind, exactly.
limit_of() {
  local t=$unit_timeout fixed=${ZINF_UNIT_TIMEOUT-}
  [[ $1 == e2e ]] && t=$e2e_timeout fixed=${ZINF_E2E_TIMEOUT-}
  local c=${committed_secs[$*]:-0}
  [[ -z $fixed ]] && ((10 * c > t)) && t=$((10 * c))
  echo "$t"
}
cores=$(nproc 2>/dev/null || echo 1)
jobs=${ZINF_TEST_JOBS:-$((2 * cores > 16 ? 16 : 2 * cores))}
[[ $jobs =~ ^[1-9][0-9]*$ ]] || { echo "run-tests: ZINF_TEST_JOBS must be a positive integer, not '$jobs'" >&2; exit 64; }
times_file=build/test-times
passed=0 failed=0 skipped=0
failed_suites=()

attr() {  # attribute value from the first <TestSuite ...> element of a Boost XML report
  grep -o "<TestSuite [^>]*>" "$2" | head -n 1 | grep -o " $1=\"[0-9]*\"" | grep -o '[0-9]\+'
}

# "PASSED FAILED SKIPPED" of a Boost XML report: a case that passed with a
# warning (BOOST_WARN) is passed, one aborted or timed out is failed; every
# case lands in one of the three, so the suites' sum counts each once.
tally() {  # XML
  local n v
  local -A c
  for n in passed passed_with_warnings failed aborted timed_out skipped; do
    v=$(attr "test_cases_$n" "$1")
    c[$n]=${v:-0}
  done
  echo "$((c[passed] + c[passed_with_warnings])) $((c[failed] + c[aborted] + c[timed_out])) ${c[skipped]}"
}

# Under a sanitizer any report fails the run (halt_on_error, exitcode).
export TSAN_OPTIONS="halt_on_error=1 exitcode=66 ${TSAN_OPTIONS:-}"
export ASAN_OPTIONS="halt_on_error=1 detect_leaks=1 ${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="halt_on_error=1 print_stacktrace=1 ${UBSAN_OPTIONS:-}"
# Suites run side by side on fewer cores than their threads: an OpenMP thread
# that spins waiting for the next region (libgomp's default) takes a core
# another suite could use. Passive waiting changes no value (the kernels are
# deterministic for any thread count) and cut test_llama's CPU by a fifth.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
# mpirun refuses root unless told, and a small machine has fewer cores than ranks.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# Open MPI yields an idle rank's core only when it sees more ranks than
# cores; at -np 2 on two cores its ranks spin in their waits, on the cores the
# suites beside them need. Yielding changes no value: mpi_train at -np 2 beside
# two busy loops took 7-9 CPU-s yielding against 12 spinning, in the same wall time.
export OMPI_MCA_mpi_yield_when_idle=${OMPI_MCA_mpi_yield_when_idle:-1}
# The e2e suites' python3, resolved once past any version manager's shim
# (tests/e2e/lib.bash says why).
if [[ -z ${ZINF_PYTHON-} ]] && command -v python3 >/dev/null; then
  ZINF_PYTHON=$(python3 -c 'import sys; print(sys.executable)' 2>/dev/null) && export ZINF_PYTHON
fi
sanitized=${ZINF_SANITIZED-$(echo build/san-*/tests/test_*)}
unit_tests=${ZINF_UNIT_TESTS-$(echo build/tests/test_* $sanitized)}
mpi_tests=${ZINF_MPI_TESTS-$(echo build/tests/mpi_*)}
suite_name() {  # kind binary: "unit/test_io", "unit/test_io (san-thread)"
  local name=$1/$(basename "$2")
  [[ $2 == build/san-* ]] && name+=" ($(cut -d/ -f2 <<<"$2"))"
  echo "$name"
}
label() {  # KIND ARG [NP]: the suite's name
  case $1 in
  e2e) echo "e2e/$(basename "$2" .sh)" ;;
  mpi) echo "$(suite_name mpi "$2") (np $3)" ;;
  *) suite_name "$1" "$2" ;;
  esac
}
# What a sanitized binary's environment needs besides the options above:
# - ThreadSanitizer: libgomp is not built with it, so TSan cannot see an
#   OpenMP region's fork and barriers and reports every variable the region
#   shares; OpenMP regions run on one thread there. zinf's own threads
#   (device streams, I/O queues, the communicator's and the optimizer's) are
#   still checked.
# - MPI ranks: Open MPI's own leaks (AddressSanitizer) and its own
#   lock-order inversion (ThreadSanitizer) are suppressed by library name;
#   tests/sanitizers/*.supp say which and why.
san_env() {  # kind binary: NAME=VALUE words (no spaces: they are split)
  case $2 in
  build/san-thread/*)
    echo OMP_THREAD_LIMIT=1
    [[ $1 == mpi ]] && echo "TSAN_OPTIONS=${TSAN_OPTIONS// /:}:suppressions=$PWD/tests/sanitizers/tsan.supp" ;;
  build/san-address/*)
    [[ $1 == mpi ]] && echo "LSAN_OPTIONS=suppressions=$PWD/tests/sanitizers/lsan.supp:fast_unwind_on_malloc=0:${LSAN_OPTIONS:-}" ;;
  esac
}

# Each run_* prints the suite's output and, last, a line "#=result NAME|P|F|S".
result() { echo "#=result $1|$2|$3|$4"; }
# The CPU-seconds (user + system) of everything the subshell ran and waited
# for, mpirun's ranks included: "#=cpu SECONDS", after the suite's result.
cpu_seconds() {
  local f
  f=$(mktemp)
  times >"$f"  # in this shell, not a pipe's: its last line, the children's user and system time
  awk 'END { s = 0; for (i = 1; i <= 2; i++) { split($i, a, "m"); s += a[1] * 60 + a[2] } printf "#=cpu %d\n", s + 0.5 }' "$f"
  rm -f "$f"
}

run_unit() {  # binary
  local t=$1 name xml rc p f s
  name=$(label unit "$t")
  xml=$(mktemp)
  env $(san_env unit "$t") timeout --kill-after=10 "$limit" "$t" --color_output=no --log_level=warning \
    --report_format=XML --report_level=detailed --report_sink="$xml"
  rc=$?
  if [[ -s $xml ]] && grep -q "<TestSuite" "$xml"; then
    read -r p f s < <(tally "$xml")
    # A crash after the report, or a non-zero exit with nothing failed, still fails.
    ((rc != 0 && f == 0)) && f=1
    result "$name" "$p" "$f" "$s"
  else
    echo "# $name: no report (exit $rc$( ((rc == 124)) && echo ", timed out after ${limit}s"))"
    result "$name" 0 1 0
  fi
  rm -f "$xml"
}

run_mpi() {  # binary np
  local t=$1 np=$2 name dir rc p f s reports xml rp rf rs
  name=$(label mpi "$t" "$np")
  if ! command -v mpirun >/dev/null; then
    echo "# $t: skipped, no mpirun"
    result "$name" 0 0 1
    return
  fi
  dir=$(mktemp -d)
  env $(san_env mpi "$t") timeout --kill-after=10 "$limit" mpirun -np "$np" bash -c \
    'exec "$1" --color_output=no --log_level=warning --report_format=XML --report_level=detailed \
       --report_sink="$2/rank${OMPI_COMM_WORLD_RANK:-0}.xml"' _ "$t" "$dir"
  rc=$?
  p='' f=0 s=0 reports=0
  for xml in "$dir"/rank*.xml; do
    [[ -s $xml ]] && grep -q "<TestSuite" "$xml" || continue
    reports=$((reports + 1))
    read -r rp rf rs < <(tally "$xml")
    [[ -z $p || $rp -lt $p ]] && p=$rp
    ((rf > f)) && f=$rf
    ((rs > s)) && s=$rs
  done
  if ((reports == np)); then
    ((rc != 0 && f == 0)) && f=1
    result "$name" "$p" "$f" "$s"
  else
    echo "# $name: $reports of $np ranks reported (exit $rc$( ((rc == 124)) && echo ", timed out after ${limit}s"))"
    result "$name" "${p:-0}" 1 0
  fi
  rm -rf "$dir"
}

run_e2e() {  # script
  local t=$1 name out rc line p f s
  name=$(label e2e "$t")
  out=$(mktemp)
  timeout --kill-after=10 "$limit" bash "$t" >"$out" 2>&1
  rc=$?
  cat "$out"
  line=$(grep '^# e2e-result ' "$out" | tail -n 1)
  if [[ -n $line ]]; then
    read -r _ _ p f s <<<"$line"
    ((rc != 0 && f == 0)) && f=1
    result "$name" "$p" "$f" "$s"
  else
    echo "# $name: ended without a result line (exit $rc)"
    result "$name" 0 1 0
  fi
  rm -f "$out"
}

# The suites, as "KIND ARGS..." lines, in the default order.
suites=()
for t in $unit_tests; do [[ -x $t ]] && suites+=("unit $t"); done
for t in $mpi_tests; do
  [[ -x $t ]] || continue
  for np in ${ZINF_MPI_NP:-2 4}; do suites+=("mpi $t $np"); done
done
if [[ ${ZINF_E2E:-1} != 0 ]]; then
  for t in tests/e2e/*.sh; do [[ -f $t ]] && suites+=("e2e $t"); done
fi

# Longest first when running side by side: the last run's seconds per suite;
# without them (a clean clone), the committed ones, and for a suite in
# neither, the e2e suites, longest script first, then MPI, then unit.
# (Without the committed times, a clean clone started test_engine, 40-80
# s, last, after every e2e script.)
if ((jobs > 1)); then
  declare -A last=()
  for k in "${!committed_secs[@]}"; do last[$k]=${committed_secs[$k]}; done
  if [[ -r $times_file ]]; then
    while IFS=$'\t' read -r secs key; do [[ $secs =~ ^[0-9]+$ ]] && last[$key]=$secs; done <"$times_file"
  fi
  guess() {  # KIND ARG: a rank for a suite never timed
    case $1 in e2e) echo $((3000000000 + $(stat -c %s "$2"))) ;; mpi) echo 2000000000 ;; *) echo 1000000000 ;; esac
  }
  mapfile -t suites < <(for i in "${!suites[@]}"; do
    k=${suites[$i]}
    printf '%s\t%s\t%s\t%s\n' "${last[$k]:--1}" "$(guess $k)" "$i" "$k"
  done | sort -t$'\t' -k1,1nr -k2,2nr -k3,3n | cut -f4-)
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
declare -A running=() started=()  # pid -> index into suites, start time
new_times=()
cpu_total=0 run_start=$SECONDS


finish() {  # index seconds shown: print the suite's output (unless shown), tally its result
  local out=$work/$1.out line name p f s cpu
  line=$(grep '^#=result ' "$out" | tail -n 1)
  cpu=$(grep '^#=cpu ' "$out" | tail -n 1)
  (($3)) || grep -v '^#=\(result\|cpu\) ' "$out"
  IFS='|' read -r name p f s <<<"${line#\#=result }"
  if [[ -z $line ]]; then
    name=$(label ${suites[$1]}) p=0 f=1 s=0
    echo "# $name: ended without a result (the runner was killed?)"
  fi
  cpu=${cpu#\#=cpu } cpu_total=$((cpu_total + ${cpu:-0}))
  printf '# %-28s %4d passed, %d failed, %d skipped (%d s, %s CPU-s)\n' "$name" "$p" "$f" "$s" "$2" "${cpu:-?}"
  passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
  ((f > 0)) && failed_suites+=("$name")
  new_times+=("$2"$'\t'"${suites[$1]}")
  rm -f "$out"
}

reap() {  # wait for one running suite and finish it
  local pid
  wait -n -p pid "${!running[@]}"
  finish "${running[$pid]}" $((SECONDS - ${started[$pid]})) 0
  unset "running[$pid]" "started[$pid]"
}

for i in "${!suites[@]}"; do
  read -r kind a b <<<"${suites[$i]}"
  limit=$(limit_of ${suites[$i]}) # (run_* read it)
  echo "# running $(label "$kind" "$a" "$b")"
  if ((jobs == 1)); then  # in order, the output as it comes
    t0=$SECONDS
    { "run_$kind" "$a" ${b:+"$b"}; cpu_seconds; } </dev/null 2>&1 | tee "$work/$i.out" | grep --line-buffered -v '^#=\(result\|cpu\) '
    finish "$i" $((SECONDS - t0)) 1
    continue
  fi
  { "run_$kind" "$a" ${b:+"$b"}; cpu_seconds; } >"$work/$i.out" 2>&1 </dev/null &
  running[$!]=$i started[$!]=$SECONDS
  while ((${#running[@]} >= jobs)); do reap; done
done
while ((${#running[@]} > 0)); do reap; done
# The times kept for the next run's order: this run's, and the last ones of
# the suites it did not run.
if ((${#new_times[@]})) && [[ -d build ]]; then
  { printf '%s\n' "${new_times[@]}"; [[ -r $times_file ]] && cat "$times_file"; } |
    awk -F'\t' '!seen[$2]++' >"$times_file.tmp.$$" && mv "$times_file.tmp.$$" "$times_file"
fi

echo "# $((SECONDS - run_start)) s, $cpu_total CPU-s in the suites, $jobs at a time"
((${#failed_suites[@]})) && echo "# failed: ${failed_suites[*]}"
if ((skipped > 0)); then
  echo "$passed passed, $failed failed, $skipped skipped"
else
  echo "$passed passed, $failed failed"
fi
((failed == 0))
