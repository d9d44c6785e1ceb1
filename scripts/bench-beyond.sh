#!/usr/bin/env bash
# bench-beyond.sh: the optimizer overlapped with backward and activation
# checkpoints offloaded, against their references, in one run.
#
# Usage: scripts/bench-beyond.sh [OPTIONS]
#
# Trains gpt2-124m (batch 4 x seq 64, one rank) with bin/zinf-train on text, in
# these configurations, each from a fresh zinf-shard init of its own layout:
#
#   resident       --resident, layout --param cpu --optim cpu (the reference step)
#   nvme           engine, layout --param nvme --optim nvme (optimizer overlapped)
#   nvme-serial    the same with --no-overlap
#   acts-device    engine, layout --param cpu --optim cpu (checkpoints on the device)
#   acts-cpu       the same with --offload-activations cpu
#
# one after the other; that is one round, and the order flips every round. Of
# each run the first SKIP steps are dropped (the trace is recorded in step 1);
# the table gives medians over the kept steps of all rounds.
#
# The bandwidth the files give is measured twice, before the rounds and after,
# with the trainer's engine settings (1 MiB blocks, depth 32, 2 queues), and
# the best of each figure is used (the smallest io_s):
#   zinf-nvmebench  a 1 GiB file in --dir, read, and written without a sync
#                   (what a drive's volatile write cache takes in; shown)
#   zinf-optbench   the same model's all-NVMe state files (bf16 parameters,
#                   fp32 gradients), read, and their twins written each
#                   followed by fdatasync: what a step that commits, as the
#                   trainer does every step of an all-NVMe run, can reach.
#                   Its read and synced write give io_s.
#
# Ratios (the issue's targets):
#   nvme      step_s / max(resident's step_s, io_s)                (<= 1.15)
#             io_s = the step's NVMe bytes read (parameters fetched, optimizer
#             state and, where it is a file, the gradients' scratch; held in
#             memory when the read-ahead budget holds it) / the read
#             bandwidth + those written (state and such a scratch) / the
#             synced write bandwidth
#   acts-cpu  step_s / acts-device's step_s                        (<= 1.05)
# floor_s and ratio are zinf-train's own disk floor, medians of its step
# records (disk_floor_s, disk_floor_ratio: the step's bytes that must reach
# the drive, the gradient scratch left out, at the bandwidth its start-up
# probe measured; 0 for runs with every state in memory).
# Each row shows where the step's time went: forward, backward, the optimizer
# after backward (opt; of it, the sync and manifest commit: commit), its
# thread's streaming during backward (overlap), its AdamW kernel (update) and
# waits for reads or write space (wait), compute's
# wait for fetched parameters (stall), and how often a step was redone (the
# step was clipped).
#
# Options:
#   --dir DIR        folder for the states (default /var/tmp; must take O_DIRECT)
#   --rounds R       interleaved rounds (default 2)
#   --steps N        training steps per run (default 8)
#   --skip K         first steps of each run left out (default 2)
#   --grad-clip C    zinf-train's --grad-clip (default 1, zinf-train's own)
#   --text FILE      training text (default: the repository's man pages)
#   --raw DIR        also keep every step record and the bench JSON in DIR
#   --check          exit 75 when a ratio misses its target
#   -h, --help       print this help and exit
#
# Environment: ZINF_BIN (default bin/ of this repository).
# Output: a table; lines that are not data start with '#'. Progress on stderr.
# Exit status: 0 ok, 64 usage, 66 a program or DIR missing, 69 jq missing,
# 74 a run failed, 75 --check and a target missed, 130 interrupted.
# The states are removed at the end, also on Ctrl-C.
#
# Example: scripts/bench-beyond.sh --rounds 3 --check
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash"

dir=/var/tmp rounds=2 steps=8 skip=2 clip=1 text= raw= check=0
model=gpt2-124m batch=4 seq=64

while [[ $# -gt 0 ]]; do
    case $1 in
        -h | --help) usage; exit 0 ;;
        --check) check=1; shift ;;
        --dir) need_value "$@"; dir=$2; shift 2 ;;
        --rounds) need_value "$@"; rounds=$2; shift 2 ;;
        --steps) need_value "$@"; steps=$2; shift 2 ;;
        --skip) need_value "$@"; skip=$2; shift 2 ;;
        --grad-clip) need_value "$@"; clip=$2; shift 2 ;;
        --text) need_value "$@"; text=$2; shift 2 ;;
        --raw) need_value "$@"; raw=$2; shift 2 ;;
        *) usage_error "unknown option $1" ;;
    esac
