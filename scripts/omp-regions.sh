#!/usr/bin/env bash
# One training step of `zinf-train --bench` on the cpu backend, taken apart by
# OpenMP region in CPU time (scripts/omp-regions.c): for each model, a run of
# one timed step and a run of three, the difference halved (the warm-up, the
# weights' fill and the sgemm peer cancel out), so that two models, or two
# builds, can be compared where other jobs make wall-clock figures useless.
# The load still moves CPU time (caches, memory bandwidth): by up to 12%
# between runs of the same code on the shared 2-vCPU VM (BENCHMARKS.md).
#
#   scripts/omp-regions.sh [--bin PATH] [--top N] MODEL... [-- BENCH-ARGS...]
#
#   --bin PATH   the zinf-train to run (default bin/zinf-train)
#   --top N      how many region functions to list per model (default 12)
#   BENCH-ARGS   more zinf-train options (default: --batch 4 --seq 64)
#
# Prints per model: regions a step; the critical path (each region's slowest
# thread, summed); all threads' time in regions; the time between regions
# (one thread); critical + between, the step on an idle machine less the
# barriers' own cost; then the region functions by critical path.
set -euo pipefail
bin=bin/zinf-train top=12 models=() extra=()
while (($#)); do
    case $1 in
        --bin) bin=$2; shift 2 ;;
        --top) top=$2; shift 2 ;;
        --) shift; extra=("$@"); break ;;
        -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d;s/^# \{0,1\}//'; exit 0 ;;
        -*) echo "omp-regions.sh: unknown option $1" >&2; exit 64 ;;
        *) models+=("$1"); shift ;;
    esac
done
((${#models[@]})) || { echo "omp-regions.sh: name at least one model" >&2; exit 64; }
((${#extra[@]})) || extra=(--batch 4 --seq 64)
dir=$(mktemp -d) && trap 'rm -rf "$dir"' EXIT
cc -O2 -shared -fPIC -fopenmp -o "$dir/omp-regions.so" "$(dirname "$0")/omp-regions.c" -ldl
for m in "${models[@]}"; do
    for n in 1 3; do
        OMP_REGIONS_OUT="$dir/$n.txt" LD_PRELOAD="$dir/omp-regions.so" \
            "$bin" --bench --bench-model "$m" "${extra[@]}" --bench-steps "$n" --bench-gemm 256 > "$dir/$n.out"
    done
    python3 - "$bin" "$dir" "$m" "$top" <<'PY'
import bisect, subprocess, sys
binary, d, model, top = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
def load(n):
    fns, serial = {}, None
    for line in open(f"{d}/{n}.txt"):
        p = line.split()
        if p[0] == "region":
            fns[(p[1], p[6])] = (int(p[2]), int(p[3]), float(p[4]), float(p[5]))
        elif p[0] == "serial":
            serial = (int(p[1]), float(p[2]))
    return fns, serial
(f1, s1), (f3, s3) = load(1), load(3)
syms = {}
def name(off, obj):
    if obj not in syms:
        out = subprocess.run(["nm", "-C", obj], capture_output=True, text=True).stdout.splitlines()
        table = sorted((int(p[0], 16), p[2]) for p in (l.split(None, 2) for l in out) if len(p) == 3 and p[1] in "tTwW")
        syms[obj] = ([a for a, _ in table], [s for _, s in table])
    addrs, names = syms[obj]
    i = bisect.bisect_right(addrs, int(off, 16)) - 1
    return names[i] if i >= 0 else f"{obj}+0x{off}"
rows = []
for k, v in f3.items():
    a = f1.get(k, (0, 0, 0.0, 0.0))
    n = (v[0] - a[0]) / 2
    if n > 0:
        rows.append(((v[2] - a[2]) / 2, (v[3] - a[3]) / 2, n, v[1], name(*k)))
crit = sum(r[0] for r in rows); busy = sum(r[1] for r in rows)
regions = (s3[0] - s1[0]) / 2; between = (s3[1] - s1[1]) / 2
print(f"{model}: a step: {regions:.0f} regions, critical path {crit:.3f} s, all threads in regions {busy:.3f} s, "
      f"between regions {between:.3f} s; critical + between {crit + between:.3f} s")
for c, b, n, team, nm in sorted(rows, reverse=True)[:top]:
    print(f"  {c:8.4f} critical {b:8.4f} all  {n:5.0f} x team {team}  {nm[:100]}")
PY
done
