#!/usr/bin/env bash
# End-to-end tests of zinf-commbench: the table and JSON Lines contracts, the
# sizes, the bandwidth formulas, --check over mpirun for every op and dtype,
# --raw and its threshold, usage errors, and a collective that times out.
source "$(dirname "$0")/lib.bash"
CB=$BIN/zinf-commbench
# The test binary with a rank that skips a collective (tests/unit/mpi_comm.cpp).
MPI_COMM=${ZINF_MPI_COMM_TEST:-$ROOT/build/tests/mpi_comm}
# Small and quick: every measurement below is a few iterations of one round.
FAST=(-n 3 -w 1 --rounds 1)

# mpirun refuses root unless told, and a 2-core machine has fewer cores than ranks.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# mpi NP CMD...: CMD under mpirun -np NP; a hang is a failure, not a stuck
# suite: past 60 s, or $limit s for a launch that measures many tables.
mpi() {
  local np=$1
  shift
  timeout -k 5 "${limit:-60}" mpirun -np "$np" "$@"
}

# The data rows of a table (every line without '#').
rows() { grep -v '^#' <<<"$1"; }
# Column C of the data rows, space-separated.
col() { rows "$1" | awk -v c="$2" '{ printf "%s%s", sep, $c; sep = " " }'; }
# Every stdout line is a '#' line or a data row of N columns: size count type
# redop time algbw busbw #wrong [raw(us) raw_busbw zinf/raw].
table_ok() {
  awk -v n="$2" '
    /^#/ { next }
    { rows++ }
    NF != n || $1 !~ /^[0-9]+$/ || $2 !~ /^[0-9]+$/ || $3 !~ /^(f32|bf16|f64)$/ ||
      $4 !~ /^(none|sum|avg|max)$/ || $5 !~ /^[0-9.]+$/ || $6 !~ /^[0-9.]+$/ || $7 !~ /^[0-9.]+$/ ||
      $8 !~ /^([0-9]+|n\/a)$/ { bad = 1; print "bad row: " $0 > "/dev/stderr" }
    END { exit bad || rows == 0 }' <<<"$1"
}
# A --check run: exit 0, WANT data rows, #wrong 0 on every one, footer says OK.
checked_ok() {
  local want=$1
  [[ $rc == 0 ]] && [[ $(rows "$out" | wc -l) == "$want" ]] &&
    awk '!/^#/ && $8 != "0" { bad = 1 } END { exit bad }' <<<"$out" &&
    contains "$out" "# out of bounds values: 0 OK"
}
# The duration of the last timed command, in seconds (EPOCHREALTIME).
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

# ---------------------------------------------------------------- one process
run "$CB" -b 1K -e 8K -f 2 "${FAST[@]}"
expect_rc 0 "one process (backend self) exits 0"
check "every stdout line is a '#' line or a data row of 8 columns" table_ok "$out" 8
check "-b 1K -e 8K -f 2 gives sizes 1024 2048 4096 8192" test "$(col "$out" 1)" = "1024 2048 4096 8192"
check "count is size / 4 for f32" test "$(col "$out" 2)" = "256 512 1024 2048"
check "busbw is 0 on one rank ((n-1)/n = 0)" test "$(col "$out" 7)" = "0.00 0.00 0.00 0.00"
check "algbw is positive" awk '!/^#/ && !($6 > 0) { bad = 1 } END { exit bad }' <<<"$out"
check "#wrong is n/a without --check" test "$(col "$out" 8)" = "n/a n/a n/a n/a"
check "the header names backend self and 1 rank" \
  bash -c '[[ $1 =~ "allgather over 1 rank"s?", f32" && $1 == *"# backend self, rank 0 of 1"* ]]' _ "$out"
check "the footer says the bounds were not checked" contains "$out" "# out of bounds values: n/a"

run "$CB" -b 1K -e 8K -i 3K -d bf16 "${FAST[@]}"
expect_rc 0 "-i (step in bytes) exits 0"
check "-b 1K -e 8K -i 3K gives sizes 1024 4096 7168" test "$(col "$out" 1)" = "1024 4096 7168"
check "count is size / 2 for bf16" test "$(col "$out" 2)" = "512 2048 3584"
run "$CB" -b 1K -e 8K -f 1.5 -d f64 "${FAST[@]}" --json
expect_rc 0 "-f 1.5 with f64 exits 0"
check "-f 1.5 rounds sizes up, whole f64 elements (count = size / 8)" \
  jq -e -s '[.[].bytes] == [1024, 1536, 2304, 3456, 5184, 7776] and all(.[]; .count * 8 == .bytes)' <<<"$out"
