#!/usr/bin/env bash
# End-to-end tests of zinf-tokenize and the tokenizers of zinf-train and
# zinf-sample: text to an llm.c token file and back, byte for byte; the same
# bytes for any --threads; JSON Lines; the held-out split; a corpus ten times
# --memory through a flat resident memory; refusals with their exit codes and
# an existing output left as it was; then, where scripts/tokenizer-refs.sh has
# installed them, token for token against the real tokenizers (GPT-2 through
# gpt-tokenizer, Llama 3 through llama3-tokenizer-js, five tokenizer.json
# files through Hugging Face's @huggingface/tokenizers) on the corpus
# build/tests/text-corpus draws; zinf-train --text --tokenizer (tokenized
# once, reused) and zinf-sample --tokenizer tokenizer.json.
source "$(dirname "$0")/lib.bash"
TK=$BIN/zinf-tokenize
TR=$BIN/zinf-train
SA=$BIN/zinf-sample
SH=$BIN/zinf-shard
GEN=${ZINF_TEXT_CORPUS:-$ROOT/build/tests/text-corpus}
REFS=$ROOT/.cache/tokenizer-refs
POOL=(--pinned 8MiB --pinned-buffer 256KiB)
W=$TMP

# --- --help names every option
run "$TK" --help
expect_rc 0 "--help exits 0"
missing=()
for opt in --tokenizer --output --field --val --val-output --sep --no-special --threads --memory --decode --json \
  --quiet --verbose --version; do
  grep -qE -- "(^|[ ,])$opt([ =]|\$)" <<<"$out" || missing+=("$opt")
