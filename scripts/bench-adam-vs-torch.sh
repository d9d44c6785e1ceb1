#!/usr/bin/env bash
# zinf's CPU AdamW against PyTorch's (torch.optim.AdamW, foreach=True, fp32,
# Debian's python3-torch) on the same number of parameters in one run: each
# side's median seconds per step over K timed steps after one warm-up,
# parameters per second, and the ratio zinf/torch. For zinf also the fraction
# of the memory-bandwidth bound (the larger of a copy and of the update's own
# streams with no arithmetic, both measured by zinf-optbench in the same run).
#
#   scripts/bench-adam-vs-torch.sh [PARAMS] [--steps K] [--min-ratio R]
#
# PARAMS: an integer or one with a decimal suffix, k/M/G (default 50M).
# Prints a table (# on non-data lines); exits 75 when --min-ratio is given and
# the zinf/torch ratio is below it. Environment: ZINF_OPTBENCH (default
# bin/zinf-optbench), ZINF_NO_BUILD=1 skips building it, PYTHON (default: the
# first of python3 and /usr/bin/python3 that imports torch).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
usage() { echo "usage: $0 [PARAMS] [--steps K] [--min-ratio R]   (PARAMS like 50M, 100M, 1G, 2000000)" >&2; exit 64; }
params=50M steps=5 min_ratio='' got_params=0
while (($#)); do
  case $1 in
    --steps) (($# >= 2)) || usage; steps=$2; shift 2 ;;
    --min-ratio) (($# >= 2)) || usage; min_ratio=$2; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "bench-adam-vs-torch: unknown option $1" >&2; usage ;;
    *) ((got_params)) && usage; params=$1 got_params=1; shift ;;
  esac
done
[[ $params =~ ^([0-9]+)([kKmMgG]?)$ ]] || { echo "bench-adam-vs-torch: bad PARAMS '$params'" >&2; usage; }
case ${BASH_REMATCH[2]} in
  k|K) mult=1000 ;; m|M) mult=1000000 ;; g|G) mult=1000000000 ;; *) mult=1 ;;
esac
n=$((10#${BASH_REMATCH[1]} * mult))
[[ $steps =~ ^[1-9][0-9]*$ ]] || { echo "bench-adam-vs-torch: bad --steps '$steps'" >&2; usage; }
[[ -z $min_ratio || $min_ratio =~ ^[0-9]*\.?[0-9]+$ ]] || { echo "bench-adam-vs-torch: bad --min-ratio '$min_ratio'" >&2; usage; }
((n >= 8)) || { echo "bench-adam-vs-torch: PARAMS must be at least 8" >&2; usage; }

command -v jq >/dev/null || { echo "bench-adam-vs-torch: needs jq (apt-get install jq)" >&2; exit 69; }
py=${PYTHON:-}
if [[ -z $py ]]; then
  for c in python3 /usr/bin/python3; do
    command -v "$c" >/dev/null && "$c" -c 'import torch' 2>/dev/null && { py=$c; break; }
  done
fi
if [[ -z $py ]] || ! "$py" -c 'import torch' 2>/dev/null; then
  echo "bench-adam-vs-torch: install Debian's python3-torch (apt-get install python3-torch)" >&2; exit 66
fi
zb=${ZINF_OPTBENCH:-$root/bin/zinf-optbench}
[[ ${ZINF_NO_BUILD:-0} == 1 ]] || make -C "$root" --no-print-directory -s bin/zinf-optbench >&2
[[ -x $zb ]] || { echo "bench-adam-vs-torch: $zb is not executable (build first: make -C $root bin/zinf-optbench)" >&2; exit 66; }

echo "# torch: $n parameters, $steps steps" >&2
torch_json=$("$py" - "$n" "$steps" <<'EOF'
import json, os, statistics, sys, time
import torch
n, steps = int(sys.argv[1]), int(sys.argv[2])
torch.set_num_threads(os.cpu_count())
torch.manual_seed(0)
k = 8
sizes = [n // k] * (k - 1) + [n - (n // k) * (k - 1)]
params = []
for s in sizes:
    p = torch.nn.Parameter(torch.randn(s, dtype=torch.float32))
    p.grad = torch.randn(s, dtype=torch.float32) * 1e-2
    params.append(p)
opt = torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                        weight_decay=0.01, foreach=True)
opt.step()  # warm-up: allocates exp_avg and exp_avg_sq
times = []
for _ in range(steps):
    t0 = time.perf_counter()
    opt.step()
    times.append(time.perf_counter() - t0)
mid = statistics.median(times)  # the statistic zinf-optbench reports
print(json.dumps({"impl": "torch", "version": torch.__version__, "params": n,
                  "threads": torch.get_num_threads(), "seconds": mid,
                  "params_per_s": n / mid}))
EOF
)
echo "# zinf: $zb --params $n --state update --steps $steps --json" >&2
zinf_json=$("$zb" --params "$n" --state update --steps "$steps" --json | jq -c 'select(.kind == "update")' | tail -n 1)
[[ -n $zinf_json ]] || { echo "bench-adam-vs-torch: no \"kind\":\"update\" record from $zb" >&2; exit 70; }
zp=$(jq '.params' <<<"$zinf_json")
((zp == n)) || echo "bench-adam-vs-torch: warning: zinf-optbench reports $zp parameters, asked for $n" >&2

echo "# $(nproc) cores, $(uptime | sed 's/.*load/load/')"
echo "# impl params threads seconds_per_step Mparams_per_s build"
jq -r '"torch \(.params) \(.threads) \(.seconds) \(.params_per_s / 1e6) \(.version)"' <<<"$torch_json" |
  awk '{ printf "%s %d %d %.6f %.1f %s\n", $1, $2, $3, $4, $5, $6 }'
jq -r '"zinf \(.params) \(.threads) \(.seconds) \(.params_per_s / 1e6) \(.isa)"' <<<"$zinf_json" |
  awk '{ printf "%s %d %d %.6f %.1f %s\n", $1, $2, $3, $4, $5, $6 }'
ratio=$(awk -v z="$(jq '.params_per_s' <<<"$zinf_json")" -v t="$(jq '.params_per_s' <<<"$torch_json")" \
  'BEGIN { printf "%.2f", z / t }')
echo "# ratio zinf/torch: $ratio"
jq -r '"\(.bound_fraction) \(.traffic_gibps) \(.copy_gibps) \(.streams_gibps)"' <<<"$zinf_json" |
  awk '{ printf "# zinf: %.1f%% of the memory-bandwidth bound (traffic %.2f GiB/s; copy %.2f, streams %.2f GiB/s)\n", $1 * 100, $2, $3, $4 }'
if [[ -n $min_ratio ]] && awk -v r="$ratio" -v m="$min_ratio" 'BEGIN { exit !(r < m) }'; then
  echo "bench-adam-vs-torch: ratio zinf/torch $ratio is below --min-ratio $min_ratio" >&2
  exit 75
fi
