#!/usr/bin/env bash
# crash-trials.sh: the crash-trial campaign of tests/crash/, N trials of each.
#
# Usage: scripts/crash-trials.sh [OPTIONS] N
#
# Runs N seeded SIGKILL trials of each of
#
#   shard-init     zinf-shard init, fresh or --force over a committed state
#   shard-reshard  zinf-shard reshard (dp 3 to 2), fresh or --force
#   shard-import   zinf-shard import of llm.c weights, fresh or --force
#   shard-hfimport zinf-shard import of a Hugging Face folder (shards, index)
#   export-llmc    zinf-shard export to llm.c's file, fresh or --force
#   export-hf      zinf-shard export to a Hugging Face folder, fresh or --force
#   train-nvme     zinf-train, every state on nvme (every step commits)
#   train-cpu      zinf-train, the state in memory, --checkpoint-every 2
#   train-overlap  zinf-train, every state on nvme, its writes held (--slow-writes
#                  200): each step's update outlasts the next forward, which
#                  waits on a module; the kills land between a norm and its commit
#   diverge        zinf-train resumed at --lr 1e12: it diverges and goes back
#   lock           a second program beside a zinf-train holding the lock,
#                  refused (75); the holder SIGKILLed, the next run not blocked
#   moved          a state copied, moved, moved with a new one at its path, or
#                  its rank folders given to a second state; every program
#                  that writes (or locks) run on it: refused (65, 73) and
#                  writing nothing of the origin, then adopted and written
#                  (tests/crash/moved.sh; no SIGKILL)
#
# each killed after a seeded delay or on entering a seeded fsync, fdatasync,
# rename or fallocate (inside a commit), and checked: the manifest is
# byte-identical to the last committed one or absent, zinf-shard verify
# passes on it, a re-run or --resume proceeds to the end (with the
# uninterrupted run's losses, bit for bit), no temporaries are left (an
# export: its output absent, the old one or the new one whole; see each
# script's header in tests/crash/ for its checks). Then
# the dying-rank trials (tests/crash/rank.sh): mpirun -np 2 and -np 4, one
# rank SIGKILLed in training, in init --ranks all and inside a commit, or
# SIGSTOPped; the others must end within the deadline (--comm-timeout, or
# twice a bare MPI job's time here where that is longer) plus a few seconds.
#
# Options:
#   --seed S           trial i of each campaign has seed S+i (default: drawn)
#   --rank-trials M    dying-rank trials (default 8: each case once; 0: none)
#   --comm-timeout T   the dying-rank trials' least --comm-timeout, seconds (default
#                      2), raised to twice a bare MPI job's time on this machine
#   --only NAME        one campaign: shard-init, shard-reshard, shard-import,
#                      shard-hfimport, export-llmc, export-hf, train-nvme,
#                      train-cpu, train-overlap, diverge, lock, moved or rank
#   --keep             keep the work folders (their paths are printed)
#   -h, --help         print this help and exit
#
# Environment: ZINF_BIN (default bin/ of this repository), ZINF_CRASH_DIR (where
# the work folders go; default /var/tmp, a disk that takes O_DIRECT).
#
# Output (stdout): every trial's line (ok/FAIL, what was killed where, what
# it left, its seed), then a table: campaign, trials, held, failed, the
# failed trials' seeds; lines that are not data start with '#'. A failed
# trial is reproduced alone by the command its row names, with its seed.
# Exit status: 0 every trial held, 1 a trial failed, 64 usage, 69 jq missing.
#
# Example: scripts/crash-trials.sh --seed 1 100
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash"

seed=$((RANDOM * 32768 + RANDOM))
rank_trials=8 comm_timeout=2 only= keep=() n=
while [[ $# -gt 0 ]]; do
    case $1 in
        -h | --help) usage; exit 0 ;;
        --seed) need_value "$@"; seed=$2; shift 2 ;;
        --rank-trials) need_value "$@"; rank_trials=$2; shift 2 ;;
        --comm-timeout) need_value "$@"; comm_timeout=$2; shift 2 ;;
        --only) need_value "$@"; only=$2; shift 2 ;;
        --keep) keep=(--keep); shift ;;
        -*) usage_error "unknown option $1" ;;
        *) [[ -z $n ]] || usage_error "one N, not '$n' and '$1'"; n=$1; shift ;;
    esac
