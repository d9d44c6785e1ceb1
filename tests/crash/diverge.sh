#!/usr/bin/env bash
# Crash trials of a diverging zinf-train run (issue 29, finding 4): a tiny
# model with every state on nvme, trained to step 2, is resumed with
# --lr 1e12: it commits step 3, whose weights give a NaN loss at step 4,
# commits step 2's manifest again and exits 65. Each trial SIGKILLs that run
# at a seeded moment (after a seeded delay, or on entering a seeded fsync,
# fdatasync, rename or fallocate: inside a commit). Then: the manifest is
# step 2's, byte for byte, or the run's step-3 commit (the last commit
# before the kill: finite weights, checked when step 4 runs); zinf-shard
# verify passes on it; the same run again exits 65 naming the step it went
# back to, which the manifest names; from step 2, a run at a sane rate then
# trains to the end (the weights were never poisoned); no temporaries.
#
#   tests/crash/diverge.sh [--seed S] [--trials N] [--keep]
#
# --seed S: trial i has seed S+i (default: drawn, printed); --trials N
# (default 10); --keep: keep the work folder. ZINF_CRASH_DIR: where the
# folder goes (default /var/tmp).
source "$(dirname "$0")/../e2e/lib.bash"
source "$(dirname "$0")/../e2e/train_lib.bash"
source "$(dirname "$0")/lib.bash"
crash_options "$@"
((${#args[@]} == 0)) || { echo "${0##*/}: unknown option ${args[0]} (see --help)" >&2; exit 64; }
name=diverge
crash_dir "$name"
M=gpt:layers=1,hidden=32,heads=2,vocab=256,seq=32
echo "# diverging zinf-train crash trials: seed $seed, $trials trials, $M at --lr 1e12 from step 2"
have_strace_ok=0
have_strace && have_strace_ok=1 || echo "# no strace with syscall injection: delays only"
head -c 4000 "$ROOT/man/zinf-shard.1" >"$W/corpus.txt"
R=(--text "$W/corpus.txt" --checkpoint-every 1 --schedule constant --batch 2 --seq 16 --threads 1 "${POOL[@]}" --json --quiet)
T=$W/t
"$SH" layout --model "$M" --param-dtype fp32 --param nvme --optim nvme | "$SH" init "${POOL[@]}" --dir "$T" >/dev/null 2>&1
"$TR" --manifest "$T/manifest.jsonl" --steps 2 "${R[@]}" >/dev/null 2>&1
cp -a "$T" "$W/pristine"
cp "$T/manifest.jsonl" "$W/ref.2"
restore() { rm -rf "$T" && cp -a "$W/pristine" "$T"; }
div=("$TR" --manifest "$T/manifest.jsonl" --steps 6 --resume --lr 1e12 "${R[@]}")
"${div[@]}" >/dev/null 2>&1 # (warms the caches: the timing is the second run's)
restore
timed run "${div[@]}" >"$W/ref.out" 2>"$W/ref.err"
ref_rc=$?
if ((ref_rc != 65)) || ! same_bytes "$T/manifest.jsonl" "$W/ref.2" || [[ $(<"$W/ref.err") != *"committed again at step 2"* ]]; then
  fail "the reference: the diverging run exits 65 and commits step 2 again" "exit $ref_rc: $(tail -c 300 "$W/ref.err")"
  crash_finish "$name"
  exit 1
fi
reference_calls "${div[@]}"

landed=()
for ((i = 0; i < trials; i++)); do
  trial_begin "$i"
  restore
  draw_kill "$run_ms" "$W/calls"
  kill_out=$W/killed
  killed "${div[@]}"
  [[ $rc == 137 || $rc == 65 ]] || why_not "the killed run exited $rc, not 137 (or 65): $(head -c 300 "$W/killed.err")"
  k=$(manifest_step "$T/manifest.jsonl" 2>/dev/null)
  if [[ $k == 2 ]]; then
    expect "the manifest at step 2 is step 2's, byte for byte" same_bytes "$T/manifest.jsonl" "$W/ref.2"
  elif [[ $k != 3 ]]; then
    why_not "the manifest the kill left is at step $k, not 2 or the run's step-3 commit"
  fi
  [[ $rc == 65 && $k != 2 ]] && why_not "the run ended 65 but its manifest is at step $k"
  expect "zinf-shard verify passes on the manifest the kill left" verifies "$T/manifest.jsonl"
  # The same run again: it diverges, and goes back to the step it resumed.
  "${div[@]}" >"$W/again.out" 2>"$W/again.err"
  r=$?
  back=$(manifest_step "$T/manifest.jsonl" 2>/dev/null)
  ((r == 65)) || why_not "the same run again exited $r, not 65: $(tail -c 300 "$W/again.err")"
  [[ $back == "$k" ]] || why_not "after the run again the manifest is at step $back, not $k"
  grep -q "diverged.*committed again at step $back\|diverged.*is at step $back" "$W/again.err" ||
    grep -q "step $back" "$W/again.err" || why_not "the run again does not name step $back: $(tail -c 300 "$W/again.err")"
  expect "…and it verifies" verifies "$T/manifest.jsonl"
  if [[ $back == 2 ]]; then
    expect "the manifest is step 2's again, byte for byte" same_bytes "$T/manifest.jsonl" "$W/ref.2"
    "$TR" --manifest "$T/manifest.jsonl" --steps 4 --resume --lr 3e-3 "${R[@]}" >"$W/sane.out" 2>"$W/sane.err" ||
      why_not "a sane run from step 2 failed: $(tail -c 300 "$W/sane.err")"
  fi
  [[ -z $(leftovers "$T") ]] || why_not "temporaries left at the end: $(leftovers "$T" | head -3 | tr '\n' ' ')"
  landed+=("$k")
  trial_end "diverging run, kill at ${kill// /:} (exit $rc): manifest at step $k; seed=$trial_seed"
done
tally "kills left the manifest at step"
crash_finish "$name"