check "JSON on one rank: backend self, 1 rank, busbw_gbps 0, algbw_gbps > 0" \
  jq -e -s 'all(.[]; .backend == "self" and .ranks == 1 and .busbw_gbps == 0 and .algbw_gbps > 0)' <<<"$out"

run "$CB" -o reduce-scatter -r max -c -b 1K -e 4K "${FAST[@]}"
check "one process --check of reduce-scatter max: exit 0, #wrong 0" checked_ok 3

# --raw on one rank: the bare call is timed too; its busbw is 0 like zinf's,
# so zinf/raw comes from the times (raw_time_us / time_us), not 0/0.
run "$CB" -b 1M -e 1M --raw --json "${FAST[@]}"
expect_rc 0 "one rank --raw --json exits 0"
check "one rank --raw: raw_time_us > 0, raw_algbw_gbps = bytes / raw_time_us, raw_busbw_gbps 0" \
  jq -e '.raw_time_us > 0 and .raw_busbw_gbps == 0
    and ((.bytes / .raw_time_us / 1000) - .raw_algbw_gbps | fabs) <= 1e-9 * .raw_algbw_gbps' <<<"$out"
check "one rank --raw: ratio is raw_time_us / time_us (not 0 from 0/0 busbw)" \
  jq -e '.ratio > 0 and ((.raw_time_us / .time_us) - .ratio | fabs) <= 1e-9 * .ratio' <<<"$out"

# --- closed output pipe: no hang, 0 or 74 from the program, never a signal
start=$EPOCHREALTIME
timeout -k 5 30 "$CB" -b 4 -e 64M -f 2 -n 1 -w 0 --rounds 1 2>"$TMP/pipe.err" | head -n 1 >/dev/null
rc=${PIPESTATUS[0]} err=$(<"$TMP/pipe.err") took=$(elapsed "$start" "$EPOCHREALTIME")
check "| head -n 1: exit 0 or 74, not a signal or a hang (got $rc in ${took}s)" test "$rc" = 0 -o "$rc" = 74
check "…and a 74 says writing stdout failed" bash -c '[[ $1 == 0 || $2 == *"stdout: writing the output failed"* ]]' _ "$rc" "$err"

# --- help and version
run "$CB" --help
expect_rc 0 "--help exits 0"
check "--help lists --raw and --check" bash -c '[[ $1 == *--raw* && $1 == *--check* && $1 == *--min-ratio* ]]' _ "$out"
run "$CB" --version
expect_rc 0 "--version exits 0"
version=$(sed -n 's/^VERSION := *//p' "$ROOT/Makefile")
check "--version prints the version ($version)" test "$out" = "$version"

# --- usage errors: 64, a message on stderr, nothing on stdout
usage_error() { # NAME CMD...
  local name=$1
  shift
  run "$@"
  expect_rc 64 "usage error: $name"
  check "…$name: message on stderr, nothing on stdout" test -z "$out" -a -n "$err"
}
usage_error "--op bogus" "$CB" --op bogus
check "…naming the op" contains "$err" "bogus"
usage_error "-b larger than -e" "$CB" -b 8K -e 1K
check "…naming --minbytes and --maxbytes" bash -c '[[ $1 == *--minbytes* && $1 == *--maxbytes* ]]' _ "$err"
usage_error "-f 1" "$CB" -f 1
check "…naming --stepfactor" contains "$err" "--stepfactor"
usage_error "-b 1Q (bad size text)" "$CB" -b 1Q
check "…quoting the bad size" contains "$err" "1Q"
usage_error "-e lots (bad size text)" "$CB" -e lots
usage_error "-f 2 with -i 1K" "$CB" -f 2 -i 1K
usage_error "-b 0" "$CB" -b 0 -e 1K
usage_error "-i 0" "$CB" -i 0
usage_error "--dtype i8" "$CB" --dtype i8
usage_error "--reduce prod" "$CB" --reduce prod
usage_error "--backend bogus" "$CB" --backend bogus
usage_error "-n 0" "$CB" -n 0
usage_error "ZINF_COMM_TIMEOUT=bogus" env ZINF_COMM_TIMEOUT=bogus "$CB" -b 1K -e 1K "${FAST[@]}"
check "…naming ZINF_COMM_TIMEOUT" contains "$err" "ZINF_COMM_TIMEOUT"
usage_error "--comm-timeout bogus" "$CB" --comm-timeout bogus -b 1K -e 1K "${FAST[@]}"
check "…naming --comm-timeout" contains "$err" "--comm-timeout"
usage_error "--min-ratio without --raw" "$CB" --min-ratio 0.5 -b 1M -e 1M "${FAST[@]}"
check "…saying to add --raw" contains "$err" "--raw"
usage_error "no whole f32 element in -b 2 -e 3" "$CB" -b 2 -e 3
check "a usage error points at --help" contains "$err" "--help"

