#!/usr/bin/env bash
# Does zinf-shard keep up with the drive, in flat memory? In one run, on one
# file system, each round measures:
#   - zinf-nvmebench: a sweep on a fresh 4GiB file (its best write and best
#     read), and one write of a second fresh file with the best write's
#     configuration (what writing new blocks costs, which is what init does);
#   - zinf-shard init of the --model state into a fresh directory, and verify
#     of it, each with the best configuration of its direction;
# and once, the peak resident memory of init for --model and for --large.
#
#   scripts/bench-shard.sh --dir DIR [--rounds 3] [--model gpt2-350m]
#                          [--large gpt:layers=24,hidden=2048,heads=16] [--pinned 256MiB]
#
# Prints one row per round and the medians, with the ratios the issue sets
# (init/best write >= 0.8, verify/best read >= 0.8, RSS large/small < 1.1);
# lines that are not data start with '#'.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=. rounds=3 model=gpt2-350m large=gpt:layers=24,hidden=2048,heads=16 pinned=256MiB
while (($#)); do
  case $1 in
    --dir) dir=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --large) large=$2; shift 2 ;;
    --pinned) pinned=$2; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench-shard: unknown option $1 (see --help)" >&2; exit 64 ;;
  esac
done
nb=$root/bin/zinf-nvmebench zs=$root/bin/zinf-shard
[[ -x $nb && -x $zs ]] || { echo "bench-shard: build first: make -C $root" >&2; exit 66; }
command -v jq >/dev/null || { echo "bench-shard: needs jq (apt-get install jq)" >&2; exit 69; }

work=$(mktemp -d "$dir/bench-shard-XXXXXX")
trap 'rm -rf "$work"' EXIT
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
cfg() { jq -c '{schema: "zinf.engine/1", engine, block_size, queue_depth, queues}'; }

"$zs" layout --model "$model" >"$work/small.m"
"$zs" layout --model "$large" >"$work/large.m"
small_bytes=$("$zs" inspect --json -m "$work/small.m" | jq .total_bytes)
large_bytes=$("$zs" inspect --json -m "$work/large.m" | jq .total_bytes)
echo "# zinf-shard $("$zs" --version | awk '{print $NF}') on $(df --output=source "$dir" | tail -1) ($dir)"
echo "# model $model: $((small_bytes >> 20)) MiB of state; large $large: $((large_bytes >> 20)) MiB; pool $pinned"
printf '# %5s %11s %11s %11s %11s %11s %9s %9s\n' round best_write fresh_write init best_read verify init/bw verify/br
bw=() fw=() iw=() br=() vr=()
for ((r = 1; r <= rounds; r++)); do
  rm -f "$work"/*.bin
  "$nb" --file "$work/sweep.bin" --size 4GiB -b 1MiB,8MiB -d 8,32 -Q 1 --json -q >"$work/sweep.jsonl"
  jq -s -c 'map(select(.op == "write")) | max_by(.gibps)' "$work/sweep.jsonl" | cfg >"$work/write.json"
  jq -s -c 'map(select(.op == "read")) | max_by(.gibps)' "$work/sweep.jsonl" | cfg >"$work/read.json"
  best_w=$(jq -s 'map(select(.op == "write")) | max_by(.gibps) | .gibps' "$work/sweep.jsonl")
  best_r=$(jq -s 'map(select(.op == "read")) | max_by(.gibps) | .gibps' "$work/sweep.jsonl")
  rm -f "$work/sweep.bin"
  read -r -a wargs < <(jq -r '"-e \(.engine) -b \(.block_size) -d \(.queue_depth) -Q \(.queues)"' "$work/write.json")
  fresh_w=$("$nb" --file "$work/fresh.bin" --size 4GiB "${wargs[@]}" --rw write --json -q | jq -s '.[0].gibps')
  rm -f "$work/fresh.bin"
  rm -rf "$work/d"
  "$zs" init --dir "$work/d" -m "$work/small.m" --config "$work/write.json" --pinned "$pinned" --stats "$work/init.json" -q >"$work/d.m"
  "$zs" verify -m "$work/d.m" --config "$work/read.json" --pinned "$pinned" --stats "$work/verify.json" -q >/dev/null
  init_g=$(jq .gibps "$work/init.json") ver_g=$(jq .gibps "$work/verify.json")
  bw+=("$best_w") fw+=("$fresh_w") iw+=("$init_g") br+=("$best_r") vr+=("$ver_g")
  printf '  %5d %11.3f %11.3f %11.3f %11.3f %11.3f %9.2f %9.2f\n' "$r" "$best_w" "$fresh_w" "$init_g" "$best_r" "$ver_g" \
    "$(jq -n "$init_g / $best_w")" "$(jq -n "$ver_g / $best_r")"
  rm -rf "$work/d"
done
m() { printf '%s\n' "$@" | median; }
mbw=$(m "${bw[@]}") mfw=$(m "${fw[@]}") miw=$(m "${iw[@]}") mbr=$(m "${br[@]}") mvr=$(m "${vr[@]}")
printf '# %5s %11.3f %11.3f %11.3f %11.3f %11.3f %9.2f %9.2f\n' median "$mbw" "$mfw" "$miw" "$mbr" "$mvr" \
  "$(jq -n "$miw / $mbw")" "$(jq -n "$mvr / $mbr")"
echo "# GiB/s; init/fresh_write $(jq -n "$miw / $mfw" | cut -c1-5) (init writes new blocks, as fresh_write does)"

# Peak resident memory: the same pool for a small and a large state.
"$zs" init --dir "$work/s" -m "$work/small.m" --pinned "$pinned" --stats "$work/rs.json" -q >/dev/null
rm -rf "$work/s"
"$zs" init --dir "$work/l" -m "$work/large.m" --pinned "$pinned" --stats "$work/rl.json" -q >/dev/null
rm -rf "$work/l"
rs=$(jq .peak_resident_bytes "$work/rs.json") rl=$(jq .peak_resident_bytes "$work/rl.json")
echo "# peak resident: $((rs >> 20)) MiB for $((small_bytes >> 20)) MiB of state, $((rl >> 20)) MiB for $((large_bytes >> 20)) MiB; ratio $(jq -n "$rl / $rs" | cut -c1-6)"