done
[[ -n $n ]] || usage_error "give N, the trials of each campaign"
[[ $n =~ ^[0-9]+$ ]] || usage_error "bad N '$n'"
[[ $seed =~ ^[0-9]+$ ]] || usage_error "bad --seed '$seed'"
[[ $rank_trials =~ ^[0-9]+$ ]] || usage_error "bad --rank-trials '$rank_trials'"
[[ $comm_timeout =~ ^[1-9][0-9]*$ ]] || usage_error "bad --comm-timeout '$comm_timeout' (whole seconds)"
campaigns=(shard-init shard-reshard shard-import shard-hfimport export-llmc export-hf train-nvme train-cpu train-overlap diverge lock moved rank)
[[ -z $only || " ${campaigns[*]} " == *" $only "* ]] || usage_error "--only: one of ${campaigns[*]}"
command -v jq >/dev/null || die 69 "needs jq (apt-get install jq)"
bin=${ZINF_BIN:-$root/bin}
for p in zinf-shard zinf-train zinf-sample; do [[ -x $bin/$p ]] || die 66 "$bin/$p is missing (make $bin/$p)"; done
export ZINF_BIN=$bin

command_of() {  # command_of CAMPAIGN: the script and its options
    case $1 in
        shard-init) echo "tests/crash/shard.sh --op init" ;;
        shard-reshard) echo "tests/crash/shard.sh --op reshard" ;;
        shard-import) echo "tests/crash/shard.sh --op import" ;;
        shard-hfimport) echo "tests/crash/shard.sh --op hfimport" ;;
        export-llmc) echo "tests/crash/export.sh --format llmc" ;;
        export-hf) echo "tests/crash/export.sh --format hf" ;;
        diverge) echo "tests/crash/diverge.sh" ;;
        lock) echo "tests/crash/lock.sh" ;;
        moved) echo "tests/crash/moved.sh" ;;
        train-nvme) echo "tests/crash/train.sh --tiers nvme" ;;
        train-cpu) echo "tests/crash/train.sh --tiers cpu" ;;
        train-overlap) echo "tests/crash/train.sh --tiers nvme --slow-writes 200" ;;
        rank) echo "tests/crash/rank.sh --comm-timeout $comm_timeout" ;;
    esac
}

echo "# crash trials: seed $seed, $n of each, $rank_trials of a dying rank"
rows=() failed_any=0
for c in "${campaigns[@]}"; do
    [[ -n $only && $c != "$only" ]] && continue
    trials=$n
    [[ $c == rank ]] && trials=$rank_trials
    ((trials > 0)) || continue
    read -r -a cmd <<<"$(command_of "$c")"
    say "$c: $trials trials"
    out=$(mktemp)
    bash "$root/${cmd[0]}" "${cmd[@]:1}" --seed "$seed" --trials "$trials" "${keep[@]}" 2>&1 | tee "$out"
    rc=${PIPESTATUS[0]}
    read -r _ _ _ t h f _ seeds < <(grep '^# crash-result ' "$out" | tail -n 1) || true
    rm -f "$out"
    if [[ -z ${t:-} ]]; then
        t=$trials h=0 f=$trials seeds="(no result: exit $rc)"
    elif ((rc != 0 && f == 0)); then
        f=1 seeds="(exit $rc)"
    fi
    ((f > 0)) && failed_any=1
    rows+=("$(printf '%-14s %7s %6s %7s  %s' "$c" "$t" "$h" "$f" "${seeds:--}")")
    t='' h='' f='' seeds=''
done
echo "# campaign        trials   held  failed  failed seeds (reproduce: COMMAND --seed S --trials 1)"
for r in "${rows[@]}"; do echo "$r"; done
for c in "${campaigns[@]}"; do
    [[ -n $only && $c != "$only" ]] && continue
    [[ $c == rank ]] && ((rank_trials == 0)) && continue
    echo "#   $c: $(command_of "$c")"
done
exit $failed_any
