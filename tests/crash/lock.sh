#!/usr/bin/env bash
# Crash trials of the lock (zinf(7), LOCKS): each trial starts a long
# zinf-train run on a tiny model (every state on nvme, every step commits),
# waits until its lock file records it, and after a seeded delay runs a
# second program on the same directory, drawn by the seed: another
# zinf-train, zinf-shard init --force, import --force (writers), verify or
# export (readers). It must be refused at once with exit 75 naming the lock
# file and the holder (zinf-train, its pid), and write nothing. Then the
# holder is SIGKILLed at once, and the next run (--resume one step further)
# must not be blocked: it ends 0, its manifest verifies and is one step past
# the one the kill left (which verifies too), and no temporaries are left.
#
#   tests/crash/lock.sh [--seed S] [--trials N] [--keep]
#
# --seed S: trial i has seed S+i (default: drawn, printed); --trials N
# (default 10); --keep: keep the work folder. ZINF_CRASH_DIR: where the
# folder goes (default /var/tmp).
source "$(dirname "$0")/../e2e/lib.bash"
source "$(dirname "$0")/../e2e/train_lib.bash"
source "$(dirname "$0")/lib.bash"
crash_options "$@"
((${#args[@]} == 0)) || { echo "${0##*/}: unknown option ${args[0]} (see --help)" >&2; exit 64; }
name=lock
crash_dir "$name"
M=gpt:layers=1,hidden=32,heads=2,vocab=256,seq=32
echo "# lock crash trials: seed $seed, $trials trials, zinf-train of $M holding the lock"
head -c 20000 "$ROOT/man/zinf-train.1" >"$W/corpus.txt"
R=(--text "$W/corpus.txt" --batch 2 --seq 16 --threads 1 "${POOL[@]}" --schedule constant --lr 3e-3 --json --quiet)
T=$W/t
"$SH" layout --model "$M" --param nvme --optim nvme >"$W/layout"
"$SH" init "${POOL[@]}" --dir "$T" <"$W/layout" >/dev/null 2>&1
cp -a "$T" "$W/pristine"
"$SH" init "${POOL[@]}" --dir "$W/wsrc" <"$W/layout" >/dev/null 2>&1
"$SH" export "${POOL[@]}" -m "$W/wsrc/manifest.jsonl" --to "$W/weights.bin" --format llmc >/dev/null 2>&1
[[ -s $W/weights.bin ]] || { fail "the references" "init or export failed"; crash_finish "$name"; exit 1; }
contenders=(train init import verify export)

landed=()
for ((i = 0; i < trials; i++)); do
  trial_begin "$i"
  rm -rf "$T" "$W/e.bin" && cp -a "$W/pristine" "$T"
  "$TR" --manifest "$T/manifest.jsonl" --steps 1000000 --resume "${R[@]}" >"$W/holder.out" 2>"$W/holder.err" &
  pid=$!
  # Held once the lock file records the holder (it writes that after its flock).
  wait_holder "$T" "$pid"
  below 1000
  sleep "0.$(printf '%03d' "$REPLY")"
  below ${#contenders[@]}
  c=${contenders[REPLY]}
  case $c in
  train) "$TR" --manifest "$T/manifest.jsonl" --steps 1000000 --resume "${R[@]}" >"$W/c.out" 2>"$W/c.err" ;;
  init) "$SH" init "${POOL[@]}" --dir "$T" --force <"$W/layout" >"$W/c.out" 2>"$W/c.err" ;;
  import) "$SH" import "${POOL[@]}" --from "$W/weights.bin" --dir "$T" --force <"$W/layout" >"$W/c.out" 2>"$W/c.err" ;;
  verify) "$SH" verify "${POOL[@]}" -m "$T/manifest.jsonl" >"$W/c.out" 2>"$W/c.err" ;;
  export) "$SH" export "${POOL[@]}" -m "$T/manifest.jsonl" --to "$W/e.bin" --format llmc >"$W/c.out" 2>"$W/c.err" ;;
  esac
  crc=$?
  alive=1
  kill -0 "$pid" 2>/dev/null || alive=0
  kill -KILL "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  hrc=$?
  err=$(head -c 600 "$W/c.err")
  if ((alive == 0)); then
    why_not "the holder had ended (exit $hrc) before the second program ran: $(head -c 300 "$W/holder.err")"
  else
    ((crc == 75)) || why_not "$c beside the holder exited $crc, not 75: $err"
    [[ $err == *"$T/.zinf-lock"* && $err == *"zinf-train (pid $pid "* ]] ||
      why_not "$c's refusal does not name the lock file and the holder (zinf-train, pid $pid): $err"
    [[ -s $W/c.out ]] && why_not "$c wrote on stdout though refused"
    [[ -e $W/e.bin ]] && why_not "the refused export wrote its file"
  fi
  # What the kill left: a committed step that verifies.
  k=$(manifest_step "$T/manifest.jsonl" 2>/dev/null)
  if [[ ! $k =~ ^[0-9]+$ ]]; then
    why_not "the manifest the kill left has no single step ($k)"
  else
    expect "zinf-shard verify passes on the manifest the kill left (step $k)" verifies "$T/manifest.jsonl"
    # The next run, at once: the killed holder's lock is gone with it.
    "$TR" --manifest "$T/manifest.jsonl" --steps $((k + 1)) --resume "${R[@]}" >"$W/next.out" 2>"$W/next.err"
    r=$?
    if ((r != 0)); then
      why_not "the next run after the kill exited $r: $(head -c 300 "$W/next.err")"
    else
      [[ $(manifest_step "$T/manifest.jsonl") == $((k + 1)) ]] || why_not "the next run did not commit step $((k + 1))"
      expect "the next run's state verifies" verifies "$T/manifest.jsonl"
    fi
  fi
  [[ -z $(leftovers "$T") ]] || why_not "temporaries left at the end: $(leftovers "$T" | head -3 | tr '\n' ' ')"
  landed+=("$c")
  trial_end "$c beside zinf-train (exit $crc), holder killed at step ${k:-?}; seed=$trial_seed"
done
tally "second programs refused"
crash_finish "$name"
