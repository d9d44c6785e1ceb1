#!/usr/bin/env bash
# End-to-end tests of zinf-nvmebench: output contracts, exit codes, files.
source "$(dirname "$0")/lib.bash"
NB=$BIN/zinf-nvmebench
D=$TMP/d
mkdir -p "$D"

# --- JSON Lines: one record per measurement, every key, consistent figures
run "$NB" --dir "$D" --size 16MiB -b 1M,4M -d 2,8 -Q 1,2 --rw both --json
expect_rc 0 "json sweep exits 0"
check "json sweep prints 16 records" test "$(printf '%s\n' "$out" | wc -l)" -eq 16
check "every stdout line is a zinf.nvmebench/1 record with the required keys" \
  jq -e -s 'length == 16 and all(.[]; .schema == "zinf.nvmebench/1" and (.op == "read" or .op == "write")
    and (.engine | type == "string") and (.block_size == 1048576 or .block_size == 4194304)
    and (.queue_depth == 2 or .queue_depth == 8) and (.queues == 1 or .queues == 2)
    and .bytes == 16777216 and .seconds > 0 and .gibps > 0 and .iops > 0)' <<<"$out"
check "gibps is bytes / seconds / 2^30" \
  jq -e -s 'all(.[]; ((.bytes / .seconds / 1073741824) - .gibps | fabs) <= 1e-9 * .gibps + 1e-12)' <<<"$out"
check "8 reads and 8 writes" jq -e -s '([.[] | select(.op == "read")] | length) == 8 and ([.[] | select(.op == "write")] | length) == 8' <<<"$out"
check "progress is on stderr" contains "$err" "[16/16]"
check "the created test file is removed" empty_dir "$D"

# --- the human table
run "$NB" --dir "$D" --size 8MiB -b 1M -d 4 -Q 1,2
expect_rc 0 "table run exits 0"
data=$(grep -v '^#' <<<"$out")
check "table has one data row per measurement" test "$(wc -l <<<"$data")" -eq 4
check "every non-data line starts with #" bash -c '! grep -qvE "^(#|[[:space:]]*(read|write) )" <<<"$1"' _ "$out"
check "one best read and one best write are marked" \
  test "$(grep -c '<- best read' <<<"$out")" -eq 1 -a "$(grep -c '<- best write' <<<"$out")" -eq 1
check "data rows have the 9 columns" bash -c 'awk "{ if (NF < 9) exit 1 }" <<<"$1"' _ "$data"

# --- --best: exactly the engine's keys, values from the sweep
run "$NB" --dir "$D" --size 8MiB -b 1M,2M -d 4 -Q 1 --best
expect_rc 0 "--best exits 0"
check "--best prints one line" test "$(wc -l <<<"$out")" -eq 1
check "--best prints exactly the engine configuration keys and its measured bandwidths" \
  jq -e '(keys == ["block_size","engine","queue_depth","queues","read_gibps","schema","write_gibps"])
    and .schema == "zinf.engine/1" and (.block_size == 1048576 or .block_size == 2097152) and .queue_depth == 4
    and .queues == 1 and .read_gibps > 0 and .write_gibps > 0' <<<"$out"

# --- --verify and injected faults
run "$NB" --dir "$D" --size 8MiB -b 1M -d 4 -Q 1 --verify --json
expect_rc 0 "--verify passes on a healthy file"
check "--verify is recorded" jq -e -s 'all(.[]; .verify == true)' <<<"$out"
ZINF_FAULTS=read:3:corrupt run "$NB" --dir "$D" --size 8MiB -b 1M -d 4 -Q 1 --verify
expect_rc 65 "--verify exits 65 on silently corrupted data"
check "the mismatch names the file and offset" bash -c '[[ $1 == *zinf-nvmebench.*verify*offset* ]]' _ "$err"
check "the file is removed after a verify failure" empty_dir "$D"
ZINF_FAULTS=read:2:EIO run "$NB" --dir "$D" --size 8MiB -b 1M -d 4 -Q 1 --rw read
expect_rc 74 "an I/O error exits 74"
check "the I/O error names path, offset and errno" bash -c '[[ $1 == *zinf-nvmebench.*offset*"errno 5"* ]]' _ "$err"
check "the file is removed after an I/O error" empty_dir "$D"

