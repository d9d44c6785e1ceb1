#!/usr/bin/env bash
# End-to-end tests of zinf-plan: the zinf.plan/1 record and its figures (§3's
# bytes, §4's arithmetic intensities and efficiencies, the paper's own numbers
# through the CLI), bench input (a recorded zinf-nvmebench run and a fixed
# file, stdin, several files, flags over files), the human report, the
# capacities, the tile factor, and exit codes. Nothing here needs a GPU: every
# run gives --gpu-mem (or checks the no-fit case), and the runs take ms.
source "$(dirname "$0")/lib.bash"
PL=$BIN/zinf-plan
NB=$BIN/zinf-nvmebench
SH=$BIN/zinf-shard
GIB=1073741824
# Capacities that fit gpt2-124m anywhere, so no run depends on this machine.
CAP=(--gpu-mem 80GiB --cpu-mem 512GiB --nvme 4TiB)

# approx A B REL: |A - B| <= REL * |B| (as a jq expression over the input).
approx() { echo "((($1) - ($2)) | fabs) <= ($3) * ((($2) | fabs) + 1e-300)"; }
# Every stdout line of the human report: a '#' line, a "key value" row, or a
# placement table row ("  gpu  cpu  ...").
report_ok() { ! grep -qvE '^(#|[a-z_]+ +[^ ]|  (gpu|cpu|nvme) +(gpu|cpu|nvme) )' <<<"$1"; }

# --- --help names every option
run "$PL" --help
expect_rc 0 "--help exits 0"
missing=()
for opt in --model --dp --nodes --tile --batch --seq --ci --param-dtype --grad-dtype --target --peak-tflops \
  --gpu-mem --gpu-max-block --cpu-mem --nvme --bench --bw-gpu-gpu --bw-cpu-gpu --bw-nvme-read --bw-nvme-write \
  --bw-cpu-update --json --quiet --verbose --version --help; do
  grep -qE -- "(^|[ ,])$opt([ =]|\$)" <<<"$out" || missing+=("$opt")
