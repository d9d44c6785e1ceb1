#!/usr/bin/env bash
# Crash trials (tests/crash/): 4 of each of zinf-shard init, reshard and
# import (llm.c weights), and zinf-train with every state on nvme and with
# the state in memory and --checkpoint-every, each SIGKILLed at a seeded moment and
# checked (the manifest the last committed one or absent, verify, re-run or
# --resume to the end with the uninterrupted run's losses). One test per
# trial. The seed is drawn and printed (ZINF_CRASH_SEED sets it); a failed
# trial names its own seed, which reproduces it alone:
#   tests/crash/train.sh --tiers cpu --seed S --trials 1
# scripts/crash-trials.sh (make crash-trials) runs more of them: make test
# keeps to 6 a kind, a new seed each run, to stay within its 8 minutes.
source "$(dirname "$0")/lib.bash"
CRASH=$ROOT/tests/crash
seed=${ZINF_CRASH_SEED:-$((RANDOM * 32768 + RANDOM))}
trials=${ZINF_CRASH_TRIALS:-4}
echo "# crash trials: seed $seed, $trials trials each"
for suite in "shard.sh --op init" "shard.sh --op reshard" "shard.sh --op import" "train.sh --tiers nvme" "train.sh --tiers cpu"; do
  read -r -a s <<<"$suite"
  bash "$CRASH/${s[0]}" "${s[@]:1}" --seed "$seed" --trials "$trials" >"$TMP/out" 2>&1
  rc=$?
  cat "$TMP/out"
  read -r _ _ p f k < <(grep '^# e2e-result ' "$TMP/out" | tail -n 1) || true
  if [[ -z ${p:-} ]]; then
    fail "tests/crash/$suite" "ended without a result (exit $rc)"
    continue
  fi
  _pass=$((_pass + p)) _fail=$((_fail + f)) _skip=$((_skip + k))
  ((rc != 0 && f == 0)) && fail "tests/crash/$suite" "exit $rc"
  p='' f='' k=''
done
finish
