#!/usr/bin/env bash
# End-to-end tests of zinf-train --profile on the cpu backend (issue 43):
# the zinf.profile/1 records of --bench --profile --json and of a training
# run through the engine are well formed (every documented key, of its
# type); the kernel rows on compute plus "other" are the steps' time to the
# rounding, "other" not negative (no kernel counted twice); the GEMM and
# attention rows' FLOPs are the model's matrix FLOPs as computed here from
# the spec (6 per weight of a GEMM per token, 6 C T (T+1) per row and layer
# of attention; plus the recomputed forward with checkpoints); the step
# record's model_flops is LanguageModel::flops_per_step's count (the biases
# and norms too); stdout holds records only, the table goes to stderr; the
# refusals; --attention flash: flash's kernels under their own names, the
# same FLOPs, no GEMM-path attention row. Every model is tiny.
source "$(dirname "$0")/lib.bash"
source "$(dirname "$0")/train_lib.bash"
TR=$BIN/zinf-train
SH=$BIN/zinf-shard
POOL=(--pinned 8MiB --pinned-buffer 256KiB)
W=$(mktemp -d /var/tmp/zinf-e2e-profile-XXXXXX)
on_exit "rm -rf '$W'"
PY=${ZINF_PYTHON:-python3}

# check_records FILE STEPS LAYERS HIDDEN VOCAB BATCH SEQ RECOMPUTE STAGES...:
# the profile records of FILE (other lines ignored) against the model.
check_records() {
  "$PY" - "$@" <<'EOF'
import json, os, sys
att = os.environ.get("ATT", "") + "attention"  # ATT=flash_: --attention flash's kernels
path, steps, L, C, V, B, T, recompute = sys.argv[1], *map(int, sys.argv[2:8]), sys.argv[8] == "1"
stages = sys.argv[9:]
alone = "forward" in stages and "fetch wait (compute stalled)" not in stages  # --bench: shapes timed alone
recs = [json.loads(l) for l in open(path) if '"zinf.profile/1"' in l]
def fail(msg):
    print("profile records: " + msg); sys.exit(1)
if not recs: fail("none")
head = [r for r in recs if r["kind"] == "step"]
if len(head) != 1 or recs[0] is not head[0]: fail("one step record, first")
h = head[0]
for k, t in [("model", str), ("precision", str), ("batch", int), ("seq", int), ("rank", int), ("device", str),
             ("threads", int), ("steps", int), ("seconds", float), ("compute_s", float), ("model_flops", float),
             ("peak_flops_per_s", float), ("peak_flops_peer", str), ("peak_bytes_per_s", float), ("uncollected", int)]:
    if not isinstance(h.get(k), (t, int) if t is float else t): fail(f"step record: {k} missing or not {t.__name__}")
if h["steps"] != steps or h["device"] != "cpu" or h["batch"] != B or h["seq"] != T: fail("step record's run")
if not (h["seconds"] > 0 and h["peak_flops_per_s"] > 0 and h["peak_bytes_per_s"] > 0): fail("step record's figures")
rows = recs[1:]
keys = ["kind", "name", "stream", "calls", "seconds", "share", "flops", "bytes", "flops_per_s", "bytes_per_s", "floor_s"]
for r in rows:
    if r.get("schema") != "zinf.profile/1" or any(k not in r for k in keys): fail(f"row {r} lacks a key")
    if r["kind"] not in ("kernel", "copy", "other", "stage", "gemm_shape"): fail(f"kind {r['kind']}")
    if r["seconds"] < 0 and r["kind"] != "other": fail(f"{r['name']}: negative seconds")
    if r["kind"] in ("kernel", "copy") and (r["calls"] < 1 or r["bytes"] <= 0): fail(f"{r['name']}: no calls/bytes")
    if abs(r["share"] - r["seconds"] / h["seconds"]) > 1e-9: fail(f"{r['name']}: share")
compute = [r for r in rows if r["kind"] in ("kernel", "copy") and "@" not in r["name"]]
other = [r for r in rows if r["kind"] == "other"]
if len(other) != 1: fail("one other row")
total = sum(r["seconds"] for r in compute) + other[0]["seconds"]
if abs(total - h["seconds"]) > 1e-9 * max(1, h["seconds"]): fail(f"compute rows + other = {total}, step {h['seconds']}")
if other[0]["seconds"] < 0: fail(f"other is negative ({other[0]['seconds']}): time counted twice")
if abs(sum(r["seconds"] for r in compute) - h["compute_s"]) > 1e-9: fail("compute_s")
# The costliest GEMM shapes: at most 6, each a part of the gemm row, timed
# alone too (--bench; a training run's engine keeps the device budget).
shapes = [r for r in rows if r["kind"] == "gemm_shape"]
gemm = [r for r in rows if r["name"] == "gemm"][0]
if not 1 <= len(shapes) <= 6: fail(f"{len(shapes)} gemm_shape rows")
for r in shapes:
    if not r["name"].startswith("gemm ") or (alone and not r.get("alone_flops_per_s", 0) > 0): fail(f"shape row {r}")
if sum(r["calls"] for r in shapes) > gemm["calls"] or sum(r["flops"] for r in shapes) > gemm["flops"] * (1 + 1e-12):
    fail("the shapes hold more than the gemm row")
names = {r["name"] for r in rows}
# (AdamW is a device kernel in --bench; the engine's optimizer runs it on the host.)
for k in ["gemm", "gemm_bias", "gemm_bias_gelu", "gemm_dbias", att + "_forward", att + "_backward",
          "layernorm_forward", "crossentropy_forward_backward"]:
    if k not in names: fail(f"no {k} row")
for s in stages:
    if not any(r["kind"] == "stage" and r["name"] == s for r in rows): fail(f"no stage {s}")
# The matrix FLOPs, from the spec alone: a block's GEMM weights are qkv 3C^2,
# proj C^2, fc 4C^2, fc proj 4C^2; the head V C; 6 a weight a token; causal
# attention 6 C T (T+1) a row a layer. With checkpoints, the blocks' forward
# (2 a weight a token, 2 C T (T+1)) once more.
N = B * T
mm = 6 * N * (L * 12 * C * C + V * C) + 6 * L * B * C * T * (T + 1)
if recompute: mm += L * (2 * N * 12 * C * C + 2 * B * C * T * (T + 1))
# The GEMMs with an epilogue (gemm_bias, gemm_bias_gelu, gemm_dbias) count
# their matrix FLOPs alone.
gemms = ("gemm", "gemm_bias", "gemm_bias_gelu", "gemm_dbias")
got = sum(r["flops"] for r in rows if r["kind"] == "kernel" and r["name"] in gemms + (att + "_forward", att + "_backward"))
if abs(got - steps * mm) > 1e-9 * steps * mm: fail(f"GEMM and attention FLOPs {got}, the model's {steps * mm}")
# The model's count (flops_per_step): every weight but the position table,
# 6 a token (the biases and norms too), and attention's.
params = L * (12 * C * C + 13 * C) + 2 * C + V * C
model = 6 * N * params + 6 * L * B * C * T * (T + 1)
if abs(h["model_flops"] - steps * model) > 1e-9 * steps * model: fail(f"model_flops {h['model_flops']}, {steps * model}")
print(f"ok: {len(rows)} rows, other {other[0]['seconds'] / h['seconds']:.1%} of {h['seconds']:.3f} s")
EOF
}

