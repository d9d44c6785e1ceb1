#!/usr/bin/env bash
# bench-vs-fio.sh: compare zinf-nvmebench with fio on the same file, in the same run.
#
# Usage: scripts/bench-vs-fio.sh [OPTIONS]
#
# Creates one test file in DIR (fio writes it once, not measured), then runs
# ROUNDS rounds; each round runs fio and zinf-nvmebench, one after the other,
# for each operation on that same file (fio first in odd rounds, zinf first in
# even ones). Both use O_DIRECT and io_uring with registered buffers and file,
# the same block size and queue depth, and GiB/s = bytes / seconds / 2^30.
# Write timings include the closing fsync for both (fio --end_fsync=1).
# The test file is removed at the end, also on Ctrl-C.
#
# Options:
#   --dir DIR           directory for the test file (default: .)
#   --size SIZE         bytes per pass (default 1GiB; a multiple of 4KiB and of BS)
#   --block-size BS     bytes per request (default 1M)
#   --queue-depth QD    requests in flight per ring (default 32)
#   --queues N          io_uring rings for zinf (default 1; fio always uses one
#                       ring, so N > 1 gives zinf N x QD requests in flight)
#   --rounds N          rounds; the table shows medians (default 5)
#   --rw OP             read, write or both (default both)
#   --zinf PATH         zinf-nvmebench to run (default: bin/zinf-nvmebench of this repo)
#   --min-ratio X       exit 75 if a zinf/fio ratio of medians is below X
#   --fio-mem SPEC      fio's buffer memory (its --mem), e.g. mmaphuge:/mnt/huge/buf
#                       for hugetlbfs pages; zinf-nvmebench takes transparent huge
#                       pages for its buffers, fio cannot: this evens the pages
#   --json              print one JSON line per op instead of the table
#   -h, --help          print this help and exit
#
# Sizes use zinf's rules: 512k, 1M, 4GiB, 2T are binary (k = 1024); 1kB, 5MB, 2GB
# are decimal. They are handed to both programs as byte counts, because fio
# reads "1MiB" as 1000000 and "1MB" as 1048576 (its kb_base=1024 default).
#
# Output: a table; lines that are not data start with '#' (per-round figures,
# the exact commands). Progress goes to stderr.
#
# Exit status: 0 ok, 64 usage, 66 zinf-nvmebench or DIR missing, 69 fio or
# python3 missing, 73 cannot create the test file, 74 a benchmark run failed,
# 75 --min-ratio not met, 130 interrupted.
#
# Example: scripts/bench-vs-fio.sh --dir /mnt/nvme --size 4GiB --rounds 5
set -euo pipefail

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash"

# --- options -----------------------------------------------------------------
dir=.
size=1GiB
bs=1M
qd=32
queues=1
rounds=5
rw=both
zinf=$script_dir/../bin/zinf-nvmebench
min_ratio=
fio_mem=
json=0

while [[ $# -gt 0 ]]; do
    case $1 in
        -h | --help) usage; exit 0 ;;
        --json) json=1; shift ;;
        --dir | --size | --block-size | --queue-depth | --queues | --rounds | --rw | --zinf | --min-ratio | --fio-mem)
            need_value "$@"
            case $1 in
                --dir) dir=$2 ;;
                --size) size=$2 ;;
                --block-size) bs=$2 ;;
                --queue-depth) qd=$2 ;;
                --queues) queues=$2 ;;
                --rounds) rounds=$2 ;;
                --rw) rw=$2 ;;
                --zinf) zinf=$2 ;;
                --min-ratio) min_ratio=$2 ;;
                --fio-mem) fio_mem=$2 ;;
            esac
            shift 2 ;;
        --*=*) set -- "${1%%=*}" "${1#*=}" "${@:2}" ;;
        *) usage_error "unknown argument '$1'" ;;
    esac
done

