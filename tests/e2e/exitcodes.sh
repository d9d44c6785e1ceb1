#!/usr/bin/env bash
# Every exit status a program's man page lists, walked (issue 47): each
# code of each man/zinf-*.1 EXIT STATUS section has a case below that makes
# the program exit with it, and every case's code is one its page lists. A
# code no cheap input reaches is named with the reason (a bug, two ranks);
# a page that lists a code no case walks, or a case whose code its page
# does not list, fails.
source "$(dirname "$0")/lib.bash"
W=$(mktemp -d /var/tmp/zinf-e2e-exitcodes-XXXXXX)
on_exit "rm -rf '$W'"
MT=gpt:layers=1,hidden=32,heads=2,vocab=256,seq=32
head -c 20000 "$ROOT/man/zinf-shard.1" >"$W/corpus.txt"
TA=(--text "$W/corpus.txt" --batch 2 --seq 16 --threads 1 --json "${POOL[@]}")

declare -A walked=() unwalked=()
# walk PROGRAM CODE WHAT CMD...: CMD (run by bash -c with $W, $BIN and the
# arrays above) must exit CODE.
walk() {
  local prog=$1 code=$2 what=$3
  shift 3
  local t0=$EPOCHREALTIME
  run bash -c "$*" _
  walked["$prog $code"]+="$what; "
  [[ -n ${ZINF_TIMES:-} ]] && echo "# $(((${EPOCHREALTIME/./} - ${t0/./}) / 1000)) ms: $prog $code"
  expect_rc "$code" "$prog: $code ($what)"
}
# not_walked PROGRAM CODE REASON: a listed code no cheap input reaches.
not_walked() { unwalked["$1 $2"]=$3; }
# holding DIR CMD...: CMD run while this shell holds DIR's lock file
# exclusively (flock(1)): a program that locks DIR finds it in use.
holding() {
  local dir=$1 fd
  shift
  exec {fd}>>"$dir/.zinf-lock"
  flock -x "$fd"
  "$@"
  flock -u "$fd"
  exec {fd}>&-
}
# interrupted [-after SECONDS] CMD...: CMD, sent SIGINT after a second (or
# SECONDS), and SIGKILL (137) when it has not ended 10 s later.
interrupted() {
  local after=1
  [[ $1 == -after ]] && after=$2 && shift 2
  timeout --preserve-status -s INT -k 10 "$after" "$@"
}
export -f interrupted

S=$W/s
"$BIN/zinf-shard" layout --model "$MT" --param-dtype fp32 >"$W/layout.jsonl"
"$BIN/zinf-shard" init "${POOL[@]}" --dir "$S" <"$W/layout.jsonl" >/dev/null 2>&1
printf 'not json\n' >"$W/bad.json"
printf '{"schema":"zinf.nvmebench/1","op":' >"$W/bad.jsonl"
head -c 4MiB /dev/urandom >"$W/file"
mkdir "$W/folder"
export W BIN
P="${POOL[*]}"
TAS="${TA[*]}"

# Every program: an unknown option is 64; an internal error (70) is a bug
# that no input reaches (zinf-pinstress's lease timeout is its 70, below).
for prog in shard train sample plan iobench streambench nvmebench optbench pinstress commbench tokenize; do
  walk zinf-$prog 64 "an unknown option" '"$BIN/zinf-'$prog'" --nope'
  [[ $prog == pinstress ]] || not_walked zinf-$prog 70 "an internal error is a bug: no input reaches it"
done

# --- zinf-shard -------------------------------------------------------------
walk zinf-shard 0 "layout" '"$BIN/zinf-shard" layout --model gpt2-124m >/dev/null'
walk zinf-shard 64 "an unknown option" '"$BIN/zinf-shard" layout --nope'
walk zinf-shard 65 "verify of a layout (no xxh3)" '"$BIN/zinf-shard" verify '"$P"' -m "$W/layout.jsonl"'
walk zinf-shard 66 "a missing manifest" '"$BIN/zinf-shard" verify -m "$W/none.jsonl"'
walk zinf-shard 73 "init into a directory that holds a manifest" \
  '"$BIN/zinf-shard" init '"$P"' --dir "$W/s" <"$W/layout.jsonl"'