run "$CB" --comm-timeout 30s -b 1K -e 1K "${FAST[@]}"
expect_rc 0 "--comm-timeout 30s is accepted"
ZINF_COMM_TIMEOUT=1m run "$CB" -b 1K -e 1K "${FAST[@]}"
expect_rc 0 "ZINF_COMM_TIMEOUT=1m is accepted"
# comm.hpp: the environment is "read when the communicator starts, so a flag
# can override a bad environment".
ZINF_COMM_TIMEOUT=bogus run "$CB" --comm-timeout 5s -b 1K -e 1K "${FAST[@]}"
expect_rc 0 "--comm-timeout 5s overrides a malformed ZINF_COMM_TIMEOUT"

# --- --backend nccl without a GPU: the user's mistake, said plainly
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  skip "--backend nccl without a GPU" "this machine has a GPU"
  skip "…names the GPU or NCCL" "this machine has a GPU"
else
  run "$CB" --backend nccl -b 1K -e 1K "${FAST[@]}"
  expect_rc 64 "--backend nccl without a GPU exits 64 (a usage error)"
  check "…with a message naming the GPU or NCCL, and nothing on stdout" \
    bash -c '[[ -z $1 && $2 =~ (GPU|NCCL|nccl) ]]' _ "$out" "$err"
fi

# ---------------------------------------------------------------- under mpirun
# Without mpirun, every check from here on is skipped, not passed.
if ! command -v mpirun >/dev/null 2>&1; then
  mpi() { return 127; }
  pass() { skip "$1" "mpirun is not installed"; }
  fail() { skip "$1" "mpirun is not installed"; }
  check() { skip "$1" "mpirun is not installed"; }
fi

# --- --check for every op, f32 and bf16, every reduction; 1K..256K is 9 sizes.
# One launch per rank count measures them all, a table each (an mpirun -np 4
# costs about a CPU-second to start: 14 launches per count cost 20 CPU-s);
# each table is judged on its own, as its own launch was.
# table OUT NP OP DTYPE [RED]: OUT's table of that op, dtype and reduction,
# from its header to the next table's.
table() {
  awk -v want=": $3 over $2 ranks, $4${5:+, $5}" '
    /^# zinf-commbench / { on = substr($0, length($0) - length(want) + 1) == want }
    on' <<<"$1"
}
for np in 2 4; do
  limit=$((14 * 60)) run mpi "$np" "$CB" --op allgather,reduce-scatter,allreduce -d f32,bf16 -r sum,avg,max -c -b 1K -e 256K "${FAST[@]}"
  all=$out
  check "np $np: -o, -d and -r lists: 14 tables from one launch, in the order op, dtype, reduction; allgather once per dtype" \
    test "$(grep '^# zinf-commbench ' <<<"$all" | sed 's/.*: //' | tr '\n' ';')" = "$(for op in allgather reduce-scatter allreduce; do
      for dt in f32 bf16; do if [[ $op == allgather ]]; then echo "allgather over $np ranks, $dt"; else
        for red in sum avg max; do echo "$op over $np ranks, $dt, $red"; done; fi; done; done | tr '\n' ';')"
  for op in allgather reduce-scatter allreduce; do
    for dt in f32 bf16; do
      reds=(sum avg max)
      [[ $op == allgather ]] && reds=(sum)
      for red in "${reds[@]}"; do
        name="np $np $op $dt${red:+ $red}: --check exits 0, 9 rows, #wrong 0 on every row"
        [[ $op == allgather ]] && name="np $np $op $dt: --check exits 0, 9 rows, #wrong 0 on every row" red=
        out=$(table "$all" "$np" "$op" "$dt" "$red")
        if checked_ok 9; then pass "$name"; else fail "$name" "exit $rc; stdout: ${out:0:800}; stderr: ${err:0:400}"; fi
      done
    done
  done
