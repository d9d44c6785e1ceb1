#!/usr/bin/env bash
# Crash trials of zinf-train: each trial SIGKILLs a training run of a tiny
# model at a seeded moment (after a seeded delay, or on entering a seeded
# fsync, fdatasync, rename or fallocate: inside a commit), with every state
# on nvme (every step commits) or, with --tiers cpu, the state in memory and
# --checkpoint-every 2. Then: manifest.jsonl is byte-identical to the one
# the uninterrupted run committed at its step, and that step is the last
# commit before the kill (from the lines printed); zinf-shard verify passes
# on it; --resume runs to the end printing, bit for bit, the uninterrupted
# run's losses, and commits its final state; no temporaries are left.
#
#   tests/crash/train.sh [--tiers nvme|cpu] [--slow-writes MS] [--seed S] [--trials N] [--keep]
#
# --slow-writes MS: every zinf-train run (references, killed, resumed) holds
# the first 6 write pieces of each file it opens MS ms each (ZINF_FAULTS
# delay): each step's update then outlasts the next step's forward, which
# waits on a module whose new values are not written yet, and its commit
# comes late in the next step. The kills (a seeded time, or entering the
# update's fdatasync on its own thread) land inside that overlap, between
# a step's norm and its commit.
# --tiers: where the state is (default nvme); --seed S: trial i has seed
# S+i (default: drawn, printed); --trials N (default 10); --keep: keep the
# work folder. ZINF_CRASH_DIR: where the folder goes (default /var/tmp).
source "$(dirname "$0")/../e2e/lib.bash"
source "$(dirname "$0")/../e2e/train_lib.bash"
source "$(dirname "$0")/lib.bash"
crash_options "$@"
tiers=nvme slow=0
set -- "${args[@]}"
while (($#)); do
  case $1 in
  --tiers) tiers=${2:-}; shift 2 ;;
  --slow-writes) slow=${2:-}; shift 2 ;;
  *) echo "${0##*/}: unknown option $1 (see --help)" >&2; exit 64 ;;
  esac
done
[[ $tiers == nvme || $tiers == cpu ]] || { echo "${0##*/}: --tiers is nvme or cpu" >&2; exit 64; }
[[ $slow =~ ^[0-9]+$ ]] || { echo "${0##*/}: --slow-writes takes milliseconds" >&2; exit 64; }
name=train-$tiers
TRC=("$TR")
if ((slow > 0)); then
  name=train-overlap-$tiers
  faults=
  for k in 1 2 3 4 5 6; do faults+=${faults:+,}write:$k:delay$slow; done
  TRC=(env "ZINF_FAULTS=$faults" "$TR")
fi
crash_dir "$name"
M=gpt:layers=1,hidden=32,heads=2,vocab=256,seq=32
N=4 # steps
every=1
CK=()
if [[ $tiers == cpu ]]; then
  every=2
  CK=(--checkpoint-every $every)
