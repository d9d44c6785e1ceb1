#!/usr/bin/env bash
# End-to-end tests of zinf-shard import and export: files written by an
# independent writer (tests/e2e/weights_ref.py, numpy) import with the right
# values into every layout (dp, tiles, bf16 or fp32 params, inference), export
# writes what that reader reads back, export then import gives the same bytes,
# the first loss of zinf-train on imported llm.c weights equals a float64
# reference forward, and every malformed file is refused with 65, naming the
# tensor, leaving an existing state intact.
source "$(dirname "$0")/lib.bash"
SH=$BIN/zinf-shard
TR=$BIN/zinf-train
POOL=(--pinned 8MiB --pinned-buffer 256KiB)
PY=/usr/bin/python3
REF=$ROOT/tests/e2e/weights_ref.py
# States on a disk that takes O_DIRECT (not a tmpfs /tmp).
W=$(mktemp -d /var/tmp/zinf-e2e-weights-XXXXXX)
on_exit "rm -rf '$W'"
M=gpt:layers=2,hidden=32,heads=2,vocab=50,seq=8 # 2 layers: llm.c's stacked arrays are told apart

if ! "$PY" -c 'import numpy' 2>/dev/null; then
  skip "every import and export test" "no numpy for $PY (scripts/deps.sh installs python3-numpy)"
  finish
  exit
fi

# imp DIR FILE [LAYOUT OPTIONS...]: layout | import into DIR; stdout in $out, status in $rc.
imp() {
  local d=$1 f=$2
  shift 2
  run bash -c 'set -o pipefail; "$1" layout --model "$2" "${@:5}" | "$1" import --from "$3" --dir "$4" --pinned 8MiB --pinned-buffer 256KiB' \
    _ "$SH" "$M" "$f" "$d" "$@"
}
exp() { run "$SH" export "${POOL[@]}" "$@"; }
data_sums() { (cd "$1" && find . -name '*.bin' -print0 | sort -z | xargs -0r sha256sum); }
# records MANIFEST: the records without the header (which names the directory).
records() { tail -n +2 "$1"; }

# --- safetensors from numpy: values in every layout --------------------------
# The inputs: safetensors with F32, F16, BF16 tensors in turn and h.0.attn.bias beside them, and
# with the transformer. prefix; llm.c checkpoints, version 3 with the vocabulary padded to 128 rows
# (the padding not zero) and version 5 padded to 64; tokens.
"$PY" "$REF" safetensors "$W/a.safetensors" "$M" 1 "$W/a.npz" + \
  safetensors "$W/p.safetensors" "$M" 1 "$W/p.npz" --prefix --dtype F32 + \
  llmc "$W/g.bin" "$M" 2 "$W/g.npz" + llmc "$W/g5.bin" "$M" 2 "$W/g5.npz" --version 5 --padded-vocab 64 + \
  tokens "$W/tok.bin" 2000 3 50
