#!/usr/bin/env bash
# End-to-end tests of zinf-pinstress (the pinned pool under threads, its checks
# and its errors) and zinf-streambench (a file larger than the pool, through it).
source "$(dirname "$0")/lib.bash"
PS=$BIN/zinf-pinstress SB=$BIN/zinf-streambench

run "$PS" --pinned 64MiB --pinned-buffer 4MiB -t 4 -s 1s --max-lease 3 --max-hold 200us --seed 42 --json
expect_rc 0 "a clean stress run exits 0"
check "one zinf.pinstress/1 record with the seed and no problems" \
  jq -e '.schema == "zinf.pinstress/1" and .seed == 42 and .threads == 4 and .problems == [] and .rounds > 0
    and .bytes_checked > 0' <<<"$out"
check "latency percentiles are ordered and positive" \
  jq -e '.lease_p50_us > 0 and .lease_p50_us <= .lease_p99_us and .lease_p99_us <= .lease_max_us' <<<"$out"
check "the pool is 16 x 4MiB and every lease came back" \
  jq -e '.pool.buffers == 16 and .pool.buffer_bytes == 4194304 and .pool.in_use == 0
    and .pool.high_water <= 16 and .pool.leases >= .rounds' <<<"$out"
check "resident memory did not grow by more than 16MiB" jq -e '.rss_growth_bytes < 16777216' <<<"$out"
check "copy bandwidth, pinned and pageable, is measured" \
  jq -e '[.copies[] | select(.copy == "memcpy" and .pinned_gibps > 0 and .pageable_gibps > 0)] | length == 1' <<<"$out"
if [[ $(id -u) == 0 ]]; then
  check "as root the pool is page-locked" jq -e '.pool.locked == true and .pool.allocator == "mmap"' <<<"$out"
fi
check "the seed is said on stderr for replay" contains "$err" "--seed 42"

run "$PS" --pinned 16MiB --pinned-buffer 1MiB -t 2 -s 300ms --no-copy
expect_rc 0 "the table form"
check "data rows carry no #, every other line does" \
  bash -c '[[ $(grep -vc "^#" <<<"$1") -eq 1 && $(grep -c "^# resident: start" <<<"$1") -eq 1 ]]' _ "$out"

run "$PS" --pinned 16MiB --pinned-buffer 1MiB -t 2 -s 500ms --no-copy --inject corrupt
expect_rc 65 "a buffer changed while held exits 65"
check "…naming the buffer, thread, round and offset" \
  bash -c '[[ $1 =~ corrupt:\ buffer\ [0-9]+\ leased\ by\ thread\ 0\ in\ round\ 1\ changed\ while\ held:\ first\ bad\ byte\ at\ offset ]]' _ "$err"
run "$PS" --pinned 16MiB --pinned-buffer 1MiB -t 2 -s 500ms --no-copy --inject leak --json
expect_rc 65 "a lease outliving its thread exits 65"
check "…and the record names it" \
  jq -e '[.problems[] | select(.kind == "leak" and (.message | test("pinstress thread 0")))] | length == 1' <<<"$out"

run "$PS" --pinned 8MiB --pinned-buffer 4MiB -t 4 --max-lease 2 -s 2s --max-hold 400ms --timeout 50ms --no-copy
expect_rc 70 "a lease that waits past --timeout fails"
# (Under load the holders may return theirs just as the wait runs out, with
# other waiters queued ahead: then it says so, and that none held any.)
check "…saying who waited and who holds the buffers" \
  bash -c '[[ $1 == *"pinned pool exhausted: '"'"'pinstress thread "*"waited 0.05s for "*"held by '"'"'pinstress thread "* ||
    $1 == *"pinned pool exhausted: '"'"'pinstress thread "*"waited 0.05s for "*"queued ahead of it; held by none at that moment"* ]]' _ "$err"

run "$PS" --pinned-buffer 5000
expect_rc 64 "a buffer size that does not suit O_DIRECT is refused"
check "…naming the option" contains "$err" "--pinned-buffer"
run "$PS" --pinned 8MiB --pinned-buffer 4MiB --max-lease 3
expect_rc 64 "--max-lease beyond the pool is refused"
run "$PS" --pinned 1MiB --pinned-buffer 4MiB
expect_rc 64 "a pool smaller than one buffer is refused"
run "$PS" -s forever
expect_rc 64 "a bad duration is refused"

# RLIMIT_MEMLOCK below the pool: runs unlocked and says how to raise the limit.
# Root ignores the limit through CAP_IPC_LOCK, so root drops that capability too.
nocap=()
[[ $(id -u) == 0 ]] && nocap=(setpriv --inh-caps=-ipc_lock --bounding-set=-ipc_lock)
if command -v prlimit >/dev/null && { [[ $(id -u) != 0 ]] || command -v setpriv >/dev/null; }; then
  run prlimit --memlock=65536 "${nocap[@]}" \
    "$PS" --pinned 16MiB --pinned-buffer 1MiB -t 2 -s 300ms --no-copy --json
  expect_rc 0 "with mlock refused the run goes on"
  check "…unlocked, in the record" jq -e '.pool.locked == false' <<<"$out"
  check "…with a warning naming the limit and the fix" \
    bash -c '[[ $1 == *"RLIMIT_MEMLOCK is 64KiB"*"ulimit -l unlimited"* ]]' _ "$err"
else
  skip "mlock refused" "needs prlimit (and setpriv as root)"
fi

# zinf-streambench: 40MiB + a ragged tail through an 8MiB pool.
F=$TMP/state.bin
head -c $((40 * 1024 * 1024 + 4097)) /dev/urandom >"$F"
run "$SB" --file "$F" --pinned 8MiB --pinned-buffer 1MiB --rounds 3 --json
expect_rc 0 "a file five times the pool streams through it"
check "all of it, three rounds, one hash" \
  jq -e '.schema == "zinf.streambench/1" and .bytes == 41947137 and (.rounds_gibps | length) == 3
    and (.xxh3 | length) == 16 and .pool.in_use == 0 and .pool.high_water <= 8' <<<"$out"
check "the pool moved every byte of every round" jq -e '.pool.bytes_moved == 3 * .bytes' <<<"$out"
h1=$(jq -r .xxh3 <<<"$out")
run "$SB" --file "$F" --pinned 4MiB --pinned-buffer 256KiB --buffers 2 -e threads --rounds 1 --json
check "another pool shape and the threads engine see the same bytes" \
  bash -c '[[ $(jq -r .xxh3 <<<"$1") == "$2" ]]' _ "$out" "$h1"
ZINF_FAULTS=read:7:corrupt run "$SB" --file "$F" --pinned 8MiB --pinned-buffer 1MiB --rounds 2
expect_rc 65 "a round that reads different bytes exits 65"
ZINF_FAULTS=read:3:EIO run "$SB" --file "$F" --pinned 8MiB --pinned-buffer 1MiB --rounds 1
expect_rc 74 "an I/O error exits 74"
check "…naming the file" contains "$err" "$F"
run "$SB" --file "$TMP/missing.bin"
expect_rc 66 "a missing file exits 66"

finish
