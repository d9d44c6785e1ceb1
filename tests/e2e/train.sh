#!/usr/bin/env bash
# End-to-end tests of zinf-train on states zinf-shard lays out and
# initialises: the JSON Lines and human-line contracts (stdout data only,
# stderr info, --quiet), learning on text (the repository's own man pages),
# --eval-every, determinism (same seed, same bits; another seed, another
# run), resume to the bit (split runs; SIGINT; SIGKILL after
# --checkpoint-every) on cpu and nvme tiers with fp32 and bf16 parameters,
# data parallel under mpirun against one process, refusals with their exit
# codes (leaving the manifest as it was), and --bench. Every model is tiny.
source "$(dirname "$0")/lib.bash"
source "$(dirname "$0")/train_lib.bash"
TR=$BIN/zinf-train
SH=$BIN/zinf-shard
POOL=(--pinned 8MiB --pinned-buffer 256KiB)
# States on a disk that takes O_DIRECT (not a tmpfs /tmp).
W=$(mktemp -d /var/tmp/zinf-e2e-train-XXXXXX)
on_exit "rm -rf '$W'"
M=gpt:layers=1,hidden=32,heads=2,vocab=256,seq=32  # byte-level: any text trains it
# One thread: sgemm cuts its work by the thread count, and the bits follow.
RUN=(--batch 2 --seq 16 --threads 1 "${POOL[@]}")

