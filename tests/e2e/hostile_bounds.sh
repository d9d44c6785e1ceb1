#!/usr/bin/env bash
# More of what a hostile manifest or a careless umask can do (issue 18),
# beside hostile.sh: partitions that run past their file or past 2^63 (where
# offset + bytes would wrap and slip past the overlap check), alignments
# that rounding would carry past 2^63, a layout whose files could not exist,
# data files read through a link leading outside by every reader (verify,
# cat, reshard, export, zinf-sample), and the modes of what zinf creates:
# 0666/0777 less the umask, whichever program makes them.
source "$(dirname "$0")/lib.bash"
M2=gpt:layers=1,hidden=24,heads=3,vocab=31,seq=5   # 16 tensors, odd sizes
MT=gpt:layers=1,hidden=32,heads=2,vocab=256,seq=32 # byte-level, trains on any text
W=$(mktemp -d /var/tmp/zinf-e2e-bounds-XXXXXX)
on_exit "rm -rf '$W'"
# set_field IN OUT TENSOR STATE KEY VALUE: the record's KEY set to VALUE,
# written exactly (jq would round integers above 2^53).
set_field() {
  python3 - "$@" <<'EOF'
import json, sys
src, dst, tensor, state, key, value = sys.argv[1:]
with open(src) as f, open(dst, "w") as g:
    for line in f:
        r = json.loads(line)
        if r.get("tensor") == tensor and r.get("state") == state:
            r[key] = int(value)
        g.write(json.dumps(r, separators=(",", ":")) + "\n")
EOF
}

# --- offsets and lengths ----------------------------------------------------
fresh b --model "$MT" --param-dtype fp32
mf=$W/b/manifest.jsonl
# Past the file: every reader says which file, where, and exits 65.
set_field "$mf" "$W/past.jsonl" ln_f.bias param offset 1048576
for sub in verify "cat --tensor ln_f.bias"; do
  run zs $sub -m "$W/past.jsonl"
  expect_rc 65 "$sub of a partition past the end of its file exits 65"
  check "…naming the file and the offset" has_all "$err" "rank0/param.bin" "1048576"
done
run zs reshard -m "$W/past.jsonl" --dp 2 --dir "$W/past-r"
expect_rc 65 "reshard from a partition past the end of its file exits 65"
check "…writing no manifest" test ! -e "$W/past-r/manifest.jsonl"

# Near 2^64: offset + bytes wraps. wte.weight's 32768 bytes at 2^64 - 4096
# would end at 28672, inside the file, where the overlap check looks.
big=$(((1 << 63) - 4096))  # bash: 2^63 - 4096, an aligned offset no file reaches
wrap=18446744073709547520 # 2^64 - 4096
set_field "$mf" "$W/wrap.jsonl" wte.weight param offset "$wrap"
for sub in inspect verify; do
  run zs $sub -m "$W/wrap.jsonl"
  expect_rc 65 "$sub of a record whose offset + bytes wraps past 2^64 exits 65"
  check "…naming the line, the offset and 2^63" has_all "$err" "line" "$wrap" "2^63"
done
zs layout --model "$MT" --param-dtype fp32 >"$W/l.jsonl"
set_field "$W/l.jsonl" "$W/lwrap.jsonl" wte.weight param offset "$wrap"
run zs init --dir "$W/wrap-init" <"$W/lwrap.jsonl"
expect_rc 65 "init of a layout whose offset + bytes wraps exits 65 (bad data, not an I/O error)"
check "…creating nothing" test ! -e "$W/wrap-init"
set_field "$W/l.jsonl" "$W/lbig.jsonl" ln_f.bias param offset "$big"
run zs init --dir "$W/big-init" <"$W/lbig.jsonl"
expect_rc 65 "init of a layout with a partition ending past 2^63 exits 65"