done

for np in 2 4; do
  run mpi "$np" "$CB" --op allreduce -b 1K -e 8K "${FAST[@]}"
  expect_rc 0 "np $np table exits 0"
  check "np $np: every stdout line is a '#' line or a data row of 8 columns" table_ok "$out" 8
  check "np $np: the header names the op and $np ranks" contains "$out" "# zinf-commbench $version: allreduce over $np ranks, f32, sum"
  check "np $np: the header names backend mpi, rank 0 of $np" contains "$out" "# backend mpi, rank 0 of $np"
  check "np $np: rank 0 alone prints: one header, one footer, sizes 1024..8192 once each" \
    bash -c '[[ $(grep -c "^# zinf-commbench" <<<"$1") == 1 && $(grep -c "^# avg bus bandwidth" <<<"$1") == 1 ]]' _ "$out"
  check "np $np: sizes 1024 2048 4096 8192, each once" test "$(col "$out" 1)" = "1024 2048 4096 8192"
done
# The printed busbw is the printed algbw times 2(n-1)/n = 1.5, within the rounding of 2 decimals.
check "np 4 table: busbw = algbw x 1.5 within the printed digits" \
  awk '!/^#/ { d = $7 - $6 * 1.5; if (d < 0) d = -d; if (d > 0.0126) bad = 1 } END { exit bad }' <<<"$out"

# --- sizes: whole elements on every rank
run mpi 4 "$CB" -b 100 -e 100 "${FAST[@]}" --json
expect_rc 0 "np 4 -b 100 -e 100 exits 0"
check "np 4 f32: 100 bytes round down to 96 (24 elements, 6 per rank)" \
  jq -e -s 'length == 1 and .[0].bytes == 96 and .[0].count == 24' <<<"$out"
run mpi 4 "$CB" -b 1000 -e 1000 -d f64 --op reduce-scatter -c "${FAST[@]}" --json
expect_rc 0 "np 4 f64 -b 1000 exits 0"
check "np 4 f64: 1000 bytes round down to 992 (124 elements), checked right" \
  jq -e -s 'length == 1 and .[0].bytes == 992 and .[0].count == 124 and .[0].wrong == 0' <<<"$out"
# (Timed: the baseline of the deadline of the rank that skips a
# collective, below: a whole 3-rank job that measures next to nothing.)
t0=$EPOCHREALTIME
run mpi 3 "$CB" -b 1K -e 1K -c "${FAST[@]}" --json
ms_since "$t0"
np3_ms=$REPLY
expect_rc 0 "np 3 -b 1K exits 0"
check "np 3 f32: 1024 bytes round down to 1020 (255 elements), checked right" \
  jq -e -s 'length == 1 and .[0].bytes == 1020 and .[0].count == 255 and .[0].ranks == 3 and .[0].wrong == 0' <<<"$out"
run mpi 4 "$CB" -b 1 -e 64 "${FAST[@]}" --json
expect_rc 0 "np 4 -b 1 -e 64 exits 0"
check "np 4: sizes with no whole element per rank are dropped (16 32 64)" \
  jq -e -s '[.[].bytes] == [16, 32, 64]' <<<"$out"
run mpi 4 "$CB" -b 2 -e 12 "${FAST[@]}"
expect_rc 64 "np 4 -b 2 -e 12 (no whole f32 element per rank) is a usage error"
check "…said on stderr, nothing on stdout" \
  bash -c '[[ -z $1 && $2 == *"holds one f32 element per rank"* ]]' _ "$out" "$err"

