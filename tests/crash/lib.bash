# Sourced by the crash trials (tests/crash/*.sh) after tests/e2e/lib.bash and
# train_lib.bash (sums, manifest_step, losses):
# options, a seeded generator, SIGKILL at a seeded moment, and one test per
# trial. A trial is reproduced by its seed alone:
#
#   tests/crash/NAME.sh --seed S --trials 1
#
# Trial i of a run started with --seed S has seed S+i. Every trial prints
# one line, "ok   - ... seed=S ..." or "FAIL - ... seed=S ...: why", and the
# script ends with "# crash-result NAME TRIALS HELD FAILED" and, as every
# e2e suite, "# e2e-result PASSED FAILED SKIPPED".

SH=$BIN/zinf-shard
TR=$BIN/zinf-train
POOL=(--pinned 8MiB --pinned-buffer 256KiB)

# crash_options "$@": --seed, --trials (default $default_trials, else 10),
# --keep and --help (the caller's header comment). Sets seed, trials, keep,
# and the rest of the options in args.
crash_options() {
  seed=${ZINF_CRASH_SEED:-$((RANDOM * 32768 + RANDOM))}
  trials=${default_trials:-10} keep=0 args=()
  while (($#)); do
    case $1 in
    --seed) seed=${2:?--seed needs a value}; shift 2 ;;
    --trials) trials=${2:?--trials needs a value}; shift 2 ;;
    --keep) keep=1; shift ;;
    -h | --help) awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"; exit 0 ;;
    *) args+=("$1"); shift ;;
    esac
  done
  [[ $seed =~ ^[0-9]+$ && $trials =~ ^[0-9]+$ ]] || { echo "${0##*/}: --seed and --trials take counts" >&2; exit 64; }
}

# crash_dir NAME: $W, a folder on a disk that takes O_DIRECT (not a tmpfs
# /tmp), removed at exit unless --keep.
crash_dir() {
  W=$(mktemp -d "${ZINF_CRASH_DIR:-/var/tmp}/zinf-crash-$1-XXXXXX")
  ((keep)) && echo "# keeping $W" || on_exit "rm -rf '$W'"
}

# seed_rng S: the generator below, from S (bash's own RANDOM: the same draws
# for the same seed).
seed_rng() { RANDOM=$1; }
# below N: a draw in [0, N), N up to 2^30, in $REPLY. Never in $(...): a
# subshell's RANDOM is reseeded, and the parent's would not advance.
below() { REPLY=$(((RANDOM * 32768 + RANDOM) % $1)); }

# timed NAME CMD...: runs CMD; its wall time in ms in ${NAME}_ms.
timed() {
  local name=$1 t0=$EPOCHREALTIME
  shift
  "$@"
  local r=$? t1=$EPOCHREALTIME
  printf -v "${name}_ms" %d $(((${t1/./} - ${t0/./}) / 1000))
  return $r
}

# syscall_counts OUT CMD...: runs CMD under strace and writes, per syscall of
# $KILL_SYSCALLS, how often the process (any thread) entered it: "name count".
# (--seccomp-bpf stops the process at those calls only; strace 6.1 does not
# inject with it, so the kills themselves go without.)
KILL_SYSCALLS=fsync,fdatasync,rename,renameat2,fallocate
syscall_counts() {
  local out=$1
  shift
  strace -f -qq -o "$out.trace" --seccomp-bpf -e trace="$KILL_SYSCALLS" "$@" >/dev/null 2>&1
  sed -E 's/^[0-9]+ +//; s/^<\.\.\. ([a-z_0-9]+) resumed>.*/\1 resumed/; s/\(.*//' "$out.trace" |
    grep -v resumed | sort | uniq -c | awk '{ print $2, $1 }' >"$out"
  rm -f "$out.trace"
}
have_strace() { strace -f -qq -o /dev/null -e trace=fsync -e inject=fsync:signal=KILL:when=1 true 2>/dev/null; }

