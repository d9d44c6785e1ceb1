#!/usr/bin/env bash
# A dying rank: under mpirun -np 2 and -np 4 (oversubscribed), one rank,
# drawn by the seed, is SIGKILLed during training (every state on nvme),
# during zinf-shard init --ranks all, or inside a checkpoint commit (the
# state in memory, --checkpoint-every 1: killed on entering a seeded
# fdatasync of its share, or, rank 0, the manifest's rename), or SIGSTOPped
# during training (alive, silent). A trial of seed S runs case S mod 8 of:
# np 2 and 4 times train, init, commit, stop (so 8 trials in a row run each
# once); the seed also draws the victim, the moment and
# the launcher: plain mpirun (which stops the job when a rank dies) or
# mpirun --enable-recovery (which leaves the others to end by themselves).
# Then: every other rank has ended within --comm-timeout plus a few seconds
# of the kill (with --enable-recovery: by itself, non-zero: 74 from zinf's
# deadline, or 1 from Open MPI when its MPI_Init aborted), plain mpirun has
# ended non-zero (a hang is a failure: every run is under a timeout; an
# mpirun that waits on once every rank has ended, as Open MPI 4.1.4's
# sometimes does when a rank died inside MPI_Init, is stopped, named in the
# trial's line and counted at the end), no rank is left, and the manifest is a committed one: init's, byte for byte,
# or absent; training's at one step, the last commit before the kill (from
# rank 0's lines), and zinf-shard verify passes on it.
#
#   tests/crash/rank.sh [--seed S] [--trials N] [--comm-timeout SECONDS] [--keep]
#
# --trials N (default 8: each case once); --comm-timeout: the least
# deadline (default 2), raised to twice a bare MPI job's time here (below:
# MPI start-up counts against it).
source "$(dirname "$0")/../e2e/lib.bash"
source "$(dirname "$0")/../e2e/train_lib.bash"
source "$(dirname "$0")/lib.bash"
default_trials=8
crash_options "$@"
C=2
set -- "${args[@]}"
while (($#)); do
  case $1 in
  --comm-timeout) C=${2:-}; shift 2 ;;
  *) echo "${0##*/}: unknown option $1 (see --help)" >&2; exit 64 ;;
  esac
done
[[ $C =~ ^[1-9][0-9]*$ ]] || { echo "${0##*/}: --comm-timeout takes whole seconds (1 or more)" >&2; exit 64; }
if ! command -v mpirun >/dev/null; then
  skip "a dying rank" "no mpirun"
  crash_finish rank
  exit 0
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
crash_dir rank
# The baseline: a bare 4-rank MPI job (zinf-commbench's smallest
# measurement: mpirun's launch, every rank's MPI_Init, one collective,
# MPI_Finalize, the teardown), timed here and now. The deadline starts
# before MPI_Init_thread, which it bounds too, and a loaded machine, or a
# host name slow to resolve, makes MPI's start-up seconds long: at 2 s a
# healthy job then ended in MPI_Init_thread (74) before any kill, and the
# trial tested the start-up, not a dying rank. So the deadline is at least
# twice this job (about four times its MPI_Init_thread, which took about
# half of it under load), and every wait for the ranks grows with it.
t0=$EPOCHREALTIME
timeout -k 2 120 mpirun -np 4 "$BIN/zinf-commbench" -b 1K -e 1K -n 1 -w 0 --rounds 1 --comm-timeout 10m \
  >/dev/null 2>"$W/baseline.err" || echo "# the baseline MPI job failed: $(tail -n 1 "$W/baseline.err")"