# --- busbw / algbw per op, from JSON's full precision (one launch per count)
for np in 2 4; do
  limit=$((3 * 60)) run mpi "$np" "$CB" --op allgather,reduce-scatter,allreduce -b 1K -e 64K "${FAST[@]}" --json
  for op in allgather reduce-scatter allreduce; do
    f=$(awk -v n="$np" -v op="$op" 'BEGIN { f = (n - 1) / n; if (op == "allreduce") f *= 2; printf "%.17g", f }')
    check "np $np $op: busbw_gbps / algbw_gbps = $f, algbw_gbps = bytes / time" \
      jq -e -s --argjson f "$f" --argjson n "$np" --arg op "$op" 'map(select(.op == $op)) | length == 7 and all(.[];
        .ranks == $n and .algbw_gbps > 0 and ((.busbw_gbps / .algbw_gbps) - $f | fabs) <= 1e-9
        and ((.bytes / .time_us / 1000) - .algbw_gbps | fabs) <= 1e-9 * .algbw_gbps)' <<<"$out"
  done
done

# --- JSON Lines: the record and its optional keys
json_keys='["algbw_gbps","backend","busbw_gbps","bytes","count","dtype","op","ranks","schema","time_us"]'
run mpi 4 "$CB" --op allreduce -d bf16 -r avg -b 1K -e 16K "${FAST[@]}" --json
expect_rc 0 "np 4 --json exits 0"
check "--json: no '#' line on stdout" bash -c '! grep -q "^#" <<<"$1"' _ "$out"
check "--json: every line parses on its own" \
  bash -c 'while IFS= read -r l; do jq -e . <<<"$l" >/dev/null || exit 1; done <<<"$1"' _ "$out"
check "--json: 5 zinf.commbench/1 records with every required key and right values" \
  jq -e -s --argjson k "$json_keys" 'length == 5 and all(.[]; . as $r | .schema == "zinf.commbench/1"
    and ($k | all(. as $key | $r | has($key))) and .op == "allreduce" and .backend == "mpi" and .ranks == 4
    and .dtype == "bf16" and .reduce == "avg" and .count * 2 == .bytes and .time_us > 0)' <<<"$out"
check "--json: sizes 1024..16384 once each (rank 0 alone writes)" \
  jq -e -s '[.[].bytes] == [1024, 2048, 4096, 8192, 16384]' <<<"$out"
check "--json without --check has no wrong; without --raw no raw_* and no ratio" \
  jq -e -s 'all(.[]; (has("wrong") | not) and ([keys[] | select(startswith("raw_"))] == []) and (has("ratio") | not))' <<<"$out"
run mpi 2 "$CB" --op reduce-scatter -b 1K -e 4K -c "${FAST[@]}" --json
expect_rc 0 "np 2 --json --check exits 0"
check "--json --check: wrong is 0 on every record, still no raw keys" \
  jq -e -s 'length == 3 and all(.[]; .wrong == 0 and (has("ratio") | not) and (has("raw_time_us") | not))' <<<"$out"

# --- --raw: the bare library call beside zinf's
run mpi 2 "$CB" -b 512K -e 1M --raw "${FAST[@]}"
expect_rc 0 "np 2 --raw exits 0"
check "--raw: every stdout line is a '#' line or a data row of 11 columns" table_ok "$out" 11
check "--raw: the header has raw(us), raw_busbw and zinf/raw" \
  bash -c '[[ $1 == *"raw(us)"* && $1 == *raw_busbw* && $1 == *zinf/raw* ]]' _ "$out"
check "--raw: the footer gives the lowest zinf/raw from 1MiB" \
  bash -c '[[ $1 =~ "# lowest zinf/raw busbw from 1MiB: "[0-9.e+-]+" at "[0-9.]+[KMG]i?B ]]' _ "$out"
run mpi 2 "$CB" --op allreduce -b 512K -e 1M --raw -c "${FAST[@]}" --json
expect_rc 0 "np 2 --raw --check --json exits 0"
check "--raw --json: raw_time_us, raw_algbw_gbps, raw_busbw_gbps, ratio and wrong 0 on every record" \
  jq -e -s 'length == 2 and all(.[]; .wrong == 0 and .raw_time_us > 0 and .raw_algbw_gbps > 0
    and ((.raw_busbw_gbps / .raw_algbw_gbps) - 1 | fabs) <= 1e-9
    and ((.raw_time_us / .time_us) - .ratio | fabs) <= 1e-9 * .ratio)' <<<"$out"
