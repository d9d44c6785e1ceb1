#!/usr/bin/env bash
# End-to-end tests of the cuda device backend against the cpu one, the
# reference: a tiny GPT trained 10 steps in fp32 on each gives losses within
# 1e-4, two cuda runs give the same losses to the bit, and zinf-sample's
# greedy text from one trained state is the same on both; under mpirun, two
# ranks on cuda (the engine's collectives on NCCL, enqueued on the device's
# streams) train within 1e-4 of two on cpu and sample cpu's greedy text
# from a dp 2 reshard (zinf-sample drives the trainer's engine), or are
# refused (64) saying why (one GPU for two ranks, no NCCL). --device and --gpu
# refusals (64) run everywhere; the rest is skipped, with the reason the
# programs give, where the cuda backend cannot run (no GPU, or no CUDA in
# the build). --precision bf16 (GEMM inputs rounded to bf16, fp32
# accumulation): on cpu, everywhere, 3 steps within 1e-2 of fp32's losses
# and not equal to them, a bad value refused (64) with the checkpoint
# untouched, --bench's record naming it and its activations 36 KiB smaller
# than fp32's (bf16 checkpoints, a block's kept activations); on cuda, 10 bf16 steps within 1e-2
# of cpu's bf16 losses and two cuda bf16 runs the same to the bit; the
# bf16 activation checkpoints of a four-block GPT on cuda offloaded to cpu
# and to nvme give the losses kept on the device gives, to the bit, moving
# half the bytes of fp32's. Every model is tiny.
source "$(dirname "$0")/lib.bash"
source "$(dirname "$0")/train_lib.bash"
TR=$BIN/zinf-train
SH=$BIN/zinf-shard
SA=$BIN/zinf-sample
POOL=(--pinned 8MiB --pinned-buffer 256KiB)
W=$(mktemp -d /var/tmp/zinf-e2e-cuda-XXXXXX)
on_exit "rm -rf '$W'"
M=gpt:layers=2,hidden=32,heads=2,vocab=256,seq=32  # byte-level: any text trains it
RUN=(--text "$W/corpus.txt" --batch 4 --seq 32 --lr 1e-2 --json -q "${POOL[@]}")
cat "$ROOT"/man/*.1 >"$W/corpus.txt"

# --- refusals, GPU or not
state refuse --param-dtype fp32
run "$TR" --manifest "$(mf refuse)" "${RUN[@]}" --steps 10 --device tpu
expect_rc 64 "--device tpu is a usage error"
run "$TR" --manifest "$(mf refuse)" "${RUN[@]}" --steps 10 --device cpu --gpu 0
expect_rc 64 "--gpu with --device cpu is a usage error"
check "…saying --gpu is for cuda" contains "$err" "--gpu is for --device cuda"
run "$TR" --manifest "$(mf refuse)" "${RUN[@]}" --steps 10 --device cuda --gpu 4096
expect_rc 64 "--gpu past the GPUs (or cuda where it cannot run) is a usage error"

# --- --precision, on cpu (everywhere)
sums "$W/refuse" >"$W/refuse.sums"
run "$TR" --manifest "$(mf refuse)" "${RUN[@]}" --steps 3 --device cpu --precision fp16
expect_rc 64 "--precision fp16 is a usage error"
check "…naming the value and the choices" has_all "$err" "precision 'fp16'" "expected fp32 or bf16"
check "…nothing on stdout" test -z "$out"
check "…the checkpoint untouched" test "$(sums "$W/refuse")" = "$(<"$W/refuse.sums")"
for p in fp32 bf16; do
  state "p$p" --param-dtype fp32
  run "$TR" --manifest "$(mf "p$p")" "${RUN[@]}" --steps 3 --device cpu --threads 1 --precision "$p"
  expect_rc 0 "3 steps on cpu, --precision $p"
  printf '%s\n' "$out" >"$W/p$p.jsonl"
done
if jq -e -n --slurpfile a "$W/pfp32.jsonl" --slurpfile b "$W/pbf16.jsonl" \
  '($a | length) == 3 and ($b | length) == 3 and
   ([$a, $b] | transpose | all((.[0].loss - .[1].loss | fabs) <= 1e-2 * (.[0].loss | fabs))) and
   ([$a, $b] | transpose | any(.[0].loss != .[1].loss))' >/dev/null; then
  pass "--precision bf16 on cpu: losses within 1e-2 of fp32's, not equal to them"
else
  fail "--precision bf16 on cpu: losses within 1e-2 of fp32's, not equal to them" \
    "fp32 $(losses "$W/pfp32.jsonl" | tr '\n' ' ')/ bf16 $(losses "$W/pbf16.jsonl" | tr '\n' ' ')"
fi
# (--checkpoint all: the checkpointed block's activations, counted below.)
BM=(--bench --bench-model gpt:layers=3,hidden=32,heads=2,vocab=256,seq=16 -B 2 -T 16 --bench-steps 1 --bench-gemm 64
  --threads 1 --device cpu --json -q --checkpoint all)
run "$TR" "${BM[@]}" --precision bf16
expect_rc 0 "--bench --precision bf16 on cpu"
check "…its record names the precision and the sgemm it is held to" \
  jq -e '.precision == "bf16" and .ratio_peer == "sgemm" and .ratio > 0' <<<"$out"
bench16=$out
run "$TR" "${BM[@]}" --precision fp32
expect_rc 0 "--bench --precision fp32 on cpu"
# Four checkpoints of 2 x 16 x 32 values: 4 KiB each in fp32, 2 KiB in bf16
# beside one fp32 buffer that a block reads them widened in: 4 KiB less;
# and the checkpointed block's kept activations (model.hpp's Kept), four of
# (N,C), q/k/v (N,3C), two of (N,4C) and the (2,2,16,16) softmax at 2 bytes
# a value: 4 x 2 KiB + 6 KiB + 2 x 8 KiB + 2 KiB less; and the logits (32
# rows of 256) at 2 bytes: 16 KiB less. 53,248 bytes less planned (each a
# multiple of the arena's 256 bytes). On the device the bf16 bench also
# keeps its working parameters apart from their fp32 master (as the
# trainer's engines keep them bf16, the master the optimizer's): the 45,568
# values of the matrices and tables bf16 (91,136 bytes) and the 1,312 of the
# vectors fp32 (5,376 bytes in the arena's units) beside the master's
# 187,648: 96,512 bytes more, so 43,264 more at the peak.
check "…bf16's checkpoints, a block's kept activations and the logits take 2 bytes a value, beside the fp32 one read" \
  jq -e -n --argjson a "$bench16" --argjson b "$out" \
  '$b.activation_bytes - $a.activation_bytes == 53248 and $a.device_peak_bytes - $b.device_peak_bytes == 96512 - 53248'

# Can cuda run here? The programs say why not.
state probe --param-dtype fp32
run "$TR" --manifest "$(mf probe)" "${RUN[@]}" --steps 1 --device cuda
if [[ $rc == 64 && $err == *"device backend 'cuda'"* ]]; then
  why=$(grep -o "device backend 'cuda'.*" <<<"$err" | head -n 1)
  if [[ $why == *"cannot run"* || $why == *"needs a CUDA GPU"* ]]; then
    pass "--device cuda where it cannot run is a usage error saying why"
  else
    fail "--device cuda where it cannot run is a usage error saying why" "$why"
  fi
  for t in "10 fp32 steps on cuda within 1e-4 of cpu" "two cuda runs give the same losses to the bit" \
    "zinf-sample greedy text is the same on cpu and cuda" "dp 2 on cuda (NCCL) within 1e-4 of dp 2 on cpu" \
    "zinf-sample at dp 2 on cuda (NCCL) gives cpu's greedy text" \
    "10 bf16 steps on cuda within 1e-2 of cpu's bf16" "two cuda bf16 runs give the same losses to the bit" \
    "bf16 checkpoints on cuda: offloaded to cpu and nvme, the losses of none to the bit" \
    "bf16 checkpoints on cuda: half the bytes offloaded to nvme of fp32's" \
    "10 fp32 steps on cuda with --attention flash within 1e-4 of cpu" \
    "two cuda runs with --attention flash give the same losses to the bit"; do
    skip "$t" "$why"
  done
  finish
  exit
fi
expect_rc 0 "one step on --device cuda exits 0"

# --- 10 steps, fp32: cpu, then cuda twice, each from its own copy of one init
for r in cpu cuda1 cuda2; do state "$r" --param-dtype fp32; done
run "$TR" --manifest "$(mf cpu)" "${RUN[@]}" --steps 10 --device cpu --threads 1
expect_rc 0 "10 steps on cpu"
printf '%s\n' "$out" >"$W/cpu.jsonl"
run "$TR" --manifest "$(mf cuda1)" "${RUN[@]}" --steps 10 --device cuda
expect_rc 0 "10 steps on cuda"
printf '%s\n' "$out" >"$W/cuda1.jsonl"
run "$TR" --manifest "$(mf cuda2)" "${RUN[@]}" --steps 10 --device cuda
expect_rc 0 "10 steps on cuda, again"
printf '%s\n' "$out" >"$W/cuda2.jsonl"
for f in cpu cuda1 cuda2; do
  check "the $f run logged steps 1 to 10" jq -e -s '[.[].step] == [range(1; 11)]' "$W/$f.jsonl"
done
close_losses() { # A B [REL]: the same steps, every loss within 1e-4 (REL: within REL times A's)
  jq -e -n --slurpfile a "$1" --slurpfile b "$2" --argjson rel "${3:-0}" \
    '($a | length) == 10 and ($b | length) == 10 and
     ([$a, $b] | transpose | all(.[0].loss - .[1].loss | fabs <
       (if $rel > 0 then $rel * (.[0].loss | fabs) else 1e-4 end)))' >/dev/null
}
if close_losses "$W/cpu.jsonl" "$W/cuda1.jsonl"; then pass "10 fp32 steps on cuda within 1e-4 of cpu"; else
  fail "10 fp32 steps on cuda within 1e-4 of cpu" "cpu $(losses "$W/cpu.jsonl" | tr '\n' ' ')/ cuda $(losses "$W/cuda1.jsonl" | tr '\n' ' ')"
fi
check "the loss falls on cuda" jq -e -s '.[-1].loss < .[0].loss' "$W/cuda1.jsonl"
if [[ $(losses "$W/cuda1.jsonl" | wc -l) == 10 && $(losses "$W/cuda1.jsonl") == "$(losses "$W/cuda2.jsonl")" ]]; then
  pass "two cuda runs give the same losses to the bit"
else
  fail "two cuda runs give the same losses to the bit" "$(losses "$W/cuda1.jsonl" | tr '\n' ' ')/ $(losses "$W/cuda2.jsonl" | tr '\n' ' ')"
fi
run "$SH" verify -m "$(mf cuda1)" "${POOL[@]}"
expect_rc 0 "the state cuda trained verifies"

# --- 10 steps, --precision bf16: cpu (the rounded reference), then cuda
# (cuBLASLt's bf16 tensor cores) twice
for r in bcpu bcuda1 bcuda2; do state "$r" --param-dtype fp32; done
run "$TR" --manifest "$(mf bcpu)" "${RUN[@]}" --steps 10 --device cpu --threads 1 --precision bf16
expect_rc 0 "10 bf16 steps on cpu"
printf '%s\n' "$out" >"$W/bcpu.jsonl"
for r in bcuda1 bcuda2; do
  run "$TR" --manifest "$(mf $r)" "${RUN[@]}" --steps 10 --device cuda --precision bf16
  expect_rc 0 "10 bf16 steps on cuda ($r)"
  printf '%s\n' "$out" >"$W/$r.jsonl"
done
if close_losses "$W/bcpu.jsonl" "$W/bcuda1.jsonl" 1e-2; then pass "10 bf16 steps on cuda within 1e-2 of cpu's bf16"; else
  fail "10 bf16 steps on cuda within 1e-2 of cpu's bf16" "cpu $(losses "$W/bcpu.jsonl" | tr '\n' ' ')/ cuda $(losses "$W/bcuda1.jsonl" | tr '\n' ' ')"
fi
if [[ $(losses "$W/bcuda1.jsonl" | wc -l) == 10 && $(losses "$W/bcuda1.jsonl") == "$(losses "$W/bcuda2.jsonl")" ]]; then
  pass "two cuda bf16 runs give the same losses to the bit"
else
  fail "two cuda bf16 runs give the same losses to the bit" "$(losses "$W/bcuda1.jsonl" | tr '\n' ' ')/ $(losses "$W/bcuda2.jsonl" | tr '\n' ' ')"
fi

# --- --attention flash on cuda (flash.cu): against the cpu's GEMM-path run
# above, and twice the same bits
for r in fcuda1 fcuda2; do
  state "$r" --param-dtype fp32
  run "$TR" --manifest "$(mf $r)" "${RUN[@]}" --steps 10 --device cuda --attention flash
  expect_rc 0 "10 steps on cuda with --attention flash ($r)"
  printf '%s\n' "$out" >"$W/$r.jsonl"
done
if close_losses "$W/cpu.jsonl" "$W/fcuda1.jsonl"; then pass "10 fp32 steps on cuda with --attention flash within 1e-4 of cpu"
else
  fail "10 fp32 steps on cuda with --attention flash within 1e-4 of cpu" \
    "cpu $(losses "$W/cpu.jsonl" | tr '\n' ' ')/ flash $(losses "$W/fcuda1.jsonl" | tr '\n' ' ')"
fi
if [[ $(losses "$W/fcuda1.jsonl" | wc -l) == 10 && $(losses "$W/fcuda1.jsonl") == "$(losses "$W/fcuda2.jsonl")" ]]; then
  pass "two cuda runs with --attention flash give the same losses to the bit"
else
  fail "two cuda runs with --attention flash give the same losses to the bit" \
    "$(losses "$W/fcuda1.jsonl" | tr '\n' ' ')/ $(losses "$W/fcuda2.jsonl" | tr '\n' ' ')"
fi

# --- bf16 activation checkpoints on cuda: a four-block GPT (blocks 0 and 1's
# inputs offloaded), kept on the device, offloaded to page-locked memory and
# to nvme; fp32's nvme run for the bytes
M4=gpt:layers=4,hidden=32,heads=2,vocab=256,seq=32
for r in anone acpu anvme afp32; do state "$r" --model "$M4" --param-dtype fp32; done
for r in none cpu nvme; do
  run "$TR" --manifest "$(mf a$r)" "${RUN[@]}" --steps 4 --device cuda --precision bf16 --offload-activations $r
  expect_rc 0 "4 bf16 steps on cuda, checkpoints offloaded to $r"
  printf '%s\n' "$out" >"$W/a$r.jsonl"
done
run "$TR" --manifest "$(mf afp32)" "${RUN[@]}" --steps 4 --device cuda --precision fp32 --offload-activations nvme
expect_rc 0 "4 fp32 steps on cuda, checkpoints offloaded to nvme"
printf '%s\n' "$out" >"$W/afp32.jsonl"
if [[ $(losses "$W/anone.jsonl" | wc -l) == 4 && $(losses "$W/anone.jsonl") == "$(losses "$W/acpu.jsonl")" &&
  $(losses "$W/anone.jsonl") == "$(losses "$W/anvme.jsonl")" ]]; then
  pass "bf16 checkpoints on cuda: offloaded to cpu and nvme, the losses of none to the bit"
else
  fail "bf16 checkpoints on cuda: offloaded to cpu and nvme, the losses of none to the bit" \
    "$(losses "$W/anone.jsonl" | tr '\n' ' ')/ $(losses "$W/acpu.jsonl" | tr '\n' ' ')/ $(losses "$W/anvme.jsonl" | tr '\n' ' ')"
fi
# Two offloaded checkpoints of 4 x 32 x 32 values a step: 16 KiB in bf16.
check "bf16 checkpoints on cuda: half the bytes offloaded to nvme of fp32's" jq -e -n \
  --slurpfile a "$W/anvme.jsonl" --slurpfile b "$W/afp32.jsonl" \
  '($a | length) == 4 and ($a | all(.activation_written_bytes == 16384 and .activation_read_bytes == 16384)) and
   ($b | all(.activation_written_bytes == 32768))'

# --- data parallel: two ranks on cuda, the engine's gathers and
# reduce-scatters on NCCL, against two on cpu (MPI), from copies of one init.
# On one GPU NCCL cannot give each rank a GPU of its own: zinf-train refuses
# (64) and says so, and the comparison is skipped with its words.
DP="dp 2 on cuda (NCCL) within 1e-4 of dp 2 on cpu"
if ! command -v mpirun >/dev/null; then
  skip "$DP" "no mpirun on this host"
else
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  for r in dpcpu dpcuda; do state "$r" --param-dtype fp32 --dp 2; done
  DPRUN=(--text "$W/corpus.txt" --batch 2 --seq 32 --lr 1e-2 --json -q "${POOL[@]}")  # 2 rows a rank: RUN's 4 in all
  run mpirun -np 2 "$TR" --manifest "$(mf dpcpu)" "${DPRUN[@]}" --steps 10 --device cpu --threads 1
  if [[ $rc == 64 && $err == *MPI* ]]; then
    skip "$DP" "this zinf has no MPI: $(grep -m 1 'MPI' <<<"$err")"
  else
    expect_rc 0 "10 steps of dp 2 on cpu"
    printf '%s\n' "$out" >"$W/dpcpu.jsonl"
    run mpirun -np 2 "$TR" --manifest "$(mf dpcuda)" "${DPRUN[@]}" --steps 10 --device cuda
    if [[ $rc == 64 && $err == *NCCL* ]]; then
      skip "$DP" "$(grep -m 1 'NCCL' <<<"$err")"
    else
      expect_rc 0 "10 steps of dp 2 on cuda"
      printf '%s\n' "$out" >"$W/dpcuda.jsonl"
      if close_losses "$W/dpcpu.jsonl" "$W/dpcuda.jsonl"; then pass "$DP"; else
        fail "$DP" "cpu $(losses "$W/dpcpu.jsonl" | tr '\n' ' ')/ cuda $(losses "$W/dpcuda.jsonl" | tr '\n' ' ')"
      fi
      check "the dp 2 state cuda trained is committed at step 10" test "$(manifest_step "$(mf dpcuda)")" = 10
    fi
  fi
fi

# --- greedy text: a state memorises a periodic text (trained on cpu), then
# samples on each backend
PERIOD=$'period: 0123456789\n'
for _ in $(seq 200); do printf '%s' "$PERIOD"; done >"$W/periodic.txt"
"$SH" layout --model gpt:layers=1,hidden=32,heads=2,vocab=256,seq=64 --param-dtype fp32 |
  "$SH" init --dir "$W/p" -q "${POOL[@]}" >/dev/null
run "$TR" --manifest "$W/p/manifest.jsonl" --text "$W/periodic.txt" --steps 60 --batch 4 --seq 64 --lr 1e-2 \
  --warmup 5 --shuffle --threads 1 --device cpu --json -q "${POOL[@]}"
expect_rc 0 "a periodic text memorised on cpu (60 steps)"
run "$SA" -m "$W/p/manifest.jsonl" --prompt 'period: 0' -n 45 --temperature 0 --device cpu --threads 1 -q "${POOL[@]}"
cpu_text=$out
expect_rc 0 "greedy sampling on cpu"
run "$SA" -m "$W/p/manifest.jsonl" --prompt 'period: 0' -n 45 --temperature 0 --device cuda -q "${POOL[@]}"
expect_rc 0 "greedy sampling on cuda"
if [[ $out == "$cpu_text" && -n $out ]]; then pass "zinf-sample greedy text is the same on cpu and cuda"; else
  fail "zinf-sample greedy text is the same on cpu and cuda" "cpu '$(printf '%q' "$cpu_text")', cuda '$(printf '%q' "$out")'"
fi

# --- the same text from two ranks on cuda over a dp 2 reshard of the state:
# zinf-sample's engine is the trainer's, its gathers on NCCL at dp 2; on one
# GPU it is refused (64) as zinf-train is, and the check skipped with its words.
SDP="zinf-sample at dp 2 on cuda (NCCL) gives cpu's greedy text"
if ! command -v mpirun >/dev/null; then
  skip "$SDP" "no mpirun on this host"
else
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  "$SH" reshard --dp 2 --dir "$W/p2" -m "$W/p/manifest.jsonl" -q >/dev/null
  run mpirun -np 2 "$SA" -m "$W/p2/manifest.jsonl" --prompt 'period: 0' -n 45 --temperature 0 --device cuda -q \
    "${POOL[@]}"
  if [[ $rc == 64 && ($err == *NCCL* || $err == *MPI*) ]]; then
    skip "$SDP" "$(grep -m 1 -E 'NCCL|MPI' <<<"$err")"
  else
    expect_rc 0 "greedy sampling at dp 2 on cuda"
    if [[ $out == "$cpu_text" && -n $out ]]; then pass "$SDP"; else
      fail "$SDP" "cpu '$(printf '%q' "$cpu_text")', cuda dp 2 '$(printf '%q' "$out")'"
    fi
  fi
fi
finish
