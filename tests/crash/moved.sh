#!/usr/bin/env bash
# Trials of moved and shared folders (issue 47): a committed state is made
# (its tiers, and whether its rank's files lie in a node-local rank folder,
# drawn by the seed) and trained two steps; then one of
#
#   copy     cp -r STATE COPY                  (the origin stays)
#   move     mv STATE MOVED                    (the origin is gone)
#   reinit   mv STATE MOVED, then a new state initialised at STATE's path
#            (with rank folders: the same --rank-dir first, refused with 73)
#   share    (rank folders) a second state initialised elsewhere with the
#            same --rank-dir: refused with 73, then taken with --force
#
# is done to it, and every program that writes (or locks) a state is run on
# what it left, in an order drawn by the seed: zinf-train --resume,
# zinf-sample, zinf-shard verify, export, reshard, and (after the folder is
# adopted with verify --data-dir) zinf-train, init --force and import
# --force into it. Each must exit as documented: 65 on a copied or moved
# folder before adoption (73 on a rank folder another state owns), 0 after;
# and the origin's files and its lock file must be byte-identical after
# every refused program (nothing of the other folder opened for writing).
# At the end every committed state verifies (but the one whose rank folder
# --force took, which must be refused with 65), and no temporaries are left.
#
#   tests/crash/moved.sh [--seed S] [--trials N] [--keep]
#
# --seed S: trial i has seed S+i (default: drawn, printed); --trials N
# (default 10); --keep: keep the work folder. ZINF_CRASH_DIR: where the
# folder goes (default /var/tmp).
source "$(dirname "$0")/../e2e/lib.bash"
source "$(dirname "$0")/../e2e/train_lib.bash"
source "$(dirname "$0")/lib.bash"
crash_options "$@"
((${#args[@]} == 0)) || { echo "${0##*/}: unknown option ${args[0]} (see --help)" >&2; exit 64; }
name=moved
crash_dir "$name"
SA=$BIN/zinf-sample
M=gpt:layers=1,hidden=32,heads=2,vocab=256,seq=32
echo "# moved and shared folders: seed $seed, $trials trials, $M"
head -c 20000 "$ROOT/man/zinf-train.1" >"$W/corpus.txt"
R=(--text "$W/corpus.txt" --batch 2 --seq 16 --threads 1 "${POOL[@]}" --schedule constant --json --quiet)
"$SH" layout --model "$M" --param-dtype fp32 >"$W/weights.layout"
"$SH" init "${POOL[@]}" --dir "$W/wsrc" <"$W/weights.layout" >/dev/null 2>&1
"$SH" export "${POOL[@]}" -m "$W/wsrc/manifest.jsonl" --to "$W/weights.bin" --format llmc >/dev/null 2>&1
[[ -s $W/weights.bin ]] || { fail "the references" "init or export failed"; crash_finish "$name"; exit 1; }

# state_sums DIR [RANK_FOLDER]: every file of a state (its lock file too).
state_sums() {
  local d
  for d in "$@"; do [[ -d $d ]] && (cd "$d" && find . -type f -print0 | sort -z | xargs -0r sha256sum); done
}
# origin_held: the origin's files, lock file included, are as they were.
origin_held() { [[ $(state_sums "$O" "${ORD[@]}") == "$origin_sums" ]]; }
# step_of MANIFEST: its step.
step_of() { jq -s '[.[1:][].step // 0] | max' "$1"; }
# program WANT NAME CMD...: CMD exits WANT (else why_not), its stdout and
# stderr in $W/p.out, $W/p.err; the origin unchanged after a refusal.
program() {
  local want=$1 what=$2
  shift 2
  "$@" >"$W/p.out" 2>"$W/p.err"
  local r=$?
  ((r == want)) || why_not "$what exited $r, not $want: $(head -c 300 "$W/p.err")"
  if ((want != 0)) && [[ -n ${origin_sums:-} ]] && ! origin_held; then
    why_not "$what (refused) changed the origin's files or lock file"
    origin_sums=$(state_sums "$O" "${ORD[@]}")
  fi
  ran+=("${what%% *}")
}

landed=()
for ((i = 0; i < trials; i++)); do
  trial_begin "$i"
  T=$W/t$i
  mkdir -p "$T"
  O=$T/state C=$T/other RD=()
  below 2
  tiers=(nvme nvme)
  ((REPLY)) && tiers=(cpu cpu)
  below 2
  if ((REPLY)); then RD=(--rank-dir "$T/local/rank%r"); fi
  below 4
  scenario=(copy move reinit share)
  scenario=${scenario[REPLY]}
  [[ $scenario == share && ${#RD[@]} == 0 ]] && scenario=copy
  "$SH" layout --model "$M" --param-dtype fp32 --param "${tiers[0]}" --optim "${tiers[1]}" >"$T/layout"
  "$SH" init "${POOL[@]}" --dir "$O" "${RD[@]}" <"$T/layout" >/dev/null 2>"$T/init.err" ||
    why_not "init of the origin failed: $(head -c 200 "$T/init.err")"
  "$TR" --manifest "$O/manifest.jsonl" --steps 2 "${R[@]}" >/dev/null 2>&1 || why_not "training the origin failed"
  ORD=()
  [[ ${#RD[@]} -gt 0 ]] && ORD=("$T/local/rank0")
  ran=()
  origin_sums=
  case $scenario in
  copy) cp -r "$O" "$C" ;;
  move) mv "$O" "$C" ;;
  reinit)
    mv "$O" "$C"
    if ((${#RD[@]})); then
      program 73 "init at the moved state's old path, into its rank folders" \
        "$SH" init "${POOL[@]}" --dir "$O" "${RD[@]}" <"$T/layout"
      [[ -e $O ]] && why_not "the refused init left $O"
      "$SH" init "${POOL[@]}" --dir "$O" --rank-dir "$T/local2/rank%r" --seed 9 <"$T/layout" >/dev/null 2>&1
    else
      "$SH" layout --model "$M" --param-dtype fp32 --seed 9 | "$SH" init "${POOL[@]}" --dir "$O" >/dev/null 2>&1
    fi
    ;;
  share)
    # A second state with the same --rank-dir: refused; the origin stays whole.
    origin_sums=$(state_sums "$O" "${ORD[@]}")
    program 73 "init of a second state into the origin's rank folders" \
      "$SH" init "${POOL[@]}" --dir "$C" "${RD[@]}" <"$T/layout"
    [[ -e $C ]] && why_not "the refused init left $C"
    "$TR" --manifest "$O/manifest.jsonl" --steps 3 --resume "${R[@]}" >/dev/null 2>&1 || why_not "the origin does not train on"
    origin_sums=
    program 0 "init --force of the second state, taking the rank folders" \
      "$SH" init "${POOL[@]}" --dir "$C" "${RD[@]}" --force <"$T/layout"
    program 65 "verify of the origin, whose rank folder was taken" "$SH" verify "${POOL[@]}" -m "$O/manifest.jsonl"
    program 65 "zinf-train of the origin, whose rank folder was taken" \
      "$TR" --manifest "$O/manifest.jsonl" --steps 4 --resume "${R[@]}"
    program 0 "zinf-train of the second state" "$TR" --manifest "$C/manifest.jsonl" --steps 1 "${R[@]}"
    expect "the second state verifies" verifies "$C/manifest.jsonl"
    landed+=("share")
    trial_end "share: ${tiers[0]} tiers, rank folders; $(IFS=,; echo "${ran[*]}"); seed=$trial_seed"
    continue
    ;;
  esac
  # The origin (for a move: gone, or the new state at its path) from now on.
  [[ -d $O ]] && origin_sums=$(state_sums "$O" "${ORD[@]}")
  [[ $scenario == reinit && ${#RD[@]} -gt 0 ]] && ORD=("$T/local2/rank0") && origin_sums=$(state_sums "$O" "${ORD[@]}")
  # Every program on the copied or moved folder, in a seeded order: refused (65).
  progs=(train sample verify export reshard cat)
  for ((k = ${#progs[@]} - 1; k > 0; k--)); do
    below $((k + 1))
    tmp=${progs[k]} progs[k]=${progs[REPLY]} progs[REPLY]=$tmp
  done
  for p in "${progs[@]}"; do
    case $p in
    train) program 65 "train on the $scenario" "$TR" --manifest "$C/manifest.jsonl" --steps 3 --resume "${R[@]}" ;;
    sample) program 65 "sample of the $scenario" "$SA" -m "$C/manifest.jsonl" --prompt x -n 2 --threads 1 "${POOL[@]}" ;;
    verify) program 65 "verify of the $scenario" "$SH" verify "${POOL[@]}" -m "$C/manifest.jsonl" ;;
    export)
      program 65 "export of the $scenario" "$SH" export "${POOL[@]}" -m "$C/manifest.jsonl" --to "$T/x.bin" --format llmc
      [[ -e $T/x.bin ]] && why_not "the refused export wrote its file"
      ;;
    reshard)
      program 65 "reshard of the $scenario" "$SH" reshard "${POOL[@]}" -m "$C/manifest.jsonl" --dp 2 --dir "$T/r"
      [[ -e $T/r ]] && why_not "the refused reshard made $T/r"
      ;;
    cat) program 65 "cat of the $scenario" "$SH" cat --sums "${POOL[@]}" -m "$C/manifest.jsonl" ;;
    esac
  done
  # Adoption: a copy whose rank folder the origin still names cannot be.
  if [[ $scenario == copy && ${#RD[@]} -gt 0 ]]; then
    program 65 "adopting a copy that shares the origin's rank folder" \
      "$SH" verify "${POOL[@]}" -m "$C/manifest.jsonl" --data-dir "$C"
    [[ $(jq -r 'select(.schema) | .dir' "$C/manifest.jsonl") == "$(realpath "$C")" ]] &&
      why_not "the refused adoption committed a manifest naming the copy"
  else
    program 0 "adopting the $scenario" "$SH" verify "${POOL[@]}" -m "$C/manifest.jsonl" --data-dir "$C"
    [[ $(jq -r 'select(.schema) | .dir' "$C/manifest.jsonl") == "$(realpath "$C")" ]] ||
      why_not "the adoption did not commit a manifest naming $C"
    program 0 "train of the adopted $scenario" "$TR" --manifest "$C/manifest.jsonl" --steps 3 --resume "${R[@]}"
    [[ $(step_of "$C/manifest.jsonl") == 3 ]] || why_not "the adopted state is not at step 3 after training"
    expect "the adopted $scenario verifies" verifies "$C/manifest.jsonl"
    ! origin_held && [[ -n $origin_sums ]] && why_not "training the adopted $scenario changed the origin"
    below 2
    if ((REPLY)); then
      program 0 "init --force into the adopted $scenario" "$SH" init "${POOL[@]}" --dir "$C" --force <"$T/layout"
    else
      program 0 "import --force into the adopted $scenario" \
        "$SH" import "${POOL[@]}" --from "$W/weights.bin" --dir "$C" --force <"$T/layout"
    fi
    expect "…which verifies" verifies "$C/manifest.jsonl"
  fi
  # The origin (where one is) is whole: it verifies and trains on.
  if [[ -d $O ]]; then
    [[ -n $origin_sums ]] && ! origin_held && why_not "the origin's files changed"
    expect "the origin verifies" verifies "$O/manifest.jsonl"
    "$TR" --manifest "$O/manifest.jsonl" --steps 4 --resume "${R[@]}" >/dev/null 2>"$T/o.err" ||
      why_not "the origin does not resume: $(head -c 200 "$T/o.err")"
  fi
  [[ -z $(leftovers "$T") ]] || why_not "temporaries left: $(leftovers "$T" | head -3 | tr '\n' ' ')"
  landed+=("$scenario")
  trial_end "$scenario: ${tiers[0]} tiers$([[ ${#RD[@]} -gt 0 ]] && echo ', rank folder'); $(IFS=,; echo "${ran[*]}"); seed=$trial_seed"
  ((keep)) || rm -rf "$T"
done
tally "scenarios"
crash_finish "$name"