# --- thresholds
run "$NB" --dir "$D" --size 8MiB -b 1M -d 4 -Q 1 --min-read-gibps 100000
expect_rc 75 "an unmet --min-read-gibps exits 75"
check "the table is still printed when a threshold fails" contains "$out" "<- best read"
check "the threshold message names the option" contains "$err" "--min-read-gibps"
run "$NB" --dir "$D" --size 8MiB -b 1M -d 4 -Q 1 --min-read-gibps 0.0001 --min-write-gibps 0.0001
expect_rc 0 "met thresholds exit 0"
run "$NB" --dir "$D" --size 8MiB --rw read --min-write-gibps 1
expect_rc 64 "--min-write-gibps without writes is a usage error"

# --- files it did not create
F=$TMP/mine.bin
head -c 8388608 /dev/urandom >"$F"
sum=$(md5sum <"$F")
run "$NB" --file "$F" --size 8MiB -b 1M -d 4 -Q 1 --rw both
expect_rc 73 "refuses to overwrite a file it did not create"
check "the refused file is unchanged" test "$(md5sum <"$F")" = "$sum"
run "$NB" --file "$F" --size 8MiB -b 1M -d 4 -Q 1 --rw read --verify
expect_rc 73 "--verify refuses a file it may not write (it writes a pattern first)"
check "…and the file is unchanged" test "$(md5sum <"$F")" = "$sum"
run "$NB" --file "$F" --size 8MiB -b 1M -d 4 -Q 1 --rw read
expect_rc 0 "reads an existing file without writing it"
check "the read file is unchanged and kept" test -f "$F" -a "$(md5sum <"$F")" = "$sum"
run "$NB" --file "$F" --size 16MiB -b 1M -d 4 -Q 1 --rw read
expect_rc 64 "a --size larger than an existing read-only file is refused"
run "$NB" --file "$F" --size 8MiB -b 1M -d 4 -Q 1 --rw both --force
expect_rc 0 "--force allows writing an existing file"
check "a forced file is not removed" test -f "$F"
run "$NB" --file "$TMP/new.bin" --size 8MiB -b 1M -d 4 -Q 1 --keep
expect_rc 0 "--file creates a missing file"
check "--keep keeps the created file" test -f "$TMP/new.bin"

# --- bad command lines
for bad in "-b 1X" "--engine libaio" "--size 1000" "-b 1000" "--bogus" "--rw sideways" "--json --best" \
  "--dir $D --file $F" "--loops 0" "--direct --buffered" "-d 0"; do
  # shellcheck disable=SC2086
  run "$NB" --size 8MiB $bad
  expect_rc 64 "usage error: $bad"
done
check "a usage error points at --help" contains "$err" "--help"
run "$NB" --dir "$D" --size 8MiB --rw write --verify
expect_rc 64 "--verify without reads is a usage error"
ZINF_FAULTS=read:x:EIO run "$NB" --dir "$D" --size 8MiB
expect_rc 64 "a malformed ZINF_FAULTS is a usage error"
check "…that leaves no file behind" empty_dir "$D"
run "$NB" --dir "$D" --size 8MiB -b 1M,1M -d 4,4 -Q 1 --json
check "repeated list items are measured once" test "$(wc -l <<<"$out")" -eq 2
run "$NB" --dir /nonexistent/zinf --size 8MiB
expect_rc 66 "a missing --dir exits 66"
run "$NB" --dir "$D" --size 100TiB
expect_rc 73 "not enough free space exits 73"
check "the free-space message says so" contains "$err" "free space"
check "nothing is left after refusing" empty_dir "$D"

# --- interrupting removes the file
"$NB" --dir "$D" --size 64MiB -b 1M -d 4 -Q 1 --rw read --loops 100000 >/dev/null 2>"$TMP/int.err" &
pid=$!
# Until its file is there (30 s: a loaded machine may take seconds to start
# it; 5 s was close), then half a second into the reads.
for _ in {1..300}; do empty_dir "$D" || break; nap 0.1; done
sleep 0.5
kill -INT "$pid"
wait "$pid"
rc=$? err=$(<"$TMP/int.err")
expect_rc 130 "SIGINT exits 130"
check "SIGINT removes the test file" empty_dir "$D"

