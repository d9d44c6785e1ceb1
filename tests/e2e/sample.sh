#!/usr/bin/env bash
# End-to-end tests of zinf-sample: a tiny byte-level model trained by
# zinf-train to memorise a periodic text continues it exactly when greedy,
# alone and under mpirun over a dp 2 reshard of it; seeds repeat their text
# and other seeds give other text; ids one per line, an llm.c tokenizer and
# token file for a non-byte vocabulary; nothing written to the state;
# refusals with their exit codes. Every model is tiny.
source "$(dirname "$0")/lib.bash"
SA=$BIN/zinf-sample
SH=$BIN/zinf-shard
TR=$BIN/zinf-train
POOL=(--pinned 8MiB --pinned-buffer 256KiB)
W=$(mktemp -d /var/tmp/zinf-e2e-sample-XXXXXX)
on_exit "rm -rf '$W'"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

# --- --help names every option
run "$SA" --help
expect_rc 0 "--help exits 0"
missing=()
for opt in --manifest --prompt --prompt-tokens --tokens --temperature --top-k --seed --tokenizer --threads \
  --device-memory --prefetch-bytes --persist-below --config --pinned --pinned-buffer --backend --quiet --version; do
  grep -qE -- "(^|[ ,])$opt([ =]|\$)" <<<"$out" || missing+=("$opt")