done
[[ $rounds =~ ^[1-9][0-9]*$ ]] || usage_error "bad --rounds '$rounds'"
[[ $steps =~ ^[1-9][0-9]*$ ]] || usage_error "bad --steps '$steps'"
[[ $skip =~ ^[0-9]+$ ]] || usage_error "bad --skip '$skip'"
((skip < steps)) || usage_error "--skip $skip leaves none of --steps $steps"
[[ $clip =~ ^[0-9]+(\.[0-9]+)?$ ]] || usage_error "bad --grad-clip '$clip'"

bin=${ZINF_BIN:-$root/bin}
need_programs "$bin" zinf-train zinf-shard zinf-nvmebench zinf-optbench
make_work "$dir"
records=$work/steps.jsonl benches=$work/bench.jsonl
: >"$records"
: >"$benches"

run_train() {  # run_train CONFIG ROUND
    local config=$1 round=$2 state=$work/state out=$work/run.jsonl tiers extra=()
    case $config in
        resident) tiers="--param cpu --optim cpu"; extra=(--resident) ;;
        nvme) tiers="--param nvme --optim nvme" ;;
        nvme-serial) tiers="--param nvme --optim nvme"; extra=(--no-overlap) ;;
        acts-device) tiers="--param cpu --optim cpu" ;;
        acts-cpu) tiers="--param cpu --optim cpu"; extra=(--offload-activations cpu) ;;
    esac
    local -a train=("$bin/zinf-train" --manifest "$state/manifest.jsonl" --text "$text" --batch "$batch"
        --seq "$seq" --steps "$steps" --grad-clip "$clip" --json -q "${extra[@]}")
    rm -rf -- "$state"
    # shellcheck disable=SC2086  # the tier options are words
    "$bin/zinf-shard" layout --model "$model" $tiers | "$bin/zinf-shard" init --dir "$state" >/dev/null 2>"$work/init.err" ||
        { cat "$work/init.err" >&2; die 74 "zinf-shard init failed for $config"; }
    say "round $round: $config: ${train[*]}"
    "${train[@]}" >"$out" || die 74 "zinf-train failed ($config)"
    jq -c --arg c "$config" --argjson r "$round" 'select(.schema == "zinf.train/1") + {config: $c, round: $r}' \
        "$out" >>"$records"
    jq -r --argjson k "$skip" 'select(.step > $k) | .step_s' "$out" |
        awk -v c="$config" -v p="$prog" '{ s = s sprintf(" %.3f", $1) } END { printf "%s: %s: steps%s s\n", p, c, s }' >&2
    rm -rf -- "$state"
}

say "$model, batch $batch x seq $seq, $steps steps a run (first $skip dropped), $rounds rounds, states in $work"
bandwidth() {  # the files' read and write bandwidth, unsynced and synced, into $benches
    say "bandwidth: zinf-nvmebench --dir $work --size 1GiB -b 1MiB -d 32 -Q 2"
    "$bin/zinf-nvmebench" --dir "$work" --size 1GiB -b 1MiB -d 32 -Q 2 --json -q >>"$benches" ||
        die 74 "zinf-nvmebench failed"
    say "bandwidth: zinf-optbench --model $model --state nvme --param-dtype bf16 --grad-dtype fp32 --steps 2"
    "$bin/zinf-optbench" --model "$model" --state nvme --param-dtype bf16 --grad-dtype fp32 --steps 2 \
        --dir "$work" --json -q | jq -c 'select(.state == "nvme") | {op: "synced", read_gibps, write_gibps}' \
        >>"$benches" || die 74 "zinf-optbench failed"
}
bandwidth
configs=(resident nvme nvme-serial acts-device acts-cpu)
for ((r = 1; r <= rounds; r++)); do
    order=("${configs[@]}")
    ((r % 2)) || order=(acts-cpu acts-device nvme-serial nvme resident)
    for c in "${order[@]}"; do run_train "$c" "$r"; done
done
bandwidth
[[ -z $raw ]] || { mkdir -p "$raw" && cp "$records" "$benches" "$raw"/; say "raw records in $raw"; }