# --- a closed output pipe (| head) is an I/O error, and the file still goes
"$NB" --dir "$D" --size 16MiB -b 1M,2M,4M -d 4 -Q 1 --json 2>"$TMP/pipe.err" | head -c 10 >/dev/null
rc=${PIPESTATUS[0]} err=$(<"$TMP/pipe.err")
expect_rc 74 "a closed output pipe exits 74"
check "…and removes the test file" empty_dir "$D"
run "$NB" --file "$TMP/no/such/dir/x.dat" --size 8MiB
expect_rc 73 "--file in a missing directory cannot be created (73)"
mkdir -p "$TMP/$(printf 'bad\xff')"
run "$NB" --dir "$TMP/$(printf 'bad\xff')" --size 8MiB -b 1M -d 4 -Q 1 --json
expect_rc 0 "a directory name that is not UTF-8 still gives JSON"
check "…with every record valid" jq -e -s 'length == 2' <<<"$out"

# --- engines and I/O modes
run "$NB" --dir "$D" --size 8MiB -b 1M -d 4 -Q 2 --engine threads --json
expect_rc 0 "the threads engine runs"
check "records name the threads engine" jq -e -s 'all(.[]; .engine == "threads")' <<<"$out"
run "$NB" --dir "$D" --size 8MiB -b 1M -d 4 -Q 1 --buffered --json
expect_rc 0 "--buffered runs"
check "--buffered records direct=false" jq -e -s 'all(.[]; .direct == false)' <<<"$out"

RAM=$TMP/ram
mkdir -p "$RAM"
if as_root mount -t ramfs -o mode=0777 ramfs "$RAM" 2>/dev/null; then
  on_exit "as_root umount '$RAM'"
  run "$NB" --dir "$RAM" --size 8MiB -b 1M -d 4 -Q 1 --json
  expect_rc 0 "a file system that refuses O_DIRECT still benchmarks (ramfs)"
  check "…warning that it fell back to buffered I/O" contains "$err" "refuses O_DIRECT"
  check "…and recording direct=false" jq -e -s 'all(.[]; .direct == false)' <<<"$out"
  run "$NB" --dir "$RAM" --size 8MiB -b 1M -d 4 -Q 1 --direct
  expect_rc 74 "--direct on a file system that refuses it exits 74"
  check "ramfs is left empty" empty_dir "$RAM"
else
  skip "O_DIRECT fallback on ramfs" "cannot mount ramfs here (neither root nor password-less sudo)"
fi

# --- io_uring refused (EPERM, as under a container seccomp profile): the
# sysctl makes io_uring_setup fail for everyone, so it is off for two short runs.
ctl=/proc/sys/kernel/io_uring_disabled
set_ctl() { echo "$1" | as_root tee "$ctl" >/dev/null 2>&1; }
if [[ -e $ctl ]] && old=$(<"$ctl") && set_ctl 2; then
  trap 'set_ctl "$old"; exit 130' INT TERM
  on_exit "set_ctl '$old'"
  run "$NB" --dir "$D" --size 8MiB -b 1M -d 4 -Q 2 --json
  auto_out=$out auto_err=$err auto_rc=$rc
  run "$NB" --dir "$D" --size 8MiB -b 1M -d 4 -Q 2 --engine uring
  set_ctl "$old"
  trap - INT TERM
  expect_rc 74 "--engine uring where io_uring is refused exits 74"
  check "…and suggests the threads engine" contains "$err" "--engine threads"
  out=$auto_out err=$auto_err rc=$auto_rc
  expect_rc 0 "--engine auto where io_uring is refused still runs"
  check "…on the threads engine" jq -e -s 'length == 2 and all(.[]; .engine == "threads")' <<<"$out"
  check "…and says why" contains "$err" "io_uring unavailable"
  check "nothing is left after the fallback runs" empty_dir "$D"
else
  skip "fallback when io_uring is refused" "cannot set $ctl here (neither root nor password-less sudo)"
fi

# --- help and version
run "$NB" --help
expect_rc 0 "--help exits 0"
check "--help shows the options and defaults" bash -c '[[ $1 == *--block-size*1MiB* ]]' _ "$out"
run "$NB" --version
check "--version prints the version" test "$rc" = 0 -a -n "$out"

finish
