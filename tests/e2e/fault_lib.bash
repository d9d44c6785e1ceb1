# Sourced (after lib.bash) by tests/e2e/faults.sh and scripts/fault-walk.sh:
# the fault-site walk. A scenario runs a program once cleanly with
# ZINF_FAULT_TRACE set, which lists every I/O site it touches (util.hpp,
# zinf::sys: open, read, write, fsync, rename, fallocate, truncate, mkdir,
# close, each with its file); then runs it again once per site and fault
# (ZINF_FAULT_SITE: EIO, ENOSPC, and a short transfer for reads and writes)
# from the same committed state, and checks:
#   EIO, ENOSPC  exit 74 (73 for no space), a message naming the site's file,
#                no temporary left, and the committed manifest intact: the
#                one before or the one the clean run commits, byte for
#                byte, and `zinf-shard verify` passes on it;
#   short        the transfer is finished: exit 0 and the clean run's
#                manifest, byte for byte, verified.
# The sites are the ones the run meets, not a list kept here; and
# check_sources fails when a file-system call in the sources bypasses
# zinf::sys, so a new site is walked as soon as a scenario reaches it.
#
# Needs: W (a folder on a disk that takes O_DIRECT), BIN, and lib.bash's
# pass/fail/skip.

FW_POOL=(--pinned 8MiB --pinned-buffer 256KiB)
FW_M2=gpt:layers=1,hidden=24,heads=3,vocab=31,seq=5     # 16 tensors, odd sizes
FW_MT=gpt:layers=1,hidden=32,heads=2,vocab=256,seq=32  # byte-level: trains on any text
FW_SH=$BIN/zinf-shard
FW_TR=$BIN/zinf-train

# Raw file-system calls that would bypass zinf::sys; a line may say why it is
# not a site with "fault-site:" (/proc, sysfs, an eventfd, the engine's
# backends, whose sites are in Completer::prepare).
FW_RAW='(^|[^A-Za-z0-9_>.])::(open|openat|creat|read|pread|preadv|preadv2|write|pwrite|pwritev|pwritev2|fsync|fdatasync|sync_file_range|rename|renameat|renameat2|fallocate|posix_fallocate|ftruncate|truncate|mkdir|mkdirat)\(|SYS_openat2|std::(rename|ofstream|ifstream|fstream)\b|\bfopen\(|stdio_filebuf|create_director(y|ies)\(|fs::(rename|copy_file|resize_file)\(|io_uring_prep_(read|write)'

