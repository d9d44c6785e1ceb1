#!/usr/bin/env bash
# End-to-end tests of zinf-shard: the layout | init | verify pipeline, the
# bytes on disk (cat, reshard, tiles, initial values), the manifest reader's
# refusals (paths, malformed lines, with their line numbers), keys it does not
# know, exit codes, and failures that must leave an old directory intact.
source "$(dirname "$0")/lib.bash"
SH=$BIN/zinf-shard
POOL=(--pinned 8MiB --pinned-buffer 256KiB)
M1=gpt:layers=2,hidden=64,heads=2,vocab=97,seq=16 # 28 tensors
M2=gpt:layers=1,hidden=24,heads=3,vocab=31,seq=5  # 16 tensors, odd sizes
BIG=gpt:layers=4,hidden=128,heads=2,vocab=97,seq=16 # about 11MiB of state

# zs SUB ARGS...: zinf-shard, the subcommands that do I/O with the small pool.
# pipeline MODEL DP DIR: layout | init --dir DIR | verify; init's stdout kept in DIR.init.
pipeline() {
  zs layout --model "$1" --dp "$2" | zs init --dir "$3" | tee "$3.init" | zs verify
  local st=("${PIPESTATUS[@]}")
  [[ ${st[*]} == "0 0 0 0" ]] || { echo "pipeline exit statuses: ${st[*]}" >&2 && return 1; }
}
# sums DIR: the sha256 of every file under DIR, by relative path.
no_temps() { [[ -z $(find "$1" -name '*.zinf-tmp*' -o -name 'manifest.jsonl.tmp.*') ]]; }
no_files() { [[ ! -e $1 || -z $(find "$1" -type f) ]]; } # DIR: absent, or no file under it
# intact DIR SUMS: DIR's files are byte for byte those `sums` listed, no temporaries beside them.
intact() { [[ $(sums "$1") == "$(<"$2")" ]] && no_temps "$1"; }
same_text() { cmp -s <(printf '%s\n' "$1") "$2"; } # TEXT FILE
same_file() { cmp -s "$1" "$2"; }
# same_sums A B: two catsums listings agree; the lines that differ on stderr.
same_sums() { cmp -s "$1" "$2" || { diff "$1" "$2" | sed 's/^/#   /' >&2 && return 1; }; }
matches() { [[ $1 =~ $2 ]]; } # TEXT REGEX
# edit FILE LINE FILTER [jq options]: FILE with line LINE put through jq -c.
edit() {
  local f=$1 n=$2 filter=$3
  shift 3
  awk -v n="$n" 'NR < n' "$f"
  sed -n "${n}p" "$f" | jq -c "$@" "$filter"
  awk -v n="$n" 'NR > n' "$f"
}
# line_of MANIFEST TENSOR RANK STATE: the line number of that record.
line_of() {
  jq -r --arg t "$2" --argjson r "$3" --arg s "$4" \
    'select(.tensor == $t and .rank == $r and .state == $s) | input_line_number' "$1"
}
# flip FILE OFFSET: invert one byte in place.
flip() {
  local b
  b=$(od -An -tu1 -j "$2" -N1 "$1" | tr -d ' ')
  printf '%b' "\\$(printf '%03o' $((b ^ 255)))" | dd of="$1" bs=1 seek="$2" conv=notrunc status=none
}
# catsums MANIFEST [TENSOR...]: "tensor state bytes sha256" of every tensor's
# (or those TENSORs') param and master, one cat each.
catsums() {
  local t s m=$1
  shift
  for t in $(if (($#)); then printf '%s\n' "$@"; else jq -r 'select(.rank == 0 and .state == "param") | .tensor' "$m"; fi); do
    for s in param master; do
      zs cat -m "$m" --tensor "$t" --state "$s" >"$TMP/cat.bin" 2>"$TMP/cat.err" || echo "$t $s exit $?"
      echo "$t $s $(stat -c %s "$TMP/cat.bin") $(sha256sum <"$TMP/cat.bin" | cut -d' ' -f1)"
    done
  done
}
# words FILE BYTES HEX COUNT: FILE is COUNT words of BYTES bytes, each HEX (host order).
words() {
  [[ $(od -An -v -tx"$2" "$1" | tr -s ' \n' '\n' | grep -v '^$' | sort | uniq -c | awk '{ print $1, $2 }') == "$4 $3" ]]
}
have_python() { command -v python3 >/dev/null; }

# --- a program's start: no thread of OpenBLAS's pool left spinning ----------
# verify blocks reading its manifest from a FIFO: by then the program has
# started, and only its own thread may be there (OpenBLAS's pthread build
# starts a pool of nproc - 1 threads as it loads; the device stops it).
if (($(nproc) > 1)); then
  mkfifo "$TMP/start.fifo"
  "$SH" verify <"$TMP/start.fifo" >/dev/null 2>&1 &
  pid=$!
  exec {fifo_w}>"$TMP/start.fifo"
  state=
  for ((i = 0; i < 3000; i++)); do # 30 s: a loaded machine may take seconds to start it
    # In the read of a pipe (the shell's child waits on the FIFO before the
    # exec, the program on OpenBLAS's pool as it stops it: not those).
    # (wchan has no newline: read sets state and still returns 1 at its end.)
    read -r comm <"/proc/$pid/comm" 2>/dev/null && [[ $comm == zinf-shard ]] &&
      { read -r state <"/proc/$pid/wchan" 2>/dev/null || [[ -n $state ]]; } && [[ $state == *pipe_read* ]] && break
    nap 0.01
  done
  tasks=("/proc/$pid/task/"*)
  check "a program blocked on its input after start runs one thread (OpenBLAS's pool stopped)" test "${#tasks[@]}" = 1
  exec {fifo_w}>&-
  wait "$pid"
else
  skip "a program runs one thread after start" "one core: OpenBLAS starts no pool"
fi

# --- layout | init | verify, for even and uneven splits ---------------------
declare -A TENSORS=([$M1]=28 [$M2]=16) NAME=([$M1]=m1 [$M2]=m2)
for model in "$M1" "$M2"; do
  dps=(1 2 3 8)
  [[ $model == "$M2" ]] && dps+=(7) # 24-element tensors leave rank 6 empty
  for dp in "${dps[@]}"; do
    D=$TMP/${NAME[$model]}-dp$dp
    n="${NAME[$model]} dp $dp"
    run pipeline "$model" "$dp" "$D"
    expect_rc 0 "$n: layout | init | verify exits 0"
    check "$n: verify prints the manifest: zinf.manifest/1, dir $D, every record with an xxh3" \
      jq -e -s --arg dir "$(realpath "$D")" --argjson dp "$dp" --argjson t "${TENSORS[$model]}" '
        .[0].schema == "zinf.manifest/1" and .[0].dir == $dir and .[0].dp == $dp and .[0].tensors == $t
        and .[0].records == $t * $dp * 4 and .[0].records == length - 1
        and (.[1:] | all(.xxh3 | type == "string" and test("^[0-9a-f]{16}$")))' <<<"$out"
    check "$n: D/manifest.jsonl is init's stdout" same_file "$D/manifest.jsonl" "$D.init"
    check "$n: verify passes the manifest through unchanged" same_text "$out" "$D.init"
    check "$n: no temporaries remain" no_temps "$D"
    check "$n: the files are manifest.jsonl, the lock file and rank<r>/<state>.bin for every rank, nothing else" \
      test "$(cd "$D" && find . -type f | sort)" = "$({ echo ./manifest.jsonl; echo ./.zinf-lock; for ((r = 0; r < dp; r++)); do
        for s in param master exp_avg exp_avg_sq; do echo "./rank$r/$s.bin"; done; done; } | sort)" \
      -a "$(cd "$D" && find . -type f | sort | wc -l)" = $((dp * 4 + 2))
    check "$n: every file is as long as its last partition's aligned end" bash -c '
      jq -r -s ".[1:] | group_by(.file)[] | \"\(.[0].file) \(map(((.offset + .bytes + 4095) / 4096 | floor) * 4096) | max)\"" \
        "$1/manifest.jsonl" | while read -r f n; do [[ $(stat -c %s "$1/$f") == "$n" ]] || exit 1; done' _ "$D"
  done
done

# A relative --dir is recorded absolute.
mkdir -p "$TMP/rel"
run bash -c 'set -o pipefail; cd "$1" && "$2" layout --model "$3" | "$2" init --pinned 8MiB --pinned-buffer 256KiB --dir sub/d' \
  _ "$TMP/rel" "$SH" "$M2"
expect_rc 0 "init with a relative --dir"
check "…records the directory's absolute path" jq -e -s --arg d "$(realpath "$TMP/rel/sub/d")" '.[0] | .dir == $d' <<<"$out"

# Written again from an initialised manifest, with one job and the threads engine: the same checksums.
run zs init --dir "$TMP/m1-again" -m "$TMP/m1-dp3/manifest.jsonl" -j 1 -e threads
expect_rc 0 "an initialised manifest can be written afresh into another directory (-j 1, threads engine)"
check "…with the same xxh3 in every record and the new dir in the header" bash -c '
  [[ $(tail -n +2 <<<"$1") == "$(tail -n +2 "$2")" ]] && jq -e -s --arg d "$3" ".[0] | .dir == \$d" <<<"$1"' \
  _ "$out" "$TMP/m1-dp3/manifest.jsonl" "$(realpath "$TMP/m1-again")"

# --stats: a record of the run for scripts.
run bash -c 'set -o pipefail; "$1" layout --model "$2" --dp 2 | "$1" init --pinned 8MiB --pinned-buffer 256KiB --dir "$3" \
  --stats "$3.init.json" | "$1" verify --pinned 8MiB --pinned-buffer 256KiB --stats "$3.verify.json"' _ "$SH" "$M2" "$TMP/stats"
expect_rc 0 "init --stats | verify --stats"
total=$(jq -s '[.[1:][].bytes] | add' <<<"$out")
check "…one zinf.shard-stats/1 record each: op, the manifest's bytes, every lease back" jq -e -s --argjson b "$total" '
  length == 2 and .[0].op == "init" and .[1].op == "verify" and all(.[]; .schema == "zinf.shard-stats/1"
    and .bytes == $b and .seconds > 0 and .pool.in_use == 0 and .pool.buffers == 32 and .pool.high_water <= 32)' \
  "$TMP/stats.init.json" "$TMP/stats.verify.json"

# --- cat: one tensor's bytes, whatever the split -----------------------------
# Every tensor through cat at dp 1 (sha256 of its bytes); every split and
# reshard through cat --sums (the same gathered bytes, through the same
# gather, shard/main.cpp's do_cat: their xxh3, one process instead of one per
# tensor and state); at dp 8, cat of two tensors (same_cats).
sumsof() { zs cat --sums --state param --state master -m "$1"; } # MANIFEST
# same_cats REF CATS: the 4 lines of CATS (2 tensors, param and master) are REF's for them.
same_cats() {
  [[ $(wc -l <"$2") == 4 ]] && same_sums <(awk 'NR == FNR { want[$1 " " $2]; next } ($1 " " $2) in want' "$2" "$1") "$2"
}
for model in "$M1" "$M2"; do
  n=${NAME[$model]}
  # Every tensor's bytes, through cat --sums (one program); through cat
  # itself, one of each kind: the embeddings, a matrix, a bias, a norm's
  # weight and the tensor split over the fewest ranks at dp 8 (at 56 cats a
  # model, one program each, the loop over every tensor was 9 s of the suite).
  few=$(jq -r -s '.[1:] | map(select(.state == "param" and .bytes > 0)) | group_by(.tensor) | min_by(length) | .[0].tensor' \
    "$TMP/$n-dp8/manifest.jsonl")
  kinds=(wte.weight wpe.weight h.0.attn.c_attn.weight h.0.mlp.c_proj.bias h.0.ln_2.weight)
  [[ " ${kinds[*]} " == *" $few "* ]] || kinds+=("$few")
  catsums "$TMP/$n-dp1/manifest.jsonl" "${kinds[@]}" >"$TMP/$n.cat"
  check "$n: cat exits 0 for a tensor of each kind, param and master" bash -c '! grep -q " exit " "$1"' _ "$TMP/$n.cat"
  # "tensor param numel*2" and "tensor master numel*4" of every tensor, as the layout gives them.
  zs layout --model "$model" | jq -r 'select(.state == "param") | (.shape | reduce .[] as $x (1; . * $x)) as $n
    | "\(.tensor) param \($n * 2)\n\(.tensor) master \($n * 4)"' >"$TMP/$n.sizes"
  check "$n: cat gives numel * 2 bytes of bf16 param, numel * 4 of fp32 master" test "$(cut -d' ' -f1-3 "$TMP/$n.cat")" = \
    "$(awk 'NR == FNR { b[$1 " " $2] = $3; next } { print $1, "param", b[$1 " param"]; print $1, "master", b[$1 " master"] }' \
      "$TMP/$n.sizes" <(printf '%s\n' "${kinds[@]}"))"
  catsums "$TMP/$n-dp8/manifest.jsonl" wte.weight "$few" >"$TMP/$n.dp8.cat"
  check "$n: cat gives the same bytes of wte and of the tensor on the fewest ranks, param and master, at dp 8 as at dp 1" \
    same_cats "$TMP/$n.cat" "$TMP/$n.dp8.cat"
  sumsof "$TMP/$n-dp1/manifest.jsonl" >"$TMP/$n.ref"
  check "$n: cat --sums: a line per tensor and state, the layout's byte counts (cat's, above), a 16-digit xxh3" \
    test "$(cut -d' ' -f1-3 "$TMP/$n.ref")" = "$(<"$TMP/$n.sizes")" \
    -a "$(grep -cE ' [0-9a-f]{16}$' "$TMP/$n.ref")" = "$(wc -l <"$TMP/$n.sizes")"
  dps=(2 3 8)
  [[ $model == "$M2" ]] && dps+=(7)
  for dp in "${dps[@]}"; do
    sumsof "$TMP/$n-dp$dp/manifest.jsonl" >"$TMP/$n.dp$dp.sums"
    check "$n: every tensor's param and master bytes are the same at dp $dp as at dp 1" \
      same_sums "$TMP/$n.ref" "$TMP/$n.dp$dp.sums"
  done
done
run zs cat --sums -m "$TMP/m2-dp3/manifest.jsonl" --tensor wte.weight --tensor wpe.weight --state master
expect_rc 0 "cat --sums --tensor A --tensor B --state master"
check "…two lines, in the order asked, the same as at dp 1" \
  test "$out" = "$(grep -E '^(wte|wpe)\.weight master ' "$TMP/m2.ref")"
run zs cat --sums -m "$TMP/m2-dp3/manifest.jsonl" --tensor wte.weight
check "…no --state: every state the manifest holds" \
  test "$(cut -d' ' -f1-2 <<<"$out")" = "$(printf 'wte.weight %s\n' param master exp_avg exp_avg_sq)"
run zs cat -m "$TMP/m2-dp3/manifest.jsonl" --tensor wte.weight --tensor wpe.weight
expect_rc 64 "cat with two --tensor and no --sums: 64"
check "…saying cat writes one tensor" contains "$err" "one --tensor"
run zs cat -m "$TMP/m2-dp3/manifest.jsonl" --tensor wte.weight --state param --state master
expect_rc 64 "cat with two --state and no --sums: 64"
run zs cat --sums -m "$TMP/m2-dp3/manifest.jsonl" --state moments
expect_rc 64 "cat --sums --state moments: 64 naming the state"
check "…and the states the manifest holds" contains "$err" "'moments' is not in this manifest"

# reshard: 3 -> 5 (M1), 8 -> 5 and 2 -> 7 (M2, empty partitions), values unchanged.
for spec in "$M1 3 5" "$M2 8 5" "$M2 2 7"; do
  read -r model from to <<<"$spec"
  n=${NAME[$model]}
  D2=$TMP/$n-from$from-to$to
  run zs reshard -m "$TMP/$n-dp$from/manifest.jsonl" --dp "$to" --dir "$D2"
  expect_rc 0 "$n: reshard dp $from -> $to exits 0"
  check "$n: …its stdout is D2's manifest, dp $to, dir D2, every record hashed" bash -c '
    [[ $(<"$2/manifest.jsonl") == "$1" ]] && jq -e -s --arg d "$3" --argjson dp "$4" \
      ".[0].dp == \$dp and .[0].dir == \$d and .[0].records == length - 1 and (.[1:] | all(.xxh3))" <<<"$1"' \
    _ "$out" "$D2" "$(realpath "$D2")" "$to"
  check "$n: …no temporaries remain" no_temps "$D2"
  run zs verify -m "$D2/manifest.jsonl"
  expect_rc 0 "$n: verify of the resharded manifest passes"
  sumsof "$D2/manifest.jsonl" >"$TMP/$n.rs$to.sums"
  check "$n: every tensor's param and master bytes are unchanged by reshard $from -> $to" \
    same_sums "$TMP/$n.ref" "$TMP/$n.rs$to.sums"
done

# --- tiles: side by side they are the untiled weight -------------------------
tiles_ok() { # MODEL K DPREF DIR: every tiled weight, param and master, against the untiled one
  # One python for all of them: each tensor gathered from its records
  # (partitions' elements in rank order), and zinf-shard cat's gather of the first
  # tile the same bytes. (A cat per tile and state was 180 processes and a
  # sixth of the suite's CPU.)
  local first
  first=$(jq -r 'select(.state == "param" and .rank == 0) | .tensor | select(endswith(".tile0"))' "$4/manifest.jsonl" | head -n 1)
  zs cat -m "$4/manifest.jsonl" --tensor "$first" >"$TMP/tile0.bin" || return 1
  python3 - "$2" "$3/manifest.jsonl" "$4/manifest.jsonl" "$first" "$TMP/tile0.bin" <<'EOF'
import json, os, sys
k, ref, tiled, first, first_cat = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
def records(path):
    lines = open(path).read().splitlines()
    out = {}
    for r in map(json.loads, lines[1:]):
        out.setdefault((r["tensor"], r["state"]), []).append(r)
    return os.path.dirname(path), out
def gather(m, tensor, state):
    root, recs = m
    parts = sorted(recs[(tensor, state)], key=lambda r: r["rank"])
    data = b""
    for r in parts:
        with open(os.path.join(root, r["file"]), "rb") as f:
            f.seek(r["offset"])  # the partition's elements (its bytes may hold a padding element)
            data += f.read((r["elements"][1] - r["elements"][0]) * {"bf16": 2, "fp32": 4}[r["dtype"]])
    return data, parts[0]["shape"]
R, T = records(ref), records(tiled)
weights = sorted(t[:-len(".tile0")] for (t, s) in T[1] if s == "param" and t.endswith(".tile0"))
bad = []
for w in weights:
    for s in ("param", "master"):
        whole, _ = gather(R, w, s)
        tiles = [gather(T, f"{w}.tile{i}", s) for i in range(k)]
        rows = tiles[0][1][0]
        ts = [t for t, _ in tiles]
        if any(len(t) % rows for t in ts) or sum(map(len, ts)) != len(whole):
            bad.append(f"{w}:{s}:sizes")
            continue
        n = [len(t) // rows for t in ts]
        if b"".join(t[r * c:(r + 1) * c] for r in range(rows) for t, c in zip(ts, n)) != whole:
            bad.append(f"{w}:{s}")
if not weights: bad.append("no tiled weights")
elif gather(T, first, "param")[0] != open(first_cat, "rb").read(): bad.append(f"{first}: zinf-shard cat")
if bad: sys.exit("mismatch: " + " ".join(bad))
print(f"{len(weights)} weights, {k} tiles each")
EOF
}
for spec in "$M1 2 3 36" "$M2 5 2 32"; do
  read -r model k dp t <<<"$spec"
  n=${NAME[$model]}
  D=$TMP/$n-tile$k
  run bash -c 'set -o pipefail; "$1" layout --model "$2" --dp "$3" --tile "$4" | "$1" init --pinned 8MiB --pinned-buffer 256KiB --dir "$5"' \
    _ "$SH" "$model" "$dp" "$k" "$D"
  expect_rc 0 "$n: layout --tile $k | init exits 0"
  check "$n: --tile $k makes $t tensors, the linear weights in $k tiles each" \
    jq -e -s --argjson t "$t" '.[0] | .tensors == $t and .tile == '"$k" <<<"$out"
  if have_python; then
    run tiles_ok "$model" "$k" "$TMP/$n-dp1" "$D"
    expect_rc 0 "$n: every weight's $k tiles side by side are the untiled weight, param and master"
  else
    skip "$n: tiles side by side" "no python3"
  fi
done

# --- initial values ---------------------------------------------------------
D=$TMP/m1-dp3 # 64 elements over 3 ranks: 22, 22, 20
ln_ok=0 ln_total=0
for t in h.0.ln_1 h.0.ln_2 h.1.ln_1 h.1.ln_2 ln_f; do
  zs cat -m "$D/manifest.jsonl" --tensor "$t.weight" >"$TMP/w.bin" && words "$TMP/w.bin" 2 3f80 64 && ((ln_ok++))
  zs cat -m "$D/manifest.jsonl" --tensor "$t.weight" --state master >"$TMP/w.bin" && words "$TMP/w.bin" 4 3f800000 64 && ((ln_ok++))
  zs cat -m "$D/manifest.jsonl" --tensor "$t.bias" >"$TMP/w.bin" && words "$TMP/w.bin" 2 0000 64 && ((ln_ok++))
  zs cat -m "$D/manifest.jsonl" --tensor "$t.bias" --state master >"$TMP/w.bin" && words "$TMP/w.bin" 4 00000000 64 && ((ln_ok++))
  ((ln_total += 4))
done
check "layer-norm weights are 1.0 and biases 0, bf16 and fp32 ($ln_ok of $ln_total)" test "$ln_ok" -eq "$ln_total"
zs cat -m "$D/manifest.jsonl" --tensor h.0.mlp.c_fc.bias >"$TMP/b.bin"
check "linear biases are 0" words "$TMP/b.bin" 2 0000 256
zs cat -m "$D/manifest.jsonl" --tensor wte.weight --state exp_avg >"$TMP/m.bin"
zs cat -m "$D/manifest.jsonl" --tensor wte.weight --state exp_avg_sq >"$TMP/v.bin"
check "the AdamW moments start at 0" bash -c 'cmp -s "$1" "$2" && [[ $(tr -d "\\0" <"$1" | wc -c) == 0 && $(stat -c %s "$1") == 24832 ]]' \
  _ "$TMP/m.bin" "$TMP/v.bin"
if have_python; then
  zs cat -m "$D/manifest.jsonl" --tensor wte.weight --state master >"$TMP/wm.bin"
  zs cat -m "$D/manifest.jsonl" --tensor wte.weight >"$TMP/wp.bin"
  zs cat -m "$D/manifest.jsonl" --tensor h.0.attn.c_proj.weight --state master >"$TMP/pm.bin"
  stats() { # FILE STD: fp32 values with mean ~0 and this standard deviation (+-10%)
    python3 - "$@" <<'EOF'
import struct, sys
b = open(sys.argv[1], 'rb').read(); v = struct.unpack('<%df' % (len(b) // 4), b); n = len(v)
mean = sum(v) / n; sd = (sum((x - mean) ** 2 for x in v) / n) ** 0.5; want = float(sys.argv[2])
sys.exit(0 if abs(mean) < want / 10 and abs(sd - want) < want / 10 and len(set(v)) > n // 2 else 1)
EOF
  }
  check "wte is normal(0, 0.02)" stats "$TMP/wm.bin" 0.02
  check "a residual projection is normal(0, 0.02/sqrt(2 layers)) = 0.01" stats "$TMP/pm.bin" 0.01
  check "the bf16 param is the fp32 master rounded to nearest even" python3 - "$TMP/wm.bin" "$TMP/wp.bin" <<'EOF'
import struct, sys
m = open(sys.argv[1], 'rb').read(); p = open(sys.argv[2], 'rb').read()
mi = struct.unpack('<%dI' % (len(m) // 4), m); pi = struct.unpack('<%dH' % (len(p) // 2), p)
sys.exit(0 if len(mi) == len(pi) == 6208 and all(((x + 0x7fff + ((x >> 16) & 1)) >> 16) == y for x, y in zip(mi, pi)) else 1)
EOF
else
  skip "initial value statistics" "no python3"
fi
run bash -c 'set -o pipefail; "$1" layout --model "$2" --seed 7 | "$1" init --pinned 8MiB --pinned-buffer 256KiB --dir "$3"' _ "$SH" "$M2" "$TMP/seed7"
expect_rc 0 "init with --seed 7"
zs cat -m "$TMP/seed7/manifest.jsonl" --tensor wte.weight --state master >"$TMP/s7.bin"
zs cat -m "$TMP/m2-dp1/manifest.jsonl" --tensor wte.weight --state master >"$TMP/s0.bin"
check "…gives other values than the default seed" bash -c '! cmp -s "$1" "$2" && [[ $(stat -c %s "$1") == 2976 ]]' _ "$TMP/s7.bin" "$TMP/s0.bin"

# fp32 parameters: no master state, the param state is the fp32 master copy.
run bash -c 'set -o pipefail; "$1" layout --model "$2" --dp 2 --param-dtype fp32 | "$1" init --pinned 8MiB --pinned-buffer 256KiB --dir "$3"' \
  _ "$SH" "$M2" "$TMP/fp32"
expect_rc 0 "layout --param-dtype fp32 | init"
check "…states are param, exp_avg, exp_avg_sq" jq -e -s '.[0] | .states == ["param","exp_avg","exp_avg_sq"] and .records == 16 * 2 * 3' <<<"$out"
zs cat -m "$TMP/fp32/manifest.jsonl" --tensor h.0.mlp.c_fc.weight >"$TMP/f.bin"
zs cat -m "$TMP/m2-dp1/manifest.jsonl" --tensor h.0.mlp.c_fc.weight --state master >"$TMP/fm.bin"
check "…the fp32 param is the bf16 layout's master, byte for byte" same_file "$TMP/f.bin" "$TMP/fm.bin"
# Inference: the param state only.
run bash -c 'set -o pipefail; "$1" layout --model "$2" --dp 3 --inference | "$1" init --pinned 8MiB --pinned-buffer 256KiB --dir "$3" |
  "$1" verify --pinned 8MiB --pinned-buffer 256KiB' _ "$SH" "$M2" "$TMP/infer"
expect_rc 0 "layout --inference | init | verify"
check "…the param state only, rank<r>/param.bin files" bash -c '
  jq -e -s ".[0].states == [\"param\"] and .[0].train == false and length == 1 + 16 * 3 and (.[1:] | all(.state == \"param\"))" <<<"$1" &&
  [[ $(cd "$2" && find . -name "*.bin" | sort | tr "\n" " ") == "./rank0/param.bin ./rank1/param.bin ./rank2/param.bin " ]]' \
  _ "$out" "$TMP/infer"
zs cat -m "$TMP/infer/manifest.jsonl" --tensor wpe.weight >"$TMP/i.bin"
zs cat -m "$TMP/m2-dp1/manifest.jsonl" --tensor wpe.weight >"$TMP/ip.bin"
check "…with the same param bytes as training" same_file "$TMP/i.bin" "$TMP/ip.bin"

# --- verify catches damage ---------------------------------------------------
D=$TMP/damage
zs layout --model "$M1" --dp 3 | zs init --dir "$D" >/dev/null 2>&1
cp -a "$D" "$TMP/damage-copy"
MF=$D/manifest.jsonl
rec=$(jq -c 'select(.tensor == "h.0.mlp.c_fc.weight" and .rank == 1 and .state == "master")' "$MF")
file=$(jq -r .file <<<"$rec") off=$(jq -r .offset <<<"$rec") line=$(line_of "$MF" h.0.mlp.c_fc.weight 1 master)
flip "$D/$file" $((off + 1001))
run zs verify -m "$MF"
expect_rc 65 "verify: one flipped byte exits 65"
check "…naming the tensor, rank, state, file, offset and manifest line" bash -c '
  [[ $1 == *"h.0.mlp.c_fc.weight rank 1 master"* && $1 == *"$2"* && $1 == *"offset $3"* && $1 == *"manifest line $4)"* ]]' \
  _ "$err" "$D/$file" "$off" "$line"
check "…and prints no manifest for a next stage" test -z "$out"
run zs verify -m "$MF" --ranks 0,2
expect_rc 0 "verify --ranks 0,2 does not look at rank 1"
run zs verify -m "$MF" --ranks 1-2
expect_rc 65 "verify --ranks 1-2 finds it"
run zs verify -m "$MF" --ranks 3
expect_rc 64 "verify --ranks 3 with dp 3 is refused"
run zs verify -m "$MF" --data-dir "$TMP/damage-copy"
expect_rc 0 "verify --data-dir: the undamaged copy passes"
run zs reshard -m "$MF" --dp 2 --dir "$TMP/from-damaged"
expect_rc 65 "reshard from a damaged source exits 65"
check "…naming the source partition and writing nothing" bash -c '
  [[ $1 == *"mismatch in the source"*"h.0.mlp.c_fc.weight rank 1 master"* ]] && [[ -z $(find "$2" -type f 2>/dev/null) ]]' \
  _ "$err" "$TMP/from-damaged"

cp "$TMP/damage-copy/rank1/master.bin" "$D/rank1/master.bin"
last=$(jq -s '[.[1:][] | select(.file == "rank2/param.bin")] | max_by(.offset)' "$MF")
size=$(($(jq .offset <<<"$last") + 10))
truncate -s "$size" "$D/rank2/param.bin"
run zs verify -m "$MF"
expect_rc 65 "verify: a truncated file exits 65"
check "…saying short file, the partition, the file and its size" bash -c '
  [[ $1 == *"short file: $2 rank 2 param"*"but the file has $3"* && $1 == *"$4"* ]]' \
  _ "$err" "$(jq -r .tensor <<<"$last")" "$size" "$D/rank2/param.bin"
rm "$D/rank2/param.bin"
run zs verify -m "$MF"
expect_rc 66 "verify: a missing rank file exits 66"
check "…naming it" contains "$err" "$D/rank2/param.bin"
run zs verify -m "$TMP/no-such-manifest.jsonl"
expect_rc 66 "verify: a missing --manifest file exits 66"

# --- file paths must stay inside the data directory -------------------------
D=$TMP/paths
zs layout --model "$M2" --dp 3 | zs init --dir "$D" >/dev/null 2>&1
for bad in "../x" "/etc/passwd" "rank0/../../x"; do
  edit "$D/manifest.jsonl" 10 '.file = $f' --arg f "$bad" >"$TMP/bad.jsonl"
  run zs verify <"$TMP/bad.jsonl"
  expect_rc 65 "verify refuses file '$bad'"
  check "…on line 10, naming the path" has_all "$err" "<stdin>: line 10: " "'$bad'"
  run zs cat --tensor wte.weight <"$TMP/bad.jsonl"
  expect_rc 65 "cat refuses file '$bad'"
  check "…on line 10, naming the path" has_all "$err" "<stdin>: line 10: " "'$bad'"
  run zs init --dir "$TMP/paths-out" <"$TMP/bad.jsonl"
  expect_rc 65 "init refuses file '$bad'"
  check "…on line 10, naming the path, creating nothing" \
    bash -c '[[ $1 == *"<stdin>: line 10: "*"'"'"'$3'"'"'"* && ! -e $2 ]]' _ "$err" "$TMP/paths-out" "$bad"
  run zs reshard --dp 2 --dir "$TMP/paths-out" -m "$TMP/bad.jsonl"
  expect_rc 65 "reshard refuses file '$bad'"
  check "…on line 10 of the named file" has_all "$err" "$TMP/bad.jsonl: line 10: " "'$bad'"
done

# --- malformed manifests: 65 and the line ------------------------------------
MF=$D/manifest.jsonl # M2, dp 3: a header and 192 records
malformed() { # NAME LINE-REGEX: verify the manifest in $TMP/bad.jsonl from stdin
  run zs verify <"$TMP/bad.jsonl"
  expect_rc 65 "malformed: $1"
  check "…$2" matches "$err" "$2"
}
sed '5s/.*/{"tensor": "wpe.weight", oops}/' "$MF" >"$TMP/bad.jsonl"
malformed "invalid JSON on line 5" "<stdin>: line 5[^0-9]"
sed 7d "$MF" >"$TMP/bad.jsonl"
missing="$(sed -n 7p "$MF" | jq -r '"\(.tensor) rank \(.rank) \(.state)"')"
malformed "a deleted record" "<stdin>: 1 record\(s\) missing after line 192, the first: $missing \(header on line 1\)"
sed 7p "$MF" >"$TMP/bad.jsonl"
malformed "a duplicated record" "<stdin>: line 8: .* again \(first on line 7\)"
edit "$MF" 1 '.dp = 2' >"$TMP/bad.jsonl"
malformed "header dp changed" "<stdin>: line 1: records 192, but dp 2"
edit "$MF" 1 '.dp = 2 | .records = 128' >"$TMP/bad.jsonl"
malformed "header dp and records changed together" "<stdin>: line 2: .*overlapping or missing range"
edit "$MF" 1 '.records += 1' >"$TMP/bad.jsonl"
malformed "header records count changed" "<stdin>: line 1: records 193"
n=$(line_of "$MF" wte.weight 1 master)
edit "$MF" "$n" '.elements[0] -= 10' >"$TMP/bad.jsonl"
malformed "an element range changed (overlap)" "<stdin>: line $n: wte.weight rank 1: elements .*overlapping"
edit "$MF" "$n" '.offset += 512' >"$TMP/bad.jsonl"
malformed "an offset off the alignment" "<stdin>: line $n: offset [0-9]+ is not aligned to 4096"
edit "$MF" 9 '.tensor = "h.7.attn.c_attn.weight"' >"$TMP/bad.jsonl"
malformed "an unknown tensor" "<stdin>: line 9: tensor 'h.7.attn.c_attn.weight' is not in"
edit "$MF" 9 'del(.file)' >"$TMP/bad.jsonl"
malformed "a record without a file" "<stdin>: line 9: .*'file'"
{ sed -n 1,2p "$MF"; sed -n 1p "$MF"; sed -n '3,$p' "$MF"; } >"$TMP/bad.jsonl"
malformed "a second header" "<stdin>: line 3: a second header"
sed 1d "$MF" >"$TMP/bad.jsonl"
malformed "no header" "<stdin>: line 1: the first record must be the header"
: >"$TMP/bad.jsonl"
malformed "empty stdin" "<stdin>: empty manifest"
printf '\n  \n' >"$TMP/bad.jsonl"
malformed "blank lines only" "<stdin>: empty manifest"
run zs verify -m "$TMP/bad.jsonl"
expect_rc 65 "malformed: an empty --manifest file"
check "…named" contains "$err" "$TMP/bad.jsonl: empty manifest"

# --- keys it does not know survive -------------------------------------------
D=$TMP/keys
run bash -c 'set -o pipefail; "$1" layout --model "$2" --dp 3 |
  jq -c "if .schema then .note = \"keep-me\" else .x_owner = \"alice\" | .x_rank = .rank end" |
  "$1" init --pinned 8MiB --pinned-buffer 256KiB --dir "$3" | "$1" verify --pinned 8MiB --pinned-buffer 256KiB' \
  _ "$SH" "$M2" "$D"
expect_rc 0 "layout | jq (unknown keys) | init | verify"
check "…the header keeps \"note\" and every record \"x_owner\" and \"x_rank\"" jq -e -s '
  .[0].note == "keep-me" and length == 193 and (.[1:] | all(.x_owner == "alice" and .x_rank == .rank))' <<<"$out"
check "…in the manifest on disk too" jq -e -s '.[0].note == "keep-me" and (.[1:] | all(.x_owner == "alice"))' "$D/manifest.jsonl"
run zs reshard -m "$D/manifest.jsonl" --dp 5 --dir "$TMP/keys5"
expect_rc 0 "reshard of the manifest with unknown keys"
check "…the header key and the key all old records agree on survive" jq -e -s '
  .[0].note == "keep-me" and .[0].dp == 5 and length == 1 + 16 * 5 * 4 and (.[1:] | all(.x_owner == "alice"))' <<<"$out"
check "…a key the old records disagree on (x_rank) is dropped" jq -e -s '.[1:] | all(has("x_rank") | not)' <<<"$out"

# --- refusals ----------------------------------------------------------------
D=$TMP/keep
zs layout --model "$M2" --dp 2 | zs init --dir "$D" >/dev/null 2>&1
sums "$D" >"$TMP/keep.sums"
zs layout --model "$M2" --dp 3 >"$TMP/l3.jsonl"
run zs init --dir "$D" <"$TMP/l3.jsonl"
expect_rc 73 "init into a directory holding manifest.jsonl, without --force, exits 73"
check "…naming --force, printing nothing" bash -c '[[ $1 == *--force* && -z $2 ]]' _ "$err" "$out"
check "…every old file unchanged" intact "$D" "$TMP/keep.sums"
run zs reshard -m "$D/manifest.jsonl" --dp 4 --dir "$D"
expect_rc 64 "reshard into the source directory exits 64"
run zs reshard -m "$D/manifest.jsonl" --dp 4 --dir "$D/../keep"
expect_rc 64 "…also when spelled another way (D/../keep)"
ln -s "$D" "$TMP/keep-link"
run zs reshard -m "$D/manifest.jsonl" --dp 4 --dir "$TMP/keep-link" --force
expect_rc 64 "…also through a symlink, even with --force"
check "…every old file unchanged" intact "$D" "$TMP/keep.sums"
run zs reshard -m "$TMP/m2-dp3/manifest.jsonl" --dp 4 --dir "$D"
expect_rc 73 "reshard into another initialised directory without --force exits 73"
# (script(1) makes the terminal; where no pseudo-terminal can be made, a
# container or chroot without /dev/pts, it cannot, and the checks say so.)
if ! command -v script >/dev/null; then
  skip "cat and verify with a terminal (3 checks)" "needs script(1) for a pseudo-terminal"
elif ! pty_err=$(script -qec true /dev/null </dev/null 2>&1); then
  skip "cat and verify with a terminal (3 checks)" "no pseudo-terminal here (script: ${pty_err//$'\n'/ })"
else
  run script -qec "$SH cat --tensor wte.weight -m $D/manifest.jsonl" /dev/null </dev/null
  expect_rc 64 "cat with stdout a terminal exits 64"
  check "…saying to redirect it" contains "$out" "redirect stdout"
  run script -qec "$SH verify" /dev/null </dev/null
  expect_rc 64 "verify with stdin a terminal exits 64"
fi
for bad in x "gpt:layers=2,hidden=65,heads=2" "gpt:layers=2,hidden=64,color=3" "gpt:layers=0,hidden=64" "gpt:hidden=64"; do
  run zs layout --model "$bad"
  expect_rc 64 "layout --model '$bad' exits 64"
  check "…naming the spec" contains "$err" "model spec '$bad'"
done
run zs layout --model "$M2" --dp 0
expect_rc 64 "layout --dp 0 exits 64"
run zs reshard -m "$D/manifest.jsonl" --dp 0 --dir "$TMP/dp0"
expect_rc 64 "reshard --dp 0 exits 64"
run zs layout --model "$M2" --tile 25
expect_rc 64 "layout --tile beyond the hidden size exits 64"
run zs layout --model "$M2" --align 1000
expect_rc 64 "layout --align 1000 (not a power of two) exits 64"
run zs init --dir "$TMP/ranks0" --ranks 0 <"$TMP/l3.jsonl"
expect_rc 64 "init --ranks 0 exits 64 (init writes every rank)"
run "$SH" verfy --dir "$D"
expect_rc 64 "an unknown subcommand exits 64"
check "…naming it" contains "$err" "verfy"
run zs verify <"$TMP/l3.jsonl"
expect_rc 65 "verify of a layout-only manifest (no xxh3) exits 65"
check "…saying it was not written by init" contains "$err" "not written by 'init'"
run zs cat --tensor wte.weight <"$TMP/l3.jsonl"
expect_rc 64 "cat of a layout-only manifest exits 64"
run zs cat -m "$D/manifest.jsonl" --tensor h.0.attn
expect_rc 64 "cat --tensor with a name not in the model exits 64 (a usage error)"
check "…listing near names" contains "$err" "near: h.0.attn.c_attn.weight"
run zs cat -m "$TMP/infer/manifest.jsonl" --tensor wte.weight --state master
expect_rc 64 "cat --state master of an inference manifest exits 64"
run zs cat -m "$TMP/m2-dp3/manifest.jsonl" --tensor wte.weight -o /dev/null
expect_rc 64 "an unknown option exits 64"
run bash -c '"$1" cat --pinned 8MiB --pinned-buffer 256KiB -m "$2" --tensor wte.weight >/dev/full' _ "$SH" "$TMP/m2-dp3/manifest.jsonl"
expect_rc 73 "cat to a full device (/dev/full, no space) exits 73"
run bash -c '"$1" verify --pinned 8MiB --pinned-buffer 256KiB -m "$2" >/dev/full' _ "$SH" "$TMP/m2-dp3/manifest.jsonl"
expect_rc 73 "verify with its manifest going to a full device exits 73"
run bash -c '"$1" layout --model "$2" >/dev/full' _ "$SH" "$M2"
expect_rc 73 "layout to a full device exits 73"
run "$SH" init --pinned 1MiB --pinned-buffer 256KiB --dir "$TMP/tiny-pool" <"$TMP/l3.jsonl"
expect_rc 64 "init with a pool of 4 buffers (bf16 needs 5) exits 64"
check "…naming the pool" contains "$err" "pinned pool"
run bash -c 'set -o pipefail; "$1" layout --model "$2" --param-dtype fp32 | "$1" init --pinned 1MiB --pinned-buffer 256KiB --dir "$3"' \
  _ "$SH" "$M2" "$TMP/tiny-pool-fp32"
expect_rc 0 "…with fp32 parameters 3 buffers do"
# The first 4KiB piece of every file lies inside wte (offset 0); its middle byte is flipped.
ZINF_FAULTS=read:1:corrupt run zs verify -m "$TMP/m1-dp1/manifest.jsonl" -b 4KiB
expect_rc 65 "ZINF_FAULTS=read:1:corrupt: verify reports a mismatch (65)"
check "…in wte, rank 0" contains "$err" "xxh3 mismatch: wte.weight rank 0"
ZINF_FAULTS=read:x:EIO run zs verify -m "$TMP/m2-dp3/manifest.jsonl"
expect_rc 64 "a malformed ZINF_FAULTS exits 64"

# --- failures leave the old directory intact ---------------------------------
D=$TMP/old
zs layout --model "$M1" --dp 2 | zs init --dir "$D" >/dev/null 2>&1
sums "$D" >"$TMP/old.sums"
zs layout --model "$M1" --dp 3 >"$TMP/m1l3.jsonl"
ZINF_FAULTS=write:3:EIO run zs init --dir "$D" --force <"$TMP/m1l3.jsonl"
expect_rc 74 "init --force with a write failing (EIO) exits 74"
check "…naming the file and errno, printing nothing" bash -c '[[ $1 == *"$2/rank"*"errno 5"* && -z $3 ]]' _ "$err" "$D" "$out"
check "…every old file byte-identical, manifest.jsonl too, no temporaries" intact "$D" "$TMP/old.sums"
ZINF_FAULTS=write:2:ENOSPC run zs init --dir "$D" --force <"$TMP/m1l3.jsonl"
expect_rc 73 "init --force with a write failing with ENOSPC (after statvfs passed) exits 73"
check "…saying no space" contains "$err" "No space left on device"
check "…every old file byte-identical, no temporaries" intact "$D" "$TMP/old.sums"
ZINF_FAULTS=write:3:EIO run zs init --dir "$TMP/fresh" <"$TMP/m1l3.jsonl"
expect_rc 74 "init into a new directory with a write failing exits 74"
check "…leaving no file there" no_files "$TMP/fresh"
ZINF_FAULTS=write:2:EIO run zs reshard -m "$TMP/m1-dp3/manifest.jsonl" --dp 2 --dir "$D" --force
expect_rc 74 "reshard --force over a directory with a write failing exits 74"
check "…every old file byte-identical, no temporaries" intact "$D" "$TMP/old.sums"
run zs verify -m "$D/manifest.jsonl"
expect_rc 0 "…and the old directory still verifies"

# A small file system: refused up front when the state does not fit.
SMALL=$TMP/small
mkdir -p "$SMALL"
if mount_tmpfs "$SMALL" size=2M; then
  on_exit "as_root umount '$SMALL'"
  run bash -c 'set -o pipefail; "$1" layout --model "$2" --dp 2 | "$1" init --pinned 8MiB --pinned-buffer 256KiB --dir "$3" |
    "$1" verify --pinned 8MiB --pinned-buffer 256KiB' _ "$SH" "$M2" "$SMALL/ok"
  expect_rc 0 "a model that fits a 2MiB tmpfs: layout | init | verify"
  sums "$SMALL/ok" >"$TMP/small.sums"
  zs layout --model "$BIG" --dp 2 >"$TMP/big.jsonl"
  run zs init --dir "$SMALL/big" <"$TMP/big.jsonl"
  expect_rc 73 "a model that does not fit exits 73"
  check "…saying so (space, needed, free)" bash -c '[[ $1 == *"not enough space"*"needed"*"free"* ]]' _ "$err"
  check "…writing no file there" no_files "$SMALL/big"
  run zs init --dir "$SMALL/ok" --force <"$TMP/big.jsonl"
  expect_rc 73 "init --force of a model that does not fit over an old directory exits 73"
  check "…every old file byte-identical" intact "$SMALL/ok" "$TMP/small.sums"
  run zs reshard -m "$SMALL/ok/manifest.jsonl" --dp 64 --dir "$SMALL/rs"
  expect_rc 73 "reshard to dp 64 (16MiB of aligned partitions) on the small file system exits 73"
  check "…writing no file there" no_files "$SMALL/rs"
else
  skip "out of space on a small tmpfs" "needs mount -t tmpfs: neither root nor password-less sudo"
fi
# Out of inodes: statvfs sees free bytes, creating a file fails (ENOSPC at open).
FEW=$TMP/few-inodes
mkdir -p "$FEW"
if mount_tmpfs "$FEW" size=4M,nr_inodes=16; then
  on_exit "as_root umount '$FEW'"
  run bash -c 'set -o pipefail; "$1" layout --model "$2" | "$1" init --pinned 8MiB --pinned-buffer 256KiB --dir "$3"' _ "$SH" "$M2" "$FEW/ok"
  expect_rc 0 "out of inodes: a dp 1 state (4 files) fits"
  sums "$FEW/ok" >"$TMP/few.sums"
  zs layout --model "$M2" --dp 4 >"$TMP/m2l4.jsonl"
  run zs init --dir "$FEW/ok" --force <"$TMP/m2l4.jsonl"
  # Documented (zinf(7)): no space is 73, whether met creating, reserving or writing.
  expect_rc 73 "out of inodes: a file that cannot be created is refused (73)"
  check "…saying no space" contains "$err" "No space left on device"
  check "…every old file byte-identical, no temporaries" intact "$FEW/ok" "$TMP/few.sums"
else
  skip "out of inodes on a small tmpfs" "needs mount -t tmpfs: neither root nor password-less sudo"
fi

# --stats that cannot be written: 73, the data committed all the same.
run zs init --dir "$TMP/stats-fail" --stats "$TMP/no-such-dir/s.json" <"$TMP/l3.jsonl"
expect_rc 73 "init --stats into a missing folder exits 73"
check "…naming the stats file, after committing the data" has_all "$err" "$TMP/no-such-dir/s.json"
run zs verify -m "$TMP/stats-fail/manifest.jsonl"
expect_rc 0 "…and the committed state verifies"

# --- inspect -----------------------------------------------------------------
zs layout --model gpt2-124m >"$TMP/124m.jsonl"
run zs inspect --json -m "$TMP/124m.jsonl"
expect_rc 0 "inspect --json of gpt2-124m"
check "…124439808 parameters, 148 tensors, preset gpt2-124m" \
  jq -e '.schema == "zinf.shard-inspect/1" and .parameters == 124439808 and (.tensors | length) == 148 and .preset == "gpt2-124m"' <<<"$out"
sum=$(jq -s '[.[1:][].bytes] | add' "$TMP/124m.jsonl")
check "…tiers.nvme.bytes and total_bytes are the sum of the records' bytes ($sum)" \
  jq -e --argjson s "$sum" '.tiers.nvme.bytes == $s and .total_bytes == $s and .tiers.nvme.max_rank_bytes == $s' <<<"$out"
run zs inspect -m "$TMP/124m.jsonl"
expect_rc 0 "inspect (the table)"
check "…148 data rows, each of 7 columns" bash -c '[[ $(grep -vc "^#" <<<"$1") == 148 ]] && grep -v "^#" <<<"$1" | awk "NF != 7 { exit 1 }"' _ "$out"
run bash -c 'set -o pipefail; "$1" layout --model gpt2-124m --dp 4 --param cpu | "$1" inspect --json' _ "$SH"
expect_rc 0 "inspect --json of gpt2-124m, dp 4, parameters on cpu"
p=$(zs layout --model gpt2-124m --dp 4 --param cpu | jq -s '[.[1:][] | select(.state == "param") | .bytes] | add')
check "…the cpu tier holds the param records' bytes, nvme the rest" jq -e --argjson s "$sum" --argjson p "$p" '
  .tiers.cpu.bytes == $p and .tiers.nvme.bytes + $p == .total_bytes and .total_bytes >= $s
  and .tiers.cpu.max_rank_bytes * 4 >= $p and .tiers.cpu.max_rank_bytes * 4 < $p + 4 * 4 * 148' <<<"$out"
run zs inspect --json -m "$TMP/m2-dp3/manifest.jsonl"
check "inspect of an initialised manifest says so, with its dir" \
  jq -e --arg d "$(realpath "$TMP/m2-dp3")" '.initialised == true and .dir == $d and .dp == 3' <<<"$out"

# --- the paper's configurations ----------------------------------------------
run bash -c 'set -o pipefail; "$1" layout --model paper-1t --dp 16 | "$1" inspect --json' _ "$SH"
expect_rc 0 "layout --model paper-1t --dp 16 | inspect --json"
C=25600 L=128
check "…parameters V*C + T*C + L*(12C^2 + 13C) + 2C, 1540 tensors" \
  jq -e --argjson n $((50257 * C + 1024 * C + L * (12 * C * C + 13 * C) + 2 * C)) \
  '.parameters == $n and (.tensors | length) == 1540 and .dp == 16' <<<"$out"
check "…the paper's estimate 12*L*h^2 is within 1% of 1000e9" jq -e '(.paper_estimate - 1000e9 | fabs) <= 10e9' <<<"$out"
run bash -c 'set -o pipefail; "$1" layout --model paper-70b | "$1" inspect --json' _ "$SH"
expect_rc 0 "layout --model paper-70b | inspect --json"
check "…estimate ~100.66e9 (the table's 125 layers x 8192, not 70B)" \
  jq -e '.paper_estimate == 12 * 125 * 8192 * 8192 and (.paper_estimate - 100.66e9 | fabs) < 0.01e9' <<<"$out"

# --- init under mpirun: each process writes its own ranks ----------------------
if command -v mpirun >/dev/null; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  zs layout --model "$M2" --dp 3 >"$TMP/mp.jsonl"
  zs init --dir "$TMP/mp1" <"$TMP/mp.jsonl" >"$TMP/mp1.out"
  for np in 2 3 4; do
    run bash -c 'mpirun -np "$1" "$2" init --pinned 8MiB --pinned-buffer 256KiB --dir "$3" <"$4"' _ "$np" "$SH" "$TMP/mp$np" "$TMP/mp.jsonl"
    expect_rc 0 "mpirun -np $np zinf-shard init (dp 3)"
    check "…the manifest on stdout once, equal to one process's but for its dir" \
      cmp <(grep -v '"schema"' <<<"$out") <(grep -v '"schema"' "$TMP/mp1.out")
    check "…the same bytes in every data file" cmp <(sums "$TMP/mp$np" | grep -v manifest) <(sums "$TMP/mp1" | grep -v manifest)
    check "…verify passes" bash -c '"$1" verify --pinned 8MiB --pinned-buffer 256KiB -m "$2/manifest.jsonl" >/dev/null' _ "$SH" "$TMP/mp$np"
    check "…no temporaries left" no_temps "$TMP/mp$np"
  done
  before=$(sums "$TMP/mp2")
  run bash -c 'mpirun -np 2 "$1" init --dir "$2" <"$3"' _ "$SH" "$TMP/mp2" "$TMP/mp.jsonl"
  expect_rc 73 "mpirun init into a directory with a manifest, without --force: 73 from every process"
  check "…the message names the directory" contains "$err" "already holds a manifest"
  check "…the directory is untouched" test "$before" == "$(sums "$TMP/mp2")"
  # One process fails after the other has written: both remove what they wrote.
  mkdir -p "$TMP/mp-fail" && echo keep >"$TMP/mp-fail/rank1"  # a file where rank 1's folder must go
  run bash -c 'mpirun -np 2 "$1" init --pinned 8MiB --pinned-buffer 256KiB --dir "$2" <"$3"' _ "$SH" "$TMP/mp-fail" "$TMP/mp.jsonl"
  expect_rc 73 "mpirun init where rank 1 cannot make its folder: 73 from the job"
  check "…rank 1 names its folder, rank 0 names rank 1" bash -c '[[ $1 == *rank1* && $1 == *"rank 1 failed"* ]]' _ "$err"
  check "…nothing of rank 0's left: no folder, no temporaries, no manifest" \
    bash -c '[[ ! -e $1/rank0 && ! -e $1/manifest.jsonl && $(ls -A "$1") == rank1 && $(<"$1/rank1") == keep ]]' _ "$TMP/mp-fail"
  # -m, not stdin: Open MPI 4.1's mpirun can crash forwarding stdin to
  # processes that end at once (orte_iof_hnp_read_local_handler, SIGSEGV).
  run bash -c 'mpirun -np 2 "$1" init --ranks 0 --dir "$2" -m "$3"' _ "$SH" "$TMP/mp-ranks" "$TMP/mp.jsonl"
  expect_rc 64 "mpirun init --ranks 0: each process's share is fixed (64)"
  check "…nothing created" test ! -e "$TMP/mp-ranks"
  run bash -c 'mpirun -np 2 "$1" reshard --dp 2 --dir "$2" -m "$3"' _ "$SH" "$TMP/mp-rs" "$TMP/mp2/manifest.jsonl"
  expect_rc 64 "mpirun reshard is refused: it runs once (64)"
  check "…nothing created" test ! -e "$TMP/mp-rs"
else
  skip "zinf-shard init under mpirun" "no mpirun"
fi

finish