done
if ((${#missing[@]} == 0)); then pass "--help names every option"; else fail "--help names every option" "missing ${missing[*]}"; fi

# --- a small byte-level tokenizer.json: the 256 bytes, a few merges, <|endoftext|> (264)
python3 - "$W" <<'EOF'
import json, sys
w = sys.argv[1]
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
cs = bs[:]
n = 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
ch = {b: chr(c) for b, c in zip(bs, cs)}
enc = lambda s: "".join(ch[b] for b in s.encode())
vocab = {ch[b]: b for b in range(256)}
merges = [("t", "h"), ("th", "e"), (" ", "m"), ("o", "d"), ("e", "l"), ("1", "2"), (" m", "od"), (" mod", "el")]
for a, b in merges:
    vocab[enc(a + b)] = len(vocab)
tok = {
    "version": "1.0", "truncation": None, "padding": None,
    "added_tokens": [{"id": len(vocab), "content": "<|endoftext|>", "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": False, "special": True}],
    "normalizer": None,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
    "post_processor": None,
    "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
    "model": {"type": "BPE", "dropout": None, "unk_token": None, "fuse_unk": False, "byte_fallback": False,
              "ignore_merges": False, "vocab": vocab, "merges": [[enc(a), enc(b)] for a, b in merges]},
}
json.dump(tok, open(w + "/toy.json", "w"))
bad = dict(tok); bad["model"] = dict(tok["model"]); bad["model"]["merges"] = tok["model"]["merges"] + [["q", "zz"]]
json.dump(bad, open(w + "/bad-merge.json", "w"))
text = json.dumps(tok)
open(w + "/truncated.json", "w").write(text[:len(text) // 2])
EOF
TOY=$W/toy.json  # 265 ids

# --- text in, tokens out, text back
printf 'the model\n12 models\n\nnaïve café €\n\xff\xfe bytes that are not UTF-8\n' >"$W/a.txt"
printf 'second document <|endoftext|> with the separator inside' >"$W/b.txt"
run "$TK" -t "$TOY" -o "$W/ab.bin" "$W/a.txt" "$W/b.txt"
expect_rc 0 "two text files tokenize"
check "…summary on stderr: documents, tokens, the rate" has_all "$err" "2 documents" "tokens, version 1" "MB/s"
check "…nothing on stdout" test -z "$out"
run "$TK" --decode -t "$TOY" "$W/ab.bin"
expect_rc 0 "--decode exits 0"
printf '<|endoftext|>' >"$W/want.txt"; cat "$W/a.txt" >>"$W/want.txt"; printf '<|endoftext|>' >>"$W/want.txt"; cat "$W/b.txt" >>"$W/want.txt"
"$TK" --decode -t "$TOY" "$W/ab.bin" -q >"$W/back.txt"
check "decode(encode(text)) is the text, byte for byte (the separator before each document)" cmp "$W/back.txt" "$W/want.txt"
"$TK" --decode -t "$TOY" "$W/ab.bin" -o "$W/back2.txt" -q
check "--decode -o FILE writes the same" cmp "$W/back2.txt" "$W/want.txt"
check "the merge ' model' is one token (id 263)" bash -c "python3 -c \"
import struct,sys; d=open('$W/ab.bin','rb').read(); n=struct.unpack_from('<3i',d)[2]
t=struct.unpack_from('<%dH'%n,d,1024); sys.exit(0 if t[0]==264 and 263 in t else 1)\""
run "$TK" -t bytes -o "$W/bytes.bin" --sep none "$W/a.txt"
check "the bytes tokenizer: one token per byte" test "$(stat -c %s "$W/bytes.bin")" = $((1024 + 2 * $(stat -c %s "$W/a.txt")))
cat "$W/a.txt" | "$TK" -t "$TOY" -o "$W/stdin.bin" --sep none -q -
"$TK" -t "$TOY" -o "$W/file.bin" --sep none -q "$W/a.txt"
check "- reads standard input, as the file" cmp "$W/stdin.bin" "$W/file.bin"

# --- --json, --threads, --val
yes 'the model offload 12345 naïve café; x = y + 1  # comment' | head -c 1500000 >"$W/big.txt"
run "$TK" -t "$TOY" -o "$W/t1.bin" --threads 1 --memory 1MiB --json "$W/big.txt"
expect_rc 0 "--json exits 0"
check "…one zinf.tokenize/1 record" jq -e '.schema == "zinf.tokenize/1" and .mode == "encode" and .documents == 1 and .input_bytes == 1500000 and .version == 1 and .tokens > 0 and .cut_documents == 1 and .round_trip == "bytes"' <<<"$out"
for n in 2 3; do
  "$TK" -t "$TOY" -o "$W/t$n.bin" --threads $n --memory 1MiB -q "$W/big.txt"
  check "--threads $n writes the same bytes as --threads 1" cmp "$W/t1.bin" "$W/t$n.bin"
done
"$TK" -t "$TOY" -o "$W/whole.bin" --threads 2 -q "$W/big.txt"
check "a document cut into parts (--memory 1MiB) gives the whole document's tokens" cmp "$W/t1.bin" "$W/whole.bin"
run "$TK" -t "$TOY" -o "$W/train.bin" --val 0.1 --json "$W/big.txt"
expect_rc 0 "--val 0.1 exits 0"
check "…the validation file beside the output, a tenth of the tokens" bash -c "
  jq -e '.val_output == \"$W/train.val.bin\" and .val_tokens == ((.tokens + .val_tokens) / 10 | ceil)' <<<'$out' >/dev/null &&
  test -s '$W/train.val.bin'"
check "…train and validation together are the whole" bash -c "cat <(tail -c +1025 '$W/train.bin') <(tail -c +1025 '$W/train.val.bin') | cmp - <(tail -c +1025 '$W/whole.bin')"

# --- JSON Lines
printf '{"text": "the model", "n": 1}\n\n{"text": "caf\\u00e9 <|endoftext|>"}\n' >"$W/docs.jsonl"
run "$TK" -t "$TOY" -o "$W/docs.bin" --field text --json "$W/docs.jsonl"
expect_rc 0 "JSON Lines with --field"
check "…two documents" jq -e '.documents == 2' <<<"$out"
"$TK" --decode -t "$TOY" "$W/docs.bin" -q >"$W/docs.txt"
check "…decoded: each document after the separator" test "$(cat "$W/docs.txt")" = "<|endoftext|>the model<|endoftext|>café <|endoftext|>"

# --- refusals, and an existing output left as it was
cp "$W/docs.bin" "$W/keep.bin"
sum_before=$(sha256sum <"$W/keep.bin")
printf '{"text": "ok"}\n{"body": "x"}\n' >"$W/bad.jsonl"
run "$TK" -t "$TOY" -o "$W/keep.bin" --field text "$W/bad.jsonl"
expect_rc 65 "a record without the field exits 65"
check "…naming the file and the line" has_all "$err" "bad.jsonl" "line 2"
check "…and the output is as it was" test "$sum_before" = "$(sha256sum <"$W/keep.bin")"
run "$TK" -t "$W/bad-merge.json" -o "$W/keep.bin" "$W/a.txt"
expect_rc 65 "a merge naming a token not in the vocabulary exits 65"
check "…naming the file and the merge" has_all "$err" "bad-merge.json" "model.merges[8]" "\"zz\""
run "$TK" -t "$W/truncated.json" -o "$W/keep.bin" "$W/a.txt"
expect_rc 65 "a truncated tokenizer.json exits 65"
check "…naming the file" has_all "$err" "truncated.json" "not JSON"
run "$TK" -t "$TOY" -o "$W/keep.bin" "$W/absent.txt"
expect_rc 66 "a missing input exits 66"
check "the output is still as it was, and no temporary is left" bash -c "test '$sum_before' = \"\$(sha256sum <'$W/keep.bin')\" && ! ls '$W' | grep -q '\.tmp\.'"
run "$TK" -t "$TOY" "$W/a.txt"
expect_rc 64 "no -o exits 64"
run "$TK" -t "$TOY" -o "$W/x.bin" --sep '<|nope|>' "$W/a.txt"
expect_rc 64 "--sep naming no token exits 64"
run "$TK" -t "$TOY" -o "$W/x.bin" --val 0.7 "$W/a.txt"
expect_rc 64 "--val past 0.5 exits 64"

# --- a corpus ten times --memory streams through a flat resident memory
yes 'the model offload 12345 naïve café; x = y + 1  # comment' | head -c 4000000 >"$W/c1.txt"
for i in $(seq 10); do cat "$W/c1.txt"; done >"$W/c10.txt"
run "$TK" -t "$TOY" -o "$W/c1.bin" --threads 2 --memory 4MiB --json "$W/c1.txt"
rss1=$(jq .peak_rss_bytes <<<"$out")
run "$TK" -t "$TOY" -o "$W/c10.bin" --threads 2 --memory 4MiB --json "$W/c10.txt"
rss10=$(jq .peak_rss_bytes <<<"$out")
check "40 MB through --memory 4MiB: peak resident $((rss10 / 1048576)) MiB, within 2 MiB of 4 MB's $((rss1 / 1048576)) MiB" \
  test "$rss10" -le $((rss1 + 2 * 1048576))
rm -f "$W"/c1*.txt "$W"/c1*.bin "$W/big.txt"

# --- zinf-train --text --tokenizer: tokenized once beside the text, reused
for i in $(seq 300); do echo "the model $i learns the model"; done >"$W/train.txt"
"$SH" layout --model gpt:layers=1,hidden=32,heads=2,vocab=265,seq=32 --param cpu --optim cpu |
  "$SH" init --dir "$W/m" -q "${POOL[@]}" >/dev/null
run "$TR" --manifest "$W/m/manifest.jsonl" --text "$W/train.txt" --tokenizer "$TOY" --steps 2 --batch 2 --seq 32 \
  --threads 1 "${POOL[@]}"
expect_rc 0 "zinf-train --text --tokenizer exits 0"
cache=$(ls "$W"/train.txt.*.tokens.bin 2>/dev/null)
check "…the token file is beside the text" test -n "$cache"
check "…and says it tokenized" contains "$err" "tokenized"
"$TK" -t "$TOY" -o "$W/direct.bin" -q "$W/train.txt"
check "…the same tokens zinf-tokenize writes" cmp "$cache" "$W/direct.bin"
touch -d '2000-01-01' "$cache"
run "$TR" --manifest "$W/m/manifest.jsonl" --text "$W/train.txt" --tokenizer "$TOY" --steps 3 --resume --batch 2 --seq 32 \
  --threads 1 "${POOL[@]}"
expect_rc 0 "a second run exits 0"
check "…reusing the token file" contains "$err" "reusing"
check "…untouched" test "$(stat -c %Y "$cache")" -lt 1000000000
echo "one more line" >>"$W/train.txt"
run "$TR" --manifest "$W/m/manifest.jsonl" --text "$W/train.txt" --tokenizer "$TOY" --steps 4 --resume --batch 2 --seq 32 \
  --threads 1 "${POOL[@]}"
check "a changed text is tokenized again, into another file" test "$(ls "$W"/train.txt.*.tokens.bin | wc -l)" = 2
"$SH" layout --model gpt:layers=1,hidden=32,heads=2,vocab=260,seq=32 --param cpu --optim cpu |
  "$SH" init --dir "$W/small" -q "${POOL[@]}" >/dev/null
run "$TR" --manifest "$W/small/manifest.jsonl" --text "$W/train.txt" --tokenizer "$TOY" --steps 1 "${POOL[@]}"
expect_rc 65 "a tokenizer larger than the model's vocabulary exits 65"
check "…naming both sizes" has_all "$err" "265" "260" "toy.json"

# --- zinf-sample --tokenizer tokenizer.json: prompt in, text out
run "$SA" -m "$W/m/manifest.jsonl" --tokenizer "$TOY" --prompt "the model" -n 12 --seed 5 --threads 1 -q "${POOL[@]}"
expect_rc 0 "zinf-sample --tokenizer tokenizer.json exits 0"
sampled=$out
# The same draws as ids (the prompt's tokens from zinf-tokenize), decoded up to <|endoftext|>.
printf 'the model' >"$W/prompt.txt"
"$TK" -t "$TOY" -o "$W/prompt.bin" --sep none -q "$W/prompt.txt"
"$SA" -m "$W/m/manifest.jsonl" --prompt-tokens "$W/prompt.bin" -n 12 --seed 5 --threads 1 -q "${POOL[@]}" >"$W/ids.txt"
python3 - "$W" <<'EOF2'
import struct, sys
w = sys.argv[1]
ids = [int(x) for x in open(w + "/ids.txt").read().split()]
ids = ids[:ids.index(264)] if 264 in ids else ids
h = [20240520, 1, len(ids)] + [0] * 253
open(w + "/ids.bin", "wb").write(struct.pack("<256i", *h) + struct.pack("<%dH" % len(ids), *ids))
EOF2
if [[ $(stat -c %s "$W/ids.bin") == 1024 ]]; then
  check "…nothing before <|endoftext|>, as the ids say" test -z "$sampled"
else
  "$TK" --decode -t "$TOY" "$W/ids.bin" -o "$W/ids-text.txt" -q
  check "…its text is the decode of the ids the same draws give" test "$sampled" = "$(cat "$W/ids-text.txt")"
fi
run "$SA" -m "$W/small/manifest.jsonl" --tokenizer "$TOY" --prompt "the" -n 2 "${POOL[@]}"
expect_rc 65 "zinf-sample with a tokenizer larger than the model exits 65"

# --- against the real tokenizers
if [[ ! -f $REFS/installed ]]; then
  skip "token for token against the reference tokenizers" "not installed in $REFS: scripts/tokenizer-refs.sh (node, npm and the npm registry) has not run or could not"
  finish
  exit
fi
if [[ ! -x $GEN ]]; then
  fail "corpus" "$GEN is not built (make tests)"
  finish
  exit
fi
run "$GEN" --seed 46 --out "$W"
expect_rc 0 "text-corpus draws the corpus"
check "…every script known to this PCRE2" contains "$err" "scripts"
J=$REFS/json
# NAME JSON CORPUS...: zinf's tokens ($W/NAME.bin, with the documents' separator and the
# post-processor's ids), their decode ($W/NAME.txt) and the --json record ($W/NAME.json).
tokens() {
  local name=$1 json=$2
  shift 2
  if "$TK" -t "$json" -o "$W/$name.bin" --field text --threads 2 --json "$@" >"$W/$name.json" 2>"$W/$name.err" &&
    "$TK" --decode -t "$json" "$W/$name.bin" -o "$W/$name.txt" -q 2>>"$W/$name.err"; then
    pass "$name: zinf-tokenize, and --decode"
  else
    fail "$name: zinf-tokenize" "$(<"$W/$name.err")"
  fi
}
# NAME IMPL JSON SEP BEGIN CORPUS...: tests/refs/compare.mjs on NAME's tokens and decode.
against() {
  local name=$1 impl=$2 json=$3 sep=$4 begin=$5
  shift 5
  local args=(--impl "$impl" --ours "$W/$name.bin" --sep "$sep" --text "$W/$name.txt")
  [[ $impl == hf ]] && args+=(--json "$json")
  [[ -n $begin ]] && args+=(--begin "$begin")
  run node "$ROOT/tests/refs/compare.mjs" "${args[@]}" "$@"
  if [[ $rc == 0 ]]; then pass "$name against $impl: $out"; else fail "$name against $impl" "$out $err"; fi
}
C=$W/corpus.jsonl N=$W/nel.jsonl
tokens gpt2 "$J/gpt2.json" "$C"
against gpt2 gpt-tokenizer "$J/gpt2.json" 50256 "" "$C"
against gpt2 tiktoken "$J/gpt2.json" 50256 "" "$C"
against gpt2 hf "$J/gpt2.json" 50256 "" "$C"
tokens llama3 "$J/llama3.json" "$C"
check "Llama 3's 128256 ids: a version 2 file" jq -e '.version == 2 and .vocab == 128256' "$W/llama3.json"
against llama3 llama3-tokenizer-js "$J/llama3.json" 128001 128000 "$C"
against llama3 hf "$J/llama3.json" 128001 128000 "$C"
# Oniguruma's \s, which Hugging Face's Split regexes keep (JavaScript's ByteLevel
# regexes do not): the NEL documents too.
tokens qwen2-style "$J/qwen2-style.json" "$C" "$N"
against qwen2-style hf "$J/qwen2-style.json" 50256 "" "$C" "$N"
tokens smollm-style "$J/smollm-style.json" "$C"
against smollm-style hf "$J/smollm-style.json" 50256 "" "$C"
tokens llama2-style "$J/llama2-style.json" "$C" "$N"
against llama2-style hf "$J/llama2-style.json" 2 1 "$C" "$N"
# Bytes that are not UTF-8 (no reference reads them): byte-level, they come back.
for t in gpt2 llama3; do
  "$TK" -t "$J/$t.json" -o "$W/inv-$t.bin" --sep none --no-special -q "$W/invalid.txt" &&
    "$TK" --decode -t "$J/$t.json" "$W/inv-$t.bin" -q >"$W/inv-$t.txt"
  check "$t: text that is not UTF-8 comes back byte for byte" cmp "$W/inv-$t.txt" "$W/invalid.txt"
done
finish
