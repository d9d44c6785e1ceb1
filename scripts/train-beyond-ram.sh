#!/usr/bin/env bash
# train-beyond-ram.sh: trains a model whose training state is larger than this
# machine's memory, with everything on NVMe (or, with --param cpu, only the
# optimizer state), and reports what it cost.
#
# Usage: scripts/train-beyond-ram.sh [OPTIONS]
#
# Lays out and initialises --model (default gpt2-1.5b: 1.56 B parameters; bf16
# parameters plus fp32 master weights, moments and gradients, about 25 GB) with
# parameters (--param) and optimizer state on NVMe in --dir, and trains it on byte-level
# text for --steps steps with --device-memory 2GiB --pinned 1GiB, activation
# checkpoints offloaded to NVMe and the optimizer overlapped with backward.
# Then prints, per step and as medians: the loss, the step time and where it
# went, bytes moved per tier, compute's stall, peak resident memory, the
# disk's bytes and the floor they set (zinf-train's disk_floor_s, at the
# bandwidth zinf-nvmebench --best measured, given as --config) with the
# step's multiple of it (disk_floor_ratio), the compute floor (forward and
# backward with no stall), the step's multiple of the larger of the two
# (step_floor_ratio, its median over steps 3..) and how much of each update
# ran under the next step (update_overlap_s); and zinf-plan's step for the same
# run (its step_s, with the run's own compute and disk, the CPU update's rate
# from zinf-optbench and the same --optimizer-readahead) beside the measured
# median step.
#
# The run is refused up front when --dir's file system cannot hold two
# generations of the state (zinf-train exits 73 with the figures).
#
# Options:
#   --dir DIR           where the state goes (default /var/tmp; needs ~2.2x the state)
#   --model M           zinf-shard model (default gpt2-1.5b)
#   --steps N           training steps (default 20)
#   --batch B --seq T   batch rows and tokens (default 1 x 64)
#   --lr LR             peak learning rate (default 3e-4)
#   --device-memory S   the device budget (default 2GiB)
#   --pinned S          the pinned pool (default 1GiB)
#   --tile K            layout --tile (default 1)
#   --param TIER        the parameters' tier: nvme (default) or cpu (only the
#                       optimizer state on NVMe; the plan's line is then its
#                       param=cpu,optim=nvme placement)
#   --optimizer-readahead S  zinf-train's read-ahead budget (default auto; 0: none)
#   --text FILE         training text (default: the repository's man pages)
#   --raw DIR           keep the step records, the plan and the bench JSON in DIR
#   --keep              keep the state (default: removed at the end)
#   -h, --help          print this help and exit
#
# Environment: ZINF_BIN (default bin/ of this repository).
# Exit status: 0 ok, 64 usage, 66 a program or DIR missing, 69 jq missing,
# 73 the disk is too small, 74 a program failed, 75 the loss did not fall or
# the peak resident memory reached 6 GiB (--optimizer-readahead 0, --param nvme),
# 130 interrupted.
#
# Example: scripts/train-beyond-ram.sh --dir /mnt/nvme --raw /tmp/beyond
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash"

dir=/var/tmp model=gpt2-1.5b steps=20 batch=1 seq=64 lr=3e-4 devmem=2GiB pinned=1GiB tile=1
text= raw= keep=0 readahead=auto param=nvme
while [[ $# -gt 0 ]]; do
    case $1 in
        -h | --help) usage; exit 0 ;;
        --keep) keep=1; shift ;;
        --dir) need_value "$@"; dir=$2; shift 2 ;;
        --model) need_value "$@"; model=$2; shift 2 ;;
        --steps) need_value "$@"; steps=$2; shift 2 ;;
        --batch) need_value "$@"; batch=$2; shift 2 ;;
        --seq) need_value "$@"; seq=$2; shift 2 ;;
        --lr) need_value "$@"; lr=$2; shift 2 ;;
        --device-memory) need_value "$@"; devmem=$2; shift 2 ;;
        --pinned) need_value "$@"; pinned=$2; shift 2 ;;
        --tile) need_value "$@"; tile=$2; shift 2 ;;
        --param) need_value "$@"; param=$2; shift 2 ;;
        --optimizer-readahead) need_value "$@"; readahead=$2; shift 2 ;;
        --text) need_value "$@"; text=$2; shift 2 ;;
        --raw) need_value "$@"; raw=$2; shift 2 ;;
        *) usage_error "unknown option $1" ;;
    esac
done
[[ $param == nvme || $param == cpu ]] || usage_error "bad --param '$param' (nvme or cpu)"
for v in steps batch seq tile; do
    [[ ${!v} =~ ^[1-9][0-9]*$ ]] || usage_error "bad --$v '${!v}'"