M=gpt:layers=2,hidden=64,heads=4,vocab=256,seq=64
BENCH=(--bench --bench-model "$M" --bench-steps 2 --batch 2 --seq 32 --threads 2 --bench-gemm 256)

# --- --bench --profile --json, without and with checkpoints
run "$TR" "${BENCH[@]}" --checkpoint none --profile --json
expect_rc 0 "--bench --profile --json exits 0"
printf '%s\n' "$out" >"$W/bench.jsonl"
check "stdout: JSON objects only (the bench's record, then the profile's)" \
  jq -e -s 'length > 3 and all(.[]; type == "object") and .[0].schema == "zinf.train-bench/1"' "$W/bench.jsonl"
check "records well formed, rows sum to the steps, FLOPs the model's (no checkpoints)" \
  check_records "$W/bench.jsonl" 2 2 64 256 2 32 0 zero_grad forward backward optimizer
# 2 (12 C^2 + 13 C) + 2 C + V C + seq C = 120576 parameters at C = 64 (every
# tensor a multiple of 16 floats: no padding between them).
check "AdamW's row: one call a step, 16 FLOPs a parameter (120576 of them)" \
  jq -e -s '[.[] | select(.name == "adamw")] | length == 1 and .[0].calls == 2 and .[0].flops == 16 * 120576 * 2' \
  "$W/bench.jsonl"
