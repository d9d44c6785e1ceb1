#!/usr/bin/env bash
# The fault-site walk (issue 18), in the time make test allows: that no
# file-system call in the sources bypasses zinf::sys, and for zinf-shard init
# (over a committed state, and into a new folder), reshard, import and
# export (llm.c's and Hugging Face's formats), and zinf-train with
# checkpoint commits and diverging (issue 29), one site of each kind the run
# meets, drawn with a seed (ZINF_FAULT_SEED, else the date), failed with
# EIO, ENOSPC and a short transfer (fault_lib.bash says what each case must
# do). scripts/fault-walk.sh walks every site.
source "$(dirname "$0")/lib.bash"
source "$(dirname "$0")/fault_lib.bash"
# On a tmpfs where there is one: every case fsyncs, and a disk's fsync
# would make the walk too slow for make test (scripts/fault-walk.sh walks on
# a disk that takes O_DIRECT). Buffered I/O also lets a short transfer of a
# small piece really be short.
W=$(mktemp -d /dev/shm/zinf-e2e-faults-XXXXXX 2>/dev/null || mktemp -d /var/tmp/zinf-e2e-faults-XXXXXX)
on_exit "rm -rf '$W'"

check_sources

# The site layer itself: a trace lists each site once, and a fault fires once.
"$FW_SH" layout --model "$FW_M2" >"$W/l.jsonl"
ZINF_FAULT_TRACE=$W/t ZINF_FAULT_SITE="rename:EIO:$W/nowhere" "$FW_SH" init "${FW_POOL[@]}" --dir "$W/s" <"$W/l.jsonl" >/dev/null 2>&1
check "a trace names each site once, with its kind and file" bash -c '
  [[ $(sort "$1" | uniq -d) == "" ]] && grep -qP "^rename\t$2/s/manifest.jsonl$" "$1" &&
  grep -qP "^open\t$2/s/rank0/param.bin.zinf-tmp.\*$" "$1"' _ "$W/t" "$W"
run env ZINF_FAULT_SITE="rename:short:$W/s/manifest.jsonl" "$FW_SH" verify "${FW_POOL[@]}" -m "$W/s/manifest.jsonl"
check "a bad ZINF_FAULT_SITE (short at a rename) is said and ignored" \
  bash -c '[[ $1 == 0 && $2 == *ZINF_FAULT_SITE*ignored* ]]' _ "$rc" "$err"

seed=${ZINF_FAULT_SEED:-$(date +%Y%m%d)}
echo "# fault walk sample, seed $seed (ZINF_FAULT_SEED=$seed to repeat it)"
fw_walk "$seed" "${FW_SCENARIOS[@]}"
# And the sites where the walk found bugs, whatever the sample draws: a
# failed rename's message named a freed string; a failed read of the
# manifest was taken for its end; the overlapped update's I/O errors were
# dropped for a redo (exit 0); init --force took a failed read of the old
# manifest for a corrupt one and replaced it (exit 0), and skipped a rank
# folder it could not list. And the optimizer's early flush: the first
# fdatasync of a file the overlapped update wrote is made by the flush
# thread once the backward ends; its failure must fail the step.
at() { FW_D=$W/$1 FW_P=$W/$1.pristine fw_case "$@"; }
at init rename "$W/init/rank0/param.alt.bin" EIO
at init read "$W/init/manifest.jsonl" EIO
at init open "$W/init/rank1" ENOSPC
at reshard read "$W/reshard/manifest.jsonl" EIO
at train read "$W/train/rank0/exp_avg.bin" EIO
at train write "$W/train/rank0/param.alt.bin" ENOSPC
at train fsync "$W/train/rank0/exp_avg.alt.bin" EIO
# Issue 29's new paths: an export whose rename fails leaves no file and no
# temporary; a Llama import whose index cannot be read commits nothing.
at export rename "$W/export.out" EIO
at hfimport read "$W/hfimport.hf/model.safetensors.index.json" EIO
# The pipeline (issue 45): step 2's update writes rank0/param.bin (the
# generation after step 1's) on its own thread beside step 3's forward and
# backward; that write-behind fails: exit 74 naming the file, on stdout
# step 1's line only, the manifest at step 1 (step 2 never committed),
# verified; and
# --resume runs steps 2 to 4 with the uninterrupted run's losses, bit for bit.
source "$ROOT/tests/e2e/train_lib.bash"
# Twice: with the second gradient scratch in memory (the default budget),
# and with both scratches in files (--optimizer-readahead 0), whose
# parity a resume after the kill must not depend on.
pipe_case() {
  local label=$1
  shift
  local P=$W/pipe$label
  "$FW_SH" layout --model "$FW_MT" --param-dtype fp32 | "$FW_SH" init "${FW_POOL[@]}" --dir "$P" >/dev/null
  cp -a "$P" "$P.pristine"
  head -c 4000 "$ROOT/man/zinf-shard.1" >"$W/pipe.txt"
  local PR=(--text "$W/pipe.txt" --schedule constant --batch 2 --seq 16 --threads 1 --json "$@" "${FW_POOL[@]}")
  ZINF_FAULT_TRACE=$P.trace "$FW_TR" --manifest "$P/manifest.jsonl" --steps 4 "${PR[@]}" >"$P.clean" 2>/dev/null
  local site
  site=$(grep -P '^write\t.*/rank0/param\.bin$' "$P.trace" | head -n 1 | cut -f 2)
  rm -rf "$P" && cp -a "$P.pristine" "$P"
  ZINF_FAULT_SITE="write:EIO:$site" "$FW_TR" --manifest "$P/manifest.jsonl" --steps 4 "${PR[@]}" >"$P.out" 2>"$P.err"
  local rc=$?
  check "a failed write-behind of a pipelined update exits 74 naming its file$label" \
    bash -c '[[ -n $1 && $2 == 74 && $(<"$3") == *"$1"* ]]' _ "$site" "$rc" "$P.err"
  check "...with step 1's line only, the manifest at step 1, verified" \
    bash -c '[[ $(jq -r .step "$1" | tr "\n" " ") == "1 " && $2 == 1 ]] && "$3" verify "${@:5}" -m "$4/manifest.jsonl" >/dev/null' \
    _ "$P.out" "$(manifest_step "$P/manifest.jsonl")" "$FW_SH" "$P" "${FW_POOL[@]}"
  "$FW_TR" --manifest "$P/manifest.jsonl" --steps 4 --resume "${PR[@]}" >"$P.resumed" 2>"$P.resumed.err"
  rc=$?
  check "...and --resume runs steps 2 to 4 with the uninterrupted run's losses" \
    bash -c '[[ $1 == 0 && $(jq -c "[.step, .loss]" "$2") == "$(jq -c "select(.step >= 2) | [.step, .loss]" "$3")" ]]' \
    _ "$rc" "$P.resumed" "$P.clean"
}
pipe_case ""
pipe_case " (both gradient scratches in files)" --optimizer-readahead 0
check "...where the steps were clipped, each update under the next backward (but the last's)" \
  jq -e -s '(.[:-1] | all(.[]; .update_under_backward and .grad_norm > 1)) and (.[-1].update_under_backward == false)' \
  "$W/pipe (both gradient scratches in files).clean"
check "...and the second scratch a file there, in memory under the default budget" \
  bash -c 'grep -q "/grad\.alt\.bin$" "$1" && ! grep -q "/grad\.alt\.bin$" "$2"' _ \
  "$W/pipe (both gradient scratches in files).trace" "$W/pipe.trace"
echo "# $FW_SITE_COUNT sites walked: $FW_HELD cases held, $FW_FAILED failed"
finish