done
bin=${ZINF_BIN:-$root/bin}
need_programs "$bin" zinf-train zinf-shard zinf-plan zinf-nvmebench zinf-optbench
make_work "$dir"
state=$work/state steps_out=$work/steps.jsonl benches=$work/engine.json
mem_kib=$(awk '/^MemTotal:/ { print $2 }' /proc/meminfo)

say "bandwidth of $work: zinf-nvmebench --size 2GiB -b 1MiB -d 32 -Q 2 --best"
"$bin/zinf-nvmebench" --dir "$work" --size 2GiB -b 1MiB -d 32 -Q 2 --best -q >"$benches" ||
    die 74 "zinf-nvmebench failed"

# The CPU update's memory traffic per second (a small model: the rate is per byte).
say "the CPU update's rate: zinf-optbench --model gpt2-124m --param-dtype bf16 --state update"
"$bin/zinf-optbench" --model gpt2-124m --param-dtype bf16 --state update --steps 3 --json -q >"$work/update.jsonl" ||
    die 74 "zinf-optbench failed"

say "layout and init: $model, --tile $tile, parameters on $param and optimizer state on NVMe, in $state"
t0=$(date +%s.%N)
"$bin/zinf-shard" layout --model "$model" --tile "$tile" --param "$param" --optim nvme |
    "$bin/zinf-shard" init --dir "$state" --pinned "$pinned" >/dev/null || die 74 "zinf-shard init failed"
t1=$(date +%s.%N)
state_bytes=$(du -sb "$state" | cut -f1)
say "state: $(numfmt --to=iec "$state_bytes")B on disk, this machine has $(numfmt --to=iec $((mem_kib * 1024)))B of memory; init took $(jq -n "$t1 - $t0 | . * 10 | floor / 10") s"

say "training: $steps steps, batch $batch x seq $seq, --device-memory $devmem --pinned $pinned --offload-activations nvme --optimizer-readahead $readahead"
rc=0
"$bin/zinf-train" --manifest "$state/manifest.jsonl" --text "$text" --steps "$steps" --batch "$batch" --seq "$seq" \
    --lr "$lr" --warmup 2 --device-memory "$devmem" --pinned "$pinned" --offload-activations nvme --json \
    --config "$benches" --optimizer-readahead "$readahead" >"$steps_out" || rc=$?
((rc == 73)) && die 73 "the disk of $dir is too small for this run (zinf-train said why above)"
((rc == 0)) || die 74 "zinf-train failed (exit $rc)"

# zinf-plan for the same run, with the measured NVMe bandwidth and a peak set
# so that its compute (8 x batch x seq x params FLOP, as the plan counts it)
# takes the measured forward + backward time less compute's stall.
read_gbps=$(jq '.read_gibps * 1.073741824' "$benches")
write_gbps=$(jq '.write_gibps * 1.073741824' "$benches")
params=$(jq -r 'select(has("schema")) | .parameters' "$state/manifest.jsonl")
compute_s=$(jq -s 'map(select(.step > 2)) | map(.compute_floor_s // (.forward_s + .backward_s - .stall_seconds)) | sort | .[length / 2 | floor]' "$steps_out")
peak_tflops=$(jq -n "8 * $batch * $seq * $params / $compute_s / 1e12")
# The dtypes zinf-train trains with: the layout's parameters, and fp32
# gradients (its optimizer's gradient scratch: 4 bytes a parameter).
param_dtype=$(jq -r 'select(has("schema")) | .param_dtype' "$state/manifest.jsonl")
"$bin/zinf-plan" --model "$model" --tile "$tile" --batch "$batch" --seq "$seq" --gpu-mem "$devmem" \
    --param-dtype "$param_dtype" --grad-dtype fp32 \
    --cpu-mem "$((mem_kib / 1024))MiB" --nvme "$dir" --peak-tflops "$peak_tflops" --bw-nvme-read "$read_gbps" \
    --bw-nvme-write "$write_gbps" --bw-cpu-gpu 1000 --bench "$work/update.jsonl" --optimizer-readahead "$readahead" \
    --json >"$work/plan.json" 2>/dev/null ||
    die 74 "zinf-plan failed"
[[ -z $raw ]] || { mkdir -p "$raw" && cp "$steps_out" "$benches" "$work/update.jsonl" "$work/plan.json" "$raw"/; say "raw records in $raw"; }

printf '# %s (%s parameters, tile %s), batch %s x seq %s, %s steps; state %s on NVMe, memory %s\n' "$model" \
    "$params" "$tile" "$batch" "$seq" "$steps" "$(numfmt --to=iec "$state_bytes")B" "$(numfmt --to=iec $((mem_kib * 1024)))B"