read_bps=$(jq -s 'map(select(.op == "read") | .gibps) + map(select(.op == "synced") | .read_gibps) | max * 1073741824' \
    "$benches")
cache_bps=$(jq -s 'map(select(.op == "write") | .gibps) | max * 1073741824' "$benches")
write_bps=$(jq -s 'map(select(.op == "synced") | .write_gibps) | max * 1073741824' "$benches")
rows=$(jq -s -c --argjson k "$skip" --argjson rb "$read_bps" --argjson wb "$write_bps" '
    def median: sort | if length == 0 then null
        elif length % 2 == 1 then .[length / 2 | floor] else (.[length / 2 - 1] + .[length / 2]) / 2 end;
    map(select(.step > $k)) | group_by(.config) | map({
        config: .[0].config, steps: length,
        step_s: map(.step_s) | median, forward_s: map(.forward_s) | median,
        backward_s: map(.backward_s) | median, optimizer_s: map(.optimizer_s) | median,
        commit_s: map(.optimizer_commit_s // 0) | median,
        overlap_s: map(.optimizer_overlap_s) | median, update_s: map(.optimizer_update_s) | median,
        wait_s: map(.optimizer_wait_s) | median, stall_s: map(.stall_seconds) | median,
        redone: (map(select(.optimizer_redo)) | length),
        read_bytes: map(.fetched_nvme_bytes + (if .optimizer_read_bytes then .optimizer_read_bytes else 0 end)) | median,
        written_bytes: map(.optimizer_written_bytes) | median,
        floor_s: map(.disk_floor_s // 0) | median, floor_ratio: map(.disk_floor_ratio // 0) | median}
      | . + {io_s: (.read_bytes / $rb + .written_bytes / $wb)})' "$records")
ratio() {  # ratio CONFIG: step / its reference
    jq -r --arg c "$1" 'INDEX(.config) as $r | $r[$c] as $x |
        if $c == "nvme" then $x.step_s / ([$r.resident.step_s, $x.io_s] | max)
        else $x.step_s / $r["acts-device"].step_s end' <<<"$rows"
}
nvme_ratio=$(ratio nvme) acts_ratio=$(ratio acts-cpu)

printf '# %s, batch %s x seq %s, 1 rank; medians of steps %s..%s over %s rounds\n' "$model" "$batch" "$seq" \
    $((skip + 1)) "$steps" "$rounds"
printf '# NVMe files: read %.2f GiB/s; write %.2f GiB/s synced (zinf-optbench, the state files), %.2f unsynced\n' \
    "$(jq -n "$read_bps / 1073741824")" "$(jq -n "$write_bps / 1073741824")" "$(jq -n "$cache_bps / 1073741824")"
printf '# (zinf-nvmebench, 1 GiB); 1 MiB blocks, depth 32, 2 queues\n'
printf '# %-12s %7s %7s %7s %7s %7s %8s %7s %7s %7s %7s %9s %9s %7s %7s %6s\n' config step_s fwd bwd opt commit \
    overlap update wait stall redone nvme_read nvme_wrt io_s floor_s ratio
jq -r '.[] | [.config, .step_s, .forward_s, .backward_s, .optimizer_s, .commit_s, .overlap_s, .update_s, .wait_s,
    .stall_s, "\(.redone)/\(.steps)", (.read_bytes / 1048576 | floor | tostring) + "MiB",
    (.written_bytes / 1048576 | floor | tostring) + "MiB", .io_s, .floor_s, .floor_ratio] | @tsv' <<<"$rows" |
    awk -F'\t' '{ printf "  %-12s %7.3f %7.3f %7.3f %7.3f %7.3f %8.3f %7.3f %7.3f %7.3f %7s %9s %9s %7.3f %7.3f %6.3f\n",
        $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16 }'
printf '# nvme:     step / max(resident step, io_s) = %.3f (target <= 1.15)\n' "$nvme_ratio"
printf '# acts-cpu: step / acts-device step          = %.3f (target <= 1.05)\n' "$acts_ratio"
missed=$(jq -n --argjson a "$nvme_ratio" --argjson b "$acts_ratio" '($a > 1.15) or ($b > 1.05)')
((check)) && [[ $missed == true ]] && die 75 "a target was missed"
exit 0
