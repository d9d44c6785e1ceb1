#!/usr/bin/env bash
# Crash trials of zinf-shard export: each trial SIGKILLs an export of a tiny
# model's committed state at a seeded moment (after a seeded delay, or on
# entering a seeded fsync, fdatasync, rename, renameat2 or fallocate), into a path that
# does not exist yet or with --force over an export of another seed. Then:
# the output is absent (an empty folder for a sharded one made fresh) or
# byte-identical to the old export or to the one an uninterrupted export
# writes, never a mix; the state exported is untouched and verifies; a
# re-export (which takes the shared lock the killed one held) ends 0, writes
# the reference, and leaves no temporary beside or inside its output.
#
#   tests/crash/export.sh [--format llmc|hf] [--seed S] [--trials N] [--keep]
#
# --format: llm.c's checkpoint of a GPT (default llmc), or hf: a Llama's
# Hugging Face folder of safetensors shards and their index (--shard-size
# 8KiB: 7 shards); --seed S: trial i has seed S+i (default: drawn,
# printed); --trials N (default 10); --keep: keep the work folder.
# ZINF_CRASH_DIR: where the folder goes (default /var/tmp).
source "$(dirname "$0")/../e2e/lib.bash"
source "$(dirname "$0")/../e2e/train_lib.bash"
source "$(dirname "$0")/lib.bash"
crash_options "$@"
format=llmc
set -- "${args[@]}"
while (($#)); do
  case $1 in
  --format) format=${2:-}; shift 2 ;;
  *) echo "${0##*/}: unknown option $1 (see --help)" >&2; exit 64 ;;
  esac
done
[[ $format == llmc || $format == hf ]] || { echo "${0##*/}: --format is llmc or hf" >&2; exit 64; }
name=export-$format
crash_dir "$name"
if [[ $format == llmc ]]; then
  M=gpt:layers=1,hidden=32,heads=2,vocab=256,seq=32 how=(--format llmc)
else
  M=llama:layers=1,hidden=32,heads=2,kv_heads=1,ffn=48,vocab=64,seq=32 how=(--shard-size 8KiB)
fi
echo "# zinf-shard export crash trials ($format): seed $seed, $trials trials, model $M"
have_strace_ok=0
have_strace && have_strace_ok=1 || echo "# no strace with syscall injection: delays only"

# The state exported, and the references: its export, and the old output
# (an export of another seed) that --force replaces.
O=$W/out
"$SH" layout --model "$M" --param-dtype fp32 --seed 1 | "$SH" init "${POOL[@]}" --dir "$W/s" >/dev/null 2>&1
"$SH" layout --model "$M" --param-dtype fp32 --seed 2 | "$SH" init "${POOL[@]}" --dir "$W/s2" >/dev/null 2>&1
sums "$W/s" >"$W/s.sums"
cmd=("$SH" export "${POOL[@]}" -m "$W/s/manifest.jsonl" --to "$O" "${how[@]}")
"$SH" export "${POOL[@]}" -m "$W/s2/manifest.jsonl" --to "$W/old" "${how[@]}" >/dev/null 2>&1
"${cmd[@]}" >/dev/null 2>&1 && rm -rf "$O" # (warms the caches: the timing is the second run's)
timed fresh "${cmd[@]}" >/dev/null 2>&1 && mv "$O" "$W/new"
cp -a "$W/old" "$O"
timed force "${cmd[@]}" --force >/dev/null 2>&1
if ! [[ -e $W/old && -e $W/new ]] || ! diff -r "$O" "$W/new" >/dev/null; then
  fail "the reference exports ($format)" "zinf-shard export failed, or --force wrote another output"
  crash_finish "$name"
  exit 1
fi
if ((have_strace_ok)); then
  rm -rf "$O"
  syscall_counts "$W/fresh.calls" "${cmd[@]}"
  rm -rf "$O" && cp -a "$W/old" "$O"
  syscall_counts "$W/force.calls" "${cmd[@]}" --force
fi
echo "# export took ${fresh_ms} ms fresh, ${force_ms} ms with --force; syscalls: $(tr '\n' ' ' <"$W/force.calls" 2>/dev/null)"
# temps: the temporaries beside the output and inside it.
temps() { find "$W" -maxdepth 1 -name 'out.tmp.*'; [[ -d $O ]] && find "$O" -name '*.tmp.*'; }
# same DIR|FILE REF: the same output, byte for byte.
same() { diff -r "$1" "$2" >/dev/null 2>&1; }

landed=()
for ((i = 0; i < trials; i++)); do
  trial_begin "$i"
  rm -rf "$O" "$W"/out.tmp.*
  below 2
  if ((REPLY == 0)); then
    mode=fresh force=() total=$fresh_ms calls=$W/fresh.calls
  else
    mode=force force=(--force) total=$force_ms calls=$W/force.calls
    cp -a "$W/old" "$O"
  fi
  draw_kill "$total" "$calls"
  kill_out=$W/killed
  killed "${cmd[@]}" "${force[@]}"
  [[ $rc == 137 || $rc == 0 ]] || why_not "the killed export exited $rc, not 137 (or 0): $(head -c 300 "$W/killed.err")"
  # What the kill left: nothing, the old output or the new one, whole.
  if [[ ! -e $O ]] || { [[ -d $O ]] && empty_dir "$O"; }; then
    found=absent
    [[ $mode == fresh ]] || why_not "--force killed: the old output is gone"
  elif same "$O" "$W/new"; then
    found=new
  elif [[ $mode == force ]] && same "$O" "$W/old"; then
    found=old
  else
    found=torn
    why_not "the output is torn: neither absent nor the old or the new export ($(diff -rq "$O" "$W/new" 2>&1 | head -2 | tr '\n' ' '))"
  fi
  [[ $rc == 0 && $found != new ]] && why_not "the export ended 0 but its output is $found"
  [[ $(sums "$W/s") == "$(<"$W/s.sums")" ]] || why_not "the exported state changed"
  expect "zinf-shard verify passes on the state exported" verifies "$W/s/manifest.jsonl"
  # The next export: --force whenever an output is there.
  again=()
  [[ -e $O ]] && again=(--force)
  "${cmd[@]}" "${again[@]}" >"$W/rerun.out" 2>"$W/rerun.err"
  r=$?
  if ((r != 0)); then
    why_not "the next export exited $r: $(head -c 300 "$W/rerun.err")"
  else
    expect "the next export writes the reference" same "$O" "$W/new"
    [[ -z $(temps) ]] || why_not "temporaries left after the next export: $(temps | head -3 | tr '\n' ' ')"
  fi
  landed+=("$found")
  trial_end "export $format $mode, kill at ${kill// /:} (exit $rc): output $found; seed=$trial_seed"
done
tally "kills left"
crash_finish "$name"
