#!/usr/bin/env bash
# A dying rank (tests/crash/rank.sh): under mpirun -np 2 and -np 4, one
# rank SIGKILLed during training, during zinf-shard init --ranks all and
# inside a checkpoint commit, or SIGSTOPped during training: the others end
# within --comm-timeout plus a few seconds, mpirun ends, no rank is left, and
# the manifest is a committed one that verifies. Each of the 8 cases once;
# the seed (drawn, printed; ZINF_CRASH_SEED sets it) draws the victim, the
# moment and the launcher's mode. scripts/crash-trials.sh --rank-trials N
# runs more. First, the regression test of a rank gone before MPI started.
source "$(dirname "$0")/lib.bash"

# A rank that dies before MPI has started: the others used to wait in
# MPI_Init_thread for good under a launcher that leaves them running (mpirun
# --enable-recovery); now that call has the collectives' deadline (74).
if command -v mpirun >/dev/null; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  W=$(mktemp -d /var/tmp/zinf-e2e-rank-XXXXXX)
  on_exit "rm -rf '$W'"
  "$BIN/zinf-shard" layout --model gpt:layers=1,hidden=32,heads=2 --dp 2 >"$W/layout"
  # Timed: rank 1's own life, from its start to its end, written by its
  # wrapper. The whole job's time would count mpirun's start and end too,
  # which is seconds where the host name is slow to resolve or the machine
  # loaded, and is not rank 1's deadline. Without the deadline rank 1 waits
  # for good: mpirun is stopped at 60 s and no end is written.
  run timeout -k 2 60 mpirun --enable-recovery -np 2 bash -c \
    '((OMPI_COMM_WORLD_RANK == 0)) && exit 3; echo "$EPOCHREALTIME" >"$0/rank1.start"
     "$@"; r=$?; echo "$EPOCHREALTIME" >"$0/rank1.end"; exit $r' "$W" \
    "$BIN/zinf-shard" init --pinned 8MiB --pinned-buffer 256KiB --dir "$W/d" --comm-timeout 1s -m "$W/layout"
  ms='no end'
  if [[ -s $W/rank1.start && -s $W/rank1.end ]]; then
    ms_between "$(<"$W/rank1.start")" "$(<"$W/rank1.end")"
    ms=$REPLY
  fi
  # 5 s past the deadline: rank 1's start before MPI_Init_thread and its
  # exit, well under a second on a loaded machine.
  check "rank 0 gone before MPI started: rank 1 stops within its 1 s deadline plus 5 s of its start ($ms ms; mpirun exit $rc)" \
    bash -c '[[ $1 =~ ^[0-9]+$ ]] && (($1 < 6000))' _ "$ms"
  check "…naming MPI_Init_thread and the deadline" has_all "$err" "rank 1: MPI_Init_thread" "did not complete within 1 s"
  check "…and nothing is committed" test ! -e "$W/d/manifest.jsonl"
fi

seed=${ZINF_CRASH_SEED:-$((RANDOM * 32768 + RANDOM))}
bash "$ROOT/tests/crash/rank.sh" --seed "$seed" --trials 8 >"$TMP/out" 2>&1
rc=$?
cat "$TMP/out"
read -r _ _ p f k < <(grep '^# e2e-result ' "$TMP/out" | tail -n 1) || true
if [[ -z ${p:-} ]]; then
  fail "tests/crash/rank.sh" "ended without a result (exit $rc)"
else
  _pass=$((_pass + p)) _fail=$((_fail + f)) _skip=$((_skip + k))
  ((rc != 0 && f == 0)) && fail "tests/crash/rank.sh" "exit $rc"
fi
finish
