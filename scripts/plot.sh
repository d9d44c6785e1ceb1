#!/usr/bin/env bash
# Plots a zinf program's JSON Lines as a PNG on stdout (gnuplot, pngcairo).
#   scripts/plot.sh [--size WxH] KIND IN.jsonl > OUT.png
# KIND (the records it reads, other lines are skipped):
#   train      zinf-train --json (zinf.train/1): loss and validation loss
#              against step, tokens/s on the right axis
#   nvmebench  zinf-nvmebench --json (zinf.nvmebench/1): GiB/s over block size
#              x queue depth, one panel per op; a cell is the best over the
#              engines and queue counts measured there
#   commbench  zinf-commbench --json (zinf.commbench/1): busbw against message
#              size per op, zinf's communicator beside the bare call (--raw)
#   optbench   zinf-optbench --json (zinf.optbench/1): where a step's time goes
#              (AdamW update, waiting for reads, commit, the rest), per state
#              tier, beside the update alone in memory
# --size: the image in pixels (default 960x600). IN.jsonl may be - (stdin).
# Exit status: 0, 64 usage, 65 no usable record in the input, 66 no input,
# 69 gnuplot or jq missing, 70 gnuplot failed. Needs gnuplot (Debian: gnuplot-nox, in scripts/deps.sh) and jq.
set -euo pipefail

usage() { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "plot.sh: $2" >&2; exit "$1"; }

