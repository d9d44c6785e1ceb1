#!/usr/bin/env bash
# End-to-end tests of what takes zinf-train beyond memory: the optimizer
# overlapped with backward (its streamed state checked as read) (the same losses and state as --no-overlap, to
# the last bit, with and without clipping, and each step saying whether it
# was redone), activation checkpoints offloaded to pinned memory or NVMe
# (the same losses, a smaller device peak), two generations of every state
# file at most, the disk a run needs refused up front (73, nothing
# written), and a model whose states are 8x the device budget and 4x the
# pinned pool trained with the resident engine's losses.
source "$(dirname "$0")/lib.bash"
source "$(dirname "$0")/train_lib.bash"
TR=$BIN/zinf-train
SH=$BIN/zinf-shard
POOL=(--pinned 8MiB --pinned-buffer 256KiB)
W=$(mktemp -d /var/tmp/zinf-e2e-beyond-XXXXXX)
on_exit "rm -rf '$W'"
M=gpt:layers=4,hidden=32,heads=2,vocab=256,seq=32
RUN=(--batch 2 --seq 16 --threads 1 "${POOL[@]}")
cat "$ROOT"/man/*.1 >"$W/corpus.txt"
CORPUS=$W/corpus.txt
# generations DIR: the most generations any state file has under DIR.
generations() {
  (cd "$1" && find . -name '*.bin' ! -name 'grad.bin' ! -name 'activations.bin' |
    sed -E 's/\.(alt|work)\.bin$/.bin/' | sort | uniq -c | sort -rn | awk 'NR == 1 { print $1 }')
}

# --- the overlapped optimizer: every state on NVMe, clipped (the default
# --grad-clip 1 clips this model's first steps) and not clipped.
for clip in 1 100; do
  state ov$clip --param nvme --optim nvme
  state no$clip --param nvme --optim nvme
  run "$TR" --manifest "$(mf ov$clip)" --text "$CORPUS" --steps 6 --json --grad-clip $clip "${RUN[@]}"
  expect_rc 0 "overlap, --grad-clip $clip: 6 steps exit 0"
  printf '%s\n' "$out" >"$W/ov$clip.jsonl"
  # zinf-nvmebench --best's bandwidths, given: the floor uses them.
  printf '{"schema":"zinf.engine/1","read_gibps":1,"write_gibps":0.5}\n' >"$W/engine.json"
  # --optimizer-readahead 0: the gradients' scratch in its file (the
  # overlapped run's default budget holds it in memory).
  run "$TR" --manifest "$(mf no$clip)" --text "$CORPUS" --steps 6 --json --grad-clip $clip --no-overlap "${RUN[@]}" \
    --config "$W/engine.json" --optimizer-readahead 0
  expect_rc 0 "--no-overlap, --grad-clip $clip: 6 steps exit 0"
  printf '%s\n' "$out" >"$W/no$clip.jsonl"
  check "--grad-clip $clip: the same losses and gradient norms with and without overlap, to the last digit" \
    test "$(jq -c '[.loss, .grad_norm]' "$W/ov$clip.jsonl")" = "$(jq -c '[.loss, .grad_norm]' "$W/no$clip.jsonl")"
  check "--grad-clip $clip: the same committed state, byte for byte" \
    test "$(state_sums "$W/ov$clip")" = "$(state_sums "$W/no$clip")"
  check "--grad-clip $clip: --no-overlap speculates nothing and redoes nothing" \
    jq -e -s 'all(.[]; .optimizer_redo == false and .optimizer_speculated == 0)' "$W/no$clip.jsonl"
  check "--grad-clip $clip: two generations of each state file at most" test "$(generations "$W/ov$clip")" -le 2
done
check "not clipped: every tensor updated during backward, nothing redone" \
  jq -e -s 'all(.[]; .optimizer_redo == false and .optimizer_speculated > 0 and .optimizer_overlap_s > 0)' "$W/ov100.jsonl"
# A clipped step's update runs on under the next backward (a second
# gradient scratch, in memory under the default budget); an unclipped
# one's is settled before it, so that the next step speculates.
check "the update under the next backward exactly after a clipped step (update_under_backward), not the last's" \
  jq -e -s '(.[:-1] | all(.[]; .update_under_backward == (.grad_norm > 1))) and (.[-1].update_under_backward == false)' "$W/ov1.jsonl"
check "…never unclipped" jq -e -s 'all(.[]; .update_under_backward == false)' "$W/ov100.jsonl"
check "clipped: a step redone exactly when its norm is over the limit (and something was speculated)" \
  jq -e -s 'all(.[]; .optimizer_redo == (.grad_norm > 1 and .optimizer_speculated > 0))' "$W/ov1.jsonl"
check "clipped: a step after a clipped one speculates nothing (it runs after backward)" \
  jq -e -s '[range(1; length) as $i | select(.[$i - 1].grad_norm > 1) | .[$i].optimizer_speculated == 0] | all' "$W/ov1.jsonl"
run "$SH" verify -m "$(mf ov1)"
expect_rc 0 "the overlapped run's manifest verifies"

# --- the disk floor: each step's bytes to and from the disk are its counted
# I/O (parameters fetched, the optimizer's state, checkpoints; the gradient
# scratch apart), and the floor is their time at the bandwidth in force.
floor_ok='all(.[]; .disk_read_bytes > 0 and .disk_written_bytes > 0
    and .disk_read_bytes == .fetched_nvme_bytes + .optimizer_read_bytes - .grad_scratch_read_bytes + .activation_read_bytes
    and .disk_written_bytes == .optimizer_written_bytes - .grad_scratch_written_bytes + .activation_written_bytes
    and (.disk_floor_s - (.disk_read_bytes / .disk_read_gbps + .disk_written_bytes / .disk_write_gbps) / 1e9 | fabs) < 1e-9 * .disk_floor_s
    and (.disk_floor_ratio - .step_s / .disk_floor_s | fabs) < 1e-9 * .disk_floor_ratio)'
for f in ov1 ov100 no1; do
  check "$f: disk bytes are the step's counted I/O; floor = bytes / bandwidth; ratio = step / floor" \
    jq -e -s "$floor_ok" "$W/$f.jsonl"
done
# The larger of the two floors (issue 45): compute_floor_s = forward +
# backward - stall - the wait for the step before's update; the ratio of
# the step to the larger floor; each update but the last (which the run
# settles at once) partly under the next step, none without overlap.
floors_ok='all(.[]; .compute_floor_s >= 0
    and (.compute_floor_s - ([0, .forward_s + .backward_s - .stall_seconds - .update_waited_s] | max) | fabs) < 1e-9
    and (([.compute_floor_s, .disk_floor_s] | max) as $f
         | if $f > 0 then (.step_floor_ratio - .step_s / $f | fabs) < 1e-9 * .step_floor_ratio
           else .step_floor_ratio == 0 end))'
for f in ov1 ov100 no1; do
  check "$f: compute floor = forward + backward - stall - waits; ratio = step / the larger floor" \
    jq -e -s "$floors_ok" "$W/$f.jsonl"
done
# (A clipped step's update starts after its backward and runs on under the
# next step; an unclipped one's runs during its own backward, so whether any
# of it is left for the next step is the machine's timing: ov100 is not held
# to it. Nor is each clipped step: the next forward trails the update module
# by module, so what is left beside it is that forward's compute, which a
# loaded machine can take to 0 -- the fresh root's make test found both.)
check "ov1: the updates ran under the next step (update_overlap_s > 0 for one step at least, never < 0)" \
  jq -e -s '(.[:-1] | any(.[]; .update_overlap_s > 0)) and all(.[]; .update_overlap_s >= 0)' "$W/ov1.jsonl"
check "--no-overlap: no update under the next step, no wait for one" \
  jq -e -s 'all(.[]; .update_overlap_s == 0 and .update_waited_s == 0)' "$W/no1.jsonl"
# The gradients' scratch: in memory under the default budget (no file
# read or written), in rank0/grad.bin with --optimizer-readahead 0; the
# same bytes handed over either way, and the same bits (above).
for f in ov1 ov100; do
  check "$f: the default budget holds the gradients' scratch in memory (no scratch file I/O)" \
    jq -e -s 'all(.[]; .grad_scratch_memory_bytes > 0 and .grad_scratch_written_bytes == 0
      and .grad_scratch_read_bytes == 0)' "$W/$f.jsonl"
done
check "--optimizer-readahead 0: the scratch is a file, written and read back every step" \
  jq -e -s 'all(.[]; .grad_scratch_memory_bytes == 0 and .grad_scratch_written_bytes > 0
    and .grad_scratch_read_bytes == .grad_scratch_written_bytes)' "$W/no1.jsonl"
check "…the bytes the memory held" \
  test "$(jq -c .grad_scratch_memory_bytes "$W/ov1.jsonl")" = "$(jq -c .grad_scratch_written_bytes "$W/no1.jsonl")"
check "--config with zinf-nvmebench --best's bandwidths: the floor is held against them" \
  jq -e -s 'all(.[]; (.disk_read_gbps - 1.073741824 | fabs) < 1e-9 and (.disk_write_gbps - 0.536870912 | fabs) < 1e-9)' "$W/no1.jsonl"
check "no bandwidth given: a probe at start-up measured one" \
  jq -e -s 'all(.[]; .disk_read_gbps > 0 and .disk_write_gbps > 0 and .disk_floor_ratio > 0)' "$W/ov1.jsonl"
before=$(sums "$W/ov1")
ZINF_FAULTS=read:2:EIO run "$TR" --manifest "$(mf ov1)" --text "$CORPUS" --steps 7 --resume --json "${RUN[@]}"
expect_rc 74 "an I/O error in the start-up disk probe fails the run (74)"
check "…naming the probe's file, before any step, the state as it was and no probe file left" \
  bash -c '[[ $1 == *rank0/disk-probe.scratch* && -z $2 && $3 == "$4" && ! -e $5 ]]' _ "$err" "$out" "$before" \
  "$(sums "$W/ov1")" "$W/ov1/rank0/disk-probe.scratch"
run "$TR" --manifest "$(mf ov1)" --text "$CORPUS" --steps 7 --resume --json --disk-probe 0 "${RUN[@]}"
check "--disk-probe 0: no bandwidth, no floor" jq -e 'has("disk_floor_s") | not' <<<"$out"

# --- streamed optimizer state is checked as it is read: a damaged moment
# or master weight is refused (65) before anything derived from it is
# committed, and never re-certified.
for f in exp_avg_sq master; do
  state bad$f --param nvme --optim nvme
  printf '\x7f\xc0\x00\x00' | dd of="$W/bad$f/rank0/$f.bin" bs=1 seek=8 conv=notrunc status=none
  before=$(sums "$W/bad$f")
  run "$TR" --manifest "$(mf bad$f)" --text "$CORPUS" --steps 3 --json "${RUN[@]}"
  expect_rc 65 "4 bytes of rank0/$f.bin changed: training refuses (65)"
  check "…naming the file, the offset, the tensor and the rank" has_all "$err" "rank0/$f.bin" "offset 0" "wte.weight rank 0 $f" "xxh3"
  check "…no step line, the manifest and the files it names as they were" \
    test -z "$out" -a "$before" = "$(sums "$W/bad$f" | grep -v '\.alt\.bin$')"
  run "$SH" verify -m "$(mf bad$f)"
  expect_rc 65 "…and verify still finds the damage"
done

# --- memory-held state with checkpoints: the streamed files still keep two
# generations (updated in place between commits), and the losses agree.
state mix --param cpu --optim nvme
state mixref --param cpu --optim cpu
run "$TR" --manifest "$(mf mix)" --text "$CORPUS" --steps 7 --checkpoint-every 3 --json "${RUN[@]}"
expect_rc 0 "parameters in memory, optimizer on NVMe, a checkpoint every 3 steps: exit 0"
printf '%s\n' "$out" >"$W/mix.jsonl"
run "$TR" --manifest "$(mf mixref)" --text "$CORPUS" --steps 7 --json "${RUN[@]}"
printf '%s\n' "$out" >"$W/mixref.jsonl"
check "…the same losses as every state in memory" test "$(losses "$W/mix.jsonl")" = "$(losses "$W/mixref.jsonl")"
check "every state in memory: no disk bytes, no floor" \
  jq -e -s 'all(.[]; .disk_read_bytes == 0 and .disk_written_bytes == 0 and (has("disk_floor_s") | not))' "$W/mixref.jsonl"
check "…two generations of each state file at most" test "$(generations "$W/mix")" -le 2
run "$SH" verify -m "$(mf mix)"
expect_rc 0 "…and the manifest verifies"

# --- activation checkpoints offloaded
for where in none cpu nvme; do
  state act$where --param nvme --optim nvme
  run "$TR" --manifest "$(mf act$where)" --text "$CORPUS" --steps 3 --json --offload-activations $where "${RUN[@]}"
  expect_rc 0 "--offload-activations $where: exit 0"
  printf '%s\n' "$out" >"$W/act$where.jsonl"
done
for where in cpu nvme; do
  check "--offload-activations $where: the same losses as none, to the last digit" \
    test "$(losses "$W/act$where.jsonl")" = "$(losses "$W/actnone.jsonl")"
  check "--offload-activations $where: a smaller device peak than none" \
    test "$(jq -s '.[-1].device_peak_bytes' "$W/act$where.jsonl")" -lt "$(jq -s '.[-1].device_peak_bytes' "$W/actnone.jsonl")"
done
check "--offload-activations nvme: the checkpoints' bytes are in the disk floor" \
  jq -e -s "$floor_ok and all(.[]; .activation_read_bytes > 0 and .activation_written_bytes > 0)" "$W/actnvme.jsonl"
check "--offload-activations cpu: no checkpoint bytes on the disk" \
  jq -e -s 'all(.[]; .activation_read_bytes == 0 and .activation_written_bytes == 0)' "$W/actcpu.jsonl"
check "--offload-activations nvme: its scratch file is gone after the run" test ! -e "$W/actnvme/rank0/activations.bin"
run "$TR" --manifest "$(mf actnone)" --text "$CORPUS" --steps 4 --resume --offload-activations cpu --no-checkpoint "${RUN[@]}"
expect_rc 64 "--offload-activations with --no-checkpoint is refused (64)"
run "$TR" --manifest "$(mf actnone)" --text "$CORPUS" --steps 4 --resume --offload-activations disk "${RUN[@]}"
expect_rc 64 "--offload-activations disk is refused (64)"

# --- the disk a run needs, known before step 1: a file system that holds
# one generation of the state but not two is refused with the figures.
if mkdir -p "$W/small" && mount_tmpfs "$W/small" size=9M; then
  "$SH" layout --model gpt:layers=2,hidden=128,heads=2,vocab=256,seq=32 --param nvme --optim nvme |
    "$SH" init --dir "$W/small/s" "${POOL[@]}" >/dev/null 2>&1
  before=$(sums "$W/small/s")
  run "$TR" --manifest "$W/small/s/manifest.jsonl" --text "$CORPUS" --steps 2 "${RUN[@]}"
  expect_rc 73 "a disk that holds one generation of the state but not two: refused (73)"
  check "…naming what is needed, what is free and how short it is" \
    has_all "$err" "the run needs" "two generations" "gradient scratch" "free" "short"
  check "…before anything is written" test "$before" = "$(sums "$W/small/s")"
  check "…and no scratch file left" test ! -e "$W/small/s/rank0/grad.bin"
  as_root umount "$W/small"
else
  skip "the disk a run needs" "cannot mount a small tmpfs here (neither root nor password-less sudo)"
fi

# --- states 8x the device budget and 4x the pinned pool, trained with the
# resident engine's losses (everything on NVMe, checkpoints on NVMe).
BIG=(--model gpt:layers=4,hidden=192,heads=4,vocab=256,seq=32 --tile 2)
state big "${BIG[@]}" --param nvme --optim nvme
state bigref "${BIG[@]}" --param cpu --optim cpu
sb=$(du -sb "$W/big" | cut -f1)
run "$TR" --manifest "$(mf big)" --text "$CORPUS" --steps 4 --json --device-memory 2MiB --pinned 2MiB \
  --pinned-buffer 128KiB --offload-activations nvme --batch 2 --seq 16 --threads 1
expect_rc 0 "states of $((sb / 1024)) KiB through a 2 MiB device budget and a 2 MiB pinned pool: 4 steps exit 0"
printf '%s\n' "$out" >"$W/big.jsonl"
check "…the states are more than 8x the device budget and 4x the pool" test "$sb" -gt $((8 * 2 * 1024 * 1024))
check "…and the device peak stays under the budget" jq -e -s 'all(.[]; .device_peak_bytes <= 2097152)' "$W/big.jsonl"
run "$TR" --manifest "$(mf bigref)" --text "$CORPUS" --steps 4 --json --resident "${RUN[@]}"
expect_rc 0 "the same model with the resident engine: exit 0"
printf '%s\n' "$out" >"$W/bigref.jsonl"
check "…the same losses as the resident engine, to the last digit" test "$(losses "$W/big.jsonl")" = "$(losses "$W/bigref.jsonl")"

# --- scripts/train-beyond-ram.sh: its placement option is checked before any work
run "$ROOT/scripts/train-beyond-ram.sh" --param gpu --dir "$W"
expect_rc 64 "train-beyond-ram.sh --param gpu is a usage error"
check "…naming the option and its values" contains "$err" "bad --param 'gpu' (nvme or cpu)"

finish