# scripts/gpu-check.sh's summary line of a profile, from these records.
line=$(jq -r -s -f "$ROOT/scripts/profile-summary.jq" "$W/bench.jsonl" 2>&1)
check "gpu-check's summary line: step, share of sgemm, the top four rows, GEMM against its shapes alone" \
  bash -c '[[ $1 =~ ^[0-9.]+\ s/step,\ [0-9.]+\ TFLOP/s\ =\ [0-9]+%\ of\ sgemm\ \([0-9.]+\ TFLOP/s\)\ \|\ ([a-z_@]+\ -?[0-9]+%,\ ){3}[a-z_@]+\ -?[0-9]+%\ \|\ gemm:\ [0-9]+%\ of\ its\ [1-6]\ costliest\ shapes\ alone$ ]]' _ "$line"
check "... and none from records without a profile" bash -c '! jq -r -s -f "$1" <<<"{\"schema\": \"zinf.train-bench/1\"}" 2>/dev/null' _ "$ROOT/scripts/profile-summary.jq"
check "the table goes to stderr" has_all "$err" "# zinf-train --profile:" "# peaks in this run: sgemm" "gemm" "other"
# zinf-plan takes the step record's GEMM rate for the device's peak (the
# same bench file may hold the train-bench record and the rows: skipped),
# unless --peak-tflops is given.
peak=$(jq -r 'select(.kind == "step") | .peak_flops_per_s' "$W/bench.jsonl")
PL=(--model "$M" --gpu-mem 8GiB --cpu-mem 8GiB --nvme 8GiB)
run "$BIN/zinf-plan" "${PL[@]}" --bench "$W/bench.jsonl" --json -q
check "zinf-plan --bench: the profile's measured GEMM rate is the peak ($peak FLOP/s)" \
  jq -e --argjson p "$peak" '(.peak_tflops - $p / 1e12 | fabs) <= 1e-12 * .peak_tflops' <<<"$out"
run "$BIN/zinf-plan" "${PL[@]}" --bench "$W/bench.jsonl" --peak-tflops 123 --json -q
check "... and --peak-tflops wins over it" jq -e '.peak_tflops == 123' <<<"$out"
run "$BIN/zinf-plan" "${PL[@]}" --bench "$W/bench.jsonl"
check "... the report names where the peak came from" contains "$out$err" "zinf-train --profile"

run "$TR" "${BENCH[@]}" --checkpoint all --profile --json
printf '%s\n' "$out" >"$W/bench-ck.jsonl"
check "with checkpoints: the recomputed forward's FLOPs too" \
  check_records "$W/bench-ck.jsonl" 2 2 64 256 2 32 1 forward backward
# --checkpoint auto (the default): every block's activations kept when the
# budget holds them (the FLOPs drop by the recompute's, and the GEMM calls
# by its forward's), recomputed when a small budget forces it.
gemm_calls() {
  jq -s '[.[] | select(.schema == "zinf.profile/1" and .kind == "kernel" and (.name | startswith("gemm")))
          | .calls] | add' "$1"
}
run "$TR" "${BENCH[@]}" --profile --json
printf '%s\n' "$out" >"$W/bench-auto.jsonl"
check "auto with a budget to spare: no recompute (FLOPs the model's)" \
  check_records "$W/bench-auto.jsonl" 2 2 64 256 2 32 0 forward backward
check "... the bench record says so" jq -e -s '.[0].checkpoint == false and .[0].checkpoint_mode == "auto"' \
  "$W/bench-auto.jsonl"