done
if ((${#missing[@]} == 0)); then pass "--help names every option"; else fail "--help names every option" "missing ${missing[*]}"; fi

# --- --json: one zinf.plan/1 line with every key
KEYS='["params","paper_params","model_state_bytes","activation_checkpoint_bytes","mswm_bytes","awm_bytes",
  "ait_param","ait_optimizer","ait_activation","efficiency_param","efficiency_optimizer","efficiency_activation",
  "placement","tile","fits","placements"]'
run "$PL" --model gpt2-124m "${CAP[@]}" --json -q
expect_rc 0 "gpt2-124m --json exits 0"
check "--json prints one line" test "$(printf '%s\n' "$out" | wc -l)" -eq 1
check "--json -q leaves stderr empty" test -z "$err"
check "schema zinf.plan/1 with every key, placements 9 entries" \
  jq -e --argjson k "$KEYS" '. as $r | .schema == "zinf.plan/1" and all($k[]; . as $key | $r | has($key))
    and (.placements | length) == 9' <<<"$out"
check "the 9 placements are every (param, optim) tier pair" \
  jq -e '[.placements[] | .param + "/" + .optim] | sort
    == ([["gpu","cpu","nvme"][] as $p | ["gpu","cpu","nvme"][] as $o | $p + "/" + $o] | sort)' <<<"$out"
shard_params=$("$SH" layout --model gpt2-124m | head -1 | jq .parameters)
check "zinf-shard says gpt2-124m has 124439808 parameters" test "$shard_params" = 124439808
check "params == 124439808, zinf-shard's exact count" jq -e --argjson n "$shard_params" '.params == $n' <<<"$out"
check "paper_params == 12 nl hd^2 = 12*12*768^2" jq -e '.paper_params == 12 * 12 * 768 * 768' <<<"$out"
check "bf16 model states: 2+2+4+8 = 16 bytes a parameter" \
  jq -e '.model_state_bytes == 16 * .params and .param_bytes == 2 * .params and .grad_bytes == 2 * .params
    and .master_bytes == 4 * .params and .moment_bytes == 8 * .params' <<<"$out"
check "it fits gpt2-124m, all on the GPU, at efficiency 1, tile 1" \
  jq -e '.fits == true and .placement == "param=gpu,optim=gpu" and .efficiency_param == 1
    and .efficiency_optimizer == 1 and .efficiency_activation == 1 and .tile == 1' <<<"$out"

run "$PL" --model gpt2-124m "${CAP[@]}" --param-dtype fp32 --grad-dtype fp32 --json -q
expect_rc 0 "fp32 params and grads exit 0"
check "fp32 model states: 4+4+0+8 = 16 bytes a parameter, no master copy" \
  jq -e '.master_bytes == 0 and .param_bytes == 4 * .params and .model_state_bytes == 16 * .params' <<<"$out"

# paper-1t: hd 25600, nl 128
run "$PL" --model paper-1t --dp 512 --nodes 32 --gpu-mem 32GiB --cpu-mem 1TiB --nvme 28TiB --json -q
expect_rc 0 "paper-1t at dp 512 exits 0"
check "paper-1t: paper_params == 12*128*25600^2, paper_model_state_bytes == 20x" \
  jq -e '.paper_params == 12 * 128 * 25600 * 25600 and .paper_params == 1006632960000
    and .paper_model_state_bytes == 20 * .paper_params' <<<"$out"
check "paper-1t: mswm_bytes == 16 hd^2 (tile 1), ait_activation == 24 hd" \
  jq -e '.mswm_bytes == 16 * 25600 * 25600 and .ait_activation == 24 * 25600' <<<"$out"
check "paper-1t: model_state_bytes_per_rank == ceil(model_state_bytes / 512)" \
  jq -e '.model_state_bytes_per_rank == ((.model_state_bytes / 512) | ceil)' <<<"$out"

# The formulas at a given bsz, seq, ci and tile (gpt2-124m: hd 768, nl 12, heads 12).
run "$PL" --model gpt2-124m "${CAP[@]}" --seq 512 --batch 2 --ci 3 --tile 3 --json -q
expect_rc 0 "gpt2-124m --seq 512 --batch 2 --ci 3 --tile 3 exits 0"
check "seq/batch/ci echoed: 512, 2, 3" jq -e '.seq == 512 and .batch == 2 and .ci == 3' <<<"$out"
check "ait_param == seq bsz == 1024, ait_optimizer == seq bsz / 4 == 256" \
  jq -e '.ait_param == 1024 and .ait_optimizer == 256' <<<"$out"
check "ait_activation == 24 hd ci == 55296" jq -e '.ait_activation == 24 * 768 * 3' <<<"$out"
check "mswm_bytes == 16 hd^2 / tile == 3145728" jq -e '.mswm_bytes == 16 * 768 * 768 / 3 and .mswm_bytes == 3145728' <<<"$out"
check "activation_checkpoint_bytes == 2 bsz seq hd nl / ci == 6291456" \
  jq -e '.activation_checkpoint_bytes == 2 * 2 * 512 * 768 * 12 / 3 and .activation_checkpoint_bytes == 6291456' <<<"$out"
check "awm_bytes == bsz seq ci (16 hd + 2 heads seq) == 75497472" \
  jq -e '.awm_bytes == 2 * 512 * 3 * (16 * 768 + 2 * 12 * 512) and .awm_bytes == 75497472' <<<"$out"
run "$PL" --model gpt2-124m "${CAP[@]}" --seq 1024 --batch 2 --json -q
expect_rc 0 "--seq 1024 --batch 2 exits 0"
check "ait_param == 2048, ait_optimizer == 512, ait_activation == 24 hd = 18432" \
  jq -e '.ait_param == 2048 and .ait_optimizer == 512 and .ait_activation == 18432' <<<"$out"
run "$PL" --model gpt2-124m "${CAP[@]}" -T 256 -B 4 --json -q
expect_rc 0 "-T 256 -B 4 exits 0"
check "-T and -B are --seq and --batch: ait_param == 1024" jq -e '.seq == 256 and .batch == 4 and .ait_param == 1024' <<<"$out"

# --- the paper's §4 figures, through the CLI, at 70 TFLOP/s
S4=(--model gpt2-124m "${CAP[@]}" --peak-tflops 70 --batch 1 --seq 1024 --dp 2 --json -q)
run "$PL" "${S4[@]}" --bw-gpu-gpu 70
expect_rc 0 "§4: dp 2 at --bw-gpu-gpu 70 exits 0"
check "§4: parameters on the GPU, allgathered at 70 GB/s, keep efficiency > 0.5" \
  jq -e '.placement == "param=gpu,optim=gpu" and .efficiency_param > 0.5' <<<"$out"
check "§4: efficiency_param == ait bw / (ait bw + peak) = 1024*70/(1024*70 + 70000)" \
  jq -e "$(approx .efficiency_param '1024 * 70 / (1024 * 70 + 70000)' 1e-12)" <<<"$out"
check "§4: the placement row says the same (bw_param_gbps 70)" \
  jq -e '.placements[] | select(.placement == "param=gpu,optim=gpu") | .efficiency_param > 0.5 and .bw_param_gbps == 70' <<<"$out"
run "$PL" "${S4[@]}" --bw-gpu-gpu 60
expect_rc 0 "§4: dp 2 at --bw-gpu-gpu 60 exits 0"
check "§4: at 60 GB/s efficiency_param < 0.5" \
  jq -e '.placement == "param=gpu,optim=gpu" and .efficiency_param < 0.5' <<<"$out"
run "$PL" --model gpt2-124m "${CAP[@]}" --peak-tflops 70 --batch 2 --seq 1024 --target 0.9 --json -q
expect_rc 0 "§4: --target 0.9 --batch 2 exits 0"
check "§4: the optimizer needs about 1.23 TB/s for 90% at bsz 2 (need_optimizer_gbps ≈ 1230, 1%)" \
  jq -e "$(approx .need_optimizer_gbps 1230 0.01)" <<<"$out"
check "§4: need_param_gbps == 9 peak / (seq bsz) ≈ 307.6" jq -e "$(approx .need_param_gbps '9 * 70000 / 2048' 1e-9)" <<<"$out"

# --- bench input: a fixed recorded file
B1=$TMP/bench1.jsonl
cat >"$B1" <<'EOF'
# zinf-nvmebench --json, recorded by hand

{"schema":"zinf.nvmebench/1","op":"read","gibps":3.0,"block_size":1048576,"queue_depth":8,"queues":1,"engine":"uring"}
   # an indented comment
{"schema":"zinf.nvmebench/1","op":"write","gibps":2.0,"block_size":1048576,"queue_depth":8,"queues":1,"engine":"uring"}
EOF
run "$PL" --model gpt2-124m "${CAP[@]}" --bench "$B1" --json -q
expect_rc 0 "--bench with a fixed recorded file exits 0"
check "nvme_read_gbps == 3.0 GiB/s = 3.221225472 GB/s, write == 2.0 GiB/s" \
  jq -e "$(approx .hardware.nvme_read_gbps '3.0 * 1.073741824' 1e-12) and $(approx .hardware.nvme_write_gbps '2.0 * 1.073741824' 1e-12)" <<<"$out"
check "the other bandwidths stay 0 (unknown)" \
  jq -e '.hardware.gpu_gpu_gbps == 0 and .hardware.cpu_gpu_gbps == 0 and .hardware.cpu_update_gbps == 0' <<<"$out"
run "$PL" --model gpt2-124m "${CAP[@]}" --bench "$B1" --bw-cpu-gpu 100 --bw-cpu-update 100 --json -q
expect_rc 0 "--bench with --bw-cpu-gpu and --bw-cpu-update exits 0"
check "param=nvme,optim=nvme: optimizer at 2/(1/3+1/2) GiB/s (read once, write once), params at 4/(3/3+1/2)" \
  jq -e '.placements[] | select(.placement == "param=nvme,optim=nvme")
    | '"$(approx .bw_optimizer_gbps '2 / (1/3 + 1/2) * 1.073741824' 1e-12)"' and '"$(approx .bw_param_gbps '4 / (3/3 + 1/2) * 1.073741824' 1e-12)" <<<"$out"
run "$PL" --model gpt2-124m "${CAP[@]}" --bench - --json -q <"$B1"
expect_rc 0 "--bench - reads stdin"
check "…with the same figures" \
  jq -e "$(approx .hardware.nvme_read_gbps '3.0 * 1.073741824' 1e-12) and $(approx .hardware.nvme_write_gbps '2.0 * 1.073741824' 1e-12)" <<<"$out"
run "$PL" --model gpt2-124m "${CAP[@]}" --bench "$B1" --bw-nvme-read 5 --json -q
expect_rc 0 "--bench with --bw-nvme-read exits 0"
check "the flag wins over the file: nvme_read_gbps == 5, write still the file's" \
  jq -e ".hardware.nvme_read_gbps == 5 and $(approx .hardware.nvme_write_gbps '2.0 * 1.073741824' 1e-12)" <<<"$out"
B2=$TMP/bench2.jsonl
printf '%s\n' '{"schema":"zinf.nvmebench/1","op":"read","gibps":4.5}' '{"schema":"zinf.nvmebench/1","op":"write","gibps":1.0}' \
  '{"schema":"zinf.something-else/1","x":1}' >"$B2"
run "$PL" --model gpt2-124m "${CAP[@]}" --bench "$B1" --bench "$B2" --json -q
expect_rc 0 "two --bench files exit 0"
check "several files combine by max: read 4.5 (second), write 2.0 (first), in GiB/s" \
  jq -e "$(approx .hardware.nvme_read_gbps '4.5 * 1.073741824' 1e-12) and $(approx .hardware.nvme_write_gbps '2.0 * 1.073741824' 1e-12)" <<<"$out"
run "$PL" --model gpt2-124m "${CAP[@]}" --bench "$B2" --bench "$B1" --json -q
check "…in either order" \
  jq -e "$(approx .hardware.nvme_read_gbps '4.5 * 1.073741824' 1e-12) and $(approx .hardware.nvme_write_gbps '2.0 * 1.073741824' 1e-12)" <<<"$out"

# --- bench input: the other benches' records, fixed
B3=$TMP/bench3.jsonl
printf '%s\n' \
  '{"schema":"zinf.pinstress/1","copies":[{"copy":"h2d","pinned_gibps":20.0},{"copy":"d2h","pinned_gibps":12.0}]}' \
  '{"schema":"zinf.commbench/1","op":"allgather","busbw_gbps":80.0}' \
  '{"schema":"zinf.commbench/1","op":"allgather","busbw_gbps":95.0}' \
  '{"schema":"zinf.commbench/1","op":"allreduce","busbw_gbps":500.0}' \
  '{"schema":"zinf.optbench/1","kind":"update","traffic_gibps":10.0,"xxh3_gibps":6.0}' \
  '{"schema":"zinf.optbench/1","kind":"step","state":"cpu"}' >"$B3"
run "$PL" --model gpt2-124m "${CAP[@]}" --bench "$B3" --json -q
expect_rc 0 "--bench with pinstress, commbench and optbench records exits 0"
check "cpu_gpu = min(best h2d, best d2h) = 12 GiB/s; gpu_gpu = best allgather busbw 95 (allreduce ignored); cpu_update = 10 GiB/s" \
  jq -e "$(approx .hardware.cpu_gpu_gbps '12 * 1.073741824' 1e-12) and .hardware.gpu_gpu_gbps == 95
    and $(approx .hardware.cpu_update_gbps '10 * 1.073741824' 1e-12) and .hardware.nvme_read_gbps == 0
    and $(approx .hardware.cpu_hash_gbps '6 * 1.073741824' 1e-12)" <<<"$out"
run "$PL" --model gpt2-124m "${CAP[@]}" --bench "$B3" --bw-gpu-gpu 7 --bw-cpu-gpu 8 --bw-cpu-update 9 --bw-cpu-hash 5 --json -q
check "--bw-gpu-gpu, --bw-cpu-gpu, --bw-cpu-update and --bw-cpu-hash win over the file" \
  jq -e '.hardware.gpu_gpu_gbps == 7 and .hardware.cpu_gpu_gbps == 8 and .hardware.cpu_update_gbps == 9
    and .hardware.cpu_hash_gbps == 5' <<<"$out"

# --- bench input: a real zinf-nvmebench --json run, recorded
ND=$(mktemp -d /var/tmp/zinf-e2e-plan-XXXXXX)
on_exit "rm -rf '$ND'"
REC=$TMP/nvmebench.jsonl
"$NB" --dir "$ND" --size 32MiB -b 1MiB -d 8 -Q 1 --json -q >"$REC" 2>"$TMP/nb.err"
nb_rc=$?
if [[ $nb_rc == 0 ]] && jq -e -s 'length == 2' "$REC" >/dev/null; then
  pass "zinf-nvmebench records a read and a write"
  run "$PL" --model gpt2-124m "${CAP[@]}" --bench "$REC" --json -q
  expect_rc 0 "--bench with the recorded zinf-nvmebench run exits 0"
  rd=$(jq -s '[.[] | select(.op == "read") | .gibps] | max' "$REC")
  wr=$(jq -s '[.[] | select(.op == "write") | .gibps] | max' "$REC")
  check "nvme_read_gbps and nvme_write_gbps are the recorded gibps x 1.073741824" \
    jq -e "$(approx .hardware.nvme_read_gbps "$rd * 1.073741824" 1e-9) and $(approx .hardware.nvme_write_gbps "$wr * 1.073741824" 1e-9)
      and .hardware.nvme_read_gbps > 0" <<<"$out"
else
  fail "zinf-nvmebench records a read and a write" "exit $nb_rc: $(head -c 600 "$TMP/nb.err")"
fi
check "zinf-nvmebench left nothing in its --dir" empty_dir "$ND"

# --- the human report
run "$PL" --model gpt2-124m "${CAP[@]}" --bench "$B1"
expect_rc 0 "the human report exits 0"
check "every stdout line is a '#' line or a data row" report_ok "$out"
check "rows: params 124439808, paper_params 84934656" \
  bash -c 'grep -qE "^params +124439808( |\$)" <<<"$1" && grep -qE "^paper_params +84934656( |\$)" <<<"$1"' _ "$out"
for key in model_state_bytes activation_checkpoint_bytes mswm_bytes awm_bytes ait_param ait_optimizer ait_activation \
  placement efficiency_param efficiency_optimizer efficiency_activation batch_for_target tile fits; do
  grep -qE "^$key +[^ ]" <<<"$out" || { fail "row $key is there" "$(head -c 300 <<<"$out")" && continue; }
  pass "row $key is there"
done
check "rows: ait_param 1024, ait_optimizer 256, ait_activation 18432, placement param=gpu,optim=gpu, fits yes" \
  bash -c 'grep -qE "^ait_param +1024 " <<<"$1" && grep -qE "^ait_optimizer +256 " <<<"$1" && grep -qE "^ait_activation +18432 " <<<"$1" &&
    grep -qE "^placement +param=gpu,optim=gpu " <<<"$1" && grep -qE "^fits +yes" <<<"$1"' _ "$out"
check "9 placement table rows" test "$(grep -cE '^  (gpu|cpu|nvme) +(gpu|cpu|nvme) ' <<<"$out")" -eq 9
check "the bench's nvme read shows in the header (3.22 GB/s)" contains "$out" "nvme read 3.22 GB/s"
check "without --quiet, the nvme capacity is said on stderr, not stdout" \
  bash -c '[[ $1 == *"nvme capacity"* && $2 != *"nvme capacity"* ]]' _ "$err" "$out"
report=$out
run "$PL" --model gpt2-124m "${CAP[@]}" --bench "$B1" --quiet
expect_rc 0 "--quiet exits 0"
check "--quiet leaves stderr empty" test -z "$err"
check "--quiet prints the same report" test "$out" = "$report"

# --- capacities
run "$PL" --model gpt2-124m --gpu-mem 24GiB --gpu-max-block 3GiB --cpu-mem 100GiB --nvme 2TB --json -q
expect_rc 0 "explicit capacities exit 0"
check "hardware: gpu 24GiB, max block 3GiB, cpu 100GiB, nvme 2TB, in bytes" \
  jq -e --argjson g $GIB '.hardware.gpu_bytes == 24 * $g and .hardware.gpu_max_block_bytes == 3 * $g
    and .hardware.cpu_bytes == 100 * $g and .hardware.nvme_bytes == 2000000000000' <<<"$out"
check "every placement row carries those capacities" \
  jq -e --argjson g $GIB 'all(.placements[]; .gpu.capacity_bytes == 24 * $g and .cpu.capacity_bytes == 100 * $g
    and .nvme.capacity_bytes == 2000000000000)' <<<"$out"
run "$PL" --model gpt2-124m --gpu-mem 24GiB --cpu-mem 100GiB --json -q
check "--gpu-max-block defaults to --gpu-mem" jq -e '.hardware.gpu_max_block_bytes == .hardware.gpu_bytes' <<<"$out"
NV=$TMP/nvme
mkdir -p "$NV"
run "$PL" --model gpt2-124m --gpu-mem 24GiB --cpu-mem 100GiB --nvme "$NV" --json
expect_rc 0 "--nvme with a folder exits 0"
avail=$(df -B1 --output=avail "$NV" | tail -1 | tr -d ' ')
check "--nvme FOLDER gives its free space (df within 1%)" \
  jq -e --argjson a "$avail" "$(approx .hardware.nvme_bytes '$a' 0.01)" <<<"$out"
check "…and says so on stderr" contains "$err" "free space of $NV"

# A model that fits nowhere: paper-1t on one rank with small capacities.
run "$PL" --model paper-1t --dp 1 --gpu-mem 32GiB --cpu-mem 64GiB --nvme 1TiB --json -q
expect_rc 0 "a model that fits nowhere still exits 0"
check "…fits false, placement null, efficiencies null, no placement row fits" \
  jq -e '.fits == false and .placement == null and .efficiency_param == null and .meets_target == false
    and .batch_for_target == null and all(.placements[]; .fits == false)' <<<"$out"
run "$PL" --model paper-1t --dp 1 --gpu-mem 32GiB --cpu-mem 64GiB --nvme 1TiB -q
expect_rc 0 "…and the human report too"
check "…says placement none and fits no" \
  bash -c 'grep -qE "^placement +none " <<<"$1" && grep -qE "^fits +no " <<<"$1"' _ "$out"

# The tile factor: the smallest whose 16 hd^2 bytes fit the largest block.
run "$PL" --model paper-1t --dp 512 --nodes 32 --gpu-mem 32GiB --gpu-max-block 2GiB --cpu-mem 1TiB --nvme 28TiB --json -q
expect_rc 0 "paper-1t with --gpu-max-block 2GiB exits 0"
check "tile 5: 16*25600^2 = 10485760000 bytes over 2GiB blocks" jq -e '.tile == 5' <<<"$out"
run "$PL" --model paper-1t --dp 512 --nodes 32 --gpu-mem 32GiB --gpu-max-block 10485760000 --cpu-mem 1TiB --nvme 28TiB --json -q
check "tile 1 when the block holds exactly 16 hd^2 bytes" jq -e '.tile == 1' <<<"$out"

# --- errors
run "$PL" --model gpt:layers=2,hidden=64,bogus=3 "${CAP[@]}"
expect_rc 64 "a bad model spec exits 64"
check "…naming the spec" contains "$err" "gpt:layers=2,hidden=64,bogus=3"
run "$PL" --model no-such-preset "${CAP[@]}"
expect_rc 64 "an unknown preset exits 64"
check "…naming it" contains "$err" "no-such-preset"
run "$PL" "${CAP[@]}"
expect_rc 64 "no --model exits 64"
for bad in "--target 1.5" "--target 0" "--dp 0" "--dp 2 --nodes 3" "--ci 0" "--ci 13" "--seq 2048" "--batch 0" \
  "--tile 0" "--peak-tflops 0" "--param-dtype fp16" "--frobnicate"; do
  # shellcheck disable=SC2086
  run "$PL" --model gpt2-124m "${CAP[@]}" $bad
  expect_rc 64 "usage error: $bad"
  check "…with nothing on stdout" test -z "$out"
done
run "$PL" --model gpt2-124m "${CAP[@]}" --seq 2048
check "--seq too long names both lengths" bash -c '[[ $1 == *2048*1024* ]]' _ "$err"
run "$PL" --model gpt2-124m --gpu-mem lots --cpu-mem 1GiB --nvme 1GiB
expect_rc 64 "a bad --gpu-mem size exits 64"
check "…naming --gpu-mem" contains "$err" "--gpu-mem"

BAD=$TMP/bad.jsonl
printf '%s\n' '# a comment' '' '{"schema":"zinf.nvmebench/1","op":"read","gibps":1.0}' 'this is not JSON' >"$BAD"
run "$PL" --model gpt2-124m "${CAP[@]}" --bench "$BAD"
expect_rc 65 "a --bench file with a non-JSON line exits 65"
check "…naming file:line ($BAD:4)" contains "$err" "$BAD:4"
check "…with nothing on stdout" test -z "$out"
NOGIB=$TMP/nogib.jsonl
printf '%s\n' '{"schema":"zinf.nvmebench/1","op":"write","gibps":1.0}' '{"schema":"zinf.nvmebench/1","op":"read"}' >"$NOGIB"
run "$PL" --model gpt2-124m "${CAP[@]}" --bench "$NOGIB"
expect_rc 65 "a zinf-nvmebench record without gibps exits 65"
check "…naming file:line and gibps" bash -c '[[ $1 == *"$2:2"*gibps* ]]' _ "$err" "$NOGIB"
run "$PL" --model gpt2-124m "${CAP[@]}" --bench - <<<'{"schema":"zinf.nvmebench/1","op":"trim","gibps":1.0}'
expect_rc 65 "a zinf-nvmebench record of an unknown op (on stdin) exits 65"
check "…naming <stdin>:1" contains "$err" "<stdin>:1"
run "$PL" --model gpt2-124m "${CAP[@]}" --bench - <<<'{"schema":"zinf.pinstress/1","copies":[{"copy":"h2d"}]}'
expect_rc 65 "a zinf-pinstress copy without pinned_gibps exits 65"
check "…naming <stdin>:1 and pinned_gibps" bash -c '[[ $1 == *"<stdin>:1"*pinned_gibps* ]]' _ "$err"
run "$PL" --model gpt2-124m "${CAP[@]}" --bench - <<<'{"op":"read","gibps":1.0}'
expect_rc 65 "a record without a schema exits 65"
check "…naming <stdin>:1" contains "$err" "<stdin>:1"
run "$PL" --model gpt2-124m "${CAP[@]}" --bench "$TMP/no-such.jsonl"
expect_rc 66 "a missing --bench file exits 66"
check "…naming it" contains "$err" "$TMP/no-such.jsonl"

finish
