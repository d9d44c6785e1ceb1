#!/usr/bin/env bash
# Walks every I/O site that zinf-shard init (over a committed state, and
# into a new folder), reshard, import and export (llm.c's and Hugging Face's
# formats) and zinf-train (checkpoint commits, and a run that diverges)
# meet, failing each in turn with EIO, ENOSPC and a short transfer;
# checks exit codes, messages, and that nothing committed is damaged
# (tests/e2e/fault_lib.bash). make test walks a seeded sample of it
# (tests/e2e/faults.sh).
#
#   scripts/fault-walk.sh [--sample SEED] [--dir DIR] [SCENARIO...]
#
# SCENARIO: init fresh reshard train import hfimport export hfexport
# diverge (default: all). --sample SEED walks one site of each kind per
# program instead of all. --dir: where the states
# live (default /var/tmp, a disk that takes O_DIRECT; /dev/shm is faster).
# Prints one line per case, then "sites N, cases N, held N, failed N"; exits
# 1 when any case failed.
set -u
usage() { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; }
seed='' dir=/var/tmp
scenarios=()
while (($#)); do
  case $1 in
  -h | --help) usage; exit 0 ;;
  --sample) seed=${2:?--sample needs a seed}; shift ;;
  --dir) dir=${2:?--dir needs a folder}; shift ;;
  init | fresh | reshard | train | import | hfimport | export | hfexport | diverge) scenarios+=("$1") ;;
  *) echo "fault-walk.sh: unknown argument '$1'" >&2; usage >&2; exit 64 ;;
  esac
  shift
done
source "$(dirname "$0")/../tests/e2e/lib.bash"
source "$ROOT/tests/e2e/fault_lib.bash"
((${#scenarios[@]})) || scenarios=("${FW_SCENARIOS[@]}")
W=$(mktemp -d "$dir/zinf-fault-walk-XXXXXX") || exit 73
on_exit "rm -rf '$W'"
start=$SECONDS
check_sources
fw_walk "$seed" "${scenarios[@]}"
echo "sites $FW_SITE_COUNT, cases $((FW_HELD + FW_FAILED)), held $FW_HELD, failed $FW_FAILED ($((SECONDS - start)) s)"
finish