# A block's forward is 4 GEMMs (qkv, proj and fc proj with their bias, fc
# with bias and GELU) and the attention's own: 2 steps x 2 layers x 4 fewer.
fewer_gemms() { (($(gemm_calls "$2") + $1 == $(gemm_calls "$3"))); }
check "... 16 GEMM calls fewer than --checkpoint all" fewer_gemms 16 "$W/bench-auto.jsonl" "$W/bench-ck.jsonl"
keep=$(jq -s '[.[] | select(.schema == "zinf.train-bench/1")][0].activation_bytes' "$W/bench.jsonl")
ckpt=$(jq -s '[.[] | select(.schema == "zinf.train-bench/1")][0].activation_bytes' "$W/bench-ck.jsonl")
# A budget for the model, its gradients and moments (16 bytes a parameter)
# and the checkpointed activations, not every block's: halfway between. An
# sgemm of 64 leaves the budget to them.
small=$(( 16 * 120576 + ckpt + (keep - ckpt) / 2 ))
SMALL=(--bench --bench-model "$M" --bench-steps 2 --batch 2 --seq 32 --threads 2 --bench-gemm 64)
run "$TR" "${SMALL[@]}" --profile --json --device-memory "$small"
printf '%s\n' "$out" >"$W/bench-small.jsonl"
# (The stages named without "forward": a budget this small leaves none to
# time the GEMM shapes alone, which the check then does not ask for.)
check "auto in a budget too small for every block's: recomputed" \
  check_records "$W/bench-small.jsonl" 2 2 64 256 2 32 1 backward zero_grad
check "... the header line says why" contains "$err" "--checkpoint auto"

# --- --attention flash: its kernels' rows, the model's FLOPs, no GEMM-path attention
run "$TR" "${BENCH[@]}" --no-checkpoint --profile --json --attention flash
expect_rc 0 "--bench --profile --json --attention flash exits 0"
printf '%s\n' "$out" >"$W/flash.jsonl"
flash_records() { ATT=flash_ check_records "$@"; }
check "flash: records well formed, rows sum to the steps, FLOPs the model's" \
  flash_records "$W/flash.jsonl" 2 2 64 256 2 32 0 zero_grad forward backward optimizer
check "... and no row of the GEMM path's attention" \
  jq -e -s '[.[] | select(.name == "attention_forward" or .name == "attention_backward")] | length == 0' \
  "$W/flash.jsonl"
check "... and the bench says it ran flash" contains "$err" "flash attention"

# --- without --json: stdout is the bench's table alone
run "$TR" "${BENCH[@]}" --profile
expect_rc 0 "--bench --profile exits 0"
check "stdout has no profile rows" bash -c '! grep -q -e "attention_forward" -e "zinf.profile" <<<"$1"' _ "$out"
check "stderr has the profile's table" has_all "$err" "attention_backward" "engine stages"

# --- a training run through the engine, its stages from the engine
state run --model gpt:layers=1,hidden=32,heads=2,vocab=256,seq=32 --param-dtype fp32
echo "some text to train on, long enough for a few windows of sixteen bytes and then some more" >"$W/text.txt"
run "$TR" --manifest "$(mf run)" --text "$W/text.txt" --steps 3 --batch 2 --seq 16 --threads 1 "${POOL[@]}" \
  --profile --json --checkpoint all
expect_rc 0 "a 3-step --profile --json run exits 0"
printf '%s\n' "$out" >"$W/run.jsonl"
check "three zinf.train/1 records, then the profile" \
  jq -e -s '[.[] | select(.schema == "zinf.train/1")] | length == 3' "$W/run.jsonl"
check "records well formed, rows sum to the steps, FLOPs the model's (with checkpoints)" \
  check_records "$W/run.jsonl" 3 1 32 256 2 16 1 forward backward optimizer "fetch wait (compute stalled)"

# --- --checkpoint all, none and auto through the engine: the same losses
# and state, to the bit; the run's second line says what auto chose and why
# (none when the budget is plenty; all in a budget that holds the
# checkpointed activations and the engine but not every block's); none
# with offloaded activations is refused.
for mode in all none auto; do
  state "ck-$mode" --model gpt:layers=2,hidden=32,heads=2,vocab=300,seq=32 --param-dtype fp32
  run "$TR" --manifest "$(mf "ck-$mode")" --text "$W/text.txt" --steps 3 --batch 2 --seq 16 --threads 1 "${POOL[@]}" \
    --checkpoint "$mode" --json
  expect_rc 0 "--checkpoint $mode: a 3-step run exits 0"
  losses <(printf '%s\n' "$out") >"$W/ck-$mode.losses"
  printf '%s\n' "$err" >"$W/ck-$mode.err"