# A layout whose files could not exist: 2^62 parameters in one fp32 file.
run zs layout --model gpt:layers=1300,hidden=16777216,heads=1,vocab=2,seq=2 --param-dtype fp32
expect_rc 64 "layout of a model whose file would pass 2^63 bytes exits 64"
check "…saying so" contains "$err" "2^63"
run zs layout --model "$M2" --align 8EiB
expect_rc 64 "layout --align 8EiB (rounding would carry past 2^63) exits 64"
jq -c 'if has("schema") then .alignment = 1099511627776 else . end' "$W/l.jsonl" >"$W/align.jsonl"
run zs inspect -m "$W/align.jsonl"
expect_rc 65 "a manifest with alignment 2^40 exits 65"
check "…naming the alignment" contains "$err" "alignment"

# Two partitions sharing bytes of one file.
jq -c 'if .tensor == "ln_f.bias" and .state == "param" then .offset = 0 else . end' "$mf" >"$W/overlap.jsonl"
run zs verify -m "$W/overlap.jsonl"
expect_rc 65 "a partition overlapping another in the same file exits 65"
check "…saying so, with both lines" has_all "$err" "overlap" "line"

# --- reading through a link that leads outside: refused by every reader ------
OUT=$W/outside
mkdir -p "$OUT"
fresh rl --model "$MT" --param-dtype fp32
mv "$W/rl/rank0/param.bin" "$OUT/param.bin"
ln -s "$OUT/param.bin" "$W/rl/rank0/param.bin"
run zs export -m "$W/rl/manifest.jsonl" --to "$W/rl.safetensors"
expect_rc 65 "export of a state whose data file is a link leading outside exits 65"
check "…naming the file" contains "$err" "rank0/param.bin"
check "…writing nothing" test ! -e "$W/rl.safetensors"
run zs reshard -m "$W/rl/manifest.jsonl" --dp 2 --dir "$W/rl-r"
expect_rc 65 "reshard from such a state exits 65"
if [[ -x $SA ]]; then
  run "$SA" --manifest "$W/rl/manifest.jsonl" --prompt "a" --tokens 2 "${POOL[@]}"
  expect_rc 65 "zinf-sample of such a state exits 65"
  check "…naming the file" contains "$err" "rank0/param.bin"
else
  skip "zinf-sample of a state whose data file leads outside" "no $SA"
fi

# --- what zinf creates honours the umask -------------------------------------
modes() { (cd "$1" && find . -mindepth 1 \( -type f -o -type d \) -printf '%M %p\n' | sort -k2); }
run bash -c 'umask 077; "$1" layout --model "$2" | "$1" init --pinned 8MiB --pinned-buffer 256KiB --dir "$3"' _ "$SH" "$M2" "$W/u077/run"
expect_rc 0 "init under umask 077"
check "…every file it made is 0600, every folder 0700 (the data directory's parent too)" bash -c '
  [[ $(stat -c %a "$1" "$1/run") == $'"'"'700\n700'"'"' ]] &&
  [[ -z $(find "$1" -mindepth 1 -type f ! -perm 600) && -z $(find "$1" -mindepth 1 -type d ! -perm 700) ]]' _ "$W/u077"
zs layout --model "$MT" --param-dtype fp32 | (umask 022 && zs init --dir "$W/u002" >/dev/null 2>&1)
head -c 3000 "$ROOT/man/zinf.7" >"$W/corpus.txt"
run bash -c 'umask 002; exec "$@"' _ "$TR" --manifest "$W/u002/manifest.jsonl" --text "$W/corpus.txt" --steps 1 \
  --batch 2 --seq 16 --threads 1 "${POOL[@]}"
expect_rc 0 "a training step under umask 002"
check "…the state files it created are 0664 (0666 less the umask), not 0644" bash -c '
  ls "$1"/rank0/*.alt.bin >/dev/null && [[ -z $(find "$1/rank0" -name "*.alt.bin" ! -perm 664) ]]' _ "$W/u002"
check "…and the committed manifest kept its 0644" test "$(stat -c %a "$W/u002/manifest.jsonl")" = 644
run bash -c 'umask 027; exec "$@"' _ "$SH" export "${POOL[@]}" -m "$W/u002/manifest.jsonl" --to "$W/u027.safetensors"
expect_rc 0 "export under umask 027"
check "…writes a 0640 file" test "$(stat -c %a "$W/u027.safetensors")" = 640

finish
