#!/usr/bin/env bash
# bench-offload.sh: the ZeRO-Infinity engine's step against the resident engine's,
# with parameters and optimizer state on CPU memory and NVMe, in one run.
#
# Usage: scripts/bench-offload.sh [OPTIONS]
#
# Trains gpt2-124m (batch 4 x seq 64 per rank) with bin/zinf-train on text, in
# these configurations, each from a fresh zinf-shard init of its own layout:
#
#   resident       --resident, layout --param cpu  --optim cpu (the reference)
#   resident-nvme  --resident, layout --param nvme --optim cpu (the same, on
#                  param-nvme's layout)
#   param-cpu      engine, layout --param cpu  --optim cpu
#   param-nvme     engine, layout --param nvme --optim cpu
#   all-nvme       engine, layout --param nvme --optim nvme
#
# one after the other with one rank, then the same five under mpirun -np NP
# (layout --dp NP), then zinf-optbench on the all-NVMe optimizer step; that is
# one round. The order of the configurations flips every round. Of each run the
# first SKIP steps are dropped (the trace is recorded in step 1; warm-up); the
# table gives the median over the kept steps of all rounds. Before the rounds,
# zinf-nvmebench and zinf-pinstress measure the bandwidths zinf-plan needs.
#
# Ratios (the issue's targets):
#   param-cpu     step_s / resident's step_s                   (<= 1.05)
#   param-nvme    step_s / resident-nvme's step_s              (<= 1.15)
#   all-nvme      step_s / (resident's forward_s + backward_s
#                                     + the optimizer step's ideal)   (<= 1.15)
# The ideal is zinf-optbench's ideal_seconds (max of the step's bytes at the
# read and write bandwidth the same files give, and the update's time) for the
# same model and dtypes (--param-dtype bf16 --grad-dtype fp32, as zinf-train),
# its state on --dir; the median over the rounds. It is the whole model's on this
# node, so it serves the NP-rank run too (the ranks share the drive and cores).
#
# zinf-plan's prediction for the all-NVMe placement (one rank) is printed beside
# it: its three efficiencies at the measured bandwidths, with --peak-tflops set
# so that the plan's compute (8 x batch x seq x params FLOP) takes the resident
# forward + backward time, and their product as one efficiency with the transfer
# times added (nothing overlapped, as the plan assumes):
#   efficiency = 1 / (1 + sum over states of (1/e - 1))
# The measured one is (resident forward_s + backward_s) / all-nvme step_s.
#
# Options:
#   --dir DIR        folder for the states (default /var/tmp; must take O_DIRECT)
#   --rounds R       interleaved rounds (default 2)
#   --steps N        training steps per run (default 8)
#   --skip K         first steps of each run left out (default 2)
#   --np NP          ranks of the data-parallel run (default 2; 0 skips it)
#   --text FILE      training text (default: the repository's man pages)
#   --raw DIR        also keep every step record (zinf.train/1 plus config, dp
#                    and round) and the bench JSON in DIR
#   --json           print one JSON record per row instead of the table
#   --check          exit 75 when a ratio misses its target
#   -h, --help       print this help and exit
#
# Environment: ZINF_BIN (default bin/ of this repository), MPIRUN (default mpirun).
# As root, mpirun runs with OMPI_ALLOW_RUN_AS_ROOT=1 and its confirmation set, and
# oversubscription allowed (OMPI_MCA_rmaps_base_oversubscribe=1).
#
# Output: a table; lines that are not data start with '#'. Progress on stderr.
# Exit status: 0 ok, 64 usage, 66 a program or DIR missing, 69 jq or mpirun
# missing, 74 a run failed, 75 --check and a target missed, 130 interrupted.
# The states are removed at the end, also on Ctrl-C.
#
# Example: scripts/bench-offload.sh --rounds 3 --check
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash"

# --- options -----------------------------------------------------------------
dir=/var/tmp
rounds=2
steps=8
skip=2
np=2
text=
raw=
json=0
check=0
model=gpt2-124m batch=4 seq=64

while [[ $# -gt 0 ]]; do
    case $1 in
        -h | --help) usage; exit 0 ;;
        --json) json=1; shift ;;
        --check) check=1; shift ;;
        --dir) need_value "$@"; dir=$2; shift 2 ;;
        --rounds) need_value "$@"; rounds=$2; shift 2 ;;
        --steps) need_value "$@"; steps=$2; shift 2 ;;
        --skip) need_value "$@"; skip=$2; shift 2 ;;
        --np) need_value "$@"; np=$2; shift 2 ;;
        --text) need_value "$@"; text=$2; shift 2 ;;
        --raw) need_value "$@"; raw=$2; shift 2 ;;
        *) usage_error "unknown option $1" ;;
    esac