walk zinf-shard 74 "EIO opening a data file" \
  'ZINF_FAULT_SITE="open:EIO:$W/s/rank0/param.bin" "$BIN/zinf-shard" verify '"$P"' -m "$W/s/manifest.jsonl" >/dev/null'
holding "$S" walk zinf-shard 75 "verify while another holds the lock" '"$BIN/zinf-shard" verify '"$P"' -m "$W/s/manifest.jsonl"'
# (gpt2-1.5b's 3 GiB, not gpt2-124m's 237 MiB: a quiet machine wrote those
# in 0.8 s, before the signal came, and exited 0.)
walk zinf-shard 130 "SIGINT during an init" \
  '"$BIN/zinf-shard" layout --model gpt2-1.5b --inference | interrupted "$BIN/zinf-shard" init --dir "$W/big" >/dev/null'

# --- zinf-train -------------------------------------------------------------
walk zinf-train 0 "a step" '"$BIN/zinf-train" '"$TAS"' --manifest "$W/s/manifest.jsonl" --steps 1 >/dev/null'
walk zinf-train 65 "a layout (no data directory)" '"$BIN/zinf-train" '"$TAS"' --manifest "$W/layout.jsonl" --steps 1'
walk zinf-train 66 "a missing manifest" '"$BIN/zinf-train" '"$TAS"' --manifest "$W/none.jsonl" --steps 1'
walk zinf-train 73 "no space on standard output" \
  '"$BIN/zinf-train" '"$TAS"' --manifest "$W/s/manifest.jsonl" --steps 2 --resume >/dev/full'
walk zinf-train 74 "EIO opening a state file" \
  'ZINF_FAULT_SITE="open:EIO:$W/s/rank0/param.bin" "$BIN/zinf-train" '"$TAS"' --manifest "$W/s/manifest.jsonl" --steps 3 --resume'
holding "$S" walk zinf-train 75 "the lock held by another" \
  '"$BIN/zinf-train" '"$TAS"' --manifest "$W/s/manifest.jsonl" --steps 3 --resume'
walk zinf-train 130 "SIGINT" \
  'interrupted "$BIN/zinf-train" '"$TAS"' --manifest "$W/s/manifest.jsonl" --steps 1000000 --resume >/dev/null'

# --- zinf-sample ------------------------------------------------------------
SAO="--prompt x -n 2 --threads 1 $P"
walk zinf-sample 0 "text" '"$BIN/zinf-sample" -m "$W/s/manifest.jsonl" '"$SAO"' >/dev/null'
walk zinf-sample 65 "a layout (no data directory)" '"$BIN/zinf-sample" -m "$W/layout.jsonl" '"$SAO"
walk zinf-sample 66 "a missing manifest" '"$BIN/zinf-sample" -m "$W/none.jsonl" '"$SAO"
walk zinf-sample 74 "EIO opening a state file" \
  'f=$(jq -r "select(.state == \"param\") | .file" "$W/s/manifest.jsonl" | head -n 1)
   ZINF_FAULT_SITE="open:EIO:$W/s/$f" "$BIN/zinf-sample" -m "$W/s/manifest.jsonl" '"$SAO"
holding "$S" walk zinf-sample 75 "the lock held by a writer" '"$BIN/zinf-sample" -m "$W/s/manifest.jsonl" '"$SAO"

# --- zinf-plan --------------------------------------------------------------
PL="--model gpt2-124m --gpu-mem 80GiB --cpu-mem 64GiB --nvme 1TiB -q"
walk zinf-plan 0 "a plan" '"$BIN/zinf-plan" '"$PL"' >/dev/null'
walk zinf-plan 65 "a bench line that is not JSON" '"$BIN/zinf-plan" '"$PL"' --bench "$W/bad.jsonl"'
walk zinf-plan 66 "a missing bench file" '"$BIN/zinf-plan" '"$PL"' --bench "$W/none.jsonl"'
walk zinf-plan 65 "a bench file that is a folder" '"$BIN/zinf-plan" '"$PL"' --bench "$W/folder"'

