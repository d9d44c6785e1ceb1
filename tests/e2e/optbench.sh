#!/usr/bin/env bash
# End-to-end tests of zinf-optbench: the JSON Lines and table contracts, the
# figures' consistency, the scratch folder (removed, or kept with manifests
# that zinf-shard verify accepts), --state, --isa and ZINF_SIMD, the
# threshold, and exit codes. Every run is tiny (--params 2M --steps 1).
source "$(dirname "$0")/lib.bash"
OB=$BIN/zinf-optbench
SHARD=$BIN/zinf-shard
D=$TMP/d
mkdir -p "$D"
# A small pinned pool: the default 256MiB, locked and faulted in, was most
# of a tiny run's CPU (2.2 CPU-s a run against 0.6).
TINY=(--params 2M --steps 1 --dir "$D" --pinned 16MiB --pinned-buffer 1MiB)

# The data rows of a table (every line without '#').
rows() { grep -v '^#' <<<"$1"; }
# Every stdout line is a '#' line or a data row starting with update or step.
table_ok() { ! grep -qvE '^(#|(update|step) )' <<<"$1"; }

# --- --help names every option
run "$OB" --help
expect_rc 0 "--help exits 0"
missing=()
for opt in --params --model --state --dir --steps --threads --isa --param-dtype --grad-dtype --config \
  --engine --block-size --queue-depth --queues --pinned --pinned-buffer --max-ideal-ratio --keep --json \
  --quiet --verbose --version --help; do
  grep -qE -- "(^|[ ,])$opt([ =]|\$)" <<<"$out" || missing+=("$opt")