ms_since "$t0"
base_ms=$REPLY base_s=$(((REPLY + 999) / 1000))
((C < 2 * base_s)) && C=$((2 * base_s))
# Seconds past --comm-timeout a rank may take to end: the watchdog's grace
# (1 s) and its exit, slower as the machine is.
SLACK=$((4 + base_s))
# Seconds the ranks may take to start, or to print their first step.
START=$((20 + 5 * base_s))
M=gpt:layers=1,hidden=32,heads=2,vocab=256,seq=32
MI=gpt:layers=4,hidden=128,heads=4,vocab=256,seq=64 # init: a few MiB a rank, so kills land inside it
echo "# a dying rank: seed $seed, $trials trials, --comm-timeout ${C}s (+${SLACK}s; a bare 4-rank MPI job took $base_ms ms)"
have_strace_ok=0
have_strace && have_strace_ok=1 || echo "# no strace with syscall injection: the commit cases are skipped"
cat "$ROOT"/man/*.1 >"$W/corpus.txt"
R=(--text "$W/corpus.txt" --steps 100000 --batch 2 --seq 16 --threads 1 "${POOL[@]}" --json --comm-timeout "${C}s")

# Each rank runs under this wrapper: its pid in DIR/pid.R, its stdout and
# stderr in DIR/out.R and DIR/err.R. Plain: exec, so that the launcher's
# signals reach the program as they would; recovery: waits and writes
# "STATUS TIME" to DIR/rc.R. A rank with DIR/strace.R runs under those
# strace options (the kill inside a commit).
cat >"$W/wrap" <<'EOF'
r=${OMPI_COMM_WORLD_RANK:?} d=$1 mode=$2
shift 2
pre=()
[[ -f $d/strace.$r ]] && read -r -a pre <"$d/strace.$r"
if [[ $mode == plain ]]; then
  echo $$ >"$d/pid.$r"
  exec "${pre[@]}" "$@" >"$d/out.$r" 2>"$d/err.$r"
fi
"${pre[@]}" "$@" >"$d/out.$r" 2>"$d/err.$r" &
p=$!
echo $p >"$d/pid.$r"
wait $p
echo "$? $EPOCHREALTIME" >"$d/rc.$r"
EOF

now() { echo "${EPOCHREALTIME/./}"; } # microseconds (a fork: the polling loop below reads EPOCHREALTIME itself)
# wait_for FILE_TEST MS: polls every 10 ms until the test passes (0) or MS pass (1).
wait_until() {
  local ms=$1 t=0
  shift
  until "$@"; do
    ((t++ >= ms / 10)) && return 1
    nap 0.01
  done
}
has_pids() { local r; for ((r = 0; r < np; r++)); do [[ -s $D/pid.$r ]] || return 1; done; }
has_line() { file_has "$D/out.0" '"step"'; }
# alive PID: running or stopped; a zombie (dead, not yet reaped by the launcher) is not.
alive() {
  local -a stat
  read -r -a stat 2>/dev/null <"/proc/$1/stat" && [[ ${stat[2]} != Z && ${stat[2]} != X ]]
}

launchers_left=0
cases=("2 train" "2 init" "2 commit" "2 stop" "4 train" "4 init" "4 commit" "4 stop")
declare -A refs
for ((i = 0; i < trials; i++)); do
  trial_begin "$i"
  read -r np phase <<<"${cases[trial_seed % ${#cases[@]}]}"
  below "$np"
  victim=$REPLY
  below 2
  mode=$( ((REPLY == 0)) && echo plain || echo recovery)
  T=$W/t$np
  D=$W/run
  rm -rf "$D" "$T"
  mkdir -p "$D"
  desc="np $np, $phase, rank $victim, $mode mpirun"
  if [[ $phase == commit ]] && ! ((have_strace_ok)); then
    skip "$desc" "no strace"
    continue
  fi
  # The state and the command.
  case $phase in
  init)
    lay=$W/init$np.layout
    if [[ -z ${refs[$np]:-} ]]; then # the reference: one process, the same folder
      "$SH" layout --model "$MI" --dp "$np" >"$lay"
      "$SH" init "${POOL[@]}" --dir "$T" <"$lay" >/dev/null 2>&1 && cp "$T/manifest.jsonl" "$W/init$np.manifest"
      refs[$np]=1
      rm -rf "$T"
    fi
    cmd=("$SH" init "${POOL[@]}" --dir "$T" --ranks all --comm-timeout "${C}s" -m "$lay")
    ;;
  train | stop)
    "$SH" layout --model "$M" --dp "$np" --param nvme --optim nvme | "$SH" init "${POOL[@]}" --dir "$T" >/dev/null 2>&1
    cmd=("$TR" --manifest "$T/manifest.jsonl" "${R[@]}")
    ;;
  commit)
    "$SH" layout --model "$M" --dp "$np" --param cpu --optim cpu | "$SH" init "${POOL[@]}" --dir "$T" >/dev/null 2>&1
    cmd=("$TR" --manifest "$T/manifest.jsonl" "${R[@]}" --checkpoint-every 1)
    call=$( ((victim == 0)) && echo rename || echo fdatasync)
    below 6
    k=$((REPLY + 2))
    echo "strace -f -qq -o /dev/null -e trace=$call -e inject=$call:signal=KILL:when=$k" >"$D/strace.$victim"
    desc+=", killed at its $call #$k"
    ;;
  esac
  recovery=()
  [[ $mode == recovery ]] && recovery=(--enable-recovery)
  guard=$((START + C + SLACK + 20))
  started=$(now)
  timeout -k 2 $guard mpirun "${recovery[@]}" -np "$np" bash "$W/wrap" "$D" "$mode" "${cmd[@]}" \
    >"$D/mpirun.out" 2>"$D/mpirun.err" &
  mpid=$!
  # The moment: after the first step line plus up to 300 ms (train, stop),
  # up to 500 ms after every rank started (init), or its syscall (commit).
  killed_at='' late=0
  case $phase in
  train | stop)
    if wait_until $((START * 1000)) has_line; then
      below 300
      ms=$REPLY
      sleep "0.$(printf '%03d' "$ms")"
      sig=$([[ $phase == stop ]] && echo STOP || echo KILL)
      desc+=", SIG$sig ${ms} ms after the first step"
      kill -"$sig" "$(<"$D/pid.$victim")" && killed_at=$(now)
    else
      why_not "no step line within $START s: $(tail -c 300 "$D/err.0" 2>/dev/null)"
    fi
    ;;
  init)
    if wait_until $((START * 1000)) has_pids; then
      below 500
      ms=$REPLY
      sleep "0.$(printf '%03d' "$ms")"
      desc+=", SIGKILL ${ms} ms after start"
      # A small init may be done by then: nothing was killed, and the
      # manifest checks below still hold it to one process's bytes.
      if kill -KILL "$(<"$D/pid.$victim")" 2>/dev/null; then killed_at=$(now); else late=1; fi
    else
      why_not "the ranks did not start within $START s"
    fi
    ;;
  commit)
    wait_until $(((START + 10) * 1000)) has_pids
    wait_until $(((START + C + 10) * 1000)) test -e "$D/rc.$victim" -o ! -e "/proc/$(cat "$D/pid.$victim" 2>/dev/null)" &&
      killed_at=$(now)
    ;;
  esac
  # Every other rank ends: the time each one is last seen alive.
  pids=()
  for ((r = 0; r < np; r++)); do pids[r]=$(cat "$D/pid.$r" 2>/dev/null); done
  declare -A ended=()
  all_ended='' launcher_left=0
  while alive "$mpid"; do
    for ((r = 0; r < np; r++)); do
      [[ -n ${pids[r]} && -z ${ended[$r]:-} ]] && ! alive "${pids[r]}" && ended[$r]=${EPOCHREALTIME/./}
    done
    # Open MPI 4.1.4's mpirun may wait on after every rank has ended when one
    # died inside MPI_Init (seen with --enable-recovery, and once in ~10
    # plain init trials: seed 5009): the launcher's, not a rank's hang. It is
    # stopped 3 s later; the trial's line and the summary count it.
    if [[ -z $all_ended ]] && ((${#ended[@]} == np)); then all_ended=${EPOCHREALTIME/./}; fi
    if [[ -n $all_ended ]] && ((${EPOCHREALTIME/./} - all_ended > 3000000)); then
      launcher_left=1
      kill -TERM "$mpid" 2>/dev/null
      sleep 1
    fi
    if [[ $mode == recovery && $phase == stop ]]; then # mpirun waits for the stopped one: end it once the rest ended
      rest=1
      for ((r = 0; r < np; r++)); do ((r == victim)) || [[ -n ${ended[$r]:-} ]] || rest=0; done
      ((rest)) && kill -KILL "${pids[victim]}" 2>/dev/null
    fi
    nap 0.02
  done
  wait "$mpid"
  mrc=$?
  end=$(now)
  for ((r = 0; r < np; r++)); do [[ -z ${ended[$r]:-} ]] && ended[$r]=$end; done
  (((end - started) / 1000000 >= guard)) && why_not "mpirun hung: stopped by the timeout after $guard s"
  # No rank is left (ending any that is, so a failure does not leak them).
  for ((r = 0; r < np; r++)); do
    if [[ -n ${pids[r]} ]] && alive "${pids[r]}"; then
      why_not "rank $r is still running after mpirun ended"
      kill -KILL "${pids[r]}" 2>/dev/null
    fi
  done
  # An init killed after its commit (its manifest there) may end 0 on the others.
  committed=0
  [[ $phase == init && -s $T/manifest.jsonl ]] && committed=1
  if [[ -n $killed_at ]]; then
    worst=0 codes=''
    for ((r = 0; r < np; r++)); do
      ((r == victim)) && continue
      d=$(((ended[$r] - killed_at) / 1000))
      ((d > worst)) && worst=$d
      ((d > (C + SLACK) * 1000)) && why_not "rank $r ended $d ms after the kill, past ${C}s + ${SLACK}s"
      if [[ $mode == recovery ]]; then
        # 74 from zinf's deadline; Open MPI ends a rank whose MPI_Init failed with 1.
        read -r st _ <"$D/rc.$r" 2>/dev/null
        codes+=" ${st:-?}"
        [[ ${st:-0} != 0 ]] || ((committed)) || why_not "rank $r exited ${st:-?}: $(tail -n 1 "$D/err.$r")"
      fi
    done
    ((mrc != 0 || committed)) || [[ $mode == recovery ]] || why_not "mpirun exited 0"
    desc+=": the others ended within $worst ms${codes:+ (exit$codes)}"
    ((launcher_left)) && desc+=" (mpirun waited on after them: stopped)" && launchers_left=$((launchers_left + 1))
  elif ((late)); then
    wait "$mpid" 2>/dev/null
    desc+=" (too late: the victim had already ended)"
  else
    why_not "the victim was never killed"
  fi
  # The manifest.
  if [[ $phase == init ]]; then
    if [[ -e $T/manifest.jsonl ]]; then
      expect "init's manifest is byte-identical to one process's" same_bytes "$T/manifest.jsonl" "$W/init$np.manifest"
      expect "…and verifies" verifies "$T/manifest.jsonl"
      desc+=", manifest committed"
    else
      desc+=", no manifest"
    fi
  else
    n=$(jq -R -r 'fromjson? | .step' "$D/out.0" 2>/dev/null | tail -n 1)
    n=${n:-0}
    k=$(manifest_step "$T/manifest.jsonl" 2>/dev/null)
    if [[ ! $k =~ ^[0-9]+$ ]]; then
      why_not "the manifest has no single step ($k)"
    elif ((k < n || k > n + 1)); then
      why_not "the manifest is at step $k after $n lines: not the last commit"
    fi
    expect "zinf-shard verify passes on the manifest" verifies "$T/manifest.jsonl"
    desc+=", manifest at step $k after $n lines"
  fi
  trial_end "$desc; seed=$trial_seed"
done
echo "# mpirun left waiting after all its ranks had ended (stopped by this script): $launchers_left of $trials trials"
crash_finish rank