size=960x600
while [[ $# -gt 0 ]]; do
  case $1 in
    --size) [[ $# -ge 2 ]] || die 64 "--size needs WxH"; size=$2; shift 2 ;;
    --size=*) size=${1#--size=}; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    -?*) die 64 "unknown option $1 (see --help)" ;;
    *) break ;;
  esac
done
[[ $# -eq 2 ]] || die 64 "expected KIND IN.jsonl (see --help)"
kind=$1 in=$2
[[ $size =~ ^([0-9]+)x([0-9]+)$ ]] || die 64 "--size $size: expected WxH, e.g. 960x600"
width=${BASH_REMATCH[1]} height=${BASH_REMATCH[2]}
((width >= 100 && width <= 10000 && height >= 100 && height <= 10000)) ||
  die 64 "--size $size: each side must be 100 to 10000 pixels"
case $kind in train|nvmebench|commbench|optbench) ;; *) die 64 "unknown KIND '$kind' (train, nvmebench, commbench, optbench)" ;; esac
for tool in gnuplot jq; do
  command -v "$tool" >/dev/null || die 69 "$tool is not installed (scripts/deps.sh installs it)"
done
[[ -t 1 ]] && die 64 "stdout is a terminal: redirect it to a .png file"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/zinf-plot-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
if [[ $in == - ]]; then
  cat >"$tmp/in.jsonl"
else
  [[ -r $in ]] || die 66 "$in: cannot read it"
  cp "$in" "$tmp/in.jsonl"
fi
name=$([[ $in == - ]] && echo stdin || echo "$in")

# The records of one schema as compact JSON, one a line; lines that are not
# JSON objects (a table's '#' lines, an engine config) are skipped.
records() {
  jq -cR --arg s "$1" 'fromjson? | objects | select(.schema == $s)' "$tmp/in.jsonl"
}
need() {  # FILE WHAT: FILE must have data lines
  [[ -s $1 ]] || die 65 "$name: no $2"
}

{
  echo "set terminal pngcairo size $width,$height enhanced font 'sans,10'"
  echo "set output '$tmp/out.png'"
  echo "set datafile separator '\t'"
  echo "set grid"
} >"$tmp/plot.gp"

case $kind in
train)
  records zinf.train/1 >"$tmp/r.jsonl"
  jq -r '[.step, .loss, .tokens_per_s] | @tsv' "$tmp/r.jsonl" >"$tmp/loss.tsv"
  jq -r 'select(.val_loss != null) | [.step, .val_loss] | @tsv' "$tmp/r.jsonl" >"$tmp/val.tsv"
  need "$tmp/loss.tsv" "zinf.train/1 records (zinf-train --json)"
  val=""
  [[ -s $tmp/val.tsv ]] && val=", '$tmp/val.tsv' using 1:2 axes x1y1 with linespoints lw 2 pt 7 title 'validation loss'"
  cat >>"$tmp/plot.gp" <<EOF
set title "zinf-train: loss and throughput"
set xlabel 'step'
set ylabel 'loss (nats per token)'
set y2label 'tokens/s'
set ytics nomirror
set y2tics
set key top right
plot '$tmp/loss.tsv' using 1:2 axes x1y1 with lines lw 2 title 'training loss' $val, \
     '$tmp/loss.tsv' using 1:3 axes x1y2 with lines lw 1 dt 2 lc rgb '#808080' title 'tokens/s'
EOF
  ;;
nvmebench)
  records zinf.nvmebench/1 >"$tmp/r.jsonl"
  [[ -s $tmp/r.jsonl ]] || die 65 "$name: no zinf.nvmebench/1 records (zinf-nvmebench --json)"
  # Grid indices for the categorical axes; a cell is the best GiB/s over the
  # engines and queue counts measured at that block size and depth.
  jq -rs '
    (map(.block_size) | unique) as $bs | (map(.queue_depth) | unique) as $qd
    | group_by([.op, .block_size, .queue_depth])[]
    | (max_by(.gibps)) as $b
    | [$b.op, ($bs | index($b.block_size)), ($qd | index($b.queue_depth)), $b.gibps] | @tsv' \
    "$tmp/r.jsonl" >"$tmp/grid.tsv"
  size_label() { # bytes -> 128KiB, 4MiB
    jq -r 'def l: if . >= 1073741824 and (. % 1073741824 == 0) then "\(. / 1073741824)GiB"
                  elif . >= 1048576 and (. % 1048576 == 0) then "\(. / 1048576)MiB"
                  elif . >= 1024 and (. % 1024 == 0) then "\(. / 1024)KiB" else "\(.)B" end;
           [.[] | l] | to_entries | map("\"\(.value)\" \(.key)") | join(", ")'
  }
  xt=$(jq -s 'map(.block_size) | unique' "$tmp/r.jsonl" | size_label)
  yt=$(jq -rs 'map(.queue_depth) | unique | to_entries | map("\"\(.value)\" \(.key)") | join(", ")' "$tmp/r.jsonl")
  nx=$(jq -s 'map(.block_size) | unique | length' "$tmp/r.jsonl")
  ny=$(jq -s 'map(.queue_depth) | unique | length' "$tmp/r.jsonl")
  mapfile -t ops < <(jq -rs 'map(.op) | unique | .[]' "$tmp/r.jsonl")
  cmax=$(jq -rs 'map(.gibps) | max' "$tmp/r.jsonl")
  file=$(jq -rs '.[0].file // ""' "$tmp/r.jsonl")
  cat >>"$tmp/plot.gp" <<EOF
