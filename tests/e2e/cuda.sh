#!/usr/bin/env bash
# End-to-end tests of the cuda device backend against the cpu one, the
# reference: a tiny GPT trained 10 steps in fp32 on each gives losses within
# 1e-4, two cuda runs give the same losses to the bit, and zinf-sample's
# greedy text from one trained state is the same on both; under mpirun, two
# ranks on cuda (the engine's collectives on NCCL, enqueued on the device's
# streams) train within 1e-4 of two on cpu, or are refused (64) saying why
# (one GPU for two ranks, no NCCL). --device and --gpu
# refusals (64) run everywhere; the rest is skipped, with the reason the
# programs give, where the cuda backend cannot run (no GPU, or no CUDA in
# the build). Every model is tiny.
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
    "zinf-sample greedy text is the same on cpu and cuda" "dp 2 on cuda (NCCL) within 1e-4 of dp 2 on cpu"; do
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
close_losses() { # A B: the same steps, every loss within 1e-4
  jq -e -n --slurpfile a "$1" --slurpfile b "$2" \
    '($a | length) == 10 and ($b | length) == 10 and
     ([$a, $b] | transpose | all(.[0].loss - .[1].loss | fabs < 1e-4))' >/dev/null
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
finish
