#!/usr/bin/env bash
# End-to-end tests of the Llama family through the same programs as the GPT:
# zinf-shard layout, init, inspect and reshard of the presets and of tiny
# llama: specs (Hugging Face's tensor names), zinf-plan's model of them
# (grouped-query attention and the three MLP matrices), and zinf-train on a
# tiny byte-level Llama: the loss falls on text, the nine placements of
# parameters and optimizer state give the same losses to the bit, a run
# resumed from its checkpoint gives the uninterrupted run's losses, the
# resident engine agrees, data parallel under mpirun (dp 2 and 4) agrees with
# one process within 1e-5, and zinf-sample continues a memorised text
# through the Llama's own blocks with a key-value cache. Every model is tiny.
source "$(dirname "$0")/lib.bash"
source "$(dirname "$0")/train_lib.bash"
TR=$BIN/zinf-train
SH=$BIN/zinf-shard
PL=$BIN/zinf-plan
POOL=(--pinned 8MiB --pinned-buffer 256KiB)
W=$(mktemp -d /var/tmp/zinf-e2e-llama-XXXXXX)
on_exit "rm -rf '$W'"
# Byte-level, grouped (4 query heads over 2 kv heads), tied.
M=llama:layers=2,hidden=32,heads=4,kv_heads=2,ffn=64,vocab=256,seq=32,tied=1
RUN=(--batch 2 --seq 16 --threads 1 "${POOL[@]}")
cat "$ROOT"/man/*.1 "$ROOT/README.md" >"$W/corpus.txt"
CORPUS=$W/corpus.txt

# --- the presets: their layouts, with Hugging Face's names and counts
for p in smollm-135m:134515008 tinyllama-1.1b:1100048384 llama-3.2-1b:1235814400 llama-3.1-8b:8030261248; do
  name=${p%%:*} count=${p#*:}
  run "$SH" layout --model "$name" --dp 4
  expect_rc 0 "zinf-shard layout --model $name exits 0"
  printf '%s\n' "$out" >"$W/$name.jsonl"
  check "$name: the header has parameters $count and the preset's name" \
    jq -e -s --argjson n "$count" --arg p "$name" '.[0].parameters == $n and .[0].preset == $p
      and (.[0].model | startswith("llama:"))' "$W/$name.jsonl"
  check "$name: tensors named as Hugging Face's, the first model.embed_tokens.weight" \
    jq -e -s '.[1].tensor == "model.embed_tokens.weight"
      and any(.[]; .tensor == "model.layers.0.self_attn.k_proj.weight")
      and any(.[]; .tensor == "model.layers.0.mlp.gate_proj.weight") and any(.[]; .tensor == "model.norm.weight")' \
    "$W/$name.jsonl"
done
check "tied models have no lm_head.weight, untied ones do" \
  test "$(jq -s 'any(.[]; .tensor == "lm_head.weight")' "$W/smollm-135m.jsonl") $(jq -s 'any(.[]; .tensor == "lm_head.weight")' "$W/tinyllama-1.1b.jsonl")" = "false true"
run "$SH" inspect <"$W/llama-3.2-1b.jsonl"
check "inspect names the model, its preset and its k_proj (512,2048)" \
  has_all "$out" "llama-3.2-1b" "rope_scale=32" "model.layers.15.self_attn.k_proj.weight" "(512,2048)"
run "$SH" layout --model "llama:layers=2,hidden=64,heads=4,kv_heads=3"
expect_rc 64 "a spec whose heads are not a multiple of kv_heads exits 64"
check "…naming both" has_all "$err" "heads 4" "kv_heads 3"

# --- zinf-plan: the block's shape (three MLP matrices, grouped k and v)
run "$PL" --model llama-3.2-1b --dp 1 --seq 1024 --gpu-mem 16GiB --json
expect_rc 0 "zinf-plan --model llama-3.2-1b exits 0"
check "params exact; mswm = 4 hd ffn (the MLP's 2048 x 8192); awm = seq (2 (2q + 2kv + 3 ffn) + 2 heads seq)" \
  jq -e '.params == 1235814400 and .mswm_bytes == 4 * 2048 * 8192
    and .awm_bytes == 1024 * (2 * (2 * 2048 + 2 * 512 + 3 * 8192) + 2 * 32 * 1024)' <<<"$out"
check "ait_activation = 2 x block weights / hd" \
  jq -e '.ait_activation == 2 * (2048 * (2048 + 2 * 512) + 2048 * 2048 + 3 * 2048 * 8192) / 2048' <<<"$out"

# --- training: the loss falls on text
state json --param-dtype fp32
run "$TR" --manifest "$(mf json)" --text "$CORPUS" --steps 30 --json --lr 1e-2 --batch 4 --seq 32 --threads 1 "${POOL[@]}"
expect_rc 0 "a 30-step --json run exits 0"
printf '%s\n' "$out" >"$W/json.jsonl"
check "the first loss is about ln 256 (an untrained byte model)" jq -e -s '(.[0].loss - (256 | log)) | fabs < 0.1' "$W/json.jsonl"
check "the loss falls over 30 steps (the last 5 average 1.0 below the first)" \
  jq -e -s '([.[-5:][].loss] | add / 5) < .[0].loss - 1.0' "$W/json.jsonl"
check "the step records count a Llama's FLOPs (flops_per_s > 0)" jq -e -s 'all(.[]; .flops_per_s > 0)' "$W/json.jsonl"
run "$SH" verify -m "$(mf json)" "${POOL[@]}"
expect_rc 0 "zinf-shard verify accepts the state after training"

# --- untied and tiled: another layout of the same kind of model trains
state tiled --model "llama:layers=2,hidden=32,heads=4,kv_heads=2,ffn=48,vocab=256,seq=32,tied=0" --tile 2
run "$TR" --manifest "$(mf tiled)" --text "$CORPUS" --steps 3 --json "${RUN[@]}"
expect_rc 0 "an untied Llama with --tile 2 trains 3 steps"
check "…its linear weights laid out in tiles" \
  test "$(jq -s '[.[] | select(.tensor == "model.layers.0.mlp.up_proj.weight.tile1")] | length' "$(mf tiled)")" -gt 0

# --- the nine placements: the same losses to the bit
for p in gpu cpu nvme; do
  for o in gpu cpu nvme; do
    state "p$p$o" --param "$p" --optim "$o"
    "$TR" --manifest "$(mf "p$p$o")" --text "$CORPUS" --steps 3 --json --quiet "${RUN[@]}" >"$W/p$p$o.jsonl"
  done
done
check "params and optimizer on gpu, cpu or nvme: nine runs, the same 3 losses to the bit" \
  test "$(for f in "$W"/p*.jsonl; do losses "$f" | tr '\n' ' '; echo; done | sort -u | wc -l) $(losses "$W/pgpugpu.jsonl" | wc -l)" = "1 3"
state res --param nvme --optim nvme
"$TR" --manifest "$(mf res)" --text "$CORPUS" --steps 3 --json --quiet --resident "${RUN[@]}" >"$W/res.jsonl"
check "--resident: the same losses as the engine, to the bit" test "$(losses "$W/res.jsonl")" = "$(losses "$W/pnvmenvme.jsonl")"

# --- resume: --steps 4 then --resume --steps 8 = --steps 8
for dt in fp32 bf16; do
  state whole --param-dtype "$dt"
  state split --param-dtype "$dt"
  R=(--text "$CORPUS" --schedule constant --lr 3e-3 --json --quiet "${RUN[@]}")
  "$TR" --manifest "$(mf whole)" --steps 8 "${R[@]}" >"$W/whole.jsonl"
  "$TR" --manifest "$(mf split)" --steps 4 "${R[@]}" >"$W/part1.jsonl"
  "$TR" --manifest "$(mf split)" --steps 8 --resume "${R[@]}" >"$W/part2.jsonl"
  check "resume ($dt): steps 5-8 identical to the whole run's, the committed states alike" \
    test "$(losses "$W/part2.jsonl") $(manifest_step "$(mf split)")" = "$(losses "$W/whole.jsonl" 5 8) 8"
done

# --- reshard: the values do not move
state rs --param-dtype fp32
"$TR" --manifest "$(mf rs)" --text "$CORPUS" --steps 2 --quiet "${RUN[@]}" >/dev/null
run "$SH" reshard -m "$(mf rs)" --dp 3 --dir "$W/rs3" "${POOL[@]}"
expect_rc 0 "zinf-shard reshard of a trained Llama to dp 3 exits 0"
check "model.layers.1.self_attn.v_proj.weight's bytes are the same after resharding" \
  test "$("$SH" cat -m "$(mf rs)" --tensor model.layers.1.self_attn.v_proj.weight --state param "${POOL[@]}" | sha256sum)" = \
  "$("$SH" cat -m "$W/rs3/manifest.jsonl" --tensor model.layers.1.self_attn.v_proj.weight --state param "${POOL[@]}" | sha256sum)"

# --- llm.c's token files, version 2 (uint32): ids past 65,535 train; one past the vocabulary is refused
python3 - "$W" <<'PY'
import random, struct, sys
d = sys.argv[1]
random.seed(7)
toks = [random.randrange(70000) for _ in range(4000)]
toks[100] = 69999
def write(name, toks):
    h = [0] * 256
    h[0], h[1], h[2] = 20240520, 2, len(toks)
    open(f"{d}/{name}", "wb").write(struct.pack("<256i", *h) + struct.pack("<%dI" % len(toks), *toks))
write("wide.bin", toks)
PY
V2=llama:layers=1,hidden=32,heads=4,kv_heads=2,ffn=32,seq=32,tied=1
state wide --model "$V2,vocab=70000"
run "$TR" --manifest "$(mf wide)" --data "$W/wide.bin" --steps 2 --json "${RUN[@]}"
expect_rc 0 "a version 2 token file (ids up to 69999) trains a vocabulary of 70000"
check "…its first loss about ln 70000" jq -e -s '(.[0].loss - (70000 | log)) | fabs < 0.1' <<<"$out"
state narrow --model "$V2,vocab=60000"
run "$TR" --manifest "$(mf narrow)" --data "$W/wide.bin" --steps 2 "${RUN[@]}"
expect_rc 65 "a token past a vocabulary of 60000 exits 65"
check "…naming the file, the token, its offset and its byte" \
  has_all "$err" "$W/wide.bin" "at token offset" "(byte " "not below the model's vocabulary 60000"

# --- --attention flash: three steps through the engine within 1e-5 of the
# GEMM path's losses, from copies of one init; a bad value is a usage error
for r in agemm aflash; do state "$r" --param-dtype fp32; done
run "$TR" --manifest "$(mf agemm)" --text "$CORPUS" --steps 3 --json "${RUN[@]}"
printf '%s\n' "$out" >"$W/agemm.jsonl"
run "$TR" --manifest "$(mf aflash)" --text "$CORPUS" --steps 3 --json "${RUN[@]}" --attention flash
expect_rc 0 "--attention flash trains a Llama"
printf '%s\n' "$out" >"$W/aflash.jsonl"
check "…its losses within 1e-5 of the GEMM path's" jq -e -n --slurpfile a "$W/aflash.jsonl" --slurpfile b "$W/agemm.jsonl" \
  '($a | length) == 3 and ($b | length) == 3 and all(range(3); (($a[.].loss - $b[.].loss) | fabs) <= 1e-5 * $b[.].loss)'
check "…and the log says flash" contains "$err" "flash attention"
run "$TR" --manifest "$(mf aflash)" --text "$CORPUS" --steps 1 "${RUN[@]}" --attention fast
expect_rc 64 "--attention fast is a usage error (64)"

# --- zinf-sample: a periodic text memorised, continued through the Llama's
# own blocks with a key-value cache (grouped heads cached once per kv head)
SA=$BIN/zinf-sample
PERIOD=$'period: 0123456789\n'
for _ in $(seq 200); do printf '%s' "$PERIOD"; done >"$W/periodic.txt"
"$SH" layout --model llama:layers=1,hidden=32,heads=4,kv_heads=2,ffn=64,vocab=256,seq=64,tied=1 --param-dtype fp32 |
  "$SH" init --dir "$W/sp" -q "${POOL[@]}" >/dev/null
run "$TR" --manifest "$W/sp/manifest.jsonl" --text "$W/periodic.txt" --steps 80 --batch 4 --seq 64 --lr 1e-2 \
  --warmup 5 --shuffle --threads 1 --json -q "${POOL[@]}"
expect_rc 0 "zinf-train memorises the periodic text with a Llama (80 steps)"
check "…its loss ends near 0" jq -e -s '.[-1].loss < 0.05' <<<"$out"
want="123456789"$'\n'"period: 0123456789"$'\n'"period: 01234567"
run "$SA" -m "$W/sp/manifest.jsonl" --prompt 'period: 0' -n 45 --temperature 0 --threads 1 "${POOL[@]}"
expect_rc 0 "greedy sampling of a Llama exits 0"
if [[ $out == "$want" ]]; then pass "greedy sampling continues the period, byte for byte (45 bytes)"; else
  fail "greedy sampling continues the period, byte for byte (45 bytes)" "got '$(printf '%q' "$out")'"; fi
check "stderr names the llama: model" contains "$err" "llama:layers=1"
run "$SA" -m "$W/sp/manifest.jsonl" --prompt 'period: 0' -n 45 --temperature 0 --persist-below 0 --prefetch-bytes 0 \
  --threads 1 "${POOL[@]}"
check "fetching every module at every token gives the same text" test "$out" = "$want"
run "$SA" -m "$W/sp/manifest.jsonl" --prompt 'period: 0' -n 30 --temperature 0.8 --seed 3 --threads 1 -q "${POOL[@]}"
a=$out
run "$SA" -m "$W/sp/manifest.jsonl" --prompt 'period: 0' -n 30 --temperature 0.8 --seed 3 --threads 1 -q "${POOL[@]}"
check "the same --seed gives the same sampled text" test "$a" = "$out"

# --- data parallel: mpirun -np 2 on a dp=2 state with -B 2 = one process with -B 4
if command -v mpirun >/dev/null; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  state dp2 --dp 2
  state dp1
  D=(--text "$CORPUS" --steps 5 --seq 16 --lr 3e-3 --json "${POOL[@]}")
  run mpirun -np 2 "$TR" --manifest "$(mf dp2)" --batch 2 "${D[@]}"
  expect_rc 0 "mpirun -np 2 on a dp=2 Llama state exits 0"
  printf '%s\n' "$out" >"$W/dp2.jsonl"
  run "$TR" --manifest "$(mf dp1)" --batch 4 "${D[@]}"
  printf '%s\n' "$out" >"$W/dp1.jsonl"
  check "dp 2 agrees with one process of batch 4 within 1e-5 relative" \
    jq -e -n --slurpfile a "$W/dp2.jsonl" --slurpfile b "$W/dp1.jsonl" \
    '($a | length) == 5 and ($b | length) == 5
      and all(range(5); (($a[.].loss - $b[.].loss) | fabs) <= 1e-5 * $b[.].loss)'
  state dp4 --dp 4
  run mpirun -np 4 "$TR" --manifest "$(mf dp4)" --batch 1 "${D[@]}"
  printf '%s\n' "$out" >"$W/dp4.jsonl"
  check "dp 4 (batch 1 each) agrees with one process of batch 4 within 1e-5 relative" \
    jq -e -n --slurpfile a "$W/dp4.jsonl" --slurpfile b "$W/dp1.jsonl" \
    '($a | length) == 5 and all(range(5); (($a[.].loss - $b[.].loss) | fabs) <= 1e-5 * $b[.].loss)'
  "$SH" reshard --dp 2 --dir "$W/sp2" -m "$W/sp/manifest.jsonl" -q >/dev/null
  run mpirun -np 2 "$SA" -m "$W/sp2/manifest.jsonl" --prompt 'period: 0' -n 45 --temperature 0 --threads 1 "${POOL[@]}"
  check "zinf-sample under mpirun -np 2 over the dp 2 reshard prints the same text" test "$out" = "$want"
else
  skip "data parallel under mpirun" "no mpirun"
fi

finish