done
if ((${#missing[@]} == 0)); then pass "--help names every option"; else fail "--help names every option" "missing ${missing[*]}"; fi

# --- bad command lines
for bad in "--params bogus" "--params 0" "--state x" "--steps 0" "--isa foo" "--params 2M --model gpt2-124m"; do
  # shellcheck disable=SC2086
  run "$OB" --dir "$D" $bad
  expect_rc 64 "usage error: $bad"
done
check "a usage error points at --help" contains "$err" "--help"
ZINF_SIMD=bogus run "$OB" "${TINY[@]}" --state cpu
expect_rc 64 "ZINF_SIMD=bogus is a usage error"
check "…naming the instruction set" contains "$err" "bogus"
check "nothing is left after the usage errors" empty_dir "$D"

# --- JSON Lines: update, cpu step, nvme step
run "$OB" "${TINY[@]}" --json
expect_rc 0 "a tiny --json run exits 0"
check "it prints 3 records" test "$(printf '%s\n' "$out" | wc -l)" -eq 3
check "kind/state: update cpu, step cpu, step nvme; schema zinf.optbench/1" \
  jq -e -s '[.[] | [.kind, .state]] == [["update","cpu"],["step","cpu"],["step","nvme"]]
    and all(.[]; .schema == "zinf.optbench/1")' <<<"$out"
check "params equal across the records and > 1.5e6" \
  jq -e -s '([.[].params] | unique | length) == 1 and .[0].params > 1500000' <<<"$out"
check "seconds > 0 and params_per_s = params / seconds > 0 in every record" \
  jq -e -s 'all(.[]; .seconds > 0 and .params_per_s > 0
    and ((.params / .seconds) - .params_per_s | fabs) <= 1e-9 * .params_per_s)' <<<"$out"
check "the update: bound_fraction > 0, bytes_per_param 28 (fp32), traffic = 28 * params / seconds / 2^30" \
  jq -e -s '.[0] | .bound_fraction > 0 and .bytes_per_param == 28 and .copy_gibps > 0 and .streams_gibps > 0
    and ((28 * .params / .seconds / 1073741824) - .traffic_gibps | fabs) <= 1e-9 * .traffic_gibps' <<<"$out"
check "the nvme step: ideal_seconds, read_gibps, write_gibps > 0, bytes_read > bytes_written > 0" \
  jq -e -s '.[2] | .ideal_seconds > 0 and .read_gibps > 0 and .write_gibps > 0
    and .bytes_read > .bytes_written and .bytes_written > 0 and .chunk_bytes > 0' <<<"$out"
check "the nvme step: ratio_to_ideal = seconds / ideal_seconds" \
  jq -e -s '.[2] | ((.seconds / .ideal_seconds) - .ratio_to_ideal | fabs) <= 1e-9 * .ratio_to_ideal' <<<"$out"
check "the scratch folder is removed (--dir left empty)" empty_dir "$D"

# --- --keep: the state and its manifests stay, at step 2 (1 warm-up + 1 timed)
run "$OB" "${TINY[@]}" --json --keep
expect_rc 0 "--keep exits 0"
kept=("$D"/zinf-optbench.*)
check "--keep leaves one scratch folder in --dir" test "${#kept[@]}" -eq 1 -a -d "${kept[0]}"
check "…and says where on stderr" contains "$err" "${kept[0]}"
for t in cpu nvme; do
  mf=${kept[0]}/$t/manifest.jsonl
  check "--keep: $t/manifest.jsonl is there" test -f "$mf"
  check "--keep: every $t record is at step 2" \
    jq -e -s '[.[] | select(has("schema") | not)] | length > 0 and all(.[]; .step == 2)' "$mf"
  run "$SHARD" verify -m "$mf"
  expect_rc 0 "zinf-shard verify accepts the kept $t state"
done
rm -rf "${kept[@]}"

# --- the human table
run "$OB" "${TINY[@]}"
expect_rc 0 "a table run exits 0"
check "every non-data line starts with #" table_ok "$out"
check "the table has 3 data rows: update cpu, step cpu, step nvme" \
  test "$(rows "$out" | awk '{ printf "%s%s/%s", sep, $1, $2; sep = " " }')" = "update/cpu step/cpu step/nvme"
check "the nvme row gives its ideal" bash -c '[[ $(grep "^step *nvme" <<<"$1") == *"ideal "*" s = max(I/O"* ]]' _ "$out"

# --- --state update: the update alone, no scratch folder
run "$OB" "${TINY[@]}" --state update
expect_rc 0 "--state update exits 0"
check "--state update prints only the update row" test "$(rows "$out" | awk '{ print $1 "/" $2 }')" = "update/cpu"
check "--state update makes no scratch folder" empty_dir "$D"

# --- the threshold
run "$OB" "${TINY[@]}" --state nvme --max-ideal-ratio 0.001
expect_rc 75 "an unmet --max-ideal-ratio exits 75"
check "…after printing the table" test "$(rows "$out" | wc -l)" -eq 2
check "…naming the option" contains "$err" "--max-ideal-ratio"
check "…and removing the scratch folder" empty_dir "$D"

# --- instruction sets
run "$OB" "${TINY[@]}" --state cpu --isa portable --json
expect_rc 0 "--isa portable runs"
check "…and the records say portable" jq -e -s 'length == 2 and all(.[]; .isa == "portable")' <<<"$out"
for isa in avx2 avx512; do
  flags=$isa
  [[ $isa == avx512 ]] && flags="avx512f avx512bw"
  have=1
  for f in $flags; do grep -qw "$f" /proc/cpuinfo || have=0; done
  if ((have)); then
    run "$OB" "${TINY[@]}" --state cpu --isa "$isa" --json
    expect_rc 0 "--isa $isa runs"
    check "…and the records say $isa" jq -e -s --arg i "$isa" 'length == 2 and all(.[]; .isa == $i)' <<<"$out"
  else
    skip "--isa $isa" "this CPU lacks $flags"
  fi
done
ZINF_SIMD=portable run "$OB" "${TINY[@]}" --state cpu --json
expect_rc 0 "ZINF_SIMD=portable runs"
check "…and --isa auto follows it" jq -e -s 'all(.[]; .isa == "portable")' <<<"$out"

# --- bf16 parameters and gradients: 24 + 2 + 2 bytes per parameter
run "$OB" "${TINY[@]}" --param-dtype bf16 --grad-dtype bf16 --json
expect_rc 0 "bf16 parameters and gradients run"
check "…3 records with bytes_per_param 28 and both dtypes bf16" \
  jq -e -s 'length == 3 and .[0].bytes_per_param == 28
    and all(.[]; .param_dtype == "bf16" and .grad_dtype == "bf16")' <<<"$out"

# --- the scratch folder cannot be made
touch "$TMP/plain"
run "$OB" --params 2M --steps 1 --dir "$TMP/plain/sub"
expect_rc 73 "--dir under a regular file exits 73"
run "$OB" --params 2M --steps 1 --dir "$TMP/no/such/dir"
expect_rc 73 "a missing --dir exits 73"

finish
