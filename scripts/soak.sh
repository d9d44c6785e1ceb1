#!/usr/bin/env bash
# soak.sh: zinf-pinstress and a training run with its state on NVMe side by
# side for MINUTES, the training SIGKILLed and resumed again and again.
#
# Usage: scripts/soak.sh [OPTIONS] MINUTES
#
# Three processes run at once for MINUTES minutes:
#   pinstress  zinf-pinstress --seconds MINUTES*60 (2 threads, 64 MiB pool)
#   training   zinf-train on a small model with every state on nvme (every
#              step commits), SIGKILLed after a seeded interval and resumed
#              with --resume, again and again; the last one is killed at the end
#   reference  the same training on a copy of the same initial state, never
#              killed: the losses the killed one must print
# After every kill: zinf-shard verify of the manifest (a failure is
# corruption), the manifest at one step, the last commit (the last step
# printed, or the one after it); each resumed run starts at the step after
# the commit. At the end, every step both runs printed must have the same
# loss, to the bit. The resident memory (VmRSS, from /proc) of each training
# process and of pinstress is sampled every second: per interval, the first
# sample, the one at --warmup seconds (the baseline), the last and the
# largest; an interval fails when its largest is more than --tolerance
# percent or --tolerance-mib above its baseline, whichever is larger.
#
# Options:
#   --seed S            draws the kill intervals (default: drawn, printed)
#   --every MIN-MAX     seconds between kills, uniform (default 60-180, or for
#                       runs under 24 minutes MINUTES*60/8 to MINUTES*60/4)
#   --warmup SEC        seconds into an interval before its baseline (default 5)
#   --tolerance PCT     allowed growth over the baseline, percent (default 5)
#   --tolerance-mib MIB allowed growth over the baseline, MiB (default 4)
#   --model SPEC        the model (default gpt:layers=2,hidden=64,heads=4,vocab=256,seq=64)
#   --dir DIR           folder for the states (default /var/tmp; must take O_DIRECT)
#   --keep              keep the folder (its path is printed)
#   -h, --help          print this help and exit
#
# Environment: ZINF_BIN (default bin/ of this repository).
#
# Output (stdout): one row per interval (lines that are not data start with
# '#'), then a summary: kills, corruption found, steps compared with the
# reference and how many differ, the largest growth, pinstress's status.
# Progress on stderr. Exit status: 0 held; 1 corruption, a loss that
# differs, memory growth past the tolerance, or a process that failed on
# its own; 64 usage; 66 a program or DIR missing; 69 jq missing; 130
# interrupted. On a shared machine run it under nice: nice scripts/soak.sh 30
#
# Example: scripts/soak.sh --seed 1 3
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash"

seed=$((RANDOM * 32768 + RANDOM))
every= warmup=5 tol_pct=5 tol_mib=4 dir=/var/tmp keep=0 minutes=
model=gpt:layers=2,hidden=64,heads=4,vocab=256,seq=64
while [[ $# -gt 0 ]]; do
    case $1 in
        -h | --help) usage; exit 0 ;;
        --seed) need_value "$@"; seed=$2; shift 2 ;;
        --every) need_value "$@"; every=$2; shift 2 ;;
        --warmup) need_value "$@"; warmup=$2; shift 2 ;;
        --tolerance) need_value "$@"; tol_pct=$2; shift 2 ;;
        --tolerance-mib) need_value "$@"; tol_mib=$2; shift 2 ;;
        --model) need_value "$@"; model=$2; shift 2 ;;
        --dir) need_value "$@"; dir=$2; shift 2 ;;
        --keep) keep=1; shift ;;
        -*) usage_error "unknown option $1" ;;
        *) [[ -z $minutes ]] || usage_error "one MINUTES, not '$minutes' and '$1'"; minutes=$1; shift ;;
    esac
done
[[ -n $minutes ]] || usage_error "give MINUTES, how long to soak"
[[ $minutes =~ ^[1-9][0-9]*$ ]] || usage_error "bad MINUTES '$minutes' (whole minutes, 1 or more)"
[[ $seed =~ ^[0-9]+$ ]] || usage_error "bad --seed '$seed'"
for v in warmup tol_pct tol_mib; do [[ ${!v} =~ ^[0-9]+$ ]] || usage_error "bad --${v/_/-} '${!v}' (a whole number)"; done
total=$((minutes * 60))
if [[ -z $every ]]; then
    if ((minutes >= 24)); then every=60-180; else every=$((total / 8))-$((total / 4)); fi
fi
[[ $every =~ ^([0-9]+)-([0-9]+)$ ]] && ((BASH_REMATCH[1] > warmup && BASH_REMATCH[1] <= BASH_REMATCH[2])) ||
    usage_error "bad --every '$every' (MIN-MAX seconds, warmup $warmup < MIN <= MAX)"