cat "$ROOT"/man/*.1 "$ROOT/README.md" >"$W/corpus.txt"
CORPUS=$W/corpus.txt

# interrupt SIGNAL LINES OUT ARGS...: zinf-train ARGS with stdout in OUT and
# stderr in OUT.err; SIGNAL once OUT holds LINES lines (or after 60 s: a
# loaded machine may take seconds a step); its status in $rc.
interrupt() {
  local sig=$1 lines=$2 o=$3 t=0
  shift 3
  : >"$o"
  "$TR" "$@" >"$o" 2>"$o.err" &
  local pid=$!
  while kill -0 "$pid" 2>/dev/null && lines_in "$o" && ((REPLY < lines && t++ < 6000)); do nap 0.01; done
  kill -"$sig" "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null  # no "Killed" notice
  rc=$?
}
last_step() { tail -n 1 "$1" | jq -r .step; }
# committed MANIFEST: what its records commit (tensor, rank, state, step, xxh3), not where.
committed() { jq -s -c '[.[] | select(has("schema") | not) | [.tensor, .rank, .state, .step, .xxh3]]' "$1"; }

# --- JSON Lines, and the loss falls on the corpus
state json --param-dtype fp32
run "$TR" --manifest "$(mf json)" --text "$CORPUS" --steps 30 --json --lr 1e-2 --batch 4 --seq 32 --threads 1 "${POOL[@]}"
expect_rc 0 "a 30-step --json run exits 0"
printf '%s\n' "$out" >"$W/json.jsonl"
check "every stdout line is one JSON object (30 of them)" jq -e -s 'length == 30 and all(.[]; type == "object")' "$W/json.jsonl"
check "schema zinf.train/1; step 1 to 30 in order" \
  jq -e -s 'all(.[]; .schema == "zinf.train/1") and [.[].step] == [range(1; 31)]' "$W/json.jsonl"
check "loss, lr, grad_norm, tokens_per_s, flops_per_s > 0; forward_s, backward_s, optimizer_s >= 0" \
  jq -e -s 'all(.[]; (.loss | type) == "number" and .loss > 0 and .lr > 0 and .grad_norm > 0
    and .tokens_per_s > 0 and .flops_per_s > 0 and .forward_s >= 0 and .backward_s >= 0 and .optimizer_s >= 0
    and .overflow == false and .tokens == 128 and (has("val_loss") | not))' "$W/json.jsonl"
check "the first loss is about ln 256 (an untrained byte model)" \
  jq -e -s '(.[0].loss - (256 | log)) | fabs < 0.1' "$W/json.jsonl"
check "the loss falls over 30 steps (last < first, and the last 5 average 0.5 below the first)" \
  jq -e -s '.[-1].loss < .[0].loss and ([.[-5:][].loss] | add / 5) < .[0].loss - 0.5' "$W/json.jsonl"
check "info goes to stderr (the model, the data, done)" has_all "$err" "zinf-train: " "$M" "$CORPUS" "done"
check "the manifest is committed at step 30" test "$(manifest_step "$(mf json)")" = 30
run "$SH" verify -m "$(mf json)" "${POOL[@]}"
expect_rc 0 "zinf-shard verify accepts the state after training"

# --- human lines; --quiet
state human
run "$TR" --manifest "$(mf human)" --text "$CORPUS" --steps 3 "${RUN[@]}"
expect_rc 0 "a human-lines run exits 0"
check "the first stdout line is the '#' header" test "${out:0:2}" = "# "
check "then one line per step: step 1/3, 2/3, 3/3" \
  test "$(grep -v '^#' <<<"$out" | awk '{ printf "%s%s", sep, $2; sep = " " }')" = "1/3 2/3 3/3"
check "nothing else on stdout (one header, three steps)" \
  test "$(grep -c '^#' <<<"$out") $(grep -cE '^step [0-9]+/3  loss [0-9.]+  lr ' <<<"$out") $(wc -l <<<"$out")" = "1 3 4"
check "stderr has the info lines" contains "$err" "zinf-train: done"
state quiet
run "$TR" --manifest "$(mf quiet)" --text "$CORPUS" --steps 3 --quiet "${RUN[@]}"
expect_rc 0 "a --quiet run exits 0"
check "--quiet: nothing on stderr" test -z "$err"
check "--quiet: the same lines on stdout" test "$(grep -c '^step ' <<<"$out")" = 3

# --- --eval-every: val_loss after every 3rd step and the last
state eval
run "$TR" --manifest "$(mf eval)" --text "$CORPUS" --steps 8 --eval-every 3 --eval-batches 2 --json "${RUN[@]}"
expect_rc 0 "an --eval-every 3 run exits 0"
check "val_loss on steps 3, 6 and 8 (the last) only, a positive number" \
  jq -e -s '([.[] | select(has("val_loss")) | .step] == [3, 6, 8])
    and all(.[] | select(has("val_loss")); .val_loss > 0)' <<<"$out"
run "$TR" --manifest "$(mf eval)" --text "$CORPUS" --steps 12 --eval-every 3 --eval-batches 2 --resume "${RUN[@]}"
expect_rc 0 "…resumed to step 12 in human lines"
check "human lines: 'val' on the evaluation steps only (9 and 12 of a resumed run)" \
  test "$(grep ' val [0-9]' <<<"$out" | awk '{ printf "%s%s", sep, $2; sep = " " }')" = "9/12 12/12"

# --- determinism: same init, data and seed -> the same losses; another seed -> others
state det1
state det2
check "two states made alike are byte-identical (one init)" \
  test "$(sums "$W/det1" | grep -v manifest.jsonl)" = "$(sums "$W/det2" | grep -v manifest.jsonl)"
"$TR" --manifest "$(mf det1)" --text "$CORPUS" --steps 6 --shuffle --seed 5 --json --quiet "${RUN[@]}" >"$W/det1.jsonl"
"$TR" --manifest "$(mf det2)" --text "$CORPUS" --steps 6 --shuffle --seed 5 --json --quiet "${RUN[@]}" >"$W/det2.jsonl"
check "same seed, same run: the 6 losses are identical" \
  test "$(losses "$W/det1.jsonl")" = "$(losses "$W/det2.jsonl")" -a "$(losses "$W/det1.jsonl" | wc -l)" = 6
check "…and so are the gradient norms" test "$(jq .grad_norm "$W/det1.jsonl")" = "$(jq .grad_norm "$W/det2.jsonl")"
check "…and the committed states" test "$(committed "$(mf det1)")" = "$(committed "$(mf det2)")"
state det3
"$TR" --manifest "$(mf det3)" --text "$CORPUS" --steps 6 --shuffle --seed 6 --json --quiet "${RUN[@]}" >"$W/det3.jsonl"
check "--seed 6 instead of 5: other losses (at every step)" \
  test "$(paste -d ' ' <(losses "$W/det1.jsonl") <(losses "$W/det3.jsonl") | awk '$1 == $2' | wc -l)" = 0

# --- resume, split: --steps 4, then --resume --steps 8 = --steps 8 from step 5 on.
# A constant schedule: the cosine's end is --steps, which differs between the
# parts (see man zinf-train, LEARNING RATE), so it would change steps 1-4.
for tiers in cpu nvme; do
  for dt in fp32 bf16; do
    name="resume ($tiers tiers, $dt)"
    lo=(--param "$tiers" --optim "$tiers" --param-dtype "$dt")
    state whole "${lo[@]}"
    state split "${lo[@]}"
    R=(--text "$CORPUS" --schedule constant --lr 3e-3 --json --quiet "${RUN[@]}")
    "$TR" --manifest "$(mf whole)" --steps 8 "${R[@]}" >"$W/whole.jsonl"
    "$TR" --manifest "$(mf split)" --steps 4 "${R[@]}" >"$W/part1.jsonl"
    check "$name: --steps 4 commits the manifest at step 4" test "$(manifest_step "$(mf split)")" = 4
    run "$TR" --manifest "$(mf split)" --steps 8 --resume "${R[@]}"
    expect_rc 0 "$name: --resume --steps 8 exits 0"
    printf '%s\n' "$out" >"$W/part2.jsonl"
    check "$name: the resumed run prints steps 5 to 8" test "$(jq -c .step "$W/part2.jsonl" | tr '\n' ' ')" = "5 6 7 8 "
    check "$name: steps 1-4 as the whole run's" test "$(losses "$W/part1.jsonl")" = "$(losses "$W/whole.jsonl" 1 4)"
    check "$name: steps 5-8 identical to the whole run's (every bit of the loss)" \
      test "$(losses "$W/part2.jsonl")" = "$(losses "$W/whole.jsonl" 5 8)"
    check "$name: both commit the same state at step 8 (every partition's xxh3)" \
      test "$(manifest_step "$(mf split)") $(committed "$(mf split)")" = "8 $(committed "$(mf whole)")"
  done
done

# --- resume after a signal, on the cosine schedule: SIGINT commits the step it
# is at and exits 130; with cpu tiers SIGKILL loses the steps since the last
# --checkpoint-every. The run resumed from either prints, from the next step
# on, the losses of a run never stopped. --steps is large so that the signal
# comes first; every run stops by a signal once it has the lines compared.
S=(--steps 100000 --text "$CORPUS" --lr 3e-3 --json "${RUN[@]}")
for tiers in cpu nvme; do
  name="SIGINT ($tiers tiers)"
  state sig --param "$tiers" --optim "$tiers"
  state ref --param "$tiers" --optim "$tiers"
  before=$(<"$(mf sig)")
  interrupt INT 3 "$W/a.jsonl" --manifest "$(mf sig)" "${S[@]}"
  check "$name: exits 130" test "$rc" = 130
  k=$(last_step "$W/a.jsonl")
  check "$name: stopped after its last line, step $k >= 3" test "$k" -ge 3
  check "$name: says where it committed, and to use --resume" \
    has_all "$(<"$W/a.jsonl.err")" "interrupted: checkpoint committed at step $k" "--resume"
  check "$name: the manifest is committed at step $k" test "$(manifest_step "$(mf sig)")" = "$k"
  check "$name: it changed (from step 0)" test "$(<"$(mf sig)")" != "$before"
  interrupt INT 3 "$W/b.jsonl" --manifest "$(mf sig)" --resume "${S[@]}"
  k2=$(last_step "$W/b.jsonl")
  check "$name: the resumed run goes on at step $((k + 1)) (and was stopped again at $k2)" \
    test "$(head -n 1 "$W/b.jsonl" | jq .step) $rc" = "$((k + 1)) 130"
  check "$name: …with stderr saying it resumes at step $k" contains "$(<"$W/b.jsonl.err")" "resuming at step $k"
  interrupt INT "$k2" "$W/ref.jsonl" --manifest "$(mf ref)" "${S[@]}"
  check "$name: steps $((k + 1))-$k2 identical to a run never stopped" \
    test "$(losses "$W/b.jsonl" 1 "$k2")" = "$(losses "$W/ref.jsonl" $((k + 1)) "$k2")" -a "$(last_step "$W/ref.jsonl")" -ge "$k2"
done
name="SIGKILL (cpu tiers, --checkpoint-every 2)"
state kill --param cpu --optim cpu
state ref --param cpu --optim cpu
interrupt KILL 5 "$W/a.jsonl" --manifest "$(mf kill)" --checkpoint-every 2 "${S[@]}"
check "$name: killed (137)" test "$rc" = 137
k=$(manifest_step "$(mf kill)")
n=$(last_step "$W/a.jsonl")
# Its checkpoint at an even step commits before that step's line: the last
# one is at the last even step printed, or the next when it was not printed yet.
check "$name: the manifest is at the last even step (at $k, $n printed), not mixed" \
  test "$k" = $((n / 2 * 2)) -o "$k" = $(((n + 1) / 2 * 2))
check "$name: and $k >= 4" test "$k" -ge 4
interrupt INT 3 "$W/b.jsonl" --manifest "$(mf kill)" --checkpoint-every 2 --resume "${S[@]}"
k2=$(last_step "$W/b.jsonl")
interrupt INT "$k2" "$W/ref.jsonl" --manifest "$(mf ref)" --checkpoint-every 2 "${S[@]}"
check "$name: resumed at step $((k + 1)), steps to $k2 identical to a run never stopped" \
  test "$(head -n 1 "$W/b.jsonl" | jq .step) $(losses "$W/b.jsonl" 1 "$k2")" = \
  "$((k + 1)) $(losses "$W/ref.jsonl" $((k + 1)) "$k2")"

# --- a checkpoint is continued only when asked, and never past --steps
state ck
"$TR" --manifest "$(mf ck)" --text "$CORPUS" --steps 2 --quiet "${RUN[@]}" >/dev/null
cp "$(mf ck)" "$W/ck.before"
sums "$W/ck" >"$W/ck.sums"
run "$TR" --manifest "$(mf ck)" --text "$CORPUS" --steps 5 "${RUN[@]}"
expect_rc 64 "a manifest at step 2 without --resume exits 64"
refused_out=$out
check "…saying it is a checkpoint at step 2 and naming --resume" has_all "$err" "checkpoint at step 2" "--resume"
run "$TR" --manifest "$(mf ck)" --text "$CORPUS" --steps 2 --resume "${RUN[@]}"
expect_rc 64 "a manifest at step 2 with --resume --steps 2 exits 64"
refused_out+=$out
check "…saying it is already at step 2" contains "$err" "already at step 2"
run "$TR" --manifest "$(mf ck)" --text "$CORPUS" --steps 5 --batch 2 --seq 16 --threads 1 --pinned 4TiB --pinned-buffer 256KiB
expect_rc 64 "a refused checkpoint is refused before the pinned pool is taken (--pinned 4TiB)"
check "…for the checkpoint, not the pool" has_all "$err" "checkpoint at step 2" "--resume"
refused_out+=$out
run "$TR" --manifest "$(mf ck)" --text "$CORPUS" --steps 1 --resume "${RUN[@]}"
expect_rc 64 "…and with --steps 1 (before it)"
check "the refused runs print nothing on stdout" test -z "$refused_out$out"
check "the refused runs leave the checkpoint byte-identical" \
  test "$(cmp "$W/ck.before" "$(mf ck)" && sums "$W/ck")" = "$(<"$W/ck.sums")"

# --- data parallel: mpirun -np 2 on a dp=2 state with -B 2 = one process with -B 4
if command -v mpirun >/dev/null; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  state dp2 --dp 2
  state dp1
  D=(--text "$CORPUS" --steps 5 --seq 16 --lr 3e-3 --json "${POOL[@]}")
  run mpirun -np 2 "$TR" --manifest "$(mf dp2)" --batch 2 "${D[@]}"
  expect_rc 0 "mpirun -np 2 on a dp=2 state exits 0"
  printf '%s\n' "$out" >"$W/dp2.jsonl"
  check "only rank 0 prints: 5 lines, steps 1-5, 64 tokens each" \
    jq -e -s '[.[].step] == [1, 2, 3, 4, 5] and all(.[]; .tokens == 64)' "$W/dp2.jsonl"
  check "…and its info once (one 'done:' line, 2 ranks named)" \
    test "$(grep -c 'zinf-train: done' <<<"$err") $(grep -c 'rank 0 of 2' <<<"$err")" = "1 1"
  run "$TR" --manifest "$(mf dp1)" --batch 4 "${D[@]}"
  printf '%s\n' "$out" >"$W/dp1.jsonl"
  check "the losses agree with one process of batch 4 within 1e-5 relative" \
    jq -e -n --slurpfile a "$W/dp2.jsonl" --slurpfile b "$W/dp1.jsonl" \
    '($a | length) == 5 and ($b | length) == 5
      and all(range(5); (($a[.].loss - $b[.].loss) | fabs) <= 1e-5 * $b[.].loss)'
  check "both states are committed at step 5" test "$(manifest_step "$(mf dp2)") $(manifest_step "$(mf dp1)")" = "5 5"
else
  skip "data parallel under mpirun" "no mpirun"
fi

# --- refusals: exit codes, messages, and the manifest left as it was
python3 - "$W" <<'EOF'
import random, struct, sys
d = sys.argv[1]
def write(name, toks, magic=20240520, version=1, count=None, cut=0):
    h = [0] * 256
    h[0], h[1], h[2] = magic, version, len(toks) if count is None else count
    b = struct.pack("<256i", *h) + struct.pack("<%dH" % len(toks), *toks)
    open(f"{d}/{name}", "wb").write(b[: len(b) - cut])
rng = random.Random(20240520)
toks = [rng.randrange(256) for _ in range(4000)]
write("good.bin", toks)
write("magic.bin", toks, magic=20240521)
write("short.bin", toks, cut=3)
big = list(toks)
big[1234] = 300
write("big.bin", big)
EOF
state control
state victim
state v100 --model gpt:layers=1,hidden=32,heads=2,vocab=100,seq=32
state infer --inference
state dp2x --dp 2
sums "$W/victim" >"$W/victim.sums"
run "$TR" --manifest "$(mf control)" "${RUN[@]}" --data "$W/good.bin" --val-data "$W/good.bin" --steps 2 --eval-every 1 --json
expect_rc 0 "an llm.c token file trains (the control for the refusals)"
check "…2 lines, each with val_loss" jq -e -s 'length == 2 and all(.[]; .val_loss > 0)' <<<"$out"
V=(--manifest "$(mf victim)" "${RUN[@]}")
refused() { # WANT NAME ARGS...: one test of the exit status, one that stdout is empty
  local want=$1 name=$2
  shift 2
  run "$TR" "$@"
  expect_rc "$want" "$name exits $want"
  [[ -z $out ]] || fail "$name: nothing on stdout" "got: ${out:0:200}"
}
refused 65 "a token file with a bad magic" "${V[@]}" --data "$W/magic.bin" --steps 2
check "…naming the file and the magic" has_all "$err" "$W/magic.bin" "magic"
refused 65 "a truncated token file" "${V[@]}" --data "$W/short.bin" --steps 2
check "…naming the file" contains "$err" "$W/short.bin"
refused 66 "a missing --data file" "${V[@]}" --data "$W/nope.bin" --steps 2
check "…naming it" contains "$err" "$W/nope.bin"
refused 65 "token 300 in a file for a vocabulary-256 model" "${V[@]}" --data "$W/big.bin" --steps 2
check "…naming the file, the token and its offset" has_all "$err" "$W/big.bin" "token 300" "offset 1234"
refused 65 "--text on a model of vocabulary 100" --manifest "$(mf v100)" "${RUN[@]}" --text "$CORPUS" --steps 2
check "…naming the offset of the first byte >= 100" has_all "$err" "$CORPUS" "offset"
refused 64 "--data and --text together" "${V[@]}" --data "$W/good.bin" --text "$CORPUS" --steps 2
refused 64 "no --steps" "${V[@]}" --text "$CORPUS"
refused 64 "--seq 64 on a model of 32 positions" --manifest "$(mf victim)" "${POOL[@]}" --text "$CORPUS" --steps 2 --seq 64
check "…naming both lengths" has_all "$err" "64" "32"
refused 64 "a bad option" "${V[@]}" --text "$CORPUS" --steps 2 --no-such-option
check "…pointing at --help" contains "$err" "--help"
refused 64 "--schedule linear" "${V[@]}" --text "$CORPUS" --steps 2 --schedule linear
refused 66 "a missing --manifest" --manifest "$W/nope/manifest.jsonl" "${RUN[@]}" --text "$CORPUS" --steps 2
refused 65 "a manifest laid out with --inference" --manifest "$(mf infer)" "${RUN[@]}" --text "$CORPUS" --steps 2
check "…saying it has no optimizer state" contains "$err" "inference"
refused 64 "a dp=2 state in one process" --manifest "$(mf dp2x)" "${RUN[@]}" --text "$CORPUS" --steps 2
check "…mentioning reshard" contains "$err" "reshard"
refused 65 "a batch larger than the data" --manifest "$(mf victim)" "${POOL[@]}" --text "$CORPUS" --steps 2 --batch 100000
check "…naming the tokens needed" contains "$err" "fewer than one global batch needs"
check "the refused runs leave the state and its manifest byte-identical" \
  test "$(sums "$W/victim")" = "$(<"$W/victim.sums")"
check "…and the other refused states at step 0" \
  test "$(manifest_step "$(mf v100)") $(manifest_step "$(mf infer)") $(manifest_step "$(mf dp2x)")" = "0 0 0"

# --- --bench: a training step's FLOP/s against sgemm, no manifest
# shellcheck disable=SC2054  # the commas are the model spec's
BENCH=(--bench --bench-model gpt:layers=1,hidden=64,heads=2,vocab=256,seq=32 --bench-steps 1 --bench-gemm 128
  --batch 2 --seq 32 --threads 1)
run "$TR" "${BENCH[@]}" --json
expect_rc 0 "--bench on a tiny model exits 0"
check "one JSON line, schema zinf.train-bench/1, ratio > 0, sgemm_flops_per_s > 0" \
  jq -e -s 'length == 1 and .[0].schema == "zinf.train-bench/1" and .[0].ratio > 0
    and .[0].sgemm_flops_per_s > 0 and .[0].flops_per_s > 0 and .[0].step_s > 0' <<<"$out"
check "ratio = flops_per_s / sgemm_flops_per_s" \
  jq -e '((.flops_per_s / .sgemm_flops_per_s) - .ratio | fabs) <= 1e-9 * .ratio' <<<"$out"
run "$TR" "${BENCH[@]}"
expect_rc 0 "--bench human lines exit 0"
check "…three '#' lines (the run, what the ratio is over, the columns) and one data line" \
  test "$(grep -vc '^#' <<<"$out") $(grep -c '^#' <<<"$out")" = "1 3"
check "…the ratio's line names its peer" contains "$out" "# ratio: the step's model FLOP/s over sgemm's"
run "$TR" "${BENCH[@]}" --json --min-ratio 1000
expect_rc 75 "--bench --min-ratio 1000 exits 75"
check "…after printing its line" jq -e -s 'length == 1' <<<"$out"
check "…naming --min-ratio" contains "$err" "--min-ratio"

# --- --bench-against: two models timed step by step, each beside an sgemm of its own
# shellcheck disable=SC2054
LL=llama:layers=1,hidden=64,heads=4,kv_heads=2,ffn=128,vocab=256,seq=32,rope_theta=10000,tied=1
# shellcheck disable=SC2054
PAIR=(--bench --bench-model gpt:layers=1,hidden=64,heads=2,vocab=256,seq=32 --bench-gemm 128
  --batch 2 --seq 32 --threads 1)
run "$TR" "${PAIR[@]}" --bench-steps 3 --bench-against "$LL" --json
expect_rc 0 "--bench --bench-against exits 0"
check "…two records: the model, then the one it is held against, each with its own ratio and sgemm" \
  jq -e -s --arg ll "$LL" 'length == 2 and .[0].role == "model" and .[1].role == "against"
    and (.[1].model | startswith("llama:layers=1,hidden=64")) and (.[0].model | startswith("gpt:layers=1"))
    and all(.[]; .paired and .ratio > 0 and .sgemm_flops_per_s > 0 and .step_s > 0)' <<<"$out"
check "…the quotient (the median of the rounds' first ratio over the second) on the first record only" \
  jq -e -s '.[0].ratio_over_against > 0 and (.[1] | has("ratio_over_against") | not)' <<<"$out"
run "$TR" "${PAIR[@]}" --bench-steps 2 --bench-against "$LL"
expect_rc 0 "--bench-against human lines exit 0"
check "…two data lines, the second under '# against:', and the quotient's line" \
  test "$(grep -vc '^#' <<<"$out") $(grep -c '^# against: llama' <<<"$out") $(grep -c '^# ratio over the against model.s: [0-9.]* (median of 2 rounds)' <<<"$out")" = "2 1 1"
run "$TR" --bench-against "$LL"
expect_rc 64 "--bench-against without --bench exits 64"
check "…naming it" contains "$err" "--bench-against needs --bench"
run "$TR" "${BENCH[@]}" --bench-against llama:layers=1
expect_rc 64 "--bench-against with a bad spec exits 64"

finish
