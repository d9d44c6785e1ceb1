#!/usr/bin/env bash
# scripts/gpu-check.sh --from on a host without a GPU (issue 47, finding 5),
# in seconds: the script runs in a tree of its own whose Makefile builds
# nothing and which has no GPU suites, with an nvidia-smi on PATH that finds
# no driver (as on a GPU host whose driver is gone) and a bundle of no
# packages. Probe: --from ... --quick on a machine without a GPU ended
# "4 passed, 0 failed, 8 skipped ... PASS", exit 0, so `gpu-check.sh &&
# deploy` passed a host whose GPU is missing; a bundle whose MANIFEST lists
# no packages stopped with exit 1 after "bundle: pass" and wrote no summary
# (grep | awk under pipefail). Now "no GPU" is its own verdict (exit 3), and
# the summary is written whatever happens.
source "$(dirname "$0")/lib.bash"
G=$TMP/tree
mkdir -p "$G/scripts" "$G/fakebin" "$TMP/bundle"
cp "$ROOT/scripts/gpu-check.sh" "$ROOT/scripts/lib.bash" "$G/scripts/"
printf 'TESTS :=\nall:\n\t@echo nothing to build\nbuild/tests/%%:\n\t@true\n' >"$G/Makefile"
cat >"$G/fakebin/nvidia-smi" <<'EOF'
#!/bin/sh
echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver." >&2
exit 9
EOF
chmod +x "$G/fakebin/nvidia-smi"
mkdir "$TMP/empty"
tar -C "$TMP/empty" -cJf "$TMP/bundle/deps.tar.xz" .
manifest() { # the bundle's MANIFEST with the package lines given
  {
    echo "# zinf GPU-check bundle (a test's)"
    echo "format 1"
    printf '%s\n' "$@"
    echo "archive deps.tar.xz $(stat -c %s "$TMP/bundle/deps.tar.xz") $(sha256sum "$TMP/bundle/deps.tar.xz" | cut -d' ' -f1)"
  } >"$TMP/bundle/MANIFEST"
}
# run_check OUT BINDIR [OPTION...]: gpu-check --from the bundle with BINDIR
# first on PATH, its status in $rc and its last lines in $err.
run_check() {
  local out=$1 bin=$2
  shift 2
  PATH="$bin:$PATH" timeout 300 bash "$G/scripts/gpu-check.sh" --from "$TMP/bundle" --out "$out" \
    --cpu-suites none --jobs 1 "$@" >"$out.log" 2>&1
  rc=$?
  err=$(tail -n 5 "$out.log")
}
gpu_check() { run_check "$1" "$G/fakebin" --quick; } # OUT: the tests only, no driver
# steps DIR PREFIX STATUS [REASON]: how many steps of DIR/results.jsonl are
# named PREFIX..., ended STATUS, with a reason that starts REASON.
steps() {
  jq -s --arg p "$2" --arg s "$3" --arg r "${4:-}" \
    '[.[] | select((.name | startswith($p)) and .status == $s and ((.reason // "") | startswith($r)))] | length' "$1/results.jsonl"
}
three_files() { [[ -s $1/log.txt && -s $1/results.jsonl && -s $1/summary.txt ]]; }

manifest
gpu_check "$TMP/r0"
expect_rc 3 "a bundle that lists no packages, no GPU: exit 3 (NO GPU), not 1 after 'bundle: pass'"
check "…with its three files" three_files "$TMP/r0"
manifest "package libfoo-dev 1.0 0000"
gpu_check "$TMP/r1"
expect_rc 3 "--quick on a host without a GPU: exit 3, not 0, so gpu-check.sh && deploy does not deploy"
check "…and the summary's verdict says NO GPU, with why" bash -c \
  'tail -n 1 "$1/summary.txt" | grep -q "0 failed.*: NO GPU (no GPU: nvidia-smi answers: NVIDIA-SMI has failed"' _ "$TMP/r1"
