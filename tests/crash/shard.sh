#!/usr/bin/env bash
# Crash trials of zinf-shard init (--op init), reshard (--op reshard,
# dp 3 to dp 2) and import (--op import, llm.c weights; --op hfimport, a
# Llama's Hugging Face folder of safetensors shards and its index): each trial SIGKILLs the subcommand on a tiny model at a
# seeded moment, into a fresh folder or with --force over a committed state
# of another seed, after a seeded delay or on entering a seeded fsync,
# fdatasync, rename or fallocate (inside the commit). Then: manifest.jsonl
# is absent (fresh) or byte-identical to the old one or to the one an
# uninterrupted run commits, never anything else; zinf-shard verify passes
# on it; a re-run ends 0, commits the new state (verified) and leaves no
# temporaries; reshard's source is untouched.
#
#   tests/crash/shard.sh [--op init|reshard|import|hfimport] [--seed S] [--trials N] [--keep]
#
# --op: the subcommand (default init); --seed S: trial i has seed S+i
# (default: drawn, printed); --trials N (default 10); --keep: keep the work
# folder. ZINF_CRASH_DIR: where the folder goes (default /var/tmp, a disk
# that takes O_DIRECT).
source "$(dirname "$0")/../e2e/lib.bash"
source "$(dirname "$0")/../e2e/train_lib.bash"
source "$(dirname "$0")/lib.bash"
crash_options "$@"
op=init
set -- "${args[@]}"
while (($#)); do
  case $1 in
  --op) op=${2:-}; shift 2 ;;
  *) echo "${0##*/}: unknown option $1 (see --help)" >&2; exit 64 ;;
  esac
done
[[ $op == init || $op == reshard || $op == import || $op == hfimport ]] ||
  { echo "${0##*/}: --op is init, reshard, import or hfimport" >&2; exit 64; }
name=shard-$op
crash_dir "$op"
M=gpt:layers=1,hidden=32,heads=2,vocab=256,seq=32
dt=()
[[ $op == hfimport ]] && M=llama:layers=1,hidden=32,heads=2,kv_heads=1,ffn=48,vocab=64,seq=32 dt=(--param-dtype fp32)
echo "# zinf-shard $op crash trials: seed $seed, $trials trials, model $M"
have_strace_ok=0
have_strace && have_strace_ok=1 || echo "# no strace with syscall injection: delays only"

# The references, all made at $W/t, the trial folder, so that their bytes
# (which name the folder) are what a trial must find there. The old state
# is an init of another seed; the new one an init of the layout (init) or
# a reshard of the source, a dp 3 state of it (reshard).
T=$W/t
dp=1
[[ $op == reshard ]] && dp=2
"$SH" layout --model "$M" "${dt[@]}" --seed 1 --dp $dp >"$W/new.layout"
"$SH" layout --model "$M" "${dt[@]}" --seed 2 --dp $dp >"$W/old.layout"
if [[ $op == reshard ]]; then
  "$SH" layout --model "$M" --seed 1 --dp 3 | "$SH" init "${POOL[@]}" --dir "$W/src" >/dev/null 2>&1
  sums "$W/src" >"$W/src.sums"
fi
if [[ $op == import ]]; then # the weights: an init of the new layout elsewhere, exported
  "$SH" init "${POOL[@]}" --dir "$W/wsrc" <"$W/new.layout" >/dev/null 2>&1
  "$SH" export "${POOL[@]}" -m "$W/wsrc/manifest.jsonl" --to "$W/weights.bin" --format llmc >/dev/null 2>&1
fi
if [[ $op == hfimport ]]; then # 7 shards and their index
  "$SH" init "${POOL[@]}" --dir "$W/wsrc" <"$W/new.layout" >/dev/null 2>&1
  "$SH" export "${POOL[@]}" -m "$W/wsrc/manifest.jsonl" --to "$W/weights.hf" --shard-size 8KiB >/dev/null 2>&1
fi
# The subcommand under trial, into $T (stdin: $W/new.layout), in $write;
# write [--force] runs it. (Each takes the directory's lock: a re-run after
# a kill shows that a killed holder's lock never blocks the next.)
if [[ $op == init ]]; then
  cmd=("$SH" init "${POOL[@]}" --dir "$T")
elif [[ $op == import ]]; then
  cmd=("$SH" import "${POOL[@]}" --from "$W/weights.bin" --dir "$T")
elif [[ $op == hfimport ]]; then
  cmd=("$SH" import "${POOL[@]}" --from "$W/weights.hf" --dir "$T")
