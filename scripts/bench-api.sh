#!/usr/bin/env bash
# Does the library API keep up with the drive? Compares, on one file in one
# run, zinf-nvmebench's best sequential read (a small sweep) with zinf-iobench:
# one io::Engine::read of the whole file into locked, registered memory using
# that round's best configuration. Rounds alternate which program goes first.
# With --stream (scripts/bench-stream.sh), zinf-streambench instead: the file
# crosses a --pinned pool with mem::Stream, and its peak resident memory is shown.
#
#   scripts/bench-api.sh --dir DIR [--size 1GiB] [--rounds 5] [--min-ratio 0.95]
#                        [-b 1MiB,4MiB] [-d 16,32] [-Q 1,2]
#                        [--stream [--pinned 256MiB] [--pinned-buffer 16MiB]]
#
# Prints the medians and the ratio api/nvmebench (# on non-data lines);
# exits 75 when --min-ratio is given and not met.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=. size=1GiB rounds=5 bs=1MiB,4MiB qd=16,32 queues=1,2 min_ratio=
stream=0 pinned=256MiB pinned_buffer=16MiB
while (($#)); do
  case $1 in
    --dir) dir=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    -b|--block-size) bs=$2; shift 2 ;;
    -d|--queue-depth) qd=$2; shift 2 ;;
    -Q|--queues) queues=$2; shift 2 ;;
    --min-ratio) min_ratio=$2; shift 2 ;;
    --stream) stream=1; shift ;;
    --pinned) pinned=$2; shift 2 ;;
    --pinned-buffer) pinned_buffer=$2; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench-api: unknown option $1 (see --help)" >&2; exit 64 ;;
  esac
done
nb=$root/bin/zinf-nvmebench io=$root/bin/zinf-iobench
((stream)) && io=$root/bin/zinf-streambench
api=${io##*/zinf-}
[[ -x $nb && -x $io ]] || { echo "bench-api: build first: make -C $root" >&2; exit 66; }
command -v jq >/dev/null || { echo "bench-api: needs jq (apt-get install jq)" >&2; exit 69; }

work=$(mktemp -d "$dir/bench-api-XXXXXX")
trap 'rm -rf "$work"' EXIT
file=$work/state.bin
echo "# writing $size to $file" >&2
"$nb" --file "$file" --size "$size" -b 1MiB -d 32 -Q 1 --rw write --keep -q >/dev/null

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
nb_runs=() io_runs=() rss_peaks=()
sweep() { "$nb" --file "$file" --size "$size" --rw read -b "$bs" -d "$qd" -Q "$queues" --json -q; }
# The API program's first read in a fresh process pays for ring and thread
# start-up, as each nvmebench measurement does; its median of 3 reads is the
# round's figure. It writes its whole record to $work/api.json.
api_read() {
  local extra=()
  ((stream)) && extra=(--pinned "$pinned" --pinned-buffer "$pinned_buffer")
  "$io" --file "$file" --config "$work/engine.json" --rounds 3 --json -q "${extra[@]}" >"$work/api.json"
}
best_config() {
  best=$(jq -s -c 'max_by(.gibps)' <<<"$(sweep)")
  jq -c '{schema: "zinf.engine/1", engine, block_size, queue_depth, queues}' <<<"$best" >"$work/engine.json"
}
for ((r = 1; r <= rounds; r++)); do
  if ((r % 2)); then
    best_config
    api_read
  else
    api_read  # first, with the previous round's best configuration
    best_config
  fi
  got=$(jq '.median_gibps' "$work/api.json")
  ((stream)) && rss_peaks+=("$(jq '.rss_peak_bytes' "$work/api.json")")
  nbest=$(jq '.gibps' <<<"$best")
  nb_runs+=("$nbest") io_runs+=("$got")
  echo "# round $r: nvmebench best read $(printf %.3f "$nbest") GiB/s ($(jq -r '"\(.engine) bs=\(.block_size) qd=\(.queue_depth) queues=\(.queues)"' <<<"$best")), $api $(printf %.3f "$got") GiB/s" >&2
done
m_nb=$(printf '%s\n' "${nb_runs[@]}" | median)
m_io=$(printf '%s\n' "${io_runs[@]}" | median)
ratio=$(awk -v a="$m_io" -v b="$m_nb" 'BEGIN { printf "%.3f", a / b }')
echo "# bench-api: $size file, $rounds rounds; nvmebench sweep -b $bs -d $qd -Q $queues"
((stream)) && echo "# $api: --pinned $pinned --pinned-buffer $pinned_buffer; peak resident bytes per round: ${rss_peaks[*]}"
echo "# nvmebench rounds: ${nb_runs[*]}"
echo "# $api rounds: ${io_runs[*]}"
echo "# nvmebench_best_read_gibps ${api}_read_gibps ratio"
printf '%.3f %.3f %s\n' "$m_nb" "$m_io" "$ratio"
if [[ -n $min_ratio ]] && awk -v r="$ratio" -v m="$min_ratio" 'BEGIN { exit !(r < m) }'; then
  echo "bench-api: ratio $ratio is below --min-ratio $min_ratio" >&2
  exit 75
fi