check "…no step failed" test "$(steps "$TMP/r1" "" fail)" = 0
# Without --quick and without a GPU: the step profiles are skipped, each
# with the reason, and the verdict is still NO GPU.
run_check "$TMP/r3" "$G/fakebin"
expect_rc 3 "the whole check on a host without a GPU: exit 3"
check "…the six step profiles skipped for want of a GPU" test "$(steps "$TMP/r3" profile/ skip "no GPU")" = 6
check "…the eight ZeRO-Infinity runs skipped for want of a GPU" test "$(steps "$TMP/r3" infinity/ skip "no GPU")" = 8
# Those runs re-tier one state with jq instead of writing it again per
# placement: the layout's files and offsets do not depend on the tiers.
untiered() { "$BIN/zinf-shard" layout --model gpt2-124m --param "$1" --optim "$2" | jq -c 'del(.tier, .param_tier, .optim_tier, .grad_tier)'; }
check "the layout's files and offsets are the same on every tier" bash -c \
  'test "$1" = "$2" && test "$1" = "$3" && test -n "$1"' _ "$(untiered gpu gpu)" "$(untiered cpu cpu)" "$(untiered nvme nvme)"
# A host whose nvidia-smi names a GPU, with a zinf-train that prints what a
# cpu run of --bench --profile --json printed (a tiny model, made here):
# each profile step passes with its records as figures and puts its line in
# summary.txt under the profiles' head; the verdict is PASS.
mkdir -p "$G/bin" "$TMP/gpu"
cp "$ROOT/scripts/profile-summary.jq" "$G/scripts/"
"$BIN/zinf-train" --bench --bench-model gpt:layers=1,hidden=32,heads=2,vocab=64,seq=32 -B 2 -T 16 --bench-steps 1 --bench-gemm 128 \
  --threads 1 --profile --json >"$TMP/records.jsonl" 2>/dev/null
printf '#!/bin/sh\ncase " $* " in *" --help "*) echo "  --profile  Time every device kernel"; exit 0 ;; esac\ncat "%s"\n' \
  "$TMP/records.jsonl" >"$G/bin/zinf-train"
printf '#!/bin/sh\necho "NVIDIA H200, 575.57.08, 143771 MiB"\n' >"$TMP/gpu/nvidia-smi"
chmod +x "$G/bin/zinf-train" "$TMP/gpu/nvidia-smi"
run_check "$TMP/r4" "$TMP/gpu"
expect_rc 0 "a host with a GPU whose profiles pass: exit 0 (PASS)"
check "…six profile steps passed, each with the records as figures" bash -c \
  'test "$(jq -s "[.[] | select((.name | startswith(\"profile/\")) and .status == \"pass\" and (.figures.records | length) > 3)] | length" "$1/results.jsonl")" = 6' _ "$TMP/r4"
check "…and six lines in summary.txt under the profiles' head" bash -c \
  'grep -q "^# step profiles" "$1/summary.txt" && test "$(grep -cE "^(gpt2-(fp32|bf16)-b(4|16)|smollm-bf16|llama1b-bf16) +[0-9.]+ s/step, .* of sgemm \([0-9.]+ TFLOP/s\) [|] [a-z_@]+ -?[0-9]+%, " "$1/summary.txt")" = 6' _ "$TMP/r4"
# A command of the script that fails under set -e (sha256sum, here): the
# run ends as a failed step, and the summary is there all the same.
cat >"$G/fakebin/sha256sum" <<'EOF'
#!/bin/sh
exit 2
EOF
chmod +x "$G/fakebin/sha256sum"
gpu_check "$TMP/r2"
check "a run stopped by a failing command exits non-zero (exit $rc), not 3 or 0" bash -c '(($1 != 0 && $1 != 3))' _ "$rc"
check "…and still writes its three files" three_files "$TMP/r2"
check "…its verdict FAIL, naming the command" bash -c \
  'tail -n 1 "$1/summary.txt" | grep -q ": FAIL$" && grep -q "stopped early at line [0-9]*: .*sha256sum" "$1/summary.txt"' _ "$TMP/r2"
finish
