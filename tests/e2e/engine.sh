#!/usr/bin/env bash
# End-to-end tests of zinf-train's ZeRO-Infinity engine: the step records'
# engine fields (bytes fetched by tier, stall, device peak, peak RSS), the
# same losses as --resident, the device budget (the need it names runs, a
# byte less is refused before step 1 with the module and a --tile, the
# manifest untouched), faults (a read error in a parameter fetch, a write
# error in a gradient offload: exit 74 naming the file, nothing committed
# past the last good step, --resume then gives the uninterrupted losses),
# and peak resident memory that does not grow with the model.
source "$(dirname "$0")/lib.bash"
source "$(dirname "$0")/train_lib.bash"
TR=$BIN/zinf-train
SH=$BIN/zinf-shard
POOL=(--pinned 8MiB --pinned-buffer 256KiB)
W=$(mktemp -d /var/tmp/zinf-e2e-engine-XXXXXX)
on_exit "rm -rf '$W'"
M=gpt:layers=2,hidden=32,heads=2,vocab=256,seq=32
RUN=(--batch 2 --seq 16 --threads 1 "${POOL[@]}")
cat "$ROOT"/man/*.1 >"$W/corpus.txt"
CORPUS=$W/corpus.txt

# --- the step records: bytes from the parameters' tier only
for tier in gpu cpu nvme; do
  state f$tier --param "$tier" --optim cpu
  run "$TR" --manifest "$(mf f$tier)" --text "$CORPUS" --steps 3 --json "${RUN[@]}"
  expect_rc 0 "parameters on $tier: 3 steps exit 0"
  printf '%s\n' "$out" >"$W/f$tier.jsonl"
  check "parameters on $tier: bytes fetched from $tier only, the same on steps 2 and 3" \
    jq -e -s --arg t "$tier" 'all(.[]; .["fetched_\($t)_bytes"] > 0
      and ([.fetched_gpu_bytes, .fetched_cpu_bytes, .fetched_nvme_bytes] | map(select(. > 0)) | length) == 1)
      and .[1]["fetched_\($t)_bytes"] == .[2]["fetched_\($t)_bytes"]' "$W/f$tier.jsonl"
  check "parameters on $tier: stall_seconds >= 0, device_peak_bytes and peak_rss_bytes > 0" \
    jq -e -s 'all(.[]; .stall_seconds >= 0 and .device_peak_bytes > 0 and .peak_rss_bytes > 0
      and (has("trace_diverged") | not))' "$W/f$tier.jsonl"
done
state res --param nvme --optim cpu
run "$TR" --manifest "$(mf res)" --text "$CORPUS" --steps 3 --json --resident "${RUN[@]}"
expect_rc 0 "--resident: 3 steps exit 0"
printf '%s\n' "$out" >"$W/res.jsonl"
check "--resident: the same losses as the engine, to the last digit" test "$(losses "$W/res.jsonl")" = "$(losses "$W/fnvme.jsonl")"
check "--resident: nothing fetched during a step" \
  jq -e -s 'all(.[]; .fetched_gpu_bytes + .fetched_cpu_bytes + .fetched_nvme_bytes == 0 and .stall_seconds == 0)' "$W/res.jsonl"
check "the engine's info line names the tiers and the device budget the run needs" \
  has_all "$(cat "$W/fnvme.jsonl" >/dev/null; "$TR" --manifest "$(mf fgpu)" --text "$CORPUS" --steps 4 --resume "${RUN[@]}" 2>&1 >/dev/null)" \
  "ZeRO-Infinity" "parameters on gpu" "the run needs a device budget of"
run "$TR" --manifest "$(mf fcpu)" --text "$CORPUS" --steps 4 --resume "${RUN[@]}"
check "human lines: 'fetched', 'stall', 'device' and 'rss' on each step line" has_all "$out" " fetched " " stall " " device " " rss "

# --- the device budget: the need the refusal names runs; a byte less is
# refused. A model whose linear layers outweigh its embedding, so that
# tiling shrinks the largest fetch.
BM=(--model gpt:layers=1,hidden=128,heads=2,vocab=256,seq=32)
state budget "${BM[@]}"
sums "$W/budget" >"$W/budget.sums"
run "$TR" --manifest "$(mf budget)" --text "$CORPUS" --steps 2 --device-memory 64KiB "${RUN[@]}"
expect_rc 64 "a device budget of 64KiB is refused (64)"
check "…before any step: nothing on stdout" test -z "$out"
check "…saying what the activations need and --device-memory" has_all "$err" "activations" "--device-memory"
need=$(grep -o 'at least [0-9]* bytes' <<<"$err" | grep -o '[0-9]*' | head -n 1)
check "…and the budget the run needs, in bytes ($need)" test -n "$need"
if [[ -n $need ]]; then
  run "$TR" --manifest "$(mf budget)" --text "$CORPUS" --steps 2 --device-memory "$((need - 1))" "${RUN[@]}"
  expect_rc 64 "a budget of $((need - 1)) bytes, one under the need, is refused"
  check "…naming the largest module, the budget needed and a --tile that fits" \
    has_all "$err" "h.0.mlp.c_fc needs" "at least $need bytes" "--tile 2"
  check "the refused runs leave the state byte-identical" test "$(sums "$W/budget")" = "$(<"$W/budget.sums")"
  run "$TR" --manifest "$(mf budget)" --text "$CORPUS" --steps 2 --device-memory "$need" --json "${RUN[@]}"
  expect_rc 0 "a budget of exactly $need bytes trains"
  check "…within it: device_peak_bytes <= $need" jq -e -s --argjson n "$need" 'length == 2 and all(.[]; .device_peak_bytes <= $n)' <<<"$out"
fi
state tiled "${BM[@]}" --tile 4
run "$TR" --manifest "$(mf tiled)" --text "$CORPUS" --steps 2 --device-memory 64KiB "${RUN[@]}"
tneed=$(grep -o 'at least [0-9]* bytes' <<<"$err" | grep -o '[0-9]*' | head -n 1)
check "a --tile 4 layout needs less device memory ($tneed) than the untiled one ($need)" test "${tneed:-0}" -lt "${need:-0}"

# --- faults: an injected read error in a parameter fetch (74, naming the
# file), nothing committed past the last good step, --resume continues with
# the losses of the run never stopped. Optimizer state in memory, so the
# parameter file is the only one read during a step.
R=(--text "$CORPUS" --schedule constant --lr 3e-3 --json "${RUN[@]}")
state whole --param nvme --optim cpu
"$TR" --manifest "$(mf whole)" --steps 6 "${R[@]}" 2>/dev/null >"$W/whole.jsonl"
state rfault --param nvme --optim cpu
"$TR" --manifest "$(mf rfault)" --steps 3 "${R[@]}" 2>/dev/null >/dev/null
before=$(<"$(mf rfault)")
# (ZINF_FAULTS applies to every file: no start-up disk probe to take the fault.)
out=$(ZINF_FAULTS=read:5:EIO "$TR" --manifest "$(mf rfault)" --steps 6 --resume --disk-probe 0 "${R[@]}" 2>"$W/rfault.err")
rc=$?
err=$(<"$W/rfault.err")
expect_rc 74 "a read error in a parameter fetch exits 74"
check "…naming the parameter file and the offset" has_all "$err" "rank0/param" "offset"
check "…printing no step (it failed in step 4)" test -z "$out"
check "…and leaving the manifest as committed at step 3" test "$(<"$(mf rfault)")" = "$before"
run "$TR" --manifest "$(mf rfault)" --steps 6 --resume "${R[@]}"
expect_rc 0 "--resume after the read error exits 0"
check "…and steps 4-6 have the uninterrupted run's losses" test "$(losses /dev/stdin <<<"$out")" = "$(losses "$W/whole.jsonl" 4 6)"

# A write error in a gradient offload: the optimizer state on NVMe and
# --optimizer-readahead 0 (no memory for the scratch), so the gradients go
# to rank0/grad.bin as each module's backward ends.
state whole2 --param cpu --optim nvme
"$TR" --manifest "$(mf whole2)" --steps 5 "${R[@]}" 2>/dev/null >"$W/whole2.jsonl"
state wfault --param cpu --optim nvme
"$TR" --manifest "$(mf wfault)" --steps 2 "${R[@]}" 2>/dev/null >/dev/null
check "the state streams from NVMe and commits every step (at step 2)" test "$(manifest_step "$(mf wfault)")" = 2
before=$(<"$(mf wfault)")
out=$(ZINF_FAULTS=write:3:EIO "$TR" --manifest "$(mf wfault)" --steps 5 --resume --disk-probe 0 --optimizer-readahead 0 \
  "${R[@]}" 2>"$W/wfault.err")
rc=$?
err=$(<"$W/wfault.err")
expect_rc 74 "a write error in a gradient offload exits 74"
check "…naming the gradient file" contains "$err" "grad.bin"
check "…and leaving the manifest as committed at step 2" test "$(<"$(mf wfault)")" = "$before"
run "$TR" --manifest "$(mf wfault)" --steps 5 --resume "${R[@]}"
expect_rc 0 "--resume after the write error exits 0"
check "…and steps 3-5 have the uninterrupted run's losses" test "$(losses /dev/stdin <<<"$out")" = "$(losses "$W/whole2.jsonl" 3 5)"

# A partition whose bytes changed on disk under the manifest: the fetch's
# xxh3 check refuses it (65), naming the tensor, the file and the offset.
state flip --param nvme --optim cpu
printf '\x55\x55\x55\x55' | dd of="$W/flip/rank0/param.bin" bs=1 seek=8 conv=notrunc 2>/dev/null
run "$TR" --manifest "$(mf flip)" --steps 2 "${R[@]}"
expect_rc 65 "a flipped parameter byte is refused at its fetch (65)"
check "…naming the tensor, the file and the xxh3" has_all "$err" "wte.weight" "rank0/param.bin" "xxh3"
check "…committing nothing" test "$(manifest_step "$(mf flip)")" = 0

# --- peak resident memory does not grow with the model: 4x the layers (about
# 66 MB more of state on disk), the same pinned pool (the default 256MiB, page-
# locked whole), prefetch window and device budget: under 10% more. (The
# optimizer's read-ahead, when on, adds its budget, up to the whole state the
# update reads: it is off here; e2e/readahead.sh checks its budget is kept.)
big=(--param nvme --optim nvme --model gpt:layers=8,hidden=256,heads=4,vocab=256,seq=32)
small=(--param nvme --optim nvme --model gpt:layers=2,hidden=256,heads=4,vocab=256,seq=32)
state rss2 "${small[@]}"
state rss8 "${big[@]}"
for n in 2 8; do
  "$TR" --manifest "$(mf rss$n)" --text "$CORPUS" --steps 3 --json --batch 2 --seq 16 --threads 1 \
    --device-memory 48MiB --prefetch-bytes 1MiB --optimizer-readahead 0 2>/dev/null | tail -n 1 | jq .peak_rss_bytes >"$W/rss$n.peak"
done
r2=$(<"$W/rss2.peak") r8=$(<"$W/rss8.peak")
check "peak RSS with 8 layers ($r8) is under 1.1x that with 2 ($r2)" \
  awk -v a="${r2:-0}" -v b="${r8:-0}" 'BEGIN { exit !(a > 0 && b > 0 && b < 1.1 * a) }'

# --- data parallel: two ranks on NVMe tiers, the losses of one process with the whole batch
if command -v mpirun >/dev/null; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  state e2 --dp 2 --param nvme --optim nvme
  state e1 --param nvme --optim nvme
  D=(--text "$CORPUS" --steps 4 --seq 16 --lr 3e-3 --json "${POOL[@]}")
  run mpirun -np 2 "$TR" --manifest "$(mf e2)" --batch 2 "${D[@]}"
  expect_rc 0 "mpirun -np 2, parameters and optimizer on NVMe, exits 0"
  printf '%s\n' "$out" >"$W/e2.jsonl"
  check "each rank fetched half the partition bytes one rank does" \
    test "$("$TR" --manifest "$(mf e1)" --batch 4 "${D[@]}" 2>/dev/null | tee "$W/e1.jsonl" | tail -n 1 | jq .fetched_nvme_bytes)" -gt \
    "$(tail -n 1 "$W/e2.jsonl" | jq .fetched_nvme_bytes)"
  check "the losses agree with one process of batch 4 within 1e-5 relative" \
    jq -e -n --slurpfile a "$W/e2.jsonl" --slurpfile b "$W/e1.jsonl" \
    '($a | length) == 4 and ($b | length) == 4
      and all(range(4); (($a[.].loss - $b[.].loss) | fabs) <= 1e-5 * $b[.].loss)'
else
  skip "data parallel under mpirun" "no mpirun"
fi

finish