done
[[ $rounds =~ ^[1-9][0-9]*$ ]] || usage_error "bad --rounds '$rounds'"
[[ $steps =~ ^[1-9][0-9]*$ ]] || usage_error "bad --steps '$steps'"
[[ $skip =~ ^[0-9]+$ ]] || usage_error "bad --skip '$skip'"
((skip < steps)) || usage_error "--skip $skip leaves none of --steps $steps"
[[ $np =~ ^[0-9]+$ && $np != 1 ]] || usage_error "bad --np '$np' (0, or 2 and more)"

bin=${ZINF_BIN:-$root/bin}
mpirun=${MPIRUN:-mpirun}
((np == 0)) || command -v "$mpirun" >/dev/null || die 69 "needs $mpirun for --np $np (or --np 0)"
need_programs "$bin" zinf-train zinf-shard zinf-optbench zinf-plan zinf-nvmebench zinf-pinstress
make_work "$dir"
records=$work/steps.jsonl   # every step record, tagged
benches=$work/bench.jsonl   # nvmebench, pinstress, optbench records
: >"$records"
: >"$benches"

# --- one run -----------------------------------------------------------------
layout_of() {  # layout_of CONFIG: zinf-shard layout's tier options
    case $1 in
        resident | param-cpu) echo "--param cpu --optim cpu" ;;
        resident-nvme | param-nvme) echo "--param nvme --optim cpu" ;;
        all-nvme) echo "--param nvme --optim nvme" ;;
    esac
}

run_train() {  # run_train CONFIG DP ROUND
    local config=$1 dp=$2 round=$3 state=$work/state out=$work/run.jsonl
    local -a train=("$bin/zinf-train" --manifest "$state/manifest.jsonl" --text "$text"
        --batch "$batch" --seq "$seq" --steps "$steps" --json -q)
    [[ $config == resident* ]] && train+=(--resident)
    rm -rf -- "$state"
    # shellcheck disable=SC2046  # the tier options are words
    "$bin/zinf-shard" layout --model "$model" --dp "$dp" $(layout_of "$config") |
        "$bin/zinf-shard" init --dir "$state" >/dev/null 2>"$work/init.err" ||
        { cat "$work/init.err" >&2; die 74 "zinf-shard init failed for $config, dp $dp"; }
    if ((dp == 1)); then
        say "round $round: $config, 1 rank: ${train[*]}"
        "${train[@]}" >"$out" || die 74 "zinf-train failed ($config, dp 1)"
    else
        say "round $round: $config, $dp ranks: $mpirun -np $dp ${train[*]}"
        OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
            "$mpirun" -np "$dp" "${train[@]}" >"$out" || die 74 "zinf-train failed ($config, dp $dp)"
    fi
    jq -c --arg c "$config" --argjson dp "$dp" --argjson r "$round" \
        'select(.schema == "zinf.train/1") + {config: $c, dp: $dp, round: $r}' "$out" >>"$records"
    jq -r --argjson k "$skip" 'select(.schema == "zinf.train/1" and .step > $k)
        | "\(.step_s) \(.stall_seconds)"' "$out" |
        awk -v c="$config" '{ s = s sprintf(" %.3f", $1); t += $2; n++ }
            END { printf "%s: %s:   steps%s s; stall %.3f s a step\n", "'"$prog"'", c, s, n ? t / n : 0 }' >&2
    rm -rf -- "$state"
}

run_optbench() {  # run_optbench ROUND: the all-NVMe optimizer step and its ideal
    say "round $1: zinf-optbench --model $model --state nvme --param-dtype bf16 --grad-dtype fp32 --dir $work"
    "$bin/zinf-optbench" --model "$model" --state nvme --steps 3 --param-dtype bf16 --grad-dtype fp32 \
        --dir "$work" --json -q | jq -c --argjson r "$1" '. + {round: $r}' >>"$benches" ||
        die 74 "zinf-optbench failed"
}

# --- the rounds --------------------------------------------------------------
say "$model, batch $batch x seq $seq, $steps steps a run (first $skip dropped), $rounds rounds, states in $work"
say "bandwidths for zinf-plan: zinf-nvmebench --dir $work --size 1GiB -b 1MiB -d 32 -Q 2 (zinf-train's engine), zinf-pinstress"
"$bin/zinf-nvmebench" --dir "$work" --size 1GiB -b 1MiB -d 32 -Q 2 --json -q >>"$benches" || die 74 "zinf-nvmebench failed"
"$bin/zinf-pinstress" -t 1 -s 2s --json 2>/dev/null | tail -n 1 >>"$benches" || die 74 "zinf-pinstress failed"

