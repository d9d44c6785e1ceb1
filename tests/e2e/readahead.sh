#!/usr/bin/env bash
# End-to-end tests of the optimizer's read-ahead (zinf-train
# --optimizer-readahead, issue 28): a step after a clipped one reads the
# master weights and moments during backward and updates from memory once
# the norm is known. Every state on NVMe, the default --grad-clip 1 (which
# clips this model's first steps): the same losses, gradient norms and
# committed state files as --no-overlap, to the last bit, at dp 1 and under
# mpirun at dp 2, whatever the budget; the budget kept (peak resident memory
# within it of the run without read-ahead); and an I/O error in a read-ahead
# read failing the step with 74, naming the file, the committed state left
# for --resume to continue with the uninterrupted run's losses.
source "$(dirname "$0")/lib.bash"
source "$(dirname "$0")/train_lib.bash"
TR=$BIN/zinf-train
SH=$BIN/zinf-shard
POOL=(--pinned 8MiB --pinned-buffer 256KiB)
W=$(mktemp -d /var/tmp/zinf-e2e-readahead-XXXXXX)
on_exit "rm -rf '$W'"
M=gpt:layers=2,hidden=32,heads=2,vocab=256,seq=32
RUN0=(--batch 2 --seq 16 --threads 1 --schedule constant --disk-probe 0 --json)
RUN=("${RUN0[@]}" "${POOL[@]}")
cat "$ROOT"/man/*.1 >"$W/corpus.txt"
CORPUS=$W/corpus.txt
# committed DIR: the manifest and the state files it names, their sha256.
committed() { (cd "$1" && sha256sum manifest.jsonl $(jq -r 'select(.file) | .file' manifest.jsonl | sort -u)); }
same_run() { # A.jsonl B.jsonl: the same losses and gradient norms, as printed
  test "$(jq -c '[.step, .loss, .grad_norm]' "$1")" = "$(jq -c '[.step, .loss, .grad_norm]' "$2")"
}

# --- dp 1: a budget of part of the state (one chunk of 64 KiB pieces of
# each state: the update reads the rest), the default (all of it), the
# same part with the disk's bandwidths given (they set the disk floor only:
# the update keeps the default depths, 1 chunk read ahead and 1 written
# behind, not the deeper split the bandwidths would give, which was
# measured no faster; BENCHMARKS.md, issue 28), and --no-overlap.
jq -n -c '{engine: "auto", block_size: 16384, queue_depth: 32, queues: 2, read_gibps: 4, write_gibps: 1}' >"$W/deep.json"
for ra in 200KiB auto deep none; do
  state s$ra --param nvme --optim nvme
  opt=(--optimizer-readahead "$ra" "${POOL[@]}")
  [[ $ra == 200KiB ]] && opt=(--optimizer-readahead "$ra" --pinned 8MiB --pinned-buffer 64KiB)
  [[ $ra == deep ]] && opt=(--optimizer-readahead 200KiB --config "$W/deep.json" --pinned 8MiB --pinned-buffer 64KiB)
  [[ $ra == none ]] && opt=(--no-overlap "${POOL[@]}")
  run "$TR" --manifest "$(mf s$ra)" --text "$CORPUS" --steps 5 "${opt[@]}" "${RUN0[@]}"
  expect_rc 0 "${opt[*]}: 5 steps exit 0"
  printf '%s\n' "$out" >"$W/s$ra.jsonl"
  printf '%s\n' "$err" >"$W/s$ra.err"
done
check "the model is clipped at its first steps (so steps 2 on read ahead)" \
  jq -e -s '[.[0:4][] | .grad_norm > 1] | all' "$W/snone.jsonl"
check "deep: with the bandwidths given, the update still reads 1 chunk ahead and writes 1 behind" \
  bash -c '[[ $(<"$1") == *"reads 1 chunk(s) ahead and writes 1 behind"* ]]' _ "$W/sdeep.err"
check "deep: the bandwidths given are the floor's" jq -e -s 'all(.[]; .disk_read_gbps > 4 and .disk_floor_s > 0)' "$W/sdeep.jsonl"
for ra in 200KiB auto deep; do
  check "--optimizer-readahead $ra: the losses and norms of --no-overlap, to the last digit" same_run "$W/s$ra.jsonl" "$W/snone.jsonl"
  check "--optimizer-readahead $ra: the committed state of --no-overlap, byte for byte" \
    test "$(state_sums "$W/s$ra")" = "$(state_sums "$W/snone")"
done
check "--no-overlap reads nothing ahead" jq -e -s 'all(.[]; .optimizer_readahead_bytes == 0)' "$W/snone.jsonl"
check "the default reads ahead after a clipped step, and the update takes it (a skipped step would not)" \
  jq -e -s '[.[1:][] | .optimizer_readahead_used_bytes > 0] | any' "$W/sauto.jsonl"
check "…never more than it read, counted in the optimizer's reads" \
  jq -e -s 'all(.[]; .optimizer_readahead_used_bytes <= .optimizer_readahead_bytes
    and .optimizer_readahead_bytes <= .optimizer_read_bytes)' "$W/sauto.jsonl"
check "the default takes the whole state the update reads, and says so" \
  bash -c '[[ $(<"$1") == *"optimizer: a step after a clipped one reads"*"from free memory"* ]]' _ "$W/sauto.err"
check "a budget of 200 KiB reads at most that much a step, and less than the default" \
  jq -e -n --slurpfile a "$W/s200KiB.jsonl" --slurpfile b "$W/sauto.jsonl" \
  '($a | all(.[]; .optimizer_readahead_bytes <= 204800)) and ($a | map(.optimizer_readahead_bytes) | max) > 0
    and ($a | map(.optimizer_readahead_bytes) | max) < ($b | map(.optimizer_readahead_bytes) | max)'

# --- the budget kept: a state of about 20 MB, 2 steps each; peak resident
# memory with a 1 MiB budget within 1 MiB (and 4 MiB of noise) of the run
# without read-ahead; the default takes the state, which the peak shows.
BIGM=gpt:layers=2,hidden=256,heads=4,vocab=256,seq=32
for ra in 0 1MiB auto; do
  state b$ra --model $BIGM --param nvme --optim nvme
  run "$TR" --manifest "$(mf b$ra)" --text "$CORPUS" --steps 2 --optimizer-readahead $ra "${RUN[@]}"
  expect_rc 0 "a 20 MB state, --optimizer-readahead $ra: exit 0"
  printf '%s\n' "$out" >"$W/b$ra.jsonl"
done
rss() { jq -s 'map(.peak_rss_bytes) | max' "$1"; }
check "a 1 MiB budget: peak resident memory under the budget plus the run's base (+4 MiB)" \
  test "$(rss "$W/b1MiB.jsonl")" -le $(($(rss "$W/b0.jsonl") + 5 * 1048576))
check "the default budget (the whole state) shows in the peak: more than 12 MB over the base" \
  test "$(rss "$W/bauto.jsonl")" -gt $(($(rss "$W/b0.jsonl") + 12000000))
check "…and all three give the same losses" \
  bash -c 'same() { test "$(jq -c .loss "$1")" = "$(jq -c .loss "$2")"; }; same "$1" "$2" && same "$1" "$3"' _ \
  "$W/b0.jsonl" "$W/b1MiB.jsonl" "$W/bauto.jsonl"

# --- an I/O error in a read-ahead read. From a state at step 1 (files
# *.alt.bin), step 2 reads them, is clipped and writes *.bin; step 3 reads
# *.bin ahead during its backward: the first read of rank0/exp_avg.bin in
# the run is the read-ahead's, and it fails.
state fa --param nvme --optim nvme
state fref --param nvme --optim nvme
run "$TR" --manifest "$(mf fref)" --text "$CORPUS" --steps 4 "${RUN[@]}"
printf '%s\n' "$out" >"$W/fref.jsonl"
run "$TR" --manifest "$(mf fa)" --text "$CORPUS" --steps 1 "${RUN[@]}"
expect_rc 0 "the faulted state's first step: exit 0"
ZINF_FAULT_SITE="read:EIO:$W/fa/rank0/exp_avg.bin" run "$TR" --manifest "$(mf fa)" --text "$CORPUS" --steps 4 --resume "${RUN[@]}"
expect_rc 74 "an EIO in the read-ahead of step 3 fails the run (74)"
printf '%s\n' "$out" >"$W/fa1.jsonl"
check "…naming the file" contains "$err" "rank0/exp_avg.bin"
check "…after step 2 (clipped, so step 3 read ahead) and its line only" \
  jq -e -s '[.[].step] == [2] and .[0].grad_norm > 1' "$W/fa1.jsonl"
check "…the manifest committed at step 2" test "$(manifest_step "$(mf fa)")" = 2
before=$(committed "$W/fa")
run "$SH" verify -m "$(mf fa)"
expect_rc 0 "…which verifies"
check "…verify changed nothing" test "$before" = "$(committed "$W/fa")"
run "$TR" --manifest "$(mf fa)" --text "$CORPUS" --steps 4 --resume "${RUN[@]}"
expect_rc 0 "--resume after the failed step: exit 0"
printf '%s\n' "$out" >"$W/fa2.jsonl"
check "…steps 3 and 4 with the uninterrupted run's losses and norms, to the last digit" \
  test "$(jq -c '[.step, .loss, .grad_norm]' "$W/fa1.jsonl" "$W/fa2.jsonl")" = \
  "$(jq -c '[.step, .loss, .grad_norm]' "$W/fref.jsonl" | sed -n '2,4p')"
check "…and its committed state, byte for byte" test "$(state_sums "$W/fa")" = "$(state_sums "$W/fref")"

# --- dp 2 under mpirun: the default read-ahead against --no-overlap.
if command -v mpirun >/dev/null; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  for v in ra no; do
    state dp$v --dp 2 --param nvme --optim nvme
    opt=()
    [[ $v == no ]] && opt=(--no-overlap)
    run timeout -k 5 120 mpirun -np 2 "$TR" --manifest "$(mf dp$v)" --text "$CORPUS" --steps 4 "${opt[@]}" "${RUN[@]}"
    expect_rc 0 "mpirun -np 2${opt:+ ${opt[*]}}: 4 steps exit 0"
    printf '%s\n' "$out" >"$W/dp$v.jsonl"
  done
  check "dp 2: the losses and norms of --no-overlap, to the last digit" same_run "$W/dpra.jsonl" "$W/dpno.jsonl"
  check "dp 2: the committed state of --no-overlap, byte for byte (both ranks)" \
    test "$(state_sums "$W/dpra")" = "$(state_sums "$W/dpno")"
  check "dp 2: rank 0 read ahead after a clipped step" \
    jq -e -s '[.[1:][] | .optimizer_readahead_used_bytes > 0] | any' "$W/dpra.jsonl"
else
  skip "read-ahead at dp 2 under mpirun" "no mpirun"
fi

finish