# draw_kill TOTAL_MS COUNTS: a kill for this trial, in $kill: "time MS" (after
# MS ms, MS uniform in [0, TOTAL_MS), TOTAL_MS the reference run's time) or, half the time when strace can
# inject, "syscall NAME K" (on entering the K-th NAME, K uniform over the
# reference run's count of it, NAME uniform over the syscalls it made): the
# latter lands inside a commit by construction (before a state file's sync,
# a rename, the manifest's rename or its folder's sync).
draw_kill() {
  local total=$1 counts=$2
  below 2
  if ((have_strace_ok && REPLY == 1)) && [[ -s $counts ]]; then
    local lines=()
    mapfile -t lines <"$counts"
    below "${#lines[@]}"
    local name=${lines[REPLY]% *} count=${lines[REPLY]#* }
    below "$count"
    kill="syscall $name $((REPLY + 1))"
  else
    below 1000 # per mille of the run's time: the same moment of a slower or faster run
    kill="time $((REPLY * total / 1000))"
  fi
}

# killed CMD...: runs CMD (a program, not a shell function) with stdin from $kill_stdin (default /dev/null),
# stdout in $kill_out and stderr in $kill_out.err, and SIGKILLs it as $kill
# says; its exit status in $rc (137 when killed, 0 when it ended first).
killed() {
  local in=${kill_stdin:-/dev/null}
  read -r -a k <<<"$kill"
  if [[ ${k[0]} == syscall ]]; then
    # (in the background and waited for, so that bash reports no "Killed")
    strace -f -qq -o /dev/null -e trace="${k[1]}" -e inject="${k[1]}:signal=KILL:when=${k[2]}" \
      "$@" <"$in" >"$kill_out" 2>"$kill_out.err" &
    wait $! 2>/dev/null
    rc=$?
  else
    "$@" <"$in" >"$kill_out" 2>"$kill_out.err" &
    local pid=$!
    local ms=${k[1]}
    sleep "$((ms / 1000)).$(printf '%03d' $((ms % 1000)))"
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    rc=$?
  fi
}

# A trial: trial_begin, then why_not for every check that fails, then trial_end.
# trial_begin I: trial I begins: its seed (seed + I, in trial_seed) seeds the
# generator, and it has no failure yet.
trial_begin() {
  trial_seed=$((seed + $1))
  seed_rng "$trial_seed"
  why=()
}
why_not() { why+=("$*"); }
# expect NAME CMD...: why_not NAME unless CMD succeeds.
expect() {
  local name=$1
  shift
  "$@" >/dev/null 2>&1 || why_not "$name"
}
# tally WHAT: one line, "# WHAT: 3 x, 2 y", of the outcomes the trials
# added to the array `landed`.
tally() { echo "# $1: $(printf '%s\n' "${landed[@]}" | sort | uniq -c | awk '{ printf "%s%s %s", sep, $1, $2; sep = ", " }')"; }
# reference_calls CMD...: with strace's injection at hand (have_strace_ok),
# CMD run once more after `restore`, its syscalls counted into $W/calls
# (draw_kill's); then the reference run's time (run_ms) and those counts said.
reference_calls() {
  if ((have_strace_ok)); then
    restore
    syscall_counts "$W/calls" "$@"
  fi
  echo "# the run took ${run_ms} ms; syscalls: $(tr '\n' ' ' <"$W/calls" 2>/dev/null)"
}
held=0 failed=0 failed_seeds=()
trial_end() {  # trial_end DESCRIPTION
  if ((${#why[@]} == 0)); then
    pass "$1"
    held=$((held + 1))
  else
    local IFS=';'
    fail "$1" "${why[*]}"
    failed=$((failed + 1))
    failed_seeds+=("$trial_seed")
  fi
}
crash_finish() {  # crash_finish NAME
  echo "# crash-result $1 $((held + failed)) $held $failed${failed_seeds[*]:+ seeds ${failed_seeds[*]}}"
  finish
}

# Files and manifests.
# same_bytes A B: the two files are byte-identical.
same_bytes() { cmp -s "$1" "$2"; }
# leftovers DIR: the temporaries a killed writer may leave (none after a re-run).
leftovers() { find "$1" -name '*.zinf-tmp.*' -o -name 'manifest.jsonl.tmp.*'; }
# verifies MANIFEST: zinf-shard verify passes and prints the manifest back, byte for byte.
verifies() { "$SH" verify "${POOL[@]}" -m "$1" 2>/dev/null | cmp -s - "$1"; }
# one_of FILE REF...: FILE is byte-identical to one of REF (prints which, by position from 1).
one_of() {
  local f=$1 i=0 r
  shift
  for r; do
    i=$((i + 1))
    if cmp -s "$f" "$r"; then echo "$i"; return 0; fi
  done
  return 1
}
