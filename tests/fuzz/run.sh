#!/usr/bin/env bash
# Runs the libFuzzer targets that `make fuzz` built, each for a while, a few
# at a time, and sums them up:
#   tests/fuzz/run.sh [--seconds N] [--jobs J] [--bin DIR] TARGET...
# Each target grows its own scratch corpus, DIR/corpus/TARGET, seeded from the
# committed tests/fuzz/corpus/TARGET (which it only reads); a crash, a
# sanitizer report, an escaped exception, a hang (10 s an input) or more than
# 2 GiB of memory is saved as tests/fuzz/corpus/TARGET/{crash,timeout,oom,leak}-<sha1>,
# where `make test` replays it from then on, and fails the target.
# Full logs: DIR/logs/TARGET.log. Exits 1 when any target found something.
set -u
cd "$(dirname "$0")/../.."

seconds=60 jobs=2 bin=build/fuzz
while (($#)); do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "run.sh: unknown option $1" >&2; exit 64 ;;
    *) break ;;
  esac
done
[[ $seconds =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: --seconds $seconds is not a positive whole number" >&2; exit 64; }
[[ $jobs =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: --jobs $jobs is not a positive whole number" >&2; exit 64; }
(($#)) || { echo "usage: tests/fuzz/run.sh [--seconds N] [--jobs J] [--bin DIR] TARGET..." >&2; exit 64; }
mkdir -p "$bin/logs"

run_one() {  # target
  local t=$1 scratch=$bin/corpus/$1 dict=()
  [[ -x $bin/fuzz-$t ]] || { echo "# $t: $bin/fuzz-$t not built" >"$bin/logs/$t.log"; return 1; }
  mkdir -p "$scratch"
  cp -n tests/fuzz/corpus/"$t"/* "$scratch"/ 2>/dev/null
  [[ -f tests/fuzz/$t.dict ]] && dict=(-dict="tests/fuzz/$t.dict")
  "$bin/fuzz-$t" "$scratch" "${dict[@]}" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="tests/fuzz/corpus/$t/" >"$bin/logs/$t.log" 2>&1
}

summary() {  # target rc
  local t=$1 rc=$2 log=$bin/logs/$1.log last execs rate
  last=$(grep -E '^#[0-9]+.*(DONE|pulse|NEW|REDUCE|INITED)' "$log" | tail -n 1)
  execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | grep -o '[0-9]*$')
  rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$')
  printf '%-11s %7s %11s %8s %6s %7s %7s  %s\n' "$t" "${seconds}s" "${execs:-?}" "${rate:-?}" \
    "$(grep -o 'cov: [0-9]*' <<<"$last" | grep -o '[0-9]*')" "$(grep -o 'ft: [0-9]*' <<<"$last" | grep -o '[0-9]*')" \
    "$(ls "$bin/corpus/$t" | wc -l)" \
    "$( ((rc == 0)) && echo none || echo "FOUND (exit $rc): $(grep -o "Test unit written to [^ ]*" "$log" | sed 's/Test unit written to //' | tr '\n' ' ')")"
}

failed=0
for t in "$@"; do
  while (($(jobs -rp | wc -l) >= jobs)); do wait -n; done
  echo "# fuzzing $t for ${seconds}s (log: $bin/logs/$t.log)" >&2
  rm -f "$bin/logs/$t.rc"
  { run_one "$t"; echo $? >"$bin/logs/$t.rc"; } &
done
wait
printf '# %-9s %7s %11s %8s %6s %7s %7s  %s\n' target time execs exec/s cov ft corpus findings
for t in "$@"; do
  rc=$(cat "$bin/logs/$t.rc" 2>/dev/null || echo 1)
  summary "$t" "$rc"
  ((rc != 0)) && failed=1
done
exit $failed
