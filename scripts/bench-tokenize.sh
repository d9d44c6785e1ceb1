#!/usr/bin/env bash
# zinf-tokenize against its peers, on GPT-2's vocabulary (BENCHMARKS.md,
# "Tokenizing"): the peers from scripts/tokenizer-refs.sh, the pairs timed by
# farm-bench --vs (A and B in turn, the ratio pair by pair).
#   1. the same tokens: zinf's and tiktoken's counts of the English text;
#   2. the encode alone (inside each process, the file read and the tokenizer
#      loaded first): zinf --threads 1, tiktoken (WebAssembly), and
#      @huggingface/tokenizers (JavaScript);
#   3. whole processes, paired: zinf --threads 1 against tiktoken and against
#      @huggingface/tokenizers; zinf --threads 2 against --threads 1;
#   4. a corpus ten times --memory: peak resident memory against one the
#      size of --memory.
# Texts: English (Debian's /usr/share/common-licenses, repeated to MB
# megabytes) and every script (build/tests/text-corpus's documents, repeated).
# Usage: scripts/bench-tokenize.sh [MB]   (default 10)
set -euo pipefail
cd "$(dirname "$0")/.."
MB=${1:-10}
R=.cache/tokenizer-refs
J=$R/json
TK=bin/zinf-tokenize
W=${TMPDIR:-/tmp}/zinf-bench-tokenize
[[ -f $R/installed ]] || { echo "bench-tokenize: run scripts/tokenizer-refs.sh first" >&2; exit 66; }
[[ -x $TK && -x build/tests/text-corpus ]] || { echo "bench-tokenize: make all tests first" >&2; exit 66; }
command -v farm-bench >/dev/null || { echo "bench-tokenize: no farm-bench" >&2; exit 66; }
mkdir -p "$W"
repeat() { # OUT SOURCE... : the sources again and again, cut after the last newline within MB megabytes
  local out=$1
  shift
  : >"$out"
  while (($(stat -c %s "$out") < MB * 1000000)); do cat "$@" >>"$out"; done
  python3 -c 'import sys; p, n = sys.argv[1], int(sys.argv[2]); d = open(p, "rb").read()[:n]; open(p, "wb").write(d[:d.rfind(b"\n") + 1])' \
    "$out" $((MB * 1000000))
}
repeat "$W/en.txt" /usr/share/common-licenses/*
build/tests/text-corpus --seed 46 --out "$W" 2>/dev/null
jq -r .text "$W/corpus.jsonl" >"$W/mixed-one.txt"
repeat "$W/mixed.txt" "$W/mixed-one.txt"
echo "# $(date -u +%F), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), node $(node --version)"
echo "# texts: en.txt $(wc -c <"$W/en.txt") bytes (the license texts repeated), mixed.txt $(wc -c <"$W/mixed.txt") bytes (every script)"

echo "## 1. the same tokens (GPT-2, English)"
zinf_tokens=$("$TK" -t "$J/gpt2.json" --sep none --threads 1 -o "$W/en.bin" --json "$W/en.txt" | jq .tokens)
tik=$(node tests/refs/bench.mjs --impl tiktoken "$W/en.txt")
echo "zinf $zinf_tokens tokens, tiktoken $(jq .tokens <<<"$tik")"
[[ $zinf_tokens == $(jq .tokens <<<"$tik") ]] || { echo "bench-tokenize: the counts differ" >&2; exit 1; }

echo "## 2. the encode alone, one thread, MB/s"
for text in en mixed; do
  z=$("$TK" -t "$J/gpt2.json" --sep none --threads 1 -o "$W/$text.bin" --json "$W/$text.txt")
  t=$(node tests/refs/bench.mjs --impl tiktoken "$W/$text.txt")
  h=$(node tests/refs/bench.mjs --impl hf --json "$J/gpt2.json" "$W/$text.txt")
  printf '%s: zinf %.2f  tiktoken %.2f  @huggingface/tokenizers %.2f  (zinf/tiktoken %.2fx, zinf/hf %.2fx)\n' "$text" \
    "$(jq .input_mb_per_s <<<"$z")" "$(jq .mb_per_s <<<"$t")" "$(jq .mb_per_s <<<"$h")" \
    "$(jq -n "$(jq .input_mb_per_s <<<"$z") / $(jq .mb_per_s <<<"$t")")" \
    "$(jq -n "$(jq .input_mb_per_s <<<"$z") / $(jq .mb_per_s <<<"$h")")"
done

echo "## 3. whole processes, paired (farm-bench --vs: A/B < 1 is A faster)"
A=("$TK" -t "$J/gpt2.json" --sep none -q -o "$W/a.bin")
farm-bench -n 5 --timeout 900 --vs "node tests/refs/bench.mjs --impl tiktoken $W/en.txt" -- "${A[@]}" --threads 1 "$W/en.txt"
farm-bench -n 3 --timeout 1800 --vs "node tests/refs/bench.mjs --impl hf --json $J/gpt2.json $W/en.txt" -- \
  "${A[@]}" --threads 1 "$W/en.txt"
farm-bench -n 5 --timeout 900 --vs "${A[*]} --threads 1 $W/en.txt" -- "${A[@]}" --threads 2 "$W/en.txt"
farm-bench -n 5 --timeout 900 --vs "${A[*]} --threads 1 $W/mixed.txt" -- "${A[@]}" --threads 2 "$W/mixed.txt"

echo "## 4. ten times --memory: peak resident memory"
cp "$W/en.txt" "$W/m1.txt"
for i in $(seq 10); do cat "$W/m1.txt"; done >"$W/m10.txt"
for f in m1 m10; do
  "$TK" -t "$J/gpt2.json" --threads 2 --memory "${MB}MiB" -o "$W/$f.bin" --json "$W/$f.txt" |
    jq -r '"\(.input_bytes) bytes in \(.elapsed_s | . * 100 | round / 100) s: peak resident \(.peak_rss_bytes / 1048576 | . * 10 | round / 10) MiB"'
done
rm -f "$W"/*.bin "$W"/m1*.txt
