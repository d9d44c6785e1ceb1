# One line of a `zinf-train --bench --profile --json` run's records, for
# scripts/gpu-check.sh's summary.txt (jq -r -s -f scripts/profile-summary.jq):
#   S s/step, R TFLOP/s = P% of PEER (G TFLOP/s) | K1 s1%, K2 s2%, K3 s3%, K4 s4% | gemm: Q% of its shapes alone
# the step's model FLOP/s as a share of the GEMM rate measured in the same run
# (the bf16 GEMM under bf16 on cuda, else the fp32 one), the four rows that
# took most of the step (kernels, copies and the time in none, "other"), and
# the GEMM's achieved rate over the rate of its costliest shapes timed alone
# (the seconds their calls would take at each shape's alone rate over the
# seconds they took). Fails (no output, jq's error) on records without a bench
# record or a profile.
def pct: . * 100 | round | tostring + "%";
def tf: . / 1e12 | . * 100 | round | . / 100 | tostring;
(map(select(.schema == "zinf.train-bench/1")) | first) as $b
| (map(select(.schema == "zinf.profile/1" and .kind == "step")) | first) as $h
| if $b == null or $h == null then error("no bench record or no profile step record") else . end
| ($b | if .ratio_peer == "bf16_gemm" then .bf16_gemm_flops_per_s else .sgemm_flops_per_s end) as $peer
| [map(select(.schema == "zinf.profile/1" and (.kind == "kernel" or .kind == "copy" or .kind == "other")))
   | sort_by(-.seconds) | .[:4][] | "\(.name) \(.share | pct)"] as $top
| [map(select(.schema == "zinf.profile/1" and .kind == "gemm_shape" and (.alone_flops_per_s // 0) > 0))[]] as $shapes
| (if ($shapes | length) > 0
   then " | gemm: " + (($shapes | map(.flops / .alone_flops_per_s) | add) / ($shapes | map(.seconds) | add) | pct)
        + " of its \($shapes | length) costliest shapes alone"
   else "" end) as $gemm
| "\($b.step_s * 1000 | round / 1000) s/step, \($b.flops_per_s | tf) TFLOP/s = \($b.ratio | pct) of \($b.ratio_peer) (\($peer | tf) TFLOP/s) | \($top | join(", "))\($gemm)"
