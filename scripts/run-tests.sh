#!/usr/bin/env bash
# Runs every test suite and ends with one line "N passed, N failed[, N skipped]"
# that sums them all; exits non-zero when anything failed.
#   unit: build/tests/test_* (Boost.Test), one per library module
#   mpi:  build/tests/mpi_* (Boost.Test) under mpirun -np 2 and -np 4,
#         oversubscribed; a case fails when it fails on any rank
#   e2e:  tests/e2e/*.sh (shell; pipes the programs), each printing
#         "# e2e-result PASSED FAILED SKIPPED" as its last line
# Each suite runs under a timeout, so a hang is a failure, never a stuck CI.
#   sanitized: build/san-<sanitizer>/tests/*, named "(san-<sanitizer>)"; the
#         Makefile says which (ZINF_SANITIZED), so a binary left there by
#         `make sanitize` never runs stale
# The Makefile may name the suites instead (make test SANITIZE=...):
# ZINF_UNIT_TESTS, ZINF_MPI_TESTS (binaries), ZINF_E2E=0 (no e2e suites).
set -u
cd "$(dirname "$0")/.."

unit_timeout=${ZINF_UNIT_TIMEOUT:-180}
e2e_timeout=${ZINF_E2E_TIMEOUT:-300}
passed=0 failed=0 skipped=0
failed_suites=()

_since=$SECONDS
tally() {  # name passed failed skipped; with the seconds since the last tally
  printf '# %-28s %4d passed, %d failed, %d skipped (%d s)\n' "$1" "$2" "$3" "$4" $((SECONDS - _since))
  _since=$SECONDS
  passed=$((passed + $2)) failed=$((failed + $3)) skipped=$((skipped + $4))
  (($3 > 0)) && failed_suites+=("$1")
  return 0
}

attr() {  # attribute value from the first <TestSuite ...> element of a Boost XML report
  grep -o "<TestSuite [^>]*>" "$2" | head -n 1 | grep -o " $1=\"[0-9]*\"" | grep -o '[0-9]\+'
}

# Under a sanitizer any report fails the run (halt_on_error, exitcode).
export TSAN_OPTIONS="halt_on_error=1 exitcode=66 ${TSAN_OPTIONS:-}"
export ASAN_OPTIONS="halt_on_error=1 detect_leaks=1 ${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="halt_on_error=1 print_stacktrace=1 ${UBSAN_OPTIONS:-}"
sanitized=${ZINF_SANITIZED-$(echo build/san-*/tests/test_*)}
unit_tests=${ZINF_UNIT_TESTS-$(echo build/tests/test_* $sanitized)}
mpi_tests=${ZINF_MPI_TESTS-$(echo build/tests/mpi_*)}
suite_name() {  # kind binary: "unit/test_io", "unit/test_io (san-thread)"
  local name=$1/$(basename "$2")
  [[ $2 == build/san-* ]] && name+=" ($(cut -d/ -f2 <<<"$2"))"
  echo "$name"
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
for t in $unit_tests; do
  [[ -x $t ]] || continue
  name=$(suite_name unit "$t")

  echo "# running $name"
  xml=$(mktemp)
  env $(san_env unit "$t") timeout --kill-after=10 "$unit_timeout" "$t" --color_output=no --log_level=warning \
    --report_format=XML --report_level=detailed --report_sink="$xml"
  rc=$?
  if [[ -s $xml ]] && grep -q "<TestSuite" "$xml"; then
    p=$(attr test_cases_passed "$xml") f=$(attr test_cases_failed "$xml")
    s=$(attr test_cases_skipped "$xml") a=$(attr test_cases_aborted "$xml")
    f=$((f + a))
    # A crash after the report, or a non-zero exit with nothing failed, still fails.
    ((rc != 0 && f == 0)) && f=1
    tally "$name" "$p" "$f" "$s"
  else
    echo "# $name: no report (exit $rc$( ((rc == 124)) && echo ", timed out after ${unit_timeout}s"))"
    tally "$name" 0 1 0
  fi
  rm -f "$xml"
done

# mpirun refuses root unless told, and a small machine has fewer cores than ranks.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
for t in $mpi_tests; do
  [[ -x $t ]] || continue
  if ! command -v mpirun >/dev/null; then
    echo "# $t: skipped, no mpirun"
    tally "$(suite_name mpi "$t")" 0 0 1
    continue
  fi
  for np in ${ZINF_MPI_NP:-2 4}; do
    name="$(suite_name mpi "$t") (np $np)"
    echo "# running $name"
    dir=$(mktemp -d)
    env $(san_env mpi "$t") timeout --kill-after=10 "$unit_timeout" mpirun -np "$np" bash -c \
      'exec "$1" --color_output=no --log_level=warning --report_format=XML --report_level=detailed \
         --report_sink="$2/rank${OMPI_COMM_WORLD_RANK:-0}.xml"' _ "$t" "$dir"
    rc=$?
    p='' f=0 s=0 reports=0
    for xml in "$dir"/rank*.xml; do
      [[ -s $xml ]] && grep -q "<TestSuite" "$xml" || continue
      reports=$((reports + 1))
      rp=$(attr test_cases_passed "$xml") rf=$(attr test_cases_failed "$xml")
      rs=$(attr test_cases_skipped "$xml") ra=$(attr test_cases_aborted "$xml")
      rf=$((rf + ra))
      [[ -z $p || $rp -lt $p ]] && p=$rp
      ((rf > f)) && f=$rf
      ((rs > s)) && s=$rs
    done
    if ((reports == np)); then
      ((rc != 0 && f == 0)) && f=1
      tally "$name" "$p" "$f" "$s"
    else
      echo "# $name: $reports of $np ranks reported (exit $rc$( ((rc == 124)) && echo ", timed out after ${unit_timeout}s"))"
      tally "$name" "${p:-0}" 1 0
    fi
    rm -rf "$dir"
  done
done

for t in tests/e2e/*.sh; do
  [[ -f $t && ${ZINF_E2E:-1} != 0 ]] || continue
  name=e2e/$(basename "$t" .sh)
  echo "# running $name"
  out=$(mktemp)
  timeout --kill-after=10 "$e2e_timeout" bash "$t" 2>&1 | tee "$out"
  rc=${PIPESTATUS[0]}
  line=$(grep '^# e2e-result ' "$out" | tail -n 1)
  if [[ -n $line ]]; then
    read -r _ _ p f s <<<"$line"
    ((rc != 0 && f == 0)) && f=1
    tally "$name" "$p" "$f" "$s"
  else
    echo "# $name: ended without a result line (exit $rc)"
    tally "$name" 0 1 0
  fi
  rm -f "$out"
done

((${#failed_suites[@]})) && echo "# failed: ${failed_suites[*]}"
if ((skipped > 0)); then
  echo "$passed passed, $failed failed, $skipped skipped"
else
  echo "$passed passed, $failed failed"
fi
((failed == 0))