# --- zinf-iobench and zinf-streambench ---------------------------------------
for p in iobench streambench; do
  B="--file $W/file --rounds 1 -q"
  [[ $p == streambench ]] && B+=" --pinned 8MiB --pinned-buffer 1MiB"
  walk zinf-$p 0 "a round" '"$BIN/zinf-'$p'" '"$B"' >/dev/null'
  walk zinf-$p 65 "a --config that is not JSON" '"$BIN/zinf-'$p'" '"$B"' --config "$W/bad.json"'
  walk zinf-$p 66 "a missing --file" '"$BIN/zinf-'$p'" --file "$W/none"'
  walk zinf-$p 74 "EIO reading the file" 'ZINF_FAULTS=read:1:EIO "$BIN/zinf-'$p'" '"$B"' >/dev/null'
done

# --- zinf-nvmebench -----------------------------------------------------------
NB="--dir $W --size 1MiB -b 128KiB -d 4 -Q 1 -e threads -q"
walk zinf-nvmebench 0 "a sweep" '"$BIN/zinf-nvmebench" '"$NB"' >/dev/null'
walk zinf-nvmebench 65 "--verify reading other bytes" 'ZINF_FAULTS=read:1:corrupt "$BIN/zinf-nvmebench" '"$NB"' --verify >/dev/null'
walk zinf-nvmebench 66 "a missing --dir" '"$BIN/zinf-nvmebench" --dir "$W/none" --size 1MiB'
walk zinf-nvmebench 73 "an existing --file without --force" '"$BIN/zinf-nvmebench" --file "$W/file" --size 1MiB'
walk zinf-nvmebench 74 "EIO reading" 'ZINF_FAULTS=read:1:EIO "$BIN/zinf-nvmebench" '"$NB"' >/dev/null'
walk zinf-nvmebench 75 "--min-read-gibps not met" '"$BIN/zinf-nvmebench" '"$NB"' --rw read --min-read-gibps 1000000 >/dev/null'
walk zinf-nvmebench 130 "SIGINT" 'interrupted "$BIN/zinf-nvmebench" '"$NB"' --loops 1000000 >/dev/null'

# --- zinf-optbench ------------------------------------------------------------
OB="--params 1M --steps 1 --dir $W -q --pinned 8MiB --pinned-buffer 1MiB"
walk zinf-optbench 0 "a step" '"$BIN/zinf-optbench" '"$OB"' --state update >/dev/null'
walk zinf-optbench 65 "a --config that is not JSON" '"$BIN/zinf-optbench" '"$OB"' --config "$W/bad.json"'
walk zinf-optbench 66 "a missing --config" '"$BIN/zinf-optbench" '"$OB"' --config "$W/none.json"'
walk zinf-optbench 73 "a --dir that does not exist" '"$BIN/zinf-optbench" --params 1M --steps 1 --dir "$W/none" --state nvme'
walk zinf-optbench 74 "EIO reading the state" 'ZINF_FAULTS=read:1:EIO "$BIN/zinf-optbench" '"$OB"' --state nvme >/dev/null'
walk zinf-optbench 75 "--max-ideal-ratio not met" '"$BIN/zinf-optbench" '"$OB"' --state nvme --max-ideal-ratio 0.000001 >/dev/null'
walk zinf-optbench 130 "SIGINT between the update's steps (past its first second, the memory's)" \
  'interrupted -after 3 "$BIN/zinf-optbench" --params 2M --steps 100000 --dir "$W" --state update -q >/dev/null'

# --- zinf-pinstress -----------------------------------------------------------
PS="--pinned 8MiB --pinned-buffer 1MiB --device cpu --no-copy -q"
walk zinf-pinstress 0 "a short run" '"$BIN/zinf-pinstress" '"$PS"' -s 100ms >/dev/null'
walk zinf-pinstress 65 "a buffer changed while held (--inject corrupt)" '"$BIN/zinf-pinstress" '"$PS"' -s 200ms --inject corrupt >/dev/null'
walk zinf-pinstress 70 "a lease that times out" \
  '"$BIN/zinf-pinstress" --pinned 2MiB --pinned-buffer 1MiB --device cpu --no-copy -q -t 4 --max-lease 2 --max-hold 50ms --timeout 1ms -s 1s >/dev/null'
walk zinf-pinstress 130 "SIGINT" 'interrupted "$BIN/zinf-pinstress" '"$PS"' -s 1h >/dev/null'

