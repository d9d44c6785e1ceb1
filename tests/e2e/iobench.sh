#!/usr/bin/env bash
# End-to-end tests of zinf-iobench, and of the engine configuration that
# zinf-nvmebench --best writes being read back by another program.
source "$(dirname "$0")/lib.bash"
NB=$BIN/zinf-nvmebench IO=$BIN/zinf-iobench
F=$TMP/state.bin
"$NB" --file "$F" --size 16MiB -b 1M -d 8 -Q 1 --rw write --keep -q >/dev/null
"$NB" --dir "$TMP" --size 8MiB -b 1M,2M -d 4 -Q 1,2 --best -q >"$TMP/engine.json"

run "$IO" --file "$F" --config "$TMP/engine.json" --rounds 3 --json
expect_rc 0 "reads with the configuration --best wrote"
check "the record is zinf.iobench/1 with the whole file and 3 rounds" \
  jq -e '.schema == "zinf.iobench/1" and .bytes == 16777216 and (.rounds_gibps | length) == 3
    and .median_gibps > 0 and .op == "read"' <<<"$out"
check "it ran the configuration it was given" \
  bash -c 'jq -e --slurpfile c "$2" ".block_size == \$c[0].block_size and .queue_depth == \$c[0].queue_depth and .queues == \$c[0].queues" <<<"$1"' _ "$out" "$TMP/engine.json"
check "the median is the middle round" \
  jq -e '(.rounds_gibps | sort | .[1]) == .median_gibps' <<<"$out"

run "$IO" --file "$F" -b 256K -d 4 -Q 2 --rounds 2
expect_rc 0 "engine flags work without --config"
check "the table marks non-data lines with #" bash -c '[[ $(grep -vc "^#" <<<"$1") -eq 2 ]]' _ "$out"

jq -c '. + {thread_count: 8}' "$TMP/engine.json" >"$TMP/bad.json"
run "$IO" --file "$F" --config "$TMP/bad.json"
expect_rc 65 "an unknown configuration key is refused, not ignored"
check "…naming the key and the file" bash -c '[[ $1 == *bad.json*thread_count* ]]' _ "$err"
echo '{"engine":"uring","queue_depth":4294967297}' >"$TMP/big.json"
run "$IO" --file "$F" --config "$TMP/big.json"
expect_rc 65 "an out-of-range queue_depth is refused"
run "$IO" --file "$F" --config "$TMP/none.json"
expect_rc 66 "a missing configuration file exits 66"
run "$IO" --file "$F" --config "$TMP/engine.json" -b 1M
expect_rc 64 "--config and engine flags exclude each other"
run "$IO" --file "$TMP"
expect_rc 64 "a directory is not a file to read"
run "$IO" --file "$TMP/missing.bin"
expect_rc 66 "a missing file exits 66"
run "$IO" --file "$F" --size 32MiB
expect_rc 64 "--size beyond the file is refused"
ZINF_FAULTS=read:3:EIO run "$IO" --file "$F" -b 1M -d 4 -Q 1
expect_rc 74 "an I/O error exits 74"
check "…naming the file, offset and errno" bash -c '[[ $1 == *state.bin*offset*"errno 5"* ]]' _ "$err"
run "$IO" --file "$F" -e threads --json
expect_rc 0 "the threads engine reads"
check "…and says so" jq -e '.engine == "threads" and .fixed_buffers == false' <<<"$out"

finish