fi
echo "# zinf-train crash trials ($tiers tiers${CK[*]:+, ${CK[*]}}): seed $seed, $trials trials, $N steps of $M"
have_strace_ok=0
have_strace && have_strace_ok=1 || echo "# no strace with syscall injection: delays only"
cat "$ROOT"/man/*.1 >"$W/corpus.txt"
# A constant schedule: the state after k steps of an --steps N run is then
# the state of an --steps k run, which gives the reference at every commit.
R=(--text "$W/corpus.txt" --batch 2 --seq 16 --threads 1 "${POOL[@]}" --schedule constant --lr 3e-3 --json --quiet "${CK[@]}")

# The references, made at $W/t, the trial folder (a manifest names its folder).
T=$W/t
"$SH" layout --model "$M" --param "$tiers" --optim "$tiers" | "$SH" init "${POOL[@]}" --dir "$T" >/dev/null 2>&1
cp -a "$T" "$W/pristine"
restore() { rm -rf "$T" && cp -a "$W/pristine" "$T"; }
cp "$T/manifest.jsonl" "$W/ref.0"
timed run "${TRC[@]}" --manifest "$T/manifest.jsonl" --steps $N "${R[@]}" >"$W/ref.jsonl" 2>"$W/ref.err"
cp "$T/manifest.jsonl" "$W/ref.final"
# The manifest of every commit, from a chain of runs that each commit once.
restore
ok=1
for ((k = every; k <= N; k += every)); do
  "${TRC[@]}" --manifest "$T/manifest.jsonl" --steps $k --resume "${R[@]}" >>"$W/chain.jsonl" 2>"$W/chain.err" || ok=0
  cp "$T/manifest.jsonl" "$W/ref.$k"
done
# pairs FILE: "step loss" of each complete JSON line (a kill may cut the last
# one), the loss as jq prints it: every bit of it.
pairs() { jq -R -r 'fromjson? | "\(.step) \(.loss)"' "$1"; }
pairs "$W/ref.jsonl" >"$W/ref.pairs"
if ! ((ok)) || ! cmp -s "$W/ref.pairs" <(pairs "$W/chain.jsonl") || ! same_bytes "$W/ref.$N" "$W/ref.final" ||
  [[ $(wc -l <"$W/ref.pairs") != "$N" ]]; then
  fail "the references: $N steps in one run and in a chain of runs commit the same state and losses" \
    "$(head -c 300 "$W/ref.err" "$W/chain.err")"
  crash_finish "$name"
  exit 1
fi
reference_calls "${TRC[@]}" --manifest "$T/manifest.jsonl" --steps $N "${R[@]}"

landed=()
for ((i = 0; i < trials; i++)); do
  trial_begin "$i"
  restore
  draw_kill "$run_ms" "$W/calls"
  kill_out=$W/killed
  killed "${TRC[@]}" --manifest "$T/manifest.jsonl" --steps $N "${R[@]}"
  [[ $rc == 137 || $rc == 0 ]] || why_not "the killed run exited $rc, not 137 (or 0): $(head -c 300 "$W/killed.err")"
  # Its lines are the uninterrupted run's first n, to the bit.
  pairs "$W/killed" >"$W/killed.pairs"
  n=$(wc -l <"$W/killed.pairs")
  cmp -s "$W/killed.pairs" <(head -n "$n" "$W/ref.pairs") ||
    why_not "the killed run's lines are not the uninterrupted run's steps 1 to $n (loss for loss)"
  k=$(manifest_step "$T/manifest.jsonl" 2>/dev/null)
  # The commit before the kill: the last commit point printed, or the next
  # one, committed before its line; after the last line, the end's commit
  # may not have come (with state in memory it follows the line).
  lo=$((n / every * every)) hi=$(((n / every + 1) * every))
  ((hi > N)) && hi=$N
  ((n == N)) && lo=$(((N - 1) / every * every))
  if [[ ! $k =~ ^[0-9]+$ ]]; then
    why_not "the manifest the kill left has no single step ($k)"
    k=x
  elif ! same_bytes "$T/manifest.jsonl" "$W/ref.$k" 2>/dev/null; then
    why_not "the manifest at step $k is not byte-identical to the one the uninterrupted run committed at step $k"
  elif ((k < lo || k > hi)) || [[ $rc == 0 && $k != "$N" ]]; then
    why_not "the manifest is at step $k, not the last commit ($lo or $hi after $n lines, exit $rc)"
  fi
  expect "zinf-shard verify passes on the manifest the kill left" verifies "$T/manifest.jsonl"
  if [[ $k =~ ^[0-9]+$ ]] && ((k < N)); then
    "${TRC[@]}" --manifest "$T/manifest.jsonl" --steps $N --resume "${R[@]}" >"$W/resumed" 2>"$W/resumed.err"
    r=$?
    if ((r != 0)); then
      why_not "--resume exited $r: $(head -c 300 "$W/resumed.err")"
    else
      cmp -s <(pairs "$W/resumed") <(sed -n "$((k + 1)),${N}p" "$W/ref.pairs") ||
        why_not "--resume did not print the uninterrupted run's steps $((k + 1)) to $N, loss for loss"
    fi
  fi
  expect "the state at the end is the uninterrupted run's, byte for byte" same_bytes "$T/manifest.jsonl" "$W/ref.final"
  [[ $k == "$N" ]] || expect "…and it verifies" verifies "$T/manifest.jsonl"
  [[ -z $(leftovers "$T") ]] || why_not "temporaries left at the end: $(leftovers "$T" | head -3 | tr '\n' ' ')"
  landed+=("$k")
  trial_end "$tiers tiers, kill at ${kill// /:} (exit $rc) after $n lines: manifest at step $k; seed=$trial_seed"
done
tally "kills left the manifest at step"
crash_finish "$name"