configs=(resident resident-nvme param-cpu param-nvme all-nvme)
for ((r = 1; r <= rounds; r++)); do
    order=("${configs[@]}")
    ((r % 2)) || order=(all-nvme param-nvme param-cpu resident-nvme resident)
    for c in "${order[@]}"; do run_train "$c" 1 "$r"; done
    if ((np > 0)); then
        for c in "${order[@]}"; do run_train "$c" "$np" "$r"; done
    fi
    run_optbench "$r"
done
[[ -z $raw ]] || { mkdir -p "$raw" && cp "$records" "$benches" "$raw"/; say "raw records in $raw"; }

# --- the figures -------------------------------------------------------------
# One row per (dp, config): medians over the kept steps of every round.
rows=$(jq -s -c --argjson k "$skip" '
    def median: sort | if length == 0 then null
        elif length % 2 == 1 then .[length / 2 | floor]
        else (.[length / 2 - 1] + .[length / 2]) / 2 end;
    map(select(.step > $k)) | group_by([.dp, .config]) | map({
        dp: .[0].dp, config: .[0].config, steps: length,
        step_s: map(.step_s) | median, forward_s: map(.forward_s) | median,
        backward_s: map(.backward_s) | median, optimizer_s: map(.optimizer_s) | median,
        stall_seconds: map(.stall_seconds) | median,
        fetched_nvme_bytes: map(.fetched_nvme_bytes) | median,
        fetched_cpu_bytes: map(.fetched_cpu_bytes) | median,
        fetched_gpu_bytes: map(.fetched_gpu_bytes) | median,
        flops_per_s: map(.flops_per_s) | median,
        device_peak_bytes: map(.device_peak_bytes) | max, peak_rss_bytes: map(.peak_rss_bytes) | max })
    | .[]' "$records")
opt=$(jq -s -c 'def median: sort | if length % 2 == 1 then .[length / 2 | floor]
        else (.[length / 2 - 1] + .[length / 2]) / 2 end;
    map(select(.schema == "zinf.optbench/1" and .kind == "step")) | {
        rounds: length, ideal_seconds: map(.ideal_seconds) | median, seconds: map(.seconds) | median,
        io_seconds: map(.io_seconds) | median, update_seconds: map(.update_seconds) | median,
        read_gibps: map(.read_gibps) | median, write_gibps: map(.write_gibps) | median }' "$benches")
ideal=$(jq '.ideal_seconds' <<<"$opt")

# Ratios and targets, per dp, against that dp's resident run.
rows=$(jq -s -c --argjson ideal "$ideal" '
    group_by(.dp) | map(
        (map(select(.config == "resident"))[0]) as $res
        | (map(select(.config == "resident-nvme"))[0]) as $resn
        | .[] | . + (
            if .config == "resident" then {baseline_s: .step_s, ratio: 1, target: null}
            elif .config == "resident-nvme" then {baseline_s: $res.step_s, ratio: (.step_s / $res.step_s), target: null}
            elif .config == "param-cpu" then {baseline_s: $res.step_s, ratio: (.step_s / $res.step_s), target: 1.05}
            elif .config == "param-nvme" then {baseline_s: $resn.step_s, ratio: (.step_s / $resn.step_s), target: 1.15}
            else ($res.forward_s + $res.backward_s + $ideal) as $b
                | {baseline_s: $b, ratio: (.step_s / $b), target: 1.15} end)
        | . + {ratio_to_resident: (.step_s / $res.step_s),
               met: (if .target == null then null else .ratio <= .target end)})
    | flatten | sort_by(.dp, (.config | {"resident": 0, "resident-nvme": 1, "param-cpu": 2, "param-nvme": 3, "all-nvme": 4}[.]))
    | .[]' <<<"$rows")

# zinf-plan for the all-NVMe placement, one rank, at the measured bandwidths.
res1=$(jq -c 'select(.dp == 1 and .config == "resident")' <<<"$rows")
all1=$(jq -c 'select(.dp == 1 and .config == "all-nvme")' <<<"$rows")
params=$(jq -s 'map(select(.kind == "step"))[0].params' "$benches")
peak=$(jq -n --argjson r "$res1" --argjson p "$params" \
    "8 * $batch * $seq * \$p / (\$r.forward_s + \$r.backward_s) / 1e12")
cpu_gpu=$(jq -s 'map(select(.schema == "zinf.pinstress/1") | .copies[] | .pinned_gibps) | max * 1.073741824' "$benches")
gpu_mem=$(awk '/^MemAvailable:/ { printf "%.0f", $2 * 1024 * 3 / 4 }' /proc/meminfo)
plan_cmd=("$bin/zinf-plan" --model "$model" --dp 1 --batch "$batch" --seq "$seq" --param-dtype bf16
    --grad-dtype fp32 --peak-tflops "$peak" --gpu-mem "$gpu_mem" --bw-cpu-gpu "$cpu_gpu" --bench "$benches" --json -q)
say "${plan_cmd[*]}"
plan=$("${plan_cmd[@]}" | jq -c --argjson a "$all1" --argjson r "$res1" '
    (.placements[] | select(.param == "nvme" and .optim == "nvme")) as $p
    | { efficiency_param: $p.efficiency_param, efficiency_optimizer: $p.efficiency_optimizer,
        efficiency_activation: $p.efficiency_activation,
        efficiency: (1 / (1 + ([$p.efficiency_param, $p.efficiency_optimizer, $p.efficiency_activation]
                               | map(1 / . - 1) | add))),
        nvme_read_gbps: .hardware.nvme_read_gbps, nvme_write_gbps: .hardware.nvme_write_gbps,
        cpu_update_gbps: .hardware.cpu_update_gbps, cpu_gpu_gbps: .hardware.cpu_gpu_gbps,
        peak_tflops: .peak_tflops,
        measured_efficiency: (($r.forward_s + $r.backward_s) / $a.step_s) }
    | . + {predicted_step_s: (($r.forward_s + $r.backward_s) / .efficiency)}') ||
    die 74 "zinf-plan failed"

# --- output ------------------------------------------------------------------
if ((json)); then
    jq -c '. + {schema: "zinf.bench-offload/1", kind: "config"}' <<<"$rows"
    jq -c '. + {schema: "zinf.bench-offload/1", kind: "optimizer_ideal"}' <<<"$opt"
    jq -c '. + {schema: "zinf.bench-offload/1", kind: "plan"}' <<<"$plan"
else
    echo "# $model, batch $batch x seq $seq per rank, steps $((skip + 1))-$steps of each run, $rounds rounds; $(nproc) cores, $(uptime | sed 's/.*load/load/')"
    echo "# ratio: step_s over resident's; param-nvme: over resident-nvme's; all-nvme: over resident's forward_s + backward_s + the optimizer step's ideal"
    echo "# dp config        steps  step_s forward_s backward_s optimizer_s stall_s nvme_MiB cpu_MiB  ratio target met"
    jq -r '[.dp, .config, .steps, .step_s, .forward_s, .backward_s, .optimizer_s, .stall_seconds,
            .fetched_nvme_bytes / 1048576, .fetched_cpu_bytes / 1048576, .ratio,
            (.target // "-"), (if .met == null then "-" elif .met then "yes" else "NO" end)] | @tsv' <<<"$rows" |
        awk -F'\t' '{ printf "%4d %-13s %5d %7.3f %9.3f %10.3f %11.3f %7.3f %8.1f %7.1f %6.3f %6s %3s\n",
                       $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13 }'
    jq -r '"# optimizer step (zinf-optbench, all-nvme state, median of \(.rounds)): \(.seconds * 1000 | round / 1000) s; ideal \(.ideal_seconds * 1000 | round / 1000) s (I/O \(.io_seconds * 1000 | round / 1000) s at read \(.read_gibps * 100 | round / 100) / write \(.write_gibps * 100 | round / 100) GiB/s; update \(.update_seconds * 1000 | round / 1000) s)"' <<<"$opt"
    jq -r '.config as $c | select($c == "all-nvme") | "# dp \(.dp) all-nvme: baseline \(.baseline_s * 1000 | round / 1000) s (resident forward + backward + ideal); its step over the resident step \(.ratio_to_resident * 1000 | round / 1000)"' <<<"$rows"
    jq -r '"# zinf-plan, param=nvme optim=nvme, dp 1, peak \(.peak_tflops * 10000 | round / 10000) TFLOP/s (the resident forward + backward), nvme \(.nvme_read_gbps * 100 | round / 100) / \(.nvme_write_gbps * 100 | round / 100) GB/s, cpu update \(.cpu_update_gbps * 10 | round / 10) GB/s, cpu-gpu \(.cpu_gpu_gbps * 10 | round / 10) GB/s (pinned memcpy)",
           "# efficiency: param \(.efficiency_param * 1000 | round / 1000), optimizer \(.efficiency_optimizer * 1000 | round / 1000), activations \(.efficiency_activation * 1000 | round / 1000); together \(.efficiency * 1000 | round / 1000) (a step of \(.predicted_step_s * 1000 | round / 1000) s); measured \(.measured_efficiency * 1000 | round / 1000)"' <<<"$plan"
fi

missed=$(jq -s 'map(select(.met == false)) | length' <<<"$rows")
if ((missed > 0)); then
    jq -r 'select(.met == false) | "\(.config), dp \(.dp): ratio \(.ratio * 1000 | round / 1000) over target \(.target)"' <<<"$rows" |
        while read -r line; do say "missed: $line"; done
    ((check)) && exit 75
fi
exit 0