every_min=${BASH_REMATCH[1]} every_max=${BASH_REMATCH[2]}
bin=${ZINF_BIN:-$root/bin}
need_programs "$bin" zinf-train zinf-shard zinf-pinstress
make_work "$dir"
((keep)) && say "keeping $work"

# Kill what this script started, by pid, when it ends early.
pids=()
stop_all() { local p; for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done; }
trap 'stop_all; _remove_work' EXIT
trap 'say interrupted; exit 130' INT TERM HUP

RANDOM=$seed
below() { REPLY=$(((RANDOM * 32768 + RANDOM) % $1)); } # in $REPLY; never in $(...)
now_s() { echo "${EPOCHREALTIME%.*}"; }
rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status" 2>/dev/null; }
mib() { awk -v k="$1" 'BEGIN { printf "%.1f", k / 1024 }'; }

POOL=(--pinned 8MiB --pinned-buffer 256KiB)
cat "$root"/man/*.[157] "$root/README.md" >"$work/corpus.txt"
R=(--text "$work/corpus.txt" --steps 100000000 --schedule constant --lr 1e-3 --batch 4 --seq 32 --threads 1
    "${POOL[@]}" --json --quiet)
say "seed $seed; $minutes min; kills every ${every_min}-${every_max} s; model $model; in $work"
"$bin/zinf-shard" layout --model "$model" --param nvme --optim nvme | "$bin/zinf-shard" init "${POOL[@]}" \
    --dir "$work/train" >/dev/null 2>"$work/init.err" || die 74 "zinf-shard init failed: $(cat "$work/init.err")"
"$bin/zinf-shard" layout --model "$model" --param nvme --optim nvme | "$bin/zinf-shard" init "${POOL[@]}" \
    --dir "$work/ref" >/dev/null 2>>"$work/init.err" || die 74 "zinf-shard init failed: $(cat "$work/init.err")"

start=$(now_s)
end=$((start + total))
"$bin/zinf-pinstress" --seconds "${total}s" --threads 2 --pinned 64MiB --pinned-buffer 1MiB --no-copy --json \
    --seed "$seed" >"$work/pinstress.json" 2>"$work/pinstress.err" &
pin=$!
pids+=("$pin")
"$bin/zinf-train" --manifest "$work/ref/manifest.jsonl" "${R[@]}" >"$work/ref.jsonl" 2>"$work/ref.err" &
ref=$!
pids+=("$ref")

problems=() corrupt=0 kills=0 grown=0
pin_samples=()
echo "# interval  from_s  to_s  steps  lines  manifest_step  verify  rss_first_mib  rss_base_mib  rss_last_mib  rss_max_mib  growth_mib"
i=0 resume=() printed=0
: >"$work/train.pairs"
while (($(now_s) < end)); do
    i=$((i + 1))
    below $((every_max - every_min + 1))
    interval=$((every_min + REPLY))
    seg_start=$(now_s)
    seg_end=$((seg_start + interval))
    ((seg_end > end)) && seg_end=$end
    "$bin/zinf-train" --manifest "$work/train/manifest.jsonl" "${R[@]}" "${resume[@]}" \
        >"$work/seg$i.jsonl" 2>"$work/seg$i.err" &
    tr=$!
    pids+=("$tr")
    first='' base='' last='' max=0 died=0
    while (($(now_s) < seg_end)); do
        if ! kill -0 "$tr" 2>/dev/null; then died=1; break; fi
        r=$(rss_kib "$tr")
        if [[ -n $r ]]; then
            [[ -z $first ]] && first=$r
            (($(now_s) - seg_start >= warmup)) && [[ -z $base ]] && base=$r
            [[ -n $base ]] && ((r > max)) && max=$r
            last=$r
        fi
        p=$(rss_kib "$pin")
        [[ -n $p ]] && pin_samples+=("$(($(now_s) - start)) $p")
        sleep 1
    done
    kill -KILL "$tr" 2>/dev/null
    wait "$tr" 2>/dev/null
    trc=$?
    kills=$((kills + 1))
    ((died)) && problems+=("interval $i: the training ended by itself (exit $trc): $(tail -n 1 "$work/seg$i.err")")
    # What the kill left: one step, the last commit, and it verifies.
    jq -R -r 'fromjson? | "\(.step) \(.loss)"' "$work/seg$i.jsonl" >"$work/seg$i.pairs"
    cat "$work/seg$i.pairs" >>"$work/train.pairs"
    lines=$(wc -l <"$work/seg$i.pairs")
    n=$(tail -n 1 "$work/seg$i.pairs" | cut -d ' ' -f 1)
    n=${n:-$printed}
    first_step=$(head -n 1 "$work/seg$i.pairs" | cut -d ' ' -f 1)
    ((lines == 0)) || [[ $first_step == $((${k:-0} + 1)) ]] ||
        problems+=("interval $i: the resumed run began at step $first_step, not $((${k:-0} + 1))")
    k=$(jq -s -r '[.[] | select(has("schema") | not) | .step // 0] | unique | if length == 1 then .[0] else "mixed" end' \
        "$work/train/manifest.jsonl" 2>/dev/null)
    if "$bin/zinf-shard" verify "${POOL[@]}" -m "$work/train/manifest.jsonl" >/dev/null 2>"$work/verify$i.err"; then
        verdict=ok
    else
        verdict=FAILED
        corrupt=$((corrupt + 1))
        problems+=("interval $i: zinf-shard verify failed: $(tail -n 1 "$work/verify$i.err")")
    fi
    if [[ ! $k =~ ^[0-9]+$ ]] || ((k < n || k > n + 1)); then
        corrupt=$((corrupt + 1))
        problems+=("interval $i: the manifest is at step '$k' after step $n was printed: not the last commit")
        k=${n:-0}
    fi
    printed=$n
    growth=$((max > 0 && base > 0 ? max - base : 0))
    allowed=$((tol_mib * 1024))
    ((base * tol_pct / 100 > allowed)) && allowed=$((base * tol_pct / 100))
    if [[ -n $base ]] && ((growth > allowed)); then
        grown=$((grown + 1))
        problems+=("interval $i: resident memory grew $(mib "$growth") MiB over its baseline $(mib "$base") MiB")
    fi
    printf '%-10s %6d %5d %6d %6d %14s %7s %14s %13s %13s %12s %11s\n' "$i" $((seg_start - start)) \
        $(($(now_s) - start)) "$n" "$lines" "$k" "$verdict" "$(mib "${first:-0}")" "$(mib "${base:-0}")" \
        "$(mib "${last:-0}")" "$(mib "$max")" "$(mib "$growth")"
    say "interval $i: killed at step $n, committed at $k, verify $verdict, rss $(mib "${base:-0}") -> $(mib "${last:-0}") MiB"
    resume=(--resume)
done
# The reference stops; pinstress ends on its own.
kill -KILL "$ref" 2>/dev/null
wait "$ref" 2>/dev/null
wait "$pin"
pin_rc=$?
((pin_rc == 0)) || problems+=("zinf-pinstress exited $pin_rc: $(tail -n 1 "$work/pinstress.err")")
# pinstress's resident memory: baseline at --warmup seconds, then the largest.
pin_base='' pin_max=0 pin_first='' pin_last=''
for s in "${pin_samples[@]}"; do
    read -r t v <<<"$s"
    [[ -z $pin_first ]] && pin_first=$v
    ((t >= warmup)) && [[ -z $pin_base ]] && pin_base=$v
    [[ -n $pin_base ]] && ((v > pin_max)) && pin_max=$v
    pin_last=$v
done
pin_growth=$((pin_max > 0 && ${pin_base:-0} > 0 ? pin_max - pin_base : 0))
pin_allowed=$((tol_mib * 1024))
((${pin_base:-0} * tol_pct / 100 > pin_allowed)) && pin_allowed=$((pin_base * tol_pct / 100))
((pin_growth > pin_allowed)) && { grown=$((grown + 1)); problems+=("zinf-pinstress's resident memory grew $(mib "$pin_growth") MiB"); }
# The losses: every step both printed, to the bit.
jq -R -r 'fromjson? | "\(.step) \(.loss)"' "$work/ref.jsonl" >"$work/ref.pairs"
read -r compared differ first_diff < <(awk 'NR == FNR { ref[$1] = $2; next }
    ($1 in ref) { c++; if (ref[$1] != $2 && !d++) f = "step " $1 ": " $2 ", never killed " ref[$1] }
    END { print c + 0, d + 0, f }' "$work/ref.pairs" "$work/train.pairs")
((differ == 0)) || problems+=("$differ of $compared steps have another loss than the never-killed run's ($first_diff)")
((compared > 0)) || problems+=("no step to compare with the never-killed run")
echo "# soak: $minutes min, seed $seed, model $model, kills every ${every_min}-${every_max} s"
echo "# kills $kills, corruption found $corrupt (verify after each kill, manifest at the last commit)"
echo "# losses: $compared steps compared with the never-killed run ($(wc -l <"$work/ref.pairs") steps), $differ differ"
echo "# training resident memory: tolerance max(${tol_pct}%, ${tol_mib} MiB) over each interval's baseline at ${warmup} s; $grown over"
echo "# pinstress: exit $pin_rc; resident $(mib "${pin_first:-0}") MiB first, $(mib "${pin_base:-0}") at ${warmup} s, $(mib "${pin_last:-0}") last, $(mib "$pin_max") max ($(mib "$pin_growth") MiB growth)"
if ((${#problems[@]})); then
    for p in "${problems[@]}"; do echo "# FAILED: $p"; done
    echo "# result: FAILED"
    exit 1
fi
echo "# result: held"