printf '# NVMe files: read %.2f GB/s, write %.2f GB/s (zinf-nvmebench)\n' "$read_gbps" "$write_gbps"
printf '# %4s %8s %8s %7s %7s %7s %8s %7s %7s %10s %10s %10s %9s %9s %8s %6s %8s %8s %7s %8s\n' step loss step_s fwd bwd opt \
    overlap stall redo nvme_fetch opt_read opt_write disk_in disk_out floor_s ratio rss cfloor_s sratio upd_ov
jq -r '[.step, .loss, .step_s, .forward_s, .backward_s, .optimizer_s, .optimizer_overlap_s, .stall_seconds,
    .optimizer_redo, .fetched_nvme_bytes, .optimizer_read_bytes, .optimizer_written_bytes, .disk_read_bytes,
    .disk_written_bytes, (.disk_floor_s // 0), (.disk_floor_ratio // 0), .peak_rss_bytes, (.compute_floor_s // 0),
    (.step_floor_ratio // 0), (.update_overlap_s // 0)] | @tsv' \
    "$steps_out" | while IFS=$'\t' read -r s l st f b o ov sl rd fn orr ow di do fl ra rss cf sr uo; do
    printf '  %4s %8.4f %8.2f %7.2f %7.2f %7.2f %8.2f %7.2f %7s %10s %10s %10s %9s %9s %8.2f %6.3f %8s %8.2f %7.3f %8.2f\n' "$s" "$l" \
        "$st" "$f" "$b" "$o" "$ov" "$sl" "$rd" "$(numfmt --to=iec "$fn")" "$(numfmt --to=iec "$orr")" \
        "$(numfmt --to=iec "$ow")" "$(numfmt --to=iec "$di")" "$(numfmt --to=iec "$do")" "$fl" "$ra" \
        "$(numfmt --to=iec "$rss")" "$cf" "$sr" "$uo"
done
first=$(jq -s '.[0].loss' "$steps_out") last=$(jq -s '.[-1].loss' "$steps_out")
rss=$(jq -s 'map(.peak_rss_bytes) | max' "$steps_out")
# The measured medians of the steps zinf-plan models (from step 3: the first
# speculates and is redone, the second's read-ahead pins its memory).
median() { jq -s "map(select(.step > 2) | $1) | sort | .[length / 2 | floor]" "$steps_out"; }
jq -r --argjson st "$(median .step_s)" --argjson f "$(median .forward_s)" --argjson b "$(median .backward_s)" \
    --argjson o "$(median .optimizer_s)" --argjson ra "$(median .optimizer_readahead_bytes)" --arg param "$param" '
    def r3: . * 1000 | round / 1000;
    (.placements[] | select(.placement == "param=\($param),optim=nvme")) as $p |
    "# zinf-plan, param=\($param),optim=nvme: step \($p.step_s | r3) s (forward \($p.step_forward_s | r3), backward \($p.step_backward_s | r3), optimizer after backward \($p.step_optimizer_s | r3); \($p.step_readahead_bytes) bytes read ahead)",
    "# measured (medians from step 3): step \($st | r3) s (forward \($f | r3), backward \($b | r3), optimizer after backward \($o | r3); \($ra) bytes read ahead); plan / measured \($p.step_s / $st | r3)",
    "# zinf-plan: NVMe needed \($p.nvme_bytes_needed) bytes"' "$work/plan.json"
ahead=$(jq -s 'map(.optimizer_readahead_bytes) | max' "$steps_out")
printf '# loss %.4f -> %.4f; peak resident memory %s (at most %s read ahead a step; with --optimizer-readahead 0 the limit is 6GiB); median step %.1f s\n' \
    "$first" "$last" "$(numfmt --to=iec "$rss")B" "$(numfmt --to=iec "$ahead")B" "$(jq -s 'map(.step_s) | sort | .[length / 2 | floor]' "$steps_out")"
printf '# disk floor (the step'"'"'s disk bytes at the bandwidth above): median %.2f s; median step / floor %.3f\n' \
    "$(jq -s 'map(.disk_floor_s // 0) | sort | .[length / 2 | floor]' "$steps_out")" \
    "$(jq -s 'map(.disk_floor_ratio // 0) | sort | .[length / 2 | floor]' "$steps_out")"
printf '# step / max(compute floor, disk floor) (step_floor_ratio): median over steps 3.. %.3f; update under the next step median %.2f s\n' \
    "$(median '.step_floor_ratio // 0')" "$(median '.update_overlap_s // 0')"
[[ $(jq -n --argjson a "$first" --argjson b "$last" '$b < $a') == true ]] || die 75 "the loss did not fall"
# The 6 GiB bound is everything-on-NVMe's: with --param cpu the parameters
# (and the optimizer's undo copy of them) are resident besides.
[[ $readahead != 0 || $param != nvme || $rss -lt $((6 << 30)) ]] ||
    die 75 "the peak resident memory reached 6 GiB without read-ahead"