positive_int() {  # positive_int OPTION VALUE
    [[ $2 =~ ^[0-9]+$ && $2 -gt 0 && ${#2} -le 9 ]] || usage_error "$1 $2: expected a positive whole number"
}
positive_int --queue-depth "$qd"
positive_int --queues "$queues"
positive_int --rounds "$rounds"
case $rw in
    read) ops=(read) ;;
    write) ops=(write) ;;
    both) ops=(write read) ;;
    *) usage_error "--rw $rw: expected read, write or both" ;;
esac
if [[ -n $min_ratio && ! $min_ratio =~ ^([0-9]+\.?[0-9]*|\.[0-9]+)$ ]]; then
    usage_error "--min-ratio $min_ratio: expected a non-negative number"
fi

# --- tools -------------------------------------------------------------------
command -v python3 >/dev/null 2>&1 ||
    die 69 "python3 not found; install the package python3 (it parses the JSON results)"
command -v fio >/dev/null 2>&1 ||
    die 69 "fio not found; install the package fio (e.g. apt-get install fio)"
if [[ $zinf != */* ]] && command -v "$zinf" >/dev/null 2>&1; then
    zinf=$(command -v "$zinf")
fi
if [[ ! -f $zinf || ! -x $zinf ]]; then
    die 66 "zinf-nvmebench not found at $zinf; run make in $(cd "$script_dir/.." && pwd) to build it, or pass --zinf PATH"
fi
zinf=$(cd "$(dirname "$zinf")" && pwd)/${zinf##*/}

# parse_size TEXT: bytes, with zinf's rules (libzinf/src/util/size.cpp).
parse_size() {
    python3 - "$1" <<'EOF'
import re, sys
text = sys.argv[1].strip()
units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40, "kiB": 1 << 10,
         "KB": 10**3, "kB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
         "K": 1 << 10, "k": 1 << 10, "M": 1 << 20, "m": 1 << 20, "G": 1 << 30, "g": 1 << 30,
         "T": 1 << 40, "t": 1 << 40, "B": 1, "": 1}
m = re.fullmatch(r"([0-9]+(?:\.[0-9]*)?)([A-Za-z]*)", text)
if not m or m.group(2) not in units:
    sys.exit(1)
from fractions import Fraction
v = Fraction(m.group(1)) * units[m.group(2)]
if v.denominator != 1:
    sys.exit(1)
print(int(v))
EOF
}
size_bytes=$(parse_size "$size") || usage_error "--size $size: not a size (examples: 4096, 512k, 1M, 4GiB)"
bs_bytes=$(parse_size "$bs") || usage_error "--block-size $bs: not a size (examples: 4096, 128k, 1M)"
((bs_bytes >= 4096 && bs_bytes % 4096 == 0)) || usage_error "--block-size $bs: must be a positive multiple of 4KiB"
((size_bytes >= bs_bytes && size_bytes % bs_bytes == 0)) ||
    usage_error "--size $size ($size_bytes bytes) must be a positive multiple of --block-size $bs ($bs_bytes bytes)"

# --- test file ---------------------------------------------------------------
[[ -d $dir ]] || die 66 "--dir $dir: no such directory"
[[ -w $dir ]] || die 73 "--dir $dir: not writable"
dir=$(cd "$dir" && pwd)
file=$dir/bench-vs-fio.$$.dat
[[ ! -e $file ]] || die 73 "$file already exists; remove it or pick another --dir"
avail=$(python3 -c 'import os, sys; s = os.statvfs(sys.argv[1]); print(s.f_bavail * s.f_frsize)' "$dir")
((avail >= size_bytes)) || die 73 "not enough free space in $dir for a $size test file ($avail bytes available)"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/bench-vs-fio.XXXXXX")
created=0
# shellcheck disable=SC2317  # called by the EXIT trap
cleanup() {
    if ((created)); then rm -f -- "$file"; fi
    rm -rf -- "$tmp"
}
trap cleanup EXIT
trap 'say "interrupted"; exit 130' INT
trap 'say "terminated"; exit 143' TERM