done
if ((${#missing[@]} == 0)); then pass "--help names every option"; else fail "--help names every option" "missing ${missing[*]}"; fi

# --- a periodic text, memorised: greedy sampling continues the period
PERIOD=$'period: 0123456789\n'  # 19 distinct bytes
for _ in $(seq 200); do printf '%s' "$PERIOD"; done >"$W/periodic.txt"
"$SH" layout --model gpt:layers=1,hidden=32,heads=2,vocab=256,seq=64 --param-dtype fp32 |
  "$SH" init --dir "$W/p" -q "${POOL[@]}" >/dev/null
run "$TR" --manifest "$W/p/manifest.jsonl" --text "$W/periodic.txt" --steps 60 --batch 4 --seq 64 --lr 1e-2 \
  --warmup 5 --shuffle --threads 1 --json -q "${POOL[@]}"
expect_rc 0 "zinf-train memorises the periodic text (60 steps)"
check "…its loss ends near 0" jq -e -s '.[-1].loss < 0.05' <<<"$out"
# (but the lock file, where a reader records itself: zinf(7), LOCKS)
state_sum() { find "$1" -type f -newer "$W/stamp" ! -name .zinf-lock | sort; }
touch "$W/stamp"
sha_before=$(sha256sum "$W/p/manifest.jsonl")
run "$SA" -m "$W/p/manifest.jsonl" --prompt 'period: 0' -n 45 --temperature 0 --threads 1 "${POOL[@]}"
expect_rc 0 "greedy sampling exits 0"
"$SA" -m "$W/p/manifest.jsonl" --prompt 'period: 0' -n 45 --temperature 0 --threads 1 -q "${POOL[@]}" >"$W/greedy.txt"
check "stdout holds the 45 drawn bytes and nothing else" test "$(wc -c <"$W/greedy.txt")" = 45
want="123456789"$'\n'"period: 0123456789"$'\n'"period: 01234567"
if [[ $out == "$want" ]]; then pass "greedy sampling continues the period, byte for byte (45 bytes)"; else
  fail "greedy sampling continues the period, byte for byte (45 bytes)" "got '$(printf '%q' "$out")'"; fi
check "stderr says the model, the seed and the rate" has_all "$err" "zinf-sample: " "vocab=256" "seed" "positions/s"
check "nothing in the data directory was written (but the lock file's holder)" test -z "$(state_sum "$W/p")"
check "the manifest is unchanged" test "$sha_before" = "$(sha256sum "$W/p/manifest.jsonl")"
# Every token's pass fetches from nvme: the same text.
run "$SA" -m "$W/p/manifest.jsonl" --prompt 'period: 0' -n 45 --temperature 0 --persist-below 0 --prefetch-bytes 0 \
  --threads 1 "${POOL[@]}"
check "fetching every module at every token gives the same text" test "$out" = "$want"
check "…and says the parameters are fetched each pass" contains "$err" "every token's pass fetches"
# The prompt may start anywhere in the period.
run "$SA" -m "$W/p/manifest.jsonl" --prompt '456' -n 10 --temperature 0 --threads 1 -q "${POOL[@]}"
check "another prompt: the period from there" test "$out" = "789"$'\n'"period"

# --- under mpirun over a dp 2 reshard: the same text
if command -v mpirun >/dev/null; then
  "$SH" reshard --dp 2 --dir "$W/p2" -m "$W/p/manifest.jsonl" -q >/dev/null
  run mpirun -np 2 "$SA" -m "$W/p2/manifest.jsonl" --prompt 'period: 0' -n 45 --temperature 0 --threads 1 "${POOL[@]}"
  expect_rc 0 "mpirun -np 2 over the dp 2 reshard exits 0"
  check "…and prints the same text once (rank 0)" test "$out" = "$want"
  run "$SA" -m "$W/p2/manifest.jsonl" --prompt 'x' -n 5 "${POOL[@]}"
  expect_rc 64 "a dp 2 manifest in one process is a usage error"
  check "…saying how to run it" has_all "$err" "dp 2" "mpirun -np 2" "reshard"
else
  skip "mpirun -np 2" "no mpirun"
fi

# --- seeds: an untrained model (near-uniform) at temperature 1
"$SH" layout --model gpt:layers=1,hidden=32,heads=2,vocab=256,seq=64 --param cpu --inference |
  "$SH" init --dir "$W/u" -q "${POOL[@]}" >/dev/null
draw() { "$SA" -m "$W/u/manifest.jsonl" -n 40 --threads 1 -q "${POOL[@]}" "$@" | od -An -tx1 | tr -d ' \n'; }
a=$(draw --seed 7) b=$(draw --seed 7) c=$(draw --seed 8)
check "a seed repeats its text (40 bytes)" test "${#a}" = 80 -a "$a" = "$b"
check "another seed gives another text" test "$a" != "$c"
run "$SA" -m "$W/u/manifest.jsonl" -n 3 --threads 1 "${POOL[@]}"
check "without --seed a fresh one is printed to repeat it" contains "$err" "repeats this text"
k1=$(draw --seed 9 --top-k 1) g=$(draw --seed 9 --temperature 0)
check "--top-k 1 is greedy" test "$k1" = "$g"

# --- a vocabulary of 97: ids, a token file prompt, an llm.c tokenizer
"$SH" layout --model gpt:layers=1,hidden=32,heads=2,vocab=97,seq=32 --inference |
  "$SH" init --dir "$W/v" -q "${POOL[@]}" >/dev/null
run "$SA" -m "$W/v/manifest.jsonl" -n 12 --seed 3 "${POOL[@]}"
expect_rc 64 "no prompt and no start token for a vocabulary of 97 is a usage error"
run "$SA" -m "$W/v/manifest.jsonl" --prompt hello "${POOL[@]}"
expect_rc 64 "--prompt TEXT for a vocabulary of 97 is a usage error"
check "…pointing to --prompt-tokens" contains "$err" "--prompt-tokens"
python3 - "$W" <<'EOF'
import struct, sys
w = sys.argv[1]
def tokens(path, toks):
    h = [0] * 256
    h[0], h[1], h[2] = 20240520, 1, len(toks)
    open(path, "wb").write(struct.pack("<256i", *h) + struct.pack("<%dH" % len(toks), *toks))
tokens(w + "/prompt.bin", [5, 17, 42])
tokens(w + "/bad-prompt.bin", [5, 97])
h = [0] * 256
h[0], h[1], h[2], h[3] = 20240328, 2, 97, 96
body = b"".join(bytes([len(s)]) + s for s in [("<%d>" % i).encode() for i in range(96)] + [b"<|endoftext|>"])
open(w + "/tok.bin", "wb").write(struct.pack("<256I", *h) + body)
open(w + "/bad-tok.bin", "wb").write(struct.pack("<256I", *h) + body[:-3])
EOF
run "$SA" -m "$W/v/manifest.jsonl" --prompt-tokens "$W/prompt.bin" -n 12 --seed 3 "${POOL[@]}"
expect_rc 0 "a token file prompt exits 0"
check "12 ids, one per line, each below 97" bash -c "[[ \$(wc -l <<<'$out') == 12 ]] && awk '\$1 !~ /^[0-9]+\$/ || \$1 >= 97 { exit 1 }' <<<'$out'"
ids=$out
run "$SA" -m "$W/v/manifest.jsonl" --prompt-tokens "$W/prompt.bin" -n 12 --seed 3 --tokenizer "$W/tok.bin" "${POOL[@]}"
expect_rc 0 "--tokenizer exits 0"
decoded=$(for i in $ids; do [[ $i == 96 ]] && break; printf '<%d>' "$i"; done)
check "the tokenizer decodes the same draws (up to its end-of-text)" test "$out" = "$decoded"
run "$SA" -m "$W/v/manifest.jsonl" --prompt-tokens "$W/bad-prompt.bin" "${POOL[@]}"
expect_rc 65 "a prompt token past the vocabulary exits 65"
run "$SA" -m "$W/v/manifest.jsonl" --prompt-tokens "$W/prompt.bin" --tokenizer "$W/bad-tok.bin" "${POOL[@]}"
expect_rc 65 "a truncated tokenizer file exits 65"
check "…naming the file" contains "$err" "bad-tok.bin"

# --- refusals
run "$SA" -m "$W/absent.jsonl" --prompt x "${POOL[@]}"
expect_rc 66 "an absent manifest exits 66"
run "$SA" -m "$W/p/manifest.jsonl" --prompt 'period: 0' -n 60 "${POOL[@]}"
expect_rc 64 "a prompt and -n past the model's 64 positions are a usage error"
check "…naming the positions" has_all "$err" "68 positions" "64"
run "$SA" -m "$W/p/manifest.jsonl" --prompt x --temperature -1 "${POOL[@]}"
expect_rc 64 "a negative temperature is a usage error"
run "$SA" -m "$W/p/manifest.jsonl" --prompt x --prompt-tokens "$W/prompt.bin" "${POOL[@]}"
expect_rc 64 "--prompt and --prompt-tokens exclude each other"
# A copy whose data directory holds no manifest.jsonl: nothing is committed
# there, so nothing is read (the trainer's rule, shard::read_committed).
mkdir -p "$W/uncommitted"
jq -c "if .dir then .dir = \"$W/uncommitted\" else . end" "$W/p/manifest.jsonl" >"$W/uncommitted.jsonl"
run "$SA" -m "$W/uncommitted.jsonl" --prompt x "${POOL[@]}"
expect_rc 65 "a manifest whose data directory holds no manifest.jsonl exits 65"
check "…saying so" contains "$err" "holds no manifest.jsonl"
# One flipped byte in the last tensor's partition: the engine's check.
cp -r "$W/p" "$W/bad"
jq -c "if .dir then .dir = \"$W/bad\" else . end" "$W/p/manifest.jsonl" >"$W/bad/manifest.jsonl"
rec=$(jq -c 'select(.state == "param")' "$W/bad/manifest.jsonl" | tail -n 1)
file=$W/bad/$(jq -r .file <<<"$rec") offset=$(jq -r .offset <<<"$rec")
printf '\x7f' | dd of="$file" bs=1 seek="$offset" conv=notrunc status=none
run "$SA" -m "$W/bad/manifest.jsonl" --prompt 'period' -n 5 --temperature 0 "${POOL[@]}"
expect_rc 65 "a corrupted partition exits 65"
check "…naming the tensor and the checksum" has_all "$err" "ln_f.bias rank 0 param" "xxh3"
finish