# check_sources: every such call outside libzinf/src/util/sys.cpp carries a reason.
check_sources() {
  local hits
  hits=$(cd "$ROOT" && grep -rnE "$FW_RAW" libzinf/src libzinf/include */main.cpp */*.cpp bench 2>/dev/null |
    grep -v '^libzinf/src/util/sys\.cpp:' | grep -v 'fault-site:' | grep -vE '^[^:]+:[0-9]+:\s*//' | sort -u)
  if [[ -z $hits ]]; then
    pass "every file-system call in the sources goes through zinf::sys (or says why it is no site)"
  else
    fail "file-system calls that bypass zinf::sys, so no fault walk sees them" "$hits"
  fi
}

fw_sums() { (cd "$1" && find . -type f ! -name .zinf-lock -print0 | sort -z | xargs -0r sha256sum); }
fw_verify() { "$FW_SH" verify "${FW_POOL[@]}" -m "$1" >/dev/null 2>&1; }
fw_temps() { find "$@" -name '*.zinf-tmp.*' -o -name '*.tmp.*' 2>/dev/null; }

# --- scenarios: fw_setup_NAME makes the committed state in $FW_D (and
# whatever else the run needs) once; fw_run_NAME runs the program on it;
# FW_OUT_NAME names the folder whose manifest the run commits.
fw_setup_init() {  # init --force over a committed state: a new seed beside the old
  "$FW_SH" layout --model "$FW_M2" --dp 2 | "$FW_SH" init "${FW_POOL[@]}" --dir "$FW_D" >/dev/null
  "$FW_SH" layout --model "$FW_M2" --dp 2 --seed 7 >"$W/init.layout"
}
fw_run_init() { "$FW_SH" init "${FW_POOL[@]}" --dir "$FW_D" --force <"$W/init.layout"; }
fw_out_init() { echo "$FW_D"; }

fw_setup_fresh() {  # init into a folder that does not exist yet
  "$FW_SH" layout --model "$FW_M2" --param cpu >"$W/fresh.layout"
}
fw_run_fresh() { "$FW_SH" init "${FW_POOL[@]}" --dir "$FW_D/new/run" <"$W/fresh.layout"; }
fw_out_fresh() { echo "$FW_D/new/run"; }

fw_setup_reshard() {
  "$FW_SH" layout --model "$FW_M2" --dp 3 | "$FW_SH" init "${FW_POOL[@]}" --dir "$FW_D" >/dev/null
}
fw_run_reshard() { "$FW_SH" reshard "${FW_POOL[@]}" -m "$FW_D/manifest.jsonl" --dp 2 --dir "$FW_D/dp2"; }
fw_out_reshard() { echo "$FW_D/dp2"; }

fw_setup_train() {  # every state on NVMe, a checkpoint committed at steps 1 and 2
  "$FW_SH" layout --model "$FW_MT" --param-dtype fp32 | "$FW_SH" init "${FW_POOL[@]}" --dir "$FW_D" >/dev/null
  head -c 4000 "$ROOT/man/zinf-shard.1" >"$W/corpus.txt"
}
# A constant rate: the step-1 checkpoint of a 2-step run is a 1-step run's.
fw_train() {
  "$FW_TR" --manifest "$FW_D/manifest.jsonl" --text "$W/corpus.txt" --checkpoint-every 1 --schedule constant \
    --batch 2 --seq 16 --threads 1 --json "${FW_POOL[@]}" "$@"
}
fw_run_train() { fw_train --steps 2; }
# Checkpoints a failed run may leave committed besides the one before and the
# clean run's: a fault at step 2 keeps step 1's.
fw_also_train() { fw_train --steps 1 >/dev/null 2>&1; }
fw_out_train() { echo "$FW_D"; }

# import --force of llm.c weights over a committed state of another seed.
fw_setup_import() {
  "$FW_SH" layout --model "$FW_MT" --param-dtype fp32 | "$FW_SH" init "${FW_POOL[@]}" --dir "$W/import.src" >/dev/null
  "$FW_SH" export "${FW_POOL[@]}" -m "$W/import.src/manifest.jsonl" --to "$W/import.llmc" --format llmc >/dev/null 2>&1
  "$FW_SH" layout --model "$FW_MT" --param-dtype fp32 --seed 7 | "$FW_SH" init "${FW_POOL[@]}" --dir "$FW_D" >/dev/null
  "$FW_SH" layout --model "$FW_MT" --param-dtype fp32 >"$W/import.layout"
}
fw_run_import() { "$FW_SH" import "${FW_POOL[@]}" --from "$W/import.llmc" --dir "$FW_D" --force <"$W/import.layout"; }
fw_out_import() { echo "$FW_D"; }

# The same from a Hugging Face Llama checkpoint: shards and their index.
FW_ML=llama:layers=1,hidden=32,heads=2,kv_heads=1,ffn=48,vocab=64,seq=32
fw_setup_hfimport() {
  "$FW_SH" layout --model "$FW_ML" --param-dtype fp32 | "$FW_SH" init "${FW_POOL[@]}" --dir "$W/hfimport.src" >/dev/null
  "$FW_SH" export "${FW_POOL[@]}" -m "$W/hfimport.src/manifest.jsonl" --to "$W/hfimport.hf" --shard-size 8KiB >/dev/null 2>&1
  "$FW_SH" layout --model "$FW_ML" --param-dtype fp32 --seed 7 | "$FW_SH" init "${FW_POOL[@]}" --dir "$FW_D" >/dev/null
  "$FW_SH" layout --model "$FW_ML" --param-dtype fp32 >"$W/hfimport.layout"
}
fw_run_hfimport() { "$FW_SH" import "${FW_POOL[@]}" --from "$W/hfimport.hf" --dir "$FW_D" --force <"$W/hfimport.layout"; }
fw_out_hfimport() { echo "$FW_D"; }

# Exports: the state is only read; fw_file_NAME is what the run writes,
# which a failed run must leave absent (or an empty folder), never torn.
fw_setup_export() { "$FW_SH" layout --model "$FW_MT" --param-dtype fp32 | "$FW_SH" init "${FW_POOL[@]}" --dir "$FW_D" >/dev/null; }
fw_run_export() { "$FW_SH" export "${FW_POOL[@]}" -m "$FW_D/manifest.jsonl" --to "$W/export.out" --format llmc; }
fw_out_export() { echo "$FW_D"; }
fw_file_export() { echo "$W/export.out"; }
fw_setup_hfexport() { "$FW_SH" layout --model "$FW_ML" --param-dtype fp32 | "$FW_SH" init "${FW_POOL[@]}" --dir "$FW_D" >/dev/null; }
fw_run_hfexport() { "$FW_SH" export "${FW_POOL[@]}" -m "$FW_D/manifest.jsonl" --to "$W/hfexport.out" --shard-size 8KiB; }
fw_out_hfexport() { echo "$FW_D"; }
fw_file_hfexport() { echo "$W/hfexport.out"; }

# A diverging run (issue 29, finding 4): every state on NVMe at step 2,
# resumed with --lr 1e12: step 3 commits weights that give a NaN loss at
# step 4, and the run commits step 2's manifest again and exits 65. A
# failed commit leaves the commit before it, as everywhere: step 2's, or,
# when the commit that goes back fails, step 3's (fw_accept_diverge: a
# manifest at step 3 that verifies; the run has failed with 74 or 73).
fw_setup_diverge() {
  fw_setup_train
  fw_train --steps 2 >/dev/null 2>&1
}
fw_run_diverge() { fw_train --steps 6 --resume --lr 1e12; }
fw_rc_diverge() { echo 65; }
fw_out_diverge() { echo "$FW_D"; }
fw_accept_diverge() { [[ $(jq -s '[.[1:][] | .step // 0] | max' "$1") == 3 ]]; }

FW_SCENARIOS=(init fresh reshard train import hfimport export hfexport diverge)

# fw_prepare NAME: the pristine state, the clean run's sites and result.
# Sets FW_SITES (one "kind<TAB>path" a line).
fw_prepare() {
  local s=$1
  FW_D=$W/$s
  FW_P=$W/$s.pristine
  rm -rf "$FW_D" "$FW_P"
  mkdir -p "$FW_D"
  "fw_setup_$s" || return 1
  cp -a "$FW_D" "$FW_P"
  rm -f "$W/$s.trace"
  local rc0=0
  ZINF_FAULT_TRACE=$W/$s.trace "fw_run_$s" >"$W/$s.clean.out" 2>"$W/$s.clean.err" || rc0=$?
  if ((rc0 != $(fw_clean_rc "$s"))); then
    fail "$s: the clean run exits $(fw_clean_rc "$s")" "exit $rc0: $(tail -c 600 "$W/$s.clean.err")"
    return 1
  fi
  local out
  out=$("fw_out_$s")
  cp "$out/manifest.jsonl" "$W/$s.clean.manifest"
  rm -rf "$W/$s.clean.file"
  if declare -F "fw_file_$s" >/dev/null; then
    cp -a "$("fw_file_$s")" "$W/$s.clean.file"
  fi
  rm -f "$W/$s".also.manifest*
  if declare -F "fw_also_$s" >/dev/null; then
    rm -rf "$FW_D" && cp -a "$FW_P" "$FW_D"
    "fw_also_$s" && cp "$out/manifest.jsonl" "$W/$s.also.manifest"
  fi
  # The trace spells the folder as the run did; lines in the order met.
  FW_SITES=$(awk '!seen[$0]++' "$W/$s.trace")
  # Each case starts from the pristine state; a failed run must leave the
  # scenario's own output as a clean one would find it.
  rm -rf "$FW_D"
  cp -a "$FW_P" "$FW_D"
}

fw_restore() {
  rm -rf "$FW_D"
  cp -a "$FW_P" "$FW_D"
  if declare -F "fw_file_${FW_D##*/}" >/dev/null; then rm -rf "$("fw_file_${FW_D##*/}")"; fi
}
# fw_clean_rc NAME: the exit status of the scenario's run without a fault.
fw_clean_rc() { if declare -F "fw_rc_$1" >/dev/null; then "fw_rc_$1"; else echo 0; fi; }

# fw_case NAME KIND PATH HOW: one run with one fault, and its checks (one test).
fw_case() {
  local s=$1 kind=$2 path=$3 how=$4 rc want name out problems=()
  fw_restore
  local before_manifest=''
  [[ -f $FW_D/manifest.jsonl ]] && before_manifest=$(sha256sum <"$FW_D/manifest.jsonl")
  local src_before
  src_before=$(fw_sums "$FW_P")
  ZINF_FAULT_SITE="$kind:$how:$path" "fw_run_$s" >"$W/case.out" 2>"$W/case.err"
  rc=$?
  out=$("fw_out_$s")
  name="$s: $how at $kind ${path#"$W"/}"
  local err
  err=$(<"$W/case.err")
  if [[ $how == short ]]; then
    ((rc == $(fw_clean_rc "$s"))) || problems+=("exit $rc, want $(fw_clean_rc "$s") (a short transfer is finished)")
    cmp -s "$out/manifest.jsonl" "$W/$s.clean.manifest" || problems+=("the manifest is not the clean run's")
  else
    want=74
    [[ $how == ENOSPC ]] && want=73
    ((rc == want)) || problems+=("exit $rc, want $want")
    # The site's file as a pattern: a "*" inside it (a temporary folder's
    # name) stands for temp_name's 16 hex digits; a last one is left off.
    local named=${path%\*} pat
    pat=${named//\*/????????????????}
    [[ $err == *$pat* ]] || problems+=("the message does not name $named")
    # The committed manifest: the old one or the new one, whole.
    local now=''
    [[ -f $out/manifest.jsonl ]] && now=$(sha256sum <"$out/manifest.jsonl")
    if [[ -n $now ]]; then
      if [[ $out == "$FW_D" && $now == "$before_manifest" ]]; then :
      elif cmp -s "$out/manifest.jsonl" "$W/$s.clean.manifest"; then :
      elif [[ -f $W/$s.also.manifest ]] && cmp -s "$out/manifest.jsonl" "$W/$s.also.manifest"; then :
      elif declare -F "fw_accept_$s" >/dev/null && "fw_accept_$s" "$out/manifest.jsonl"; then :
      else problems+=("manifest.jsonl is neither the committed one nor the clean run's")
      fi
    elif [[ -n $before_manifest && $out == "$FW_D" ]]; then
      problems+=("the committed manifest is gone")
    fi
  fi
  [[ $(wc -l <"$W/case.out") -le $(wc -l <"$W/$s.clean.out") ]] || problems+=("more lines on stdout than the clean run")
  if [[ -f $out/manifest.jsonl ]] && ! fw_verify "$out/manifest.jsonl"; then
    problems+=("zinf-shard verify fails on $out/manifest.jsonl")
  fi
  if [[ $out != "$FW_D" && -f $FW_D/manifest.jsonl ]]; then  # the source of reshard
    [[ $(cd "$FW_D" && find . -path ./dp2 -prune -o -type f ! -name .zinf-lock -print0 | sort -z | xargs -0r sha256sum) == "$src_before" ]] ||
      problems+=("the source state changed")
  fi
  if declare -F "fw_file_$s" >/dev/null; then  # what an export writes: whole or absent
    local f
    f=$("fw_file_$s")
    if [[ $how == short ]]; then
      diff -r "$f" "$W/$s.clean.file" >/dev/null 2>&1 || problems+=("${f#"$W"/} is not the clean run's")
    elif [[ -e $f ]] && ! { [[ -d $f ]] && empty_dir "$f"; }; then
      diff -r "$f" "$W/$s.clean.file" >/dev/null 2>&1 || problems+=("${f#"$W"/} is torn: neither absent nor the clean run's")
    fi
    local ftemps
    ftemps=$(ls -d "$f".tmp.* "$f"/*.tmp.* "$f"/*.zinf-tmp.* 2>/dev/null)
    [[ -z $ftemps ]] || problems+=("temporaries left beside ${f#"$W"/}: $ftemps")
  fi
  local temps
  temps=$(fw_temps "$FW_D")
  [[ -z $temps ]] || problems+=("temporaries left: $temps")
  if ((${#problems[@]} == 0)); then
    pass "$name"
    FW_HELD=$((FW_HELD + 1))
  else
    local IFS=';'
    fail "$name" "${problems[*]}; stderr: ${err:0:400}"
    FW_FAILED=$((FW_FAILED + 1))
  fi
}

fw_program() { [[ $1 == train || $1 == diverge ]] && echo zinf-train || echo zinf-shard; }

# fw_walk SEED SCENARIO...: every site each scenario meets, with every fault
# that applies; with a SEED, one site of each kind per program instead,
# drawn with that seed from all of its scenarios' sites.
fw_walk() {
  local seed=$1 s
  shift
  : >"$W/all.sites"
  for s in "$@"; do
    fw_prepare "$s" || continue
    local kinds
    kinds=$(cut -f1 <<<"$FW_SITES" | sort -u | tr '\n' ' ')
    echo "# $s ($(fw_program "$s")): $(wc -l <<<"$FW_SITES") sites: $kinds"
    awk -v s="$s" -v p="$(fw_program "$s")" '{ print p "\t" s "\t" $0 }' <<<"$FW_SITES" >>"$W/all.sites"
  done
  local cases=$W/all.sites
  if [[ -n $seed ]]; then
    awk -F'\t' -v seed="$seed" 'BEGIN { srand(seed) } { k = $1 "\t" $3; n[k]++; if (rand() * n[k] < 1) pick[k] = $0 }
      END { for (k in pick) print pick[k] }' "$W/all.sites" | sort >"$W/sample.sites"
    cases=$W/sample.sites
    echo "# walking $(wc -l <"$cases") of $(wc -l <"$W/all.sites") sites: one of each kind per program (seed $seed)"
  fi
  FW_SITE_COUNT=$((FW_SITE_COUNT + $(wc -l <"$cases")))
  local prog kind path how hows i=0
  while IFS=$'\t' read -r prog s kind path; do
    [[ -n $kind ]] || continue
    FW_D=$W/$s FW_P=$W/$s.pristine
    hows=(EIO ENOSPC)
    [[ $kind == read || $kind == write ]] && hows+=(short)
    # A sample takes one fault per site, in turn from a seeded start.
    [[ -n $seed ]] && hows=("${hows[(seed + i++) % ${#hows[@]}]}")
    for how in "${hows[@]}"; do fw_case "$s" "$kind" "$path" "$how"; done
  done <"$cases"
}
FW_HELD=0 FW_FAILED=0 FW_SITE_COUNT=0