fio_cmd() {  # fio_cmd OP: the fio command for OP, in the array cmd
    cmd=(fio --name="bench-vs-fio-$1" --filename="$file" --ioengine=io_uring --direct=1
        --fixedbufs --registerfiles --bs="$bs_bytes" --iodepth="$qd" --size="$size_bytes"
        --rw="$1")
    if [[ $1 == write ]]; then cmd+=(--end_fsync=1); fi
    if [[ -n $fio_mem ]]; then cmd+=(--mem="$fio_mem"); fi
    cmd+=(--output-format=json)
}
zinf_cmd() {  # zinf_cmd OP: the zinf-nvmebench command for OP, in the array cmd
    cmd=("$zinf" --file "$file" --force --size "$size_bytes" -b "$bs_bytes" -d "$qd"
        -Q "$queues" --rw "$1" --json)
}
quoted() { local s; printf -v s '%q ' "$@"; printf '%s' "${s% }"; }

# run_tool TOOL OP: runs it, sets gibps (and for zinf, engine and direct).
run_tool() {
    local tool=$1 op=$2 status=0
    "${tool}_cmd" "$op"
    "${cmd[@]}" >"$tmp/out" 2>"$tmp/err" || status=$?
    if ((status != 0)); then
        cat "$tmp/err" >&2
        ((status == 130)) && exit 130
        die 74 "$tool $op failed with status $status: $(quoted "${cmd[@]}")"
    fi
    local parsed
    parsed=$(python3 - "$tool" "$op" "$tmp/out" <<'EOF'
import json, sys
tool, op, path = sys.argv[1:]
text = open(path).read()
if tool == "fio":
    # fio may print notes before the JSON document.
    start = text.find("{")
    if start < 0:
        sys.exit("no JSON in fio's output")
    job = json.JSONDecoder().raw_decode(text[start:])[0]["jobs"][0]
    if job.get("error"):
        sys.exit("fio reported error %s" % job["error"])
    print("%.6f %d" % (job[op]["bw_bytes"] / 2**30, job[op]["runtime"]))
else:
    recs = [json.loads(l) for l in text.splitlines() if l.startswith("{")]
    recs = [r for r in recs if r.get("op") == op]
    if len(recs) != 1:
        sys.exit("expected one %s record from zinf-nvmebench, got %d" % (op, len(recs)))
    r = recs[0]
    print("%.6f %s %s" % (r["gibps"], r["engine"], "true" if r["direct"] else "false"))
EOF
    ) || { cat "$tmp/out" >&2; die 74 "could not read the result of $tool $op: $(quoted "${cmd[@]}")"; }
    if [[ $tool == fio ]]; then
        read -r gibps fio_ms <<<"$parsed"
        if ((fio_ms < 250)); then short_runs=1; fi
    else
        read -r gibps engine direct <<<"$parsed"
    fi
}

say "preparing $file ($size_bytes bytes) with fio (not measured)"
created=1
fio_cmd write
"${cmd[@]}" >"$tmp/out" 2>"$tmp/err" || {
    status=$?
    cat "$tmp/err" >&2
    ((status == 130)) && exit 130
    die 74 "fio could not write the test file (does $dir support O_DIRECT and io_uring?): $(quoted "${cmd[@]}")"
}

short_runs=0
declare -A fio_results zinf_results zinf_engine zinf_direct
for op in "${ops[@]}"; do fio_results[$op]=""; zinf_results[$op]=""; done
for ((round = 1; round <= rounds; round++)); do
    if ((round % 2)); then order=(fio zinf); else order=(zinf fio); fi
    for op in "${ops[@]}"; do
        line="round $round/$rounds $op:"
        for tool in "${order[@]}"; do
            run_tool "$tool" "$op"
            if [[ $tool == fio ]]; then
                fio_results[$op]+="$gibps "
            else
                zinf_results[$op]+="$gibps "
                zinf_engine[$op]=$engine
                zinf_direct[$op]=$direct
            fi
            line+=" $tool $(printf '%.3f' "$gibps")"
        done
        say "$line GiB/s"
    done
done

if ((short_runs)); then
    say "note: some fio runs took under 250 ms; fio times in whole milliseconds, so pass a larger --size for steadier figures"
fi