set multiplot layout 1,${#ops[@]} title "zinf-nvmebench: GiB/s on $file (best over engines and queues)"
set xrange [-0.5:$nx - 0.5]
set yrange [-0.5:$ny - 0.5]
set xtics ($xt)
set ytics ($yt)
set xlabel 'block size'
set ylabel 'queue depth'
set cbrange [0:$cmax]
set cblabel 'GiB/s'
set palette defined (0 '#fff7ec', 0.5 '#fc8d59', 1 '#7f0000')
unset grid
set tics out
EOF
  # One colour scale for every panel, drawn beside the last.
  last=${ops[-1]}
  for op in "${ops[@]}"; do
    awk -F'\t' -v op="$op" '$1 == op { print $2 "\t" $3 "\t" $4 }' "$tmp/grid.tsv" >"$tmp/op-$op.tsv"
    [[ $op == "$last" ]] && echo "set colorbox" >>"$tmp/plot.gp" || echo "unset colorbox" >>"$tmp/plot.gp"
    cat >>"$tmp/plot.gp" <<EOF
set title '$op'
plot '$tmp/op-$op.tsv' using 1:2:(0.5):(0.5):3 with boxxyerror fs solid 1.0 noborder lc palette notitle, \
     '$tmp/op-$op.tsv' using 1:2:(sprintf('%.2f', \$3)) with labels notitle
EOF
  done
  echo "unset multiplot" >>"$tmp/plot.gp"
  ;;
commbench)
  records zinf.commbench/1 >"$tmp/r.jsonl"
  [[ -s $tmp/r.jsonl ]] || die 65 "$name: no zinf.commbench/1 records (zinf-commbench --json)"
  mapfile -t ops < <(jq -rs 'map(.op) | unique | .[]' "$tmp/r.jsonl")
  meta=$(jq -rs '.[0] | "\(.backend), \(.ranks) ranks, \(.dtype)"' "$tmp/r.jsonl")
  plots=() colour=0
  for op in "${ops[@]}"; do
    colour=$((colour + 1))  # an op's two lines in one colour
    jq -r --arg op "$op" 'select(.op == $op) | [.bytes, .busbw_gbps, (.raw_busbw_gbps // "NaN")] | @tsv' \
      "$tmp/r.jsonl" | sort -n >"$tmp/op-$op.tsv"
    plots+=("'$tmp/op-$op.tsv' using 1:2 with linespoints lw 2 pt 7 lc $colour title '$op, zinf'")
    if jq -se --arg op "$op" 'any(.[]; .op == $op and .raw_busbw_gbps != null)' "$tmp/r.jsonl" >/dev/null; then
      plots+=("'$tmp/op-$op.tsv' using 1:3 with linespoints lw 1 dt 2 pt 6 lc $colour title '$op, bare call'")
    fi
  done
  joined=$(printf '%s, ' "${plots[@]}")
  cat >>"$tmp/plot.gp" <<EOF
set title "zinf-commbench: bus bandwidth ($meta)"
set logscale x 2
set format x '%.0b%BB'
set xlabel "message size (all ranks' data, as nccl-tests counts it)"
set ylabel 'busbw (GB/s)'
set yrange [0:*]
set key top left
plot ${joined%, }
EOF
  ;;
optbench)
  records zinf.optbench/1 >"$tmp/r.jsonl"
  # One bar per measurement: the update alone in memory, then each step.
  jq -r 'if .kind == "update" then ["AdamW alone (memory)", .seconds, 0, 0, 0]
         else ["step, state on \(.state)", .update_seconds, .wait_seconds, .commit_seconds,
               ([.seconds - .update_seconds - .wait_seconds - .commit_seconds, 0] | max)] end
         | @tsv' "$tmp/r.jsonl" >"$tmp/bars.tsv"
  need "$tmp/bars.tsv" "zinf.optbench/1 records (zinf-optbench --json)"
  meta=$(jq -rs '.[0] | "\(.params) parameters, \(.isa), \(.threads) threads"' "$tmp/r.jsonl")
  cat >>"$tmp/plot.gp" <<EOF
set title "zinf-optbench: where a step's time goes ($meta)"
set style data histograms
set style histogram rowstacked
set style fill solid 0.85 border -1
set boxwidth 0.6
set ylabel 'seconds per step'
set yrange [0:*]
set key top left
set xtics nomirror
plot '$tmp/bars.tsv' using 2:xtic(1) title 'AdamW update', \
     '' using 3 title 'waiting for reads or write space', \
     '' using 4 title 'commit (sync, manifest)', \
     '' using 5 title 'the rest'
EOF
  ;;
esac

gnuplot "$tmp/plot.gp" 2>"$tmp/gnuplot.err" || die 70 "gnuplot failed: $(head -c 2000 "$tmp/gnuplot.err")"
[[ -s $tmp/out.png ]] || die 70 "gnuplot wrote no image: $(head -c 2000 "$tmp/gnuplot.err")"
cat "$tmp/out.png"
