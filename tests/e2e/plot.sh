#!/usr/bin/env bash
# End-to-end tests of scripts/plot.sh on small recorded outputs of the
# programs (tests/data/plot-*.jsonl): each kind gives a PNG (signature,
# IHDR, IEND) of the size asked for on stdout and nothing else; refusals
# with their exit codes. Skipped where gnuplot is not installed.
source "$(dirname "$0")/lib.bash"
PLOT=$ROOT/scripts/plot.sh
DATA=$ROOT/tests/data

if ! command -v gnuplot >/dev/null; then
  skip "plots" "gnuplot is not installed (scripts/deps.sh installs gnuplot-nox)"
  finish
  exit
fi

# png_size FILE: "WIDTH HEIGHT" from the IHDR chunk of a well-formed PNG
# (signature, IHDR first, IEND last), else nothing.
png_size() {
  local f=$1
  [[ $(od -An -tx1 -N8 "$f" | tr -d ' \n') == 89504e470d0a1a0a ]] || return 1
  [[ $(od -An -c -j12 -N4 "$f" | tr -d ' \n') == IHDR ]] || return 1
  [[ $(tail -c 12 "$f" | od -An -tx1 | tr -d ' \n') == 0000000049454e44ae426082 ]] || return 1
  local b
  read -r -a b <<<"$(od -An -tu1 -j16 -N8 "$f")"
  echo "$(((b[0] << 24) | (b[1] << 16) | (b[2] << 8) | b[3])) $(((b[4] << 24) | (b[5] << 16) | (b[6] << 8) | b[7]))"
}

for kind in train nvmebench commbench optbench; do
  in=$DATA/plot-$kind.jsonl
  "$PLOT" "$kind" "$in" >"$TMP/$kind.png" 2>"$TMP/$kind.err"
  rc=$?
  expect_rc 0 "$kind: exits 0"
  size=$(png_size "$TMP/$kind.png")
  if [[ $size == "960 600" ]]; then pass "$kind: a PNG of 960 x 600 (the default)"; else
    fail "$kind: a PNG of 960 x 600 (the default)" "got '${size:-not a PNG}'; stderr: $(head -c 400 "$TMP/$kind.err")"; fi
  check "$kind: nothing on stderr" test ! -s "$TMP/$kind.err"
  "$PLOT" --size 480x360 "$kind" - <"$in" >"$TMP/$kind-small.png" 2>/dev/null
  size=$(png_size "$TMP/$kind-small.png")
  if [[ $size == "480 360" ]]; then pass "$kind: --size 480x360 from stdin"; else
    fail "$kind: --size 480x360 from stdin" "got '${size:-not a PNG}'"; fi
done
# The plot draws the data: another input gives another image.
head -n 3 "$DATA/plot-train.jsonl" >"$TMP/short.jsonl"
"$PLOT" train "$TMP/short.jsonl" >"$TMP/short.png" 2>/dev/null
check "train: fewer steps give another image" bash -c "! cmp -s '$TMP/short.png' '$TMP/train.png'"

# --- refusals
run "$PLOT" pie "$DATA/plot-train.jsonl"
expect_rc 64 "an unknown kind is a usage error"
check "…naming it" contains "$err" "pie"
run "$PLOT" --size 10x10 train "$DATA/plot-train.jsonl"
expect_rc 64 "--size 10x10 is refused"
run "$PLOT" train
expect_rc 64 "a missing input argument is a usage error"
run "$PLOT" train "$TMP/absent.jsonl"
expect_rc 66 "an absent input exits 66"
run "$PLOT" train "$DATA/plot-optbench.jsonl"
expect_rc 65 "an input without the kind's records exits 65"
check "…saying which records it wanted" contains "$err" "zinf.train/1"
check "…and writes nothing to stdout" test -z "$out"
printf 'not json\n# a comment\n' >"$TMP/junk.jsonl"
run "$PLOT" nvmebench "$TMP/junk.jsonl"
expect_rc 65 "lines that are not JSON give no records (65)"
run "$PLOT" --help
expect_rc 0 "--help exits 0"
check "--help names every kind" has_all "$out" train nvmebench commbench optbench --size
finish
