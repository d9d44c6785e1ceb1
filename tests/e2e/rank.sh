#!/usr/bin/env bash
# A dying rank (tests/crash/rank.sh): under mpirun -np 2 and -np 4, one
# rank SIGKILLed during training, during zinf-shard init --ranks all and
# inside a checkpoint commit, or SIGSTOPped during training: the others end
# within --comm-timeout (2 s) plus 4 s, mpirun ends, no rank is left, and
# the manifest is a committed one that verifies. Each of the 8 cases once;
# the seed (drawn, printed; ZINF_CRASH_SEED sets it) draws the victim, the
# moment and the launcher's mode. scripts/crash-trials.sh --rank-trials N
# runs more.
source "$(dirname "$0")/lib.bash"
seed=${ZINF_CRASH_SEED:-$((RANDOM * 32768 + RANDOM))}
bash "$ROOT/tests/crash/rank.sh" --seed "$seed" --trials 8 >"$TMP/out" 2>&1
rc=$?
cat "$TMP/out"
read -r _ _ p f k < <(grep '^# e2e-result ' "$TMP/out" | tail -n 1) || true
if [[ -z ${p:-} ]]; then
  fail "tests/crash/rank.sh" "ended without a result (exit $rc)"
else
  _pass=$p _fail=$f _skip=$k
  ((rc != 0 && f == 0)) && fail "tests/crash/rank.sh" "exit $rc"
fi
finish
