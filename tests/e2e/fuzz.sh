#!/usr/bin/env bash
# The fuzz corpora, replayed (tests/fuzz/README.md): every committed input of
# every target -- the real seeds and each crash the fuzzers ever found --
# through the g++ build of the same targets (build/tests/fuzz-replay, built by
# `make tests`). An input that crashes, trips a target's check, or throws an
# error the call does not document fails its target; every real seed
# (good-*) must also be read, not refused. `make fuzz` runs the fuzzers.
source "$(dirname "$0")/lib.bash"
R=${ZINF_FUZZ_REPLAY:-$ROOT/build/tests/fuzz-replay}
C=$ROOT/tests/fuzz/corpus

if [[ ! -x $R ]]; then
  fail "replay binary" "$R is not built (make tests)"
  finish
  exit
fi

# --- every target source is registered, and has a corpus
run "$R" --list
expect_rc 0 "--list exits 0"
want=$(cd "$ROOT/tests/fuzz" && ls fuzz_*.cpp | sed 's/^fuzz_//; s/\.cpp$//' | sort)
if [[ $(sort <<<"$out") == "$want" ]]; then pass "every tests/fuzz/fuzz_*.cpp is a target"
else fail "every tests/fuzz/fuzz_*.cpp is a target" "listed: $(echo $out), sources: $(echo $want)"; fi

# --- each corpus replays clean
for t in $want; do
  n=$(find "$C/$t" -type f ! -name '.*' 2>/dev/null | wc -l)
  if ((n == 0)); then
    fail "$t: corpus" "no inputs in $C/$t"
    continue
  fi
  run "$R" "$t" "$C/$t"
  if [[ $rc == 0 && $out == "# $t: $n inputs, "*", 0 findings" ]]; then pass "$t: $n inputs replay with no finding"
  else fail "$t: $n inputs replay with no finding" "exit $rc: $out ${err:0:800}"; fi
  good=$(find "$C/$t" -type f -name 'good-*' | wc -l)
  run "$R" "$t" $(find "$C/$t" -type f -name 'good-*')
  if ((good > 0)) && [[ $rc == 0 && $out == "# $t: $good inputs, $good accepted, 0 findings" ]]; then
    pass "$t: all $good real seeds are accepted"
  else fail "$t: all $good real seeds are accepted" "exit $rc: $out ${err:0:800}"; fi
done

# --- the replay's own contract
run "$R" no-such-target "$C"
expect_rc 64 "an unknown target is a usage error"
run "$R" size "$TMP/absent"
expect_rc 66 "a missing corpus path is 66"

finish