run mpi 2 "$CB" -b 1M -e 1M --raw --min-ratio 1000 "${FAST[@]}"
expect_rc 75 "np 2 --raw --min-ratio 1000 exits 75"
check "…saying so on stderr, naming --min-ratio" \
  bash -c '[[ $1 == *"is below --min-ratio"* ]]' _ "$err"
check "…after printing the table" contains "$out" "# lowest zinf/raw busbw from 1MiB"

run mpi 2 "$CB" -b 256K -e 512K --raw "${FAST[@]}"
expect_rc 0 "--raw with no row of 1MiB or more exits 0"
check "…and prints no 'lowest zinf/raw' footer" bash -c '! grep -q "lowest zinf/raw" <<<"$1"' _ "$out"
run mpi 2 "$CB" -b 256K -e 512K --raw --min-ratio 1000 "${FAST[@]}"
expect_rc 64 "--min-ratio with no row of 1MiB or more is a usage error"
check "…said on stderr, nothing on stdout" bash -c '[[ -z $1 && $2 == *--min-ratio* ]]' _ "$out" "$err"
run mpi 3 "$CB" -b 1M -e 1M --raw --min-ratio 1000 "${FAST[@]}"
expect_rc 75 "np 3: 1M rounds to 1048572, which --min-ratio still judges (exit 75)"
check "…the row is 1048572 bytes, named in the footer" \
  bash -c '[[ $(grep -v "^#" <<<"$1" | awk "{print \$1}") == 1048572 && $1 == *"lowest zinf/raw busbw from 1MiB"* ]]' _ "$out"

run mpi 2 "$CB" -r avg -b 1K -e 1K "${FAST[@]}"
expect_rc 0 "allgather with -r avg runs (exit 0)"
check "…warning on stderr that --reduce has no meaning for allgather" contains "$err" "has no meaning for allgather"

# --- backends that do not fit the launch
run mpi 2 "$CB" --backend self -b 1K -e 1K "${FAST[@]}"
expect_rc 64 "--backend self under mpirun -np 2 exits 64"
check "…naming the launcher and the process count, nothing on stdout" \
  bash -c '[[ -z $1 && $2 == *"backend self"* && $2 == *"mpirun started 2 processes"* ]]' _ "$out" "$err"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  skip "np 2 --backend nccl without a GPU" "this machine has a GPU"
else
  run mpi 2 "$CB" --backend nccl -b 1K -e 1K "${FAST[@]}"
  if [[ $rc == 64 && -z $out && $err =~ (GPU|NCCL|nccl) ]]; then
    pass "np 2 --backend nccl without a GPU exits 64, naming the GPU or NCCL"
  else
    fail "np 2 --backend nccl without a GPU exits 64, naming the GPU or NCCL" "exit $rc; stderr: ${err:0:400}"
  fi
fi

# --- rank 0's own stdout closed under mpirun. (A plain `mpirun ... | head`
# closes mpirun's stdout, not the program's: mpirun's exit then says nothing
# about zinf.) Rank 0 fails writing (74); the job must end then, not hang
# until the other rank's collective times out. The job's time tells which:
# under 50 s, against the other rank's --comm-timeout of 60 s. (An idle
# machine starts and ends the job in 1-2 s, a loaded one took 4.7 and 6.3
# s; at 5 s, then 20 s, the limit failed there, and a slow host name adds
# seconds to every MPI start-up. Only a broken run waits the 60 s.)
mkdir -p "$TMP/pipe"
start=$EPOCHREALTIME
limit=90 mpi 2 bash -c \
  'd=$1; shift; "$@" | head -n 1 >/dev/null; echo "${PIPESTATUS[0]}" >"$d/rank$OMPI_COMM_WORLD_RANK"' \
  _ "$TMP/pipe" "$CB" -b 8 -e 64M -f 2 -n 1 -w 0 --rounds 1 --comm-timeout 60s >/dev/null 2>"$TMP/pipe.err"
took=$(elapsed "$start" "$EPOCHREALTIME")
rc0=$(cat "$TMP/pipe/rank0" 2>/dev/null) err=$(<"$TMP/pipe.err")
check "np 2, rank 0's stdout closed: rank 0 says writing stdout failed (or it finished first)" \
  bash -c '[[ $1 == 0 || $2 == *"stdout: writing the output failed"* ]]' _ "$rc0" "$err"