else
  cmd=("$SH" reshard "${POOL[@]}" -m "$W/src/manifest.jsonl" --dp 2 --dir "$T")
fi
write() { "${cmd[@]}" "$@"; }
init() { "$SH" init "${POOL[@]}" --dir "$T" "$@"; }
init <"$W/old.layout" >/dev/null 2>&1 && cp "$T/manifest.jsonl" "$W/old.manifest" && cp -a "$T" "$W/old"
rm -rf "$T"
timed fresh write <"$W/new.layout" >/dev/null 2>&1 && cp "$T/manifest.jsonl" "$W/new.manifest"
rm -rf "$T" && cp -a "$W/old" "$T"
timed force write --force <"$W/new.layout" >/dev/null 2>&1 && cp "$T/manifest.jsonl" "$W/forced.manifest"
[[ -s $W/old.manifest && -s $W/new.manifest && -s $W/forced.manifest ]] || {
  fail "the reference runs of $op" "zinf-shard failed"
  crash_finish "$name"
  exit 1
}
# The syscalls each kind of run makes, for the kills inside the commit.
if ((have_strace_ok)); then
  rm -rf "$T"
  syscall_counts "$W/fresh.calls" "${cmd[@]}" <"$W/new.layout"
  rm -rf "$T" && cp -a "$W/old" "$T"
  syscall_counts "$W/force.calls" "${cmd[@]}" --force <"$W/new.layout"
fi
echo "# $op took ${fresh_ms} ms fresh, ${force_ms} ms with --force; syscalls: $(tr '\n' ' ' <"$W/force.calls" 2>/dev/null)"

landed=()
for ((i = 0; i < trials; i++)); do
  trial_begin "$i"
  rm -rf "$T"
  below 2
  if ((REPLY == 0)); then
    mode=fresh force=() refs=("$W/new.manifest") total=$fresh_ms calls=$W/fresh.calls
  else
    mode=force force=(--force) refs=("$W/old.manifest" "$W/forced.manifest") total=$force_ms calls=$W/force.calls
    cp -a "$W/old" "$T"
  fi
  draw_kill "$total" "$calls"
  kill_stdin=$W/new.layout kill_out=$W/killed
  killed "${cmd[@]}" "${force[@]}" # (not the function: its subshell would take the kill)
  [[ $rc == 137 || $rc == 0 ]] || why_not "the killed $op exited $rc, not 137 (or 0): $(head -c 300 "$W/killed.err")"
  # What the kill left: no manifest, the old one, or the new one.
  if [[ ! -e $T/manifest.jsonl ]]; then
    found=absent
    [[ $mode == fresh ]] || why_not "--force killed: the old manifest is gone"
  elif which=$(one_of "$T/manifest.jsonl" "${refs[@]}"); then
    found=$([[ ${refs[which - 1]} == "$W/old.manifest" ]] && echo old || echo new)
    expect "zinf-shard verify passes on the $found manifest the kill left" verifies "$T/manifest.jsonl"
  else
    found=other
    why_not "manifest.jsonl is neither absent nor a committed one ($(wc -c <"$T/manifest.jsonl") bytes)"
  fi
  [[ $rc == 0 && $found != new ]] && why_not "the $op ended 0 but its manifest is $found"
  # A re-run: --force whenever a manifest is there.
  again=()
  [[ -e $T/manifest.jsonl ]] && again=(--force)
  write "${again[@]}" <"$W/new.layout" >"$W/rerun.out" 2>"$W/rerun.err"
  r=$?
  if ((r != 0)); then
    why_not "the re-run exited $r: $(head -c 300 "$W/rerun.err")"
  else
    expect "the re-run prints the manifest it commits" same_bytes "$W/rerun.out" "$T/manifest.jsonl"
    expect "the re-run's state verifies" verifies "$T/manifest.jsonl"
    # The same state as the reference (file names may take the other generation).
    expect "the re-run commits the new state (every partition's xxh3 as the reference's)" \
      cmp -s <(sed 's/\.alt\.bin"/.bin"/g' "$T/manifest.jsonl") <(sed 's/\.alt\.bin"/.bin"/g' "$W/new.manifest")
    [[ -z $(leftovers "$T") ]] || why_not "temporaries left after the re-run: $(leftovers "$T" | head -3 | tr '\n' ' ')"
  fi
  [[ $op != reshard ]] || [[ $(sums "$W/src") == "$(<"$W/src.sums")" ]] || why_not "reshard's source changed"
  landed+=("$found")
  trial_end "$op $mode, kill at ${kill// /:} (exit $rc): manifest $found; seed=$trial_seed"
done
tally "kills left"
crash_finish "$name"
