#!/usr/bin/env bash
# The third round of hostile findings (issue 47): a moved or copied folder
# never writes into its origin, rank folders have one owner, no crash on any
# input. Each section names the finding and how the probe reproduced it, and
# checks what must hold now. Every section has checks that fail on main at
# 6052a62 (ZINF_BIN=<its bin> with each program under a 60 s timeout: 74 of
# 110 fail, among them every section's first; the ones that pass there are
# the companions, such as "…while --threads 2 trains").
source "$(dirname "$0")/lib.bash"
MT=gpt:layers=1,hidden=32,heads=2,vocab=256,seq=32 # byte-level, trains on any text
M2=$MT
W=$(mktemp -d /var/tmp/zinf-e2e-round3-XXXXXX)
on_exit "rm -rf '$W'"
head -c 20000 "$ROOT/man/zinf-shard.1" >"$W/corpus.txt"
TA=(--text "$W/corpus.txt" --batch 2 --seq 16 --json "${POOL[@]}")
# train ARGS...: zinf-train on the corpus, one thread unless ARGS say.
train() {
  local threads=(--threads 1)
  [[ " $* " == *" --threads "* ]] && threads=()
  "$TR" "${TA[@]}" "${threads[@]}" "$@"
}
SAO=(--prompt x -n 2 --threads 1 "${POOL[@]}")
# state NAME [LAYOUT OPTIONS]: an fp32 state of $MT in $W/NAME.
state() {
  local name=$1
  shift
  fresh "$name" --param-dtype fp32 "$@"
}