imp "$W/st3" "$W/a.safetensors" --dp 3
expect_rc 0 "import of a numpy-written safetensors file (F32, F16, BF16 tensors) at dp 3"
check "…its stdout is the committed manifest, every record hashed, the moments included" bash -c '
  [[ $(<"$2/manifest.jsonl") == "$1" ]] && jq -e -s ".[0].records == length - 1 and (.[1:] | all(.xxh3)) and
    ([.[1:][].state] | unique) == [\"exp_avg\", \"exp_avg_sq\", \"master\", \"param\"]" <<<"$1"' _ "$out" "$W/st3"
check "…the master holds the file's values as fp32, the bf16 param them rounded to nearest even" \
  "$PY" "$REF" check "$W/st3/manifest.jsonl" "$W/a.npz"
run "$SH" verify -m "$W/st3/manifest.jsonl" "${POOL[@]}"
expect_rc 0 "…and zinf-shard verify passes"
"$SH" cat -m "$W/st3/manifest.jsonl" --tensor h.1.mlp.c_fc.weight --state exp_avg_sq "${POOL[@]}" >"$W/v.bin"
check "…the AdamW moments are zero" bash -c '[[ $(stat -c %s "$1") == 16384 && -z $(tr -d "\\0" <"$1") ]]' _ "$W/v.bin"
imp "$W/pre" "$W/p.safetensors" --dp 2 --param-dtype fp32
expect_rc 0 "import of names with the 'transformer.' prefix into an fp32-param layout"
check "…the fp32 param holds the values exactly" "$PY" "$REF" check "$W/pre/manifest.jsonl" "$W/p.npz"
imp "$W/tile" "$W/a.safetensors" --dp 2 --tile 3
expect_rc 0 "import into a tiled layout (--tile 3, dp 2)"
check "…every tile holds its columns of the weight" "$PY" "$REF" check "$W/tile/manifest.jsonl" "$W/a.npz"
imp "$W/inf" "$W/a.safetensors" --dp 4 --inference
expect_rc 0 "import into an inference layout (bf16 param only, dp 4)"
check "…the param holds the values rounded to bf16" "$PY" "$REF" check "$W/inf/manifest.jsonl" "$W/a.npz"

# --- llm.c's checkpoint from numpy --------------------------------------------
imp "$W/llmc" "$W/g.bin" --dp 3 --param-dtype fp32
expect_rc 0 "import of a numpy-written llm.c checkpoint (version 3)"
check "…every weight transposed from llm.c's (out, in), the padded rows left out" \
  "$PY" "$REF" check "$W/llmc/manifest.jsonl" "$W/g.npz"
imp "$W/llmc5" "$W/g5.bin" --dp 2 --tile 2
expect_rc 0 "import of an llm.c version 5 (bf16) checkpoint into a tiled layout"
check "…with the right values" "$PY" "$REF" check "$W/llmc5/manifest.jsonl" "$W/g5.npz"

# The first loss of zinf-train on the imported weights: a float64 forward's.
imp "$W/llmc1" "$W/g.bin" --param-dtype fp32 # one process trains it
run "$TR" --manifest "$W/llmc1/manifest.jsonl" --data "$W/tok.bin" --steps 1 --json --batch 4 --seq 8 --threads 1 "${POOL[@]}"
expect_rc 0 "zinf-train runs a step on the imported llm.c weights"
loss=$(jq -r 'select(.step == 1) | .loss' <<<"$out")
want=$("$PY" "$REF" loss "$W/g.npz" "$M" "$W/tok.bin" 4 8)
check "…its first loss $loss equals the float64 reference $want within 1e-4 relative" \
  awk -v a="$loss" -v b="$want" 'BEGIN { d = (a - b) / b; exit !(b > 1 && (d < 0 ? -d : d) < 1e-4) }'

# --- export: what an independent reader reads back ----------------------------
exp -m "$W/st3/manifest.jsonl" --to "$W/e3.safetensors"
expect_rc 0 "export of the dp 3 state to safetensors"
check "…nothing on stdout" test -z "$out"
check "…numpy reads every tensor back: GPT-2 names and shapes, F32 from the master, the same values" \
  "$PY" "$REF" read-safetensors "$W/e3.safetensors" "$W/a.npz"
exp -m "$W/llmc/manifest.jsonl" --to "$W/e.bin" --format llmc
expect_rc 0 "export to llm.c's format"
check "…numpy reads it as llm.c does: header, (out, in) weights, zero rows padding the vocabulary to 128" \
  "$PY" "$REF" read-llmc "$W/e.bin" "$W/g.npz"
exp -m "$W/tile/manifest.jsonl" --to "$W/et.safetensors"
expect_rc 0 "export of the tiled dp 2 state"
check "…is byte for byte the untiled dp 3 state's file (tiles joined, dp gone)" cmp "$W/et.safetensors" "$W/e3.safetensors"
exp -m "$W/tile/manifest.jsonl" --to "$W/et.bin" --format llmc
exp -m "$W/st3/manifest.jsonl" --to "$W/e3.bin" --format llmc
check "…and so is its llm.c file" cmp "$W/et.bin" "$W/e3.bin"
exp -m "$W/inf/manifest.jsonl" --to "$W/ei.safetensors"
expect_rc 0 "export of an inference state (bf16 param only)"
check "…as BF16 tensors holding the param's values" "$PY" "$REF" read-safetensors "$W/ei.safetensors" "$W/a.npz" --bf16
exp -m "$W/llmc5/manifest.jsonl" --to "$W/e5.bin" --format llmc
expect_rc 0 "export of the tiled llm.c-imported state back to llm.c's format"
check "…holds the version 5 file's values in fp32" "$PY" "$REF" read-llmc "$W/e5.bin" "$W/g5.npz"

# --- export then import: the same bytes ---------------------------------------
for spec in "st3 e3.safetensors --dp 3" "st3 e3.bin --dp 3" "llmc e.bin --dp 3 --param-dtype fp32" \
  "inf ei.safetensors --dp 4 --inference" "tile et.safetensors --dp 2 --tile 3" "llmc5 e5.bin --dp 2 --tile 2"; do
  read -r from file opts <<<"$spec"
  # shellcheck disable=SC2086
  imp "$W/back-$from-$file" "$W/$file" $opts
  expect_rc 0 "import of $file into the layout of $from ($opts)"
  check "…every data file is byte for byte $from's" test "$(data_sums "$W/back-$from-$file")" = "$(data_sums "$W/$from")"
  check "…and every record the same, xxh3 included" cmp <(records "$W/back-$from-$file/manifest.jsonl") <(records "$W/$from/manifest.jsonl")
done

# --- 4KiB pool buffers: tensors larger than a buffer, llm.c's weights read a line at a time
small=(--pinned 64KiB --pinned-buffer 4KiB)
run bash -c 'set -o pipefail; "$1" layout --model "$2" --dp 2 --tile 2 | "$1" import --from "$3" --dir "$4" "${@:5}"' \
  _ "$SH" "$M" "$W/g5.bin" "$W/small" "${small[@]}"
expect_rc 0 "import with 4KiB pool buffers (1024 fp32 values, smaller than a weight)"
check "…writes the same bytes as with 256KiB buffers" test "$(data_sums "$W/small")" = "$(data_sums "$W/llmc5")"
run bash -c 'set -o pipefail; "$1" layout --model "$2" --dp 3 --param-dtype fp32 | "$1" import --from "$3" --dir "$4" "${@:5}"' \
  _ "$SH" "$M" "$W/g.bin" "$W/small3" "${small[@]}"
check "…and so does an fp32 llm.c file, one read per weight column" test "$(data_sums "$W/small3")" = "$(data_sums "$W/llmc")"
run "$SH" export -m "$W/small/manifest.jsonl" --to "$W/small.bin" --format llmc "${small[@]}"
expect_rc 0 "export with 4KiB pool buffers"
check "…writes the same file as with 256KiB buffers" cmp "$W/small.bin" "$W/e5.bin"
run "$SH" export -m "$W/st3/manifest.jsonl" --to "$W/small.safetensors" "${small[@]}"
check "…in safetensors too" cmp "$W/small.safetensors" "$W/e3.safetensors"

# --- memory: flat in the model's size ---------------------------------------
# A 42MB file through an 8MiB pool: the peak resident memory stays within a few MiB
# of what the 81KB file's import and export took.
B=gpt:layers=2,hidden=512,heads=8,vocab=8192,seq=64
"$PY" "$REF" safetensors "$W/big.safetensors" "$B" 5 - --dtype F32
peak() { # OP ARGS...: zinf-shard OP with --stats; its peak_resident_bytes
  local op=$1
  shift
  "$SH" "$op" --pinned 8MiB --pinned-buffer 1MiB --stats "$W/peak.json" "$@" >/dev/null 2>&1 && jq .peak_resident_bytes "$W/peak.json"
}
p_small=$("$SH" layout --model "$M" --dp 2 --inference | peak import --from "$W/a.safetensors" --dir "$W/p-small")
p_big=$("$SH" layout --model "$B" --dp 2 --inference | peak import --from "$W/big.safetensors" --dir "$W/p-big")
check "import's peak resident memory: $p_small bytes for 81KB of weights, $p_big for 42MB (less than 4MiB more)" \
  test -n "$p_big" -a -n "$p_small" -a $((p_big - p_small)) -lt $((4 << 20))
e_small=$(peak export -m "$W/p-small/manifest.jsonl" --to "$W/p-small.bin" --format llmc)
e_big=$(peak export -m "$W/p-big/manifest.jsonl" --to "$W/p-big.bin" --format llmc)
check "export's: $e_small bytes for the small model, $e_big for the 42MB llm.c file (less than 4MiB more)" \
  test -n "$e_big" -a -n "$e_small" -a $((e_big - e_small)) -lt $((4 << 20)) -a "$(stat -c %s "$W/p-big.bin")" -gt 40000000
rm -rf "$W/big.safetensors" "$W/p-big" "$W/p-big.bin"

# --- refusals: 65 naming the tensor, nothing written --------------------------
# A shape the model does not have.
run bash -c 'set -o pipefail; "$1" layout --model gpt:layers=2,hidden=16,heads=2,vocab=50,seq=8 |
  "$1" import --from "$2" --dir "$3" --pinned 8MiB --pinned-buffer 256KiB' _ "$SH" "$W/a.safetensors" "$W/no16"
expect_rc 65 "import into a model of another hidden size exits 65"
check "…naming the tensor and both shapes, creating nothing" bash -c '
  [[ $1 == *"wte.weight"*"[50, 32]"*"[50, 16]"* && ! -e $2 ]]' _ "$err" "$W/no16"
run bash -c 'set -o pipefail; "$1" layout --model gpt:layers=1,hidden=32,heads=2,vocab=50,seq=8 |
  "$1" import --from "$2" --dir "$3" --pinned 8MiB --pinned-buffer 256KiB' _ "$SH" "$W/g.bin" "$W/no1"
expect_rc 65 "an llm.c checkpoint of 2 layers into a 1-layer model exits 65"
check "…naming num_layers and both counts" has_all "$err" "num_layers (header[4]) is 2" "has 1"
run bash -c 'set -o pipefail; "$1" layout --model gpt:layers=2,hidden=32,heads=4,vocab=50,seq=8 |
  "$1" import --from "$2" --dir "$3" --pinned 8MiB --pinned-buffer 256KiB' _ "$SH" "$W/g.bin" "$W/no4"
expect_rc 65 "…or into a model with other heads"
check "…naming num_heads" contains "$err" "num_heads (header[5]) is 2"

# Malformed safetensors files, each from the good one, imported over an existing state with --force.
cp -a "$W/st3" "$W/keep"
(cd "$W/keep" && find . -type f ! -name .zinf-lock -print0 | sort -z | xargs -0 sha256sum) >"$W/keep.sums"
# bad NAME PYTHON-EDIT PATTERN...: a case; PYTHON-EDIT changes the header h and the data
# (or sets `out` to the whole file); the edited file must be refused, naming every PATTERN.
names=() patterns=() edits=""
bad() {
  local i=${#names[@]}
  names+=("$1")
  edits+="def edit$i(h, data):
    out = None
$(sed 's/^/    /' <<<"$2")
    return out if out is not None else pack(h, data)
"
  shift 2
  patterns+=("$(IFS='|' && echo "$*")")
}
bad "overlapping tensors" 'h["h.1.ln_2.bias"]["data_offsets"] = [h["h.1.ln_2.bias"]["data_offsets"][0] - 4, h["h.1.ln_2.bias"]["data_offsets"][1] - 4]' \
  "overlap"
bad "a gap between tensors" 'e = h["wpe.weight"]["data_offsets"]; data = data[:e[1]] + b"\0" * 8 + data[e[1]:]
for v in h.values():
    if isinstance(v, dict) and "data_offsets" in v and v["data_offsets"][0] >= e[1]: v["data_offsets"] = [x + 8 for x in v["data_offsets"]]
data = data' "belong to no tensor"
bad "data past the end of the file" 'data = data[:-4]' "run past the data"
bad "trailing bytes" 'data = data + b"\0\0\0\0"' "at the end of the file belong to no tensor"
bad "a header length past the end" 'out = pack(h, data, n=len(json.dumps(h)) + len(data) + 1)' "runs past the end of the file"
bad "a header that is not JSON" 'out = struct.pack("<Q", 5) + b"{nope" + data' "not JSON"
bad "a number past a double in the header" 'out = struct.pack("<Q", 11) + b"{\"a\":1e999}" + data' "not JSON" "out_of_range"
bad "a size that is not shape x dtype" 'h["ln_f.bias"]["shape"] = [31]' "ln_f.bias" "needs 124"
bad "an unknown dtype" 'h["ln_f.bias"]["dtype"] = "Q7"' "ln_f.bias" "unknown dtype"
bad "a dtype import does not convert" 'h["ln_f.bias"]["dtype"] = "I32"' "ln_f.bias" "is I32"
bad "a tensor the model lacks" 'e = h["h.1.ln_1.weight"]["data_offsets"]
h["h.2.ln_1.weight"] = dict(h["h.1.ln_1.weight"], data_offsets=[len(data), len(data) + e[1] - e[0]])
data = data + data[e[0]:e[1]]' "h.2.ln_1.weight" "no place"
bad "a missing tensor" 'e = h.pop("ln_f.bias"); h["x.extra"] = e; h["h.0.attn.masked_bias"] = h.pop("x.extra")' \
  "no tensor 'ln_f.bias'"
bad "a name given twice" 't = json.dumps(h)[:-1] + ", \"wpe.weight\": " + json.dumps(h["wpe.weight"]) + "}"
out = struct.pack("<Q", len(t)) + t.encode() + data' '"wpe.weight" appears twice'
# Issue 29, finding 12: a key repeated inside one entry was accepted, the
# last one winning; a 0-byte shape [2^62, 2^62, 0] was "too large".
bad "a key given twice inside an entry" 't = json.dumps(h).replace("\"ln_f.bias\": {", "\"ln_f.bias\": {\"dtype\": \"I32\", ", 1)
out = struct.pack("<Q", len(t)) + t.encode() + data' '"dtype" appears twice'
bad "an empty tensor of a huge shape" 'h["x.empty"] = {"dtype": "F32", "shape": [1 << 62, 1 << 62, 0], "data_offsets": [len(data), len(data)]}' \
  "x.empty" "[4611686018427387904, 4611686018427387904, 0]" "no place"
# Finding 7: nesting is capped before it is built (the probe's 100 MiB
# header of nested arrays took 21 s and 3.9 GB; round2.sh measures it).
bad "a header nested 100 deep" 'h["x.deep"] = json.loads("[" * 100 + "]" * 100)' "nested deeper than 3"
bad "a name and its prefixed twin" 'e = h["wpe.weight"]["data_offsets"]
h["transformer.wpe.weight"] = dict(h["wpe.weight"], data_offsets=[len(data), len(data) + e[1] - e[0]])
data = data + data[e[0]:e[1]]' "are both the model's wpe.weight"
# All the files from one python.
"$PY" - "$W/a.safetensors" "$W/bad" "${#names[@]}" <<EOF
import json, struct, sys
def pack(h, data, n=None):
    t = json.dumps(h).encode()
    return struct.pack("<Q", len(t) if n is None else n) + t + data
$edits
raw = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", raw[:8])[0]
for i in range(int(sys.argv[3])):
    open(f"{sys.argv[2]}{i}.safetensors", "wb").write(globals()[f"edit{i}"](json.loads(raw[8:8 + n]), raw[8 + n:]))
EOF
for i in "${!names[@]}"; do
  run "$SH" import --from "$W/bad$i.safetensors" --dir "$W/keep" --force -m "$W/keep/manifest.jsonl" "${POOL[@]}"
  expect_rc 65 "safetensors with ${names[i]} exits 65"
  IFS='|' read -r -a want <<<"${patterns[i]}"
  check "…naming it (${want[*]})" has_all "$err" "$W/bad$i.safetensors" "${want[@]}"
  check "…and the state it would replace is intact" bash -c '
    [[ $(cd "$1" && find . -type f ! -name .zinf-lock -print0 | sort -z | xargs -0 sha256sum) == "$(<"$2")" ]]' _ "$W/keep" "$W/keep.sums"
done
run "$SH" import --from "$W/g.bin" --format safetensors --dir "$W/keep" --force -m "$W/keep/manifest.jsonl" "${POOL[@]}"
expect_rc 65 "--format safetensors on an llm.c file exits 65"
head -c 5000 "$W/g.bin" >"$W/short.bin"
run "$SH" import --from "$W/short.bin" --dir "$W/keep" --force -m "$W/keep/manifest.jsonl" "${POOL[@]}"
expect_rc 65 "a truncated llm.c checkpoint exits 65"
check "…saying how long it is and should be" has_all "$err" "5000 bytes" "makes it"
check "…the state is still intact after them all" bash -c '
  [[ $(cd "$1" && find . -type f ! -name .zinf-lock -print0 | sort -z | xargs -0 sha256sum) == "$(<"$2")" ]] && [[ -z $(find "$1" -name "*.zinf-tmp") ]]' \
  _ "$W/keep" "$W/keep.sums"
run "$SH" import --from "$W/a.safetensors" --dir "$W/keep" -m "$W/keep/manifest.jsonl" "${POOL[@]}"
expect_rc 73 "import into a directory holding a manifest, without --force, exits 73"
run "$SH" import --from "$W/none.safetensors" --dir "$W/none" -m "$W/keep/manifest.jsonl" "${POOL[@]}"
expect_rc 66 "import from a missing file exits 66"

# Export refusals: the old file stays; nothing half-written appears.
cp "$W/e3.safetensors" "$W/old.safetensors"
exp -m "$W/llmc/manifest.jsonl" --to "$W/e3.safetensors"
expect_rc 73 "export over an existing file without --force exits 73"
check "…leaving it as it was" cmp "$W/e3.safetensors" "$W/old.safetensors"
exp -m "$W/llmc/manifest.jsonl" --to "$W/e3.safetensors" --force
expect_rc 0 "with --force it is replaced"
check "…by the new state's values" "$PY" "$REF" read-safetensors "$W/e3.safetensors" "$W/g.npz"
rec=$(jq -c 'select(.tensor == "h.1.attn.c_proj.weight" and .rank == 1 and .state == "master")' "$W/keep/manifest.jsonl")
"$PY" -c 'import sys; f = open(sys.argv[1], "r+b"); f.seek(int(sys.argv[2])); b = f.read(1); f.seek(-1, 1); f.write(bytes([b[0] ^ 0xFF]))' \
  "$W/keep/$(jq -r .file <<<"$rec")" $(($(jq .offset <<<"$rec") + 9))
exp -m "$W/keep/manifest.jsonl" --data-dir "$W/keep" --to "$W/damaged.safetensors" # a copy of st3's directory
expect_rc 65 "export of a damaged state exits 65"
check "…naming the partition, writing no file and no temporary" bash -c '
  [[ $1 == *"h.1.attn.c_proj.weight rank 1 master"* && ! -e $2 && -z $(find "$3" -name "*.tmp.*") ]]' \
  _ "$err" "$W/damaged.safetensors" "$W"
"$SH" layout --model "$M" >"$W/laid.jsonl"
exp -m "$W/laid.jsonl" --to "$W/never.safetensors"
expect_rc 64 "export of a manifest that was never written exits 64"
exp -m "$W/st3/manifest.jsonl" --to "$W/never.safetensors" --format onnx
expect_rc 64 "an unknown --format exits 64"

finish