done
check "--checkpoint none: the losses of --checkpoint all, to the bit" cmp "$W/ck-all.losses" "$W/ck-none.losses"
check "--checkpoint auto: the same" cmp "$W/ck-all.losses" "$W/ck-auto.losses"
check "... and three of them" test "$(wc -l <"$W/ck-all.losses")" -eq 3
same_state() { diff <(state_sums "$1") <(state_sums "$2"); }
check "... and the same state" same_state "$W/ck-all" "$W/ck-auto"
check "all: the header says checkpointed" contains "$(<"$W/ck-all.err")" "(checkpointed, --checkpoint all)"
check "auto with a budget to spare keeps every block's, saying why" \
  grep -q "every block's kept, --checkpoint auto: every block's .* fit the device's .* free" "$W/ck-auto.err"
state ck-small --model gpt:layers=2,hidden=32,heads=2,vocab=300,seq=32 --param-dtype fp32
# Every block's activations (227 KiB) and the engine's need with 1 MiB of
# fetches ahead (1.2 MiB) pass a 1 MiB budget; the checkpointed ones and the
# engine's need (324 KiB) fit it.
run "$TR" --manifest "$(mf ck-small)" --text "$W/text.txt" --steps 3 --batch 2 --seq 16 --threads 1 "${POOL[@]}" \
  --device-memory 1MiB --prefetch-bytes 1MiB --json
expect_rc 0 "auto in a small budget: the run exits 0"
check "... recomputing, saying why" grep -q "checkpointed, --checkpoint auto: every block's .* would pass the device's" <<<"$err"
check "... the same losses" cmp "$W/ck-all.losses" <(losses <(printf '%s\n' "$out"))
# At dp 2 the ranks decide alike (a recomputed forward gathers again): rank
# 1's small budget asks for the recompute, rank 0's plenty follows it.
if command -v mpirun >/dev/null; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  D2=(--text "$W/text.txt" --steps 3 --batch 2 --seq 16 --threads 1 "${POOL[@]}" --prefetch-bytes 1MiB --json)
  state ck-dp2all --model gpt:layers=2,hidden=32,heads=2,vocab=300,seq=32 --param-dtype fp32 --dp 2
  run mpirun -np 2 "$TR" --manifest "$(mf ck-dp2all)" "${D2[@]}" --checkpoint all
  expect_rc 0 "dp 2, --checkpoint all: exits 0"
  losses <(printf '%s\n' "$out") >"$W/ck-dp2all.losses"
  state ck-dp2 --model gpt:layers=2,hidden=32,heads=2,vocab=300,seq=32 --param-dtype fp32 --dp 2
  run mpirun -np 1 "$TR" --manifest "$(mf ck-dp2)" "${D2[@]}" : -np 1 "$TR" --manifest "$(mf ck-dp2)" "${D2[@]}" \
    --device-memory 1MiB
  expect_rc 0 "dp 2, auto with one rank's budget small: exits 0"
  check "... every rank recomputes, rank 0 saying why" contains "$err" "but another rank's do not: every rank recomputes"
  check "... the losses of --checkpoint all" cmp "$W/ck-dp2all.losses" <(losses <(printf '%s\n' "$out"))
  check "... three of them" test "$(wc -l <"$W/ck-dp2all.losses")" -eq 3
else
  skip "--checkpoint auto at dp 2" "no mpirun"
fi
run "$TR" --manifest "$(mf ck-small)" --resume --text "$W/text.txt" --steps 4 --batch 2 --seq 16 --threads 1 \
  "${POOL[@]}" --offload-activations cpu --checkpoint none
expect_rc 64 "--checkpoint none with --offload-activations is a usage error (64)"
check "... saying why" contains "$err" "--checkpoint none"

# --- refusals
run "$TR" "${BENCH[@]}" --profile --bench-against "$M"
expect_rc 64 "--profile with --bench-against is a usage error (64)"
check "... saying why" contains "$err" "--profile"
run "$TR" --manifest "$(mf run)" --resume --text "$W/text.txt" --steps 5 --eval-every 1 --batch 2 --seq 16 --threads 1 \
  "${POOL[@]}" --profile
expect_rc 64 "--profile with --eval-every is a usage error (64)"
check "... saying why" contains "$err" "--eval-every"

finish