check "…and exits by itself, 0 or 74, well before the other rank's 60 s --comm-timeout (rank 0: ${rc0:-killed}; ${took}s)" \
  bash -c '[[ ($1 == 0 || $1 == 74) ]] && awk -v t="$2" "BEGIN { exit !(t < 50) }"' _ "$rc0" "$took"

# --- a rank that skips a collective: every waiting rank times out, no hang.
# skip_a_collective: uneven blocks (MPI_Allgatherv); skip_a_plain_collective:
# one buffer of equal blocks (MPI_Allgather). Both end in the watchdog (74).
# The deadline (ZINF_COMM_TIMEOUT) starts before MPI_Init_thread, which it
# bounds too: at a fixed 2 s, a loaded machine's start-up of 3 ranks ended
# the job in MPI_Init_thread, and the case tested the start-up, not the
# collective. So it is twice this run's whole 3-rank job (np3_ms, above;
# about four times its MPI_Init_thread), 2 s at least; a start-up
# that outlasts even that is tried again with twice the deadline, and a
# waiting rank must name the allgather.
T0=$(((2 * np3_ms + 999) / 1000))
((T0 < 2)) && T0=2
# Past the deadline, the job's own start and end (np3_ms), with room.
slack=$((18 + 2 * ((np3_ms + 999) / 1000)))
for case in skip_a_collective skip_a_plain_collective; do
  for np in 2 3; do
    T=$T0
    names=("np $np $case: exits non-zero" "np $np $case: within its deadline plus ${slack}s"
      "np $np $case: stderr says the allgather 'did not complete within' the deadline and names the waiting rank")
    why=
    if ! command -v mpirun >/dev/null; then
      why="mpirun is not installed"
    elif [[ ! -x $MPI_COMM ]]; then
      why="$MPI_COMM is not built"
    elif ! timeout 20 "$MPI_COMM" --list_content 2>&1 | grep -q "$case"; then
      why="$MPI_COMM has no test case $case"
    fi
    if [[ -n $why ]]; then
      for n in "${names[@]}"; do skip "$n" "$why"; done
      continue
    fi
    # Boost.Test reports the escaped Timeout in its log: sent to stderr here.
    # Open MPI 4.1's mpirun now and then hangs or crashes tearing down a job
    # whose ranks left without MPI_Finalize, with every rank already gone
    # (the crash is mpirun's own SIGSEGV in PMIx_server_finalize, exit 139).
    # On this 2-core VM at np 3 that is about one run in five (20 runs: 3
    # hangs, 1 crash), so a run that mpirun fails to end within its deadline
    # plus the slack (the case takes 2-3 s idle), or ends by crashing, is tried
    # again, up to five times in all, after killing what the failed one left
    # behind.
    for attempt in 1 2 3 4 5; do
      start=$EPOCHREALTIME
      ZINF_COMM_TIMEOUT=${T}s run timeout -k 5 $((T + slack)) mpirun -np "$np" "$MPI_COMM" --run_test="$case" \
        --log_sink=stderr --color_output=no
      took=$(elapsed "$start" "$EPOCHREALTIME")
      if ((rc == 74)) && [[ $err == *"MPI_Init_thread (every rank starting) did not complete"* ]]; then
        echo "# $case np $np: MPI's start-up outlasted the ${T} s deadline; again with $((2 * T)) s"
        T=$((2 * T))
        continue
      fi
      ((rc == 124 || rc == 137 || rc == 139)) || break
      echo "# $case np $np: mpirun did not end or crashed ending (exit $rc after ${took}s); again"
      pkill -KILL -f -- "$MPI_COMM --run_test=$case" 2>/dev/null
      sleep 1
    done
    check "${names[0]}: 74 (got $rc)" test "$rc" == 74
    check "${names[1]} (${T}s deadline; took ${took}s)" awk -v t="$took" -v b="$((T + slack))" 'BEGIN { exit !(t < b) }'
    # Rank 1 skips; every other rank waits and times out. With 3 ranks, mpirun
    # may stop rank 0 once rank 2 has failed, so either may be the one named.
    waiting=0
    ((np == 3)) && waiting='0|2'
    if grep -Eq "rank ($waiting): allgather .*did not complete within $T s" <<<"$err"; then
      pass "${names[2]}"
    else
      fail "${names[2]}" "${T} s; stderr: ${err:0:800}"
    fi
  done
done

finish