# --- zinf-commbench -----------------------------------------------------------
CB="-b 1KiB -e 4KiB -n 1 -w 0 --rounds 1 --backend self"
walk zinf-commbench 0 "a sweep" '"$BIN/zinf-commbench" '"$CB"' >/dev/null'
walk zinf-commbench 75 "--min-ratio not met" \
  '"$BIN/zinf-commbench" -b 1MiB -e 1MiB -n 1 -w 0 --rounds 1 --backend self --raw --min-ratio 1000000 >/dev/null'
not_walked zinf-commbench 65 "--check's mismatch needs a collective that computes wrong: no input reaches it"

# --- zinf-tokenize -------------------------------------------------------------
TK='"$BIN/zinf-tokenize" -q -t bytes'
walk zinf-tokenize 0 "a text file" "$TK"' -o "$W/t.bin" "$W/corpus.txt"'
walk zinf-tokenize 65 "a tokenizer.json cut short" '"$BIN/zinf-tokenize" -t "$W/bad.jsonl" -o "$W/t.bin" "$W/corpus.txt"'
walk zinf-tokenize 66 "a missing input" "$TK"' -o "$W/t.bin" "$W/none.txt"'
walk zinf-tokenize 73 "an output in a folder that does not exist" "$TK"' -o "$W/none/t.bin" "$W/corpus.txt"'
mkfifo "$W/fifo"
walk zinf-tokenize 130 "SIGINT while waiting for a FIFO's writer" 'interrupted '"$TK"' -o "$W/t.bin" "$W/fifo"'

# --- standard output (zinf(7)'s one rule) ---------------------------------------
# Every program that prints: no space on stdout is 73, a stdout that cannot
# be written otherwise 74 (here: a descriptor open for reading only); never
# 0 with the output lost.
declare -A OK=(
  [zinf-shard]='"$BIN/zinf-shard" layout --model gpt2-124m'
  [zinf-sample]='"$BIN/zinf-sample" -m "$W/s/manifest.jsonl" '"$SAO"
  [zinf-plan]='"$BIN/zinf-plan" '"$PL"
  [zinf-iobench]='"$BIN/zinf-iobench" --file "$W/file" --rounds 1 -q'
  [zinf-streambench]='"$BIN/zinf-streambench" --file "$W/file" --rounds 1 -q --pinned 8MiB --pinned-buffer 1MiB'
  [zinf-nvmebench]='"$BIN/zinf-nvmebench" '"$NB"
  [zinf-optbench]='"$BIN/zinf-optbench" '"$OB"' --state update'
  [zinf-pinstress]='"$BIN/zinf-pinstress" '"$PS"' -s 100ms'
  [zinf-commbench]='"$BIN/zinf-commbench" '"$CB"
  [zinf-tokenize]="$TK"' --json -o "$W/t.bin" "$W/corpus.txt"'
)
for prog in "${!OK[@]}"; do
  walk "$prog" 73 "no space on standard output" "${OK[$prog]} >/dev/full"
  walk "$prog" 74 "standard output not open for writing" "${OK[$prog]} 1</dev/null"
done

# --- the pages against the walk -------------------------------------------------
# A page's codes: in its EXIT STATUS section, each number that is a .TP item's tag.
for page in "$ROOT"/man/zinf-*.1; do
  prog=$(basename "$page" .1)
  codes=$(awk '/^\.SH EXIT STATUS/ { on = 1; next } /^\.SH/ { on = 0 } on && tp && /^(\.B )?[0-9]+$/ { print $NF } { tp = on && /^\.TP/ }' "$page")
  missing= extra=
  for c in $codes; do
    [[ -n ${walked["$prog $c"]:-} || -n ${unwalked["$prog $c"]:-} ]] || missing+=" $c"
  done
  for k in "${!walked[@]}" "${!unwalked[@]}"; do
    [[ ${k%% *} == "$prog" ]] || continue
    [[ " $(echo $codes) " == *" ${k#* } "* ]] || extra+=" ${k#* }"
  done
  check "$prog(1) lists ${codes//$'\n'/ }: every one walked or said why not${missing:+ (not walked:$missing)}" test -z "$missing"
  check "…and every code the walk met is listed${extra:+ (not listed:$extra)}" test -z "$extra"
done
finish