# --- 6. Output written into the lock file when stdout is closed -------------
# Probe: `zinf-train ... >&-` and `zinf-sample ... >&-` opened .zinf-lock as
# descriptor 1, wrote the step lines or the sampled text into it, and exited
# 0. Now every program opens /dev/null on a closed 0, 1 or 2 before anything
# else (open_standard_fds, the first call of every main).
state s6
train --manifest "$W/s6/manifest.jsonl" --steps 2 >&- 2>"$W/s6.err"
rc=$?
err=$(<"$W/s6.err")
expect_rc 0 "zinf-train with stdout closed runs (its lines go nowhere)"
check "…and writes no step line into the lock file" bash -c '! grep -q "\"step\"" "$1"' _ "$W/s6/.zinf-lock"
check "…whose holder record is still one JSON line" bash -c 'head -c 511 "$1" | jq -e ".zinf == \"lock\"" >/dev/null' _ "$W/s6/.zinf-lock"
"$SA" -m "$W/s6/manifest.jsonl" "${SAO[@]}" >&- 2>"$W/s6.err"
rc=$?
err=$(<"$W/s6.err")
expect_rc 0 "zinf-sample with stdout closed runs"
check "…and writes no text into the lock file" bash -c '[[ $(head -c 1 "$1") == "{" ]] && [[ $(wc -c <"$1") == 512 ]]' _ "$W/s6/.zinf-lock"
run zs verify -m "$W/s6/manifest.jsonl"
expect_rc 0 "…and the state still verifies"
# stdin and stderr closed too: a layout, verified through a pipe.
zs layout --model "$MT" <&- 2>&- | zs init --dir "$W/s6b" 2>&- <&0 >/dev/null
check "zinf-shard with stdin and stderr closed: layout | init commits" test -s "$W/s6b/manifest.jsonl"
# Every program's main calls open_standard_fds first.
bad=
for f in "$ROOT"/*/main.cpp "$ROOT"/bench/*.cpp; do
  grep -q '^int main(' "$f" || continue
  first=$(awk '/^int main\(/ { getline; print; exit }' "$f")
  [[ $first == *"open_standard_fds("* ]] || bad+=" ${f#"$ROOT"/}"
done
check "every program's main calls open_standard_fds first${bad:+ (not:$bad)}" test -z "$bad"

# --- 3. Crash: --threads 100000 -------------------------------------------
# Probe: zinf-train --threads 100000 died of SIGSEGV inside GOMP_parallel
# (exit 139, no message), --threads 30000 exited 1 with libgomp's "Thread
# creation failed"; zinf-train --bench the same. Now a count past 4 per CPU
# is refused (64) before any thread starts, in every program that takes it.
state s3
for t in 100000 30000; do
  run train --manifest "$W/s3/manifest.jsonl" --steps 1 --threads "$t"
  expect_rc 64 "zinf-train --threads $t is refused (64)"
  check "…saying the most this machine takes" has_all "$err" "--threads $t" "threads per CPU"
done
run "$TR" --bench --threads 100000 --batch 1 --seq 8
expect_rc 64 "zinf-train --bench --threads 100000 is refused (64)"
run "$SA" -m "$W/s3/manifest.jsonl" --prompt x -n 2 --threads 100000 "${POOL[@]}"
expect_rc 64 "zinf-sample --threads 100000 is refused (64)"
run "$BIN/zinf-optbench" --params 1M --steps 1 --threads 100000
expect_rc 64 "zinf-optbench --threads 100000 is refused (64)"
run train --manifest "$W/s3/manifest.jsonl" --steps 1 --threads 2
expect_rc 0 "…while --threads 2 trains"

# --- 7. Bad input accepted ---------------------------------------------------
# Probe: --device-memory 0 trained with an undocumented 1 GiB (while 1 was
# refused with 64); zinf-shard layout --seed 18446744073709551616 saturated
# to 2^64-1 with exit 0; verify --ranks 99999999999999999999 reported rank
# 4294967295 (wrapped). Now each is a usage error (64) naming the value.
run train --manifest "$W/s3/manifest.jsonl" --steps 3 --resume --device-memory 0
expect_rc 64 "--device-memory 0 is refused (64)"
check "…naming the option" contains "$err" "--device-memory 0"
for seed in 18446744073709551616 0x10000000000000000 99999999999999999999999; do
  run zs layout --model "$MT" --seed "$seed"
  expect_rc 64 "layout --seed $seed (past 2^64-1) is refused (64), not saturated"
done
run zs layout --model "$MT" --seed 18446744073709551615
expect_rc 0 "…while --seed 18446744073709551615 (2^64-1) is taken"
check "…as itself" contains "$out" '"seed":18446744073709551615'
run train --manifest "$W/s3/manifest.jsonl" --steps 18446744073709551616 --resume
expect_rc 64 "zinf-train --steps 18446744073709551616 is refused (64)"
run zs verify -m "$W/s3/manifest.jsonl" --ranks 99999999999999999999
expect_rc 64 "verify --ranks 99999999999999999999 is refused (64)"
check "…naming the rank as given, not wrapped" has_all "$err" "rank 99999999999999999999 is not below dp 1"
for ranks in 4294967296 0-4294967296 1-0 0,,0 0-; do
  run zs verify -m "$W/s3/manifest.jsonl" --ranks "$ranks"
  expect_rc 64 "verify --ranks '$ranks' is refused (64)"
done
run zs verify -m "$W/s3/manifest.jsonl" --ranks 0
expect_rc 0 "…while --ranks 0 verifies"

# --- 1. A copied or moved folder wrote into its origin (data loss) ----------
# Probe: cp -r B A; zinf-shard verify -m A/manifest.jsonl --data-dir A > X.m;
# zinf-train --manifest X.m --resume exited 0, said it committed
# A/manifest.jsonl, and rewrote every file of B (both generations) and B's
# lock; B then failed verify and --resume (65). A's manifest names dir B, and
# the trainer followed it. The same after mv run1 run1-old, a new init of
# run1, and resuming the old run from its new place. Now a committed
# manifest that names another folder than the one it lies in is refused
# (65, saying how to adopt it) by every program that reads or writes a
# state, before anything is opened for writing; verify --data-dir adopts it.
state B1
train --manifest "$W/B1/manifest.jsonl" --steps 2 >/dev/null 2>&1
cp -r "$W/B1" "$W/A1"
sums "$W/B1" >"$W/B1.sums"
cp "$W/B1/.zinf-lock" "$W/B1.lock"
unchanged() { sums "$W/B1" | cmp -s - "$W/B1.sums" && cmp -s "$W/B1/.zinf-lock" "$W/B1.lock"; }
run train --manifest "$W/A1/manifest.jsonl" --steps 4 --resume
expect_rc 65 "zinf-train on a copied folder's manifest is refused (65)"
check "…naming both folders and how to adopt it" has_all "$err" "names the data directory $W/B1, not $W/A1" \
  "zinf-shard verify -m $W/A1/manifest.jsonl --data-dir $W/A1"
jq -c "if .dir then .dir = \"$W/A1\" else . end" "$W/A1/manifest.jsonl" >"$W/A1.m" # a copy naming A1
run train --manifest "$W/A1.m" --steps 4 --resume
expect_rc 65 "zinf-train given a manifest naming the copy (whose own manifest names the origin) is refused (65)"
run "$SA" -m "$W/A1/manifest.jsonl" "${SAO[@]}"
expect_rc 65 "zinf-sample on the copy is refused (65)"
run "$SA" -m "$W/A1.m" "${SAO[@]}"
expect_rc 65 "zinf-sample through a manifest naming the copy is refused (65)"
for sub in verify "cat --sums" "export --to $W/a1.safetensors" "reshard --dp 2 --dir $W/A1r"; do
  run bash -c '"$@" >/dev/null' _ "$SH" $sub "${POOL[@]}" -m "$W/A1/manifest.jsonl"
  expect_rc 65 "zinf-shard ${sub%% *} of the copy is refused (65)"
done
check "…and reshard made no directory" test ! -e "$W/A1r"
for sub in "cat --sums" "export --to $W/a1.safetensors"; do
  run bash -c '"$@" >/dev/null' _ "$SH" $sub "${POOL[@]}" -m "$W/A1.m" --data-dir "$W/A1"
  expect_rc 65 "zinf-shard ${sub%% *} --data-dir of the copy is refused (65): adopt it first"
done
check "…and nothing of the origin was written, its lock file included" unchanged
# Adoption, as the probe's first step did it: the copy verified where it
# lies, and its manifest committed naming it.
run zs verify -m "$W/A1/manifest.jsonl" --data-dir "$W/A1" --ranks 0
expect_rc 64 "adopting with --ranks is refused (64): every rank is verified"
run zs verify -m "$W/A1/manifest.jsonl" --data-dir "$W/A1"
expect_rc 0 "verify --data-dir adopts the copy"
echo "$out" >"$W/X.m"
check "…and commits a manifest naming it" test "$(jq -r 'select(.schema) | .dir' "$W/A1/manifest.jsonl")" = "$(realpath "$W/A1")"
check "…which it prints" test "$(head -n 1 "$W/X.m" | jq -r .dir)" = "$(realpath "$W/A1")"
run train --manifest "$W/X.m" --steps 4 --resume
expect_rc 0 "the probe's zinf-train --manifest X.m --resume trains the adopted copy"
check "…committing it there, at step 4" test "$(jq -s '[.[1:][].step] | max' "$W/A1/manifest.jsonl")" = 4
check "…and the origin is untouched" unchanged
run zs verify -m "$W/B1/manifest.jsonl"
expect_rc 0 "…and verifies"
run train --manifest "$W/B1/manifest.jsonl" --steps 3 --resume
expect_rc 0 "…and resumes"
# A damaged copy is not adopted: its manifest still names the origin.
cp -r "$W/A1" "$W/A2"
printf 'x' | dd of="$W/A2/rank0/param.bin" bs=1 seek=100 conv=notrunc status=none
run zs verify -m "$W/A2/manifest.jsonl" --data-dir "$W/A2"
expect_rc 65 "a damaged copy is not adopted (65)"
check "…its manifest still names the origin" test "$(jq -r 'select(.schema) | .dir' "$W/A2/manifest.jsonl")" = "$(realpath "$W/A1")"
# The move: mv run1 run1-old, a new init of run1, the old run resumed from its new place.
state run1
train --manifest "$W/run1/manifest.jsonl" --steps 2 >/dev/null 2>&1
mv "$W/run1" "$W/run1-old"
state run1 --seed 7
sums "$W/run1" >"$W/run1.sums"
run train --manifest "$W/run1-old/manifest.jsonl" --steps 4 --resume
expect_rc 65 "resuming a moved run from its new place, with a new run at the old one, is refused (65)"
check "…and the new run is untouched" bash -c 'cd "$1" && find . -type f ! -name .zinf-lock -print0 | sort -z | xargs -0r sha256sum | cmp -s - "$2"' _ "$W/run1" "$W/run1.sums"
run zs verify -m "$W/run1-old/manifest.jsonl" --data-dir "$W/run1-old"
expect_rc 0 "…adopted where it lies"
run train --manifest "$W/run1-old/manifest.jsonl" --steps 4 --resume
expect_rc 0 "…it resumes there"
# A copy of a manifest kept elsewhere (no state beside it) still leads to its directory.
mkdir "$W/keep" && cp "$W/B1/manifest.jsonl" "$W/keep/manifest.jsonl"
run zs verify -m "$W/keep/manifest.jsonl"
expect_rc 0 "a manifest copied alone into another folder still leads to its directory (0)"

# --- 2. One run's rank folders taken by another without --force -------------
# Probe: two zinf-shard init --rank-dir $PWD/shared_rd/rank%r from different
# directories: the second exited 0 over the first's data, which then failed
# verify (65); reshard --rank-dir onto them the same. The marker recorded
# only the rank. Now it records the state that owns the folder: another
# owner is refused (73) without --force.
zs layout --model "$MT" --param-dtype fp32 --dp 2 >"$W/l2.jsonl"
mkdir "$W/e1" "$W/e2"
(cd "$W/e1" && zs init --dir run --rank-dir "$W/shared_rd/rank%r" <"$W/l2.jsonl" >/dev/null 2>&1)
check "the rank folder's marker names its owner" test "$(jq -r .dir "$W/shared_rd/rank1/.zinf-rank")" = "$(realpath "$W/e1/run")"
sums "$W/shared_rd" >"$W/rd.sums"
run bash -c 'cd "$1/e2" && "${@:2}" --dir run --rank-dir "$1/shared_rd/rank%r" <"$1/l2.jsonl"' _ "$W" "$SH" init "${POOL[@]}"
expect_rc 73 "a second init into another run's rank folders is refused (73)"
check "…naming the folder and its owner" has_all "$err" "$W/shared_rd/rank0" "belongs to the state in $(realpath "$W/e1/run")" "--force"
check "…writing nothing there" bash -c 'cd "$1" && find . -type f ! -name .zinf-lock -print0 | sort -z | xargs -0r sha256sum | cmp -s - "$2"' _ "$W/shared_rd" "$W/rd.sums"
check "…and leaving no directory" test ! -e "$W/e2/run"
run zs reshard -m "$W/e1/run/manifest.jsonl" --dp 2 --dir "$W/e3" --rank-dir "$W/shared_rd/rank%r"
expect_rc 73 "reshard --rank-dir onto another run's rank folders is refused (73)"
run zs verify -m "$W/e1/run/manifest.jsonl"
expect_rc 0 "…and the first run still verifies"
run bash -c 'cd "$1/e2" && "${@:2}" --dir run --rank-dir "$1/shared_rd/rank%r" --force <"$1/l2.jsonl"' _ "$W" "$SH" init "${POOL[@]}"
expect_rc 0 "with --force the second run takes them over"
run zs verify -m "$W/e1/run/manifest.jsonl"
expect_rc 65 "…and the first run is refused (65), not read as the second's"
check "…naming the folder's owner now" has_all "$err" "belongs to the state in $(realpath "$W/e2/run")"
# A copy of a run with rank folders cannot share them; a moved one takes them.
cp -r "$W/e2/run" "$W/e2/copy"
run zs verify -m "$W/e2/copy/manifest.jsonl" --data-dir "$W/e2/copy"
expect_rc 65 "adopting a copy whose rank folders its origin still names is refused (65)"
check "…saying so" has_all "$err" "which still names it"
mv "$W/e2/run" "$W/e2/moved"
run zs verify -m "$W/e2/moved/manifest.jsonl" --data-dir "$W/e2/moved"
expect_rc 0 "a moved run is adopted with its rank folders"
check "…whose markers name it now" test "$(jq -r .dir "$W/shared_rd/rank0/.zinf-rank")" = "$(realpath "$W/e2/moved")"
run zs verify -m "$W/e2/moved/manifest.jsonl"
expect_rc 0 "…and it verifies"
# mv run run-old, then a new init at run's path with the same --rank-dir:
# the rank folder's marker names that path, but the state there now does
# not name the folder; the moved state still uses it (73 without --force).
zs layout --model "$MT" --param-dtype fp32 | zs init --dir "$W/rr" --rank-dir "$W/rr_rd/rank%r" >/dev/null 2>&1
mv "$W/rr" "$W/rr-old"
sums "$W/rr_rd" >"$W/rr.sums"
run bash -c '"$1" layout --model "$2" --seed 9 | "$1" init --dir "$3" --rank-dir "$4" "${@:5}"' _ "$SH" "$MT" "$W/rr" \
  "$W/rr_rd/rank%r" "${POOL[@]}"
expect_rc 73 "a new init at a moved state's old path, into its rank folder, is refused (73)"
check "…saying the state that was there still uses it" contains "$err" "was moved or copied away and may still use them"
check "…writing nothing there" bash -c 'cd "$1" && find . -type f ! -name .zinf-lock -print0 | sort -z | xargs -0r sha256sum | cmp -s - "$2"' _ "$W/rr_rd" "$W/rr.sums"
run zs verify -m "$W/rr-old/manifest.jsonl" --data-dir "$W/rr-old"
expect_rc 0 "…and the moved state is adopted with it"
# A marker from before owners were recorded is still read.
printf '{"zinf":"rank folder","rank":0}\n' >"$W/shared_rd/rank0/.zinf-rank"
run zs verify -m "$W/e2/moved/manifest.jsonl"
expect_rc 0 "a marker without an owner (written before issue 47) is still taken"

# --- 4. The token file truncated during training: SIGBUS ------------------
# Probe: --data's token file truncated while zinf-train ran: SIGBUS (exit
# 135, no message), 213 trained steps lost since the last checkpoint. Now
# every batch is read with pread and checked against the file as opened: a
# truncated or replaced file is an error (65) naming the file and offset,
# and the steps taken are committed as an interrupt commits them.
"${ZINF_PYTHON:-python3}" - "$W" <<'PY'
import random, struct, sys
d = sys.argv[1]
h = [0] * 256
h[0], h[1], h[2] = 20240520, 1, 200000
rng = random.Random(47)
toks = [rng.randrange(256) for _ in range(h[2])]
b = struct.pack("<256i", *h) + struct.pack("<%dH" % len(toks), *toks)
for name in ("tok.bin", "tok2.bin", "tok.orig"):
    open(f"{d}/{name}", "wb").write(b)
PY
for how in truncate replace; do
  cp "$W/tok.orig" "$W/tok.bin"
  fresh "t4$how" --param-dtype fp32 --param cpu --optim cpu
  : >"$W/t4.out"
  "$TR" --data "$W/tok.bin" --manifest "$W/t4$how/manifest.jsonl" --steps 100000 --batch 2 --seq 16 --threads 1 \
    --json "${POOL[@]}" >"$W/t4.out" 2>"$W/t4.err" &
  pid=$!
  for ((i = 0; i < 600; i++)); do
    lines_in "$W/t4.out"
    ((REPLY >= 20)) && break
    kill -0 "$pid" 2>/dev/null || break
    nap 0.1
  done
  if [[ $how == truncate ]]; then truncate -s 3024 "$W/tok.bin"; else cp "$W/tok2.bin" "$W/tok.new" && mv "$W/tok.new" "$W/tok.bin"; fi
  for ((i = 0; i < 300; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    nap 0.1
  done
  kill -9 "$pid" 2>/dev/null
  wait "$pid"
  rc=$?
  err=$(<"$W/t4.err")
  expect_rc 65 "the token file ${how}d under zinf-train: exit 65, not a signal"
  check "…naming the file, what changed and the offset" has_all "$err" "$W/tok.bin: the token file changed during the run" \
    "$([[ $how == truncate ]] && echo truncated || echo replaced)" "at offset"
  last=$(tail -n 1 "$W/t4.out" | jq .step)
  check "…committing the $last steps taken, as an interrupt does" \
    test "$(jq -s '[.[1:][].step] | max' "$W/t4$how/manifest.jsonl")" = "$last"
  check "…saying so" contains "$err" "checkpoint committed at step $last"
  cp "$W/tok.orig" "$W/tok.bin"
  run "$TR" --data "$W/tok.bin" --manifest "$W/t4$how/manifest.jsonl" --steps $((last + 2)) --resume --batch 2 --seq 16 \
    --threads 1 --json "${POOL[@]}"
  expect_rc 0 "…and the run resumes from there"
done

# --- 8. Unclear messages, inconsistent codes -------------------------------
# Probe: a Hugging Face shard that is a folder exited 74 (an index that is a
# folder 65); .zinf-lock as a folder 74, as a FIFO 65; a GPT-2 import from
# a sharded index said "header length 7017841271895827067 is more than the
# 100MiB"; --manifest /dev/stdin read the pipe twice ("empty manifest") and
# --manifest - was "-: open failed" in zinf-train and zinf-sample; a range
# error for --temperature -1 printed DBL_MAX in some 300 digits; a
# weight_map name with a NUL read as a contradiction.
LS=llama:layers=1,hidden=32,heads=4,kv_heads=2,ffn=48,vocab=64,seq=32
zs layout --model "$LS" --param-dtype fp32 | zs init --dir "$W/ll" >/dev/null 2>&1
zs export -m "$W/ll/manifest.jsonl" --to "$W/hf" --shard-size 8KiB >/dev/null 2>&1
shard=$(jq -r '[.weight_map[]] | unique | .[1]' "$W/hf/model.safetensors.index.json")
cp -r "$W/hf" "$W/hf-dir" && rm "$W/hf-dir/$shard" && mkdir "$W/hf-dir/$shard"
run bash -c '"$1" layout --model "$2" | "$1" import --from "$3" --dir "$4" "${@:5}"' _ "$SH" "$LS" "$W/hf-dir" "$W/hfi" "${POOL[@]}"
expect_rc 65 "a Hugging Face shard that is a folder is bad input (65), as an index that is one"
check "…naming it" has_all "$err" "$W/hf-dir/$shard: is a folder, not a safetensors shard"
run bash -c '"$1" layout --model "$2" | "$1" import --from "$3" --dir "$4" "${@:5}"' _ "$SH" "$MT" \
  "$W/hf/model.safetensors.index.json" "$W/gi" "${POOL[@]}"
expect_rc 65 "a GPT-2 import from a sharded index exits 65"
check "…saying the sharded import is for Llama-family models, not a header length" \
  bash -c '[[ $1 == *"sharded import is for Llama-family models"* && $1 != *"header length"* ]]' _ "$err"
jq -c '.weight_map["model.norm\u0000weight"] = .weight_map["model.norm.weight"]' "$W/hf/model.safetensors.index.json" \
  >"$W/hf/nul.json"
cp -r "$W/hf" "$W/hf-nul" && mv "$W/hf-nul/nul.json" "$W/hf-nul/model.safetensors.index.json"
run bash -c '"$1" layout --model "$2" | "$1" import --from "$3" --dir "$4" "${@:5}"' _ "$SH" "$LS" "$W/hf-nul" "$W/ni" "${POOL[@]}"
expect_rc 65 "a weight_map name holding a NUL byte exits 65"
check "…saying so, not that a shard lacks it" has_all "$err" 'whose name holds a NUL byte' 'model.norm\u0000weight'
state lk
rm "$W/lk/.zinf-lock" && mkdir "$W/lk/.zinf-lock"
run zs verify -m "$W/lk/manifest.jsonl"
expect_rc 65 ".zinf-lock as a folder is bad data (65), as a FIFO there is"
check "…saying so" contains "$err" "the lock file is a folder"
rmdir "$W/lk/.zinf-lock" && mkfifo "$W/lk/.zinf-lock"
run zs verify -m "$W/lk/manifest.jsonl"
expect_rc 65 "…and as a FIFO (65)"
rm "$W/lk/.zinf-lock"
run bash -c '"$1" "${@:3}" --manifest - <"$2"' _ "$TR" "$W/lk/manifest.jsonl" "${TA[@]}" --threads 1 --steps 2
expect_rc 0 "zinf-train --manifest - reads the manifest from stdin"
run bash -c 'cat "$2" | "$1" "${@:3}" --manifest /dev/stdin' _ "$TR" "$W/lk/manifest.jsonl" "${TA[@]}" --threads 1 --steps 3 --resume
expect_rc 0 "zinf-train --manifest /dev/stdin reads the pipe once"
check "…and commits the directory's manifest (step 3)" test "$(jq -s '[.[1:][].step] | max' "$W/lk/manifest.jsonl")" = 3
run bash -c '"$1" -m - "${@:3}" <"$2"' _ "$SA" "$W/lk/manifest.jsonl" "${SAO[@]}"
expect_rc 0 "zinf-sample -m - reads the manifest from stdin"
run bash -c 'cat "$2" | "$1" -m /dev/stdin "${@:3}"' _ "$SA" "$W/lk/manifest.jsonl" "${SAO[@]}"
expect_rc 0 "zinf-sample -m /dev/stdin reads the pipe once"
run "$SA" -m "$W/lk/manifest.jsonl" --temperature -1 --prompt x
expect_rc 64 "--temperature -1 is refused (64)"
check "…in a short line (${#err} characters), not DBL_MAX's 300 digits" bash -c '(($1 < 200))' _ "${#err}"
check "…saying it must be 0 or more" contains "$err" "'-1' is negative: it must be 0 or more"
run train --manifest "$W/lk/manifest.jsonl" --steps 4 --resume --grad-clip -1
expect_rc 64 "--grad-clip -1 is refused (64) the same way"
check "…in a short line" bash -c '(($1 < 200))' _ "${#err}"

finish