# --- report ------------------------------------------------------------------
report_args=()
for op in "${ops[@]}"; do
    fio_cmd "$op"; fio_line=$(quoted "${cmd[@]}")
    zinf_cmd "$op"; zinf_line=$(quoted "${cmd[@]}")
    report_args+=("$op" "${fio_results[$op]}" "${zinf_results[$op]}" "${zinf_engine[$op]}"
        "${zinf_direct[$op]}" "$fio_line" "$zinf_line")
done
status=0
python3 - "$json" "${min_ratio:-}" "$file" "$size_bytes" "$bs_bytes" "$qd" "$queues" "$rounds" \
    "$(fio --version)" "${report_args[@]}" <<'EOF' || status=$?
import json, math, statistics, sys
json_out, min_ratio, path, size, bs, qd, queues, rounds, fio_version, *rest = sys.argv[1:]
size, bs, qd, queues, rounds = int(size), int(bs), int(qd), int(queues), int(rounds)
rows = []
for i in range(0, len(rest), 7):
    op, fio, zinf, engine, direct, fio_cmd, zinf_cmd = rest[i:i + 7]
    fio = [float(x) for x in fio.split()]
    zinf = [float(x) for x in zinf.split()]
    f, z = statistics.median(fio), statistics.median(zinf)
    rows.append(dict(op=op, fio=fio, zinf=zinf, fio_med=f, zinf_med=z,
                     ratio=z / f if f > 0 else float("inf"), engine=engine,
                     direct=direct == "true", fio_cmd=fio_cmd, zinf_cmd=zinf_cmd))
if json_out == "1":
    for r in rows:
        print(json.dumps({
            "schema": "zinf.bench-vs-fio/1", "op": r["op"],
            "fio_gibps": round(r["fio_med"], 4), "zinf_gibps": round(r["zinf_med"], 4),
            "ratio": round(r["ratio"], 4) if math.isfinite(r["ratio"]) else None,
            "fio_rounds": r["fio"], "zinf_rounds": r["zinf"],
            "size": size, "block_size": bs, "queue_depth": qd, "queues": queues,
            "rounds": rounds, "zinf_engine": r["engine"], "zinf_direct": r["direct"],
            "fio_version": fio_version, "fio_command": r["fio_cmd"],
            "zinf_command": r["zinf_cmd"]}, separators=(",", ":")))
else:
    print("# bench-vs-fio: %s, %d bytes per pass, block %d, queue depth %d, zinf queues %d, "
          "%d rounds (medians)" % (path, size, bs, qd, queues, rounds))
    print("# %s; zinf engine %s, direct I/O %s; GiB/s = bytes / seconds / 2^30"
          % (fio_version, ",".join(sorted({r["engine"] for r in rows})),
             ",".join(sorted({"on" if r["direct"] else "off" for r in rows}))))
    print("#%5s %10s %10s %9s" % ("op", "fio GiB/s", "zinf GiB/s", "zinf/fio"))
    for r in rows:
        print("%6s %10.3f %10.3f %9.3f" % (r["op"], r["fio_med"], r["zinf_med"], r["ratio"]))
    for r in rows:
        for name in ("fio", "zinf"):
            print("# %-5s %-4s rounds: %s" % (r["op"], name, " ".join("%.3f" % x for x in r[name])))
    for r in rows:
        print("# command %-5s fio:  %s" % (r["op"], r["fio_cmd"]))
        print("# command %-5s zinf: %s" % (r["op"], r["zinf_cmd"]))
for r in rows:
    if r["engine"] != "uring" or not r["direct"]:
        print("bench-vs-fio.sh: warning: zinf %s ran with engine %s, direct I/O %s; fio used "
              "io_uring with O_DIRECT" % (r["op"], r["engine"], "on" if r["direct"] else "off"),
              file=sys.stderr)
if min_ratio:
    low = [r for r in rows if r["ratio"] < float(min_ratio)]
    for r in low:
        print("bench-vs-fio.sh: %s ratio zinf/fio %.3f is below --min-ratio %s"
              % (r["op"], r["ratio"], min_ratio), file=sys.stderr)
    if low:
        sys.exit(75)
EOF
exit "$status"
