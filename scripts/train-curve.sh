#!/usr/bin/env bash
# The loss curve of BENCHMARKS.md: a small byte-level GPT trained for 300
# steps on text this machine carries (the repository's own man pages, docs
# and sources; or FILES given as arguments), the validation loss every 25
# steps against the unigram entropy of the text.
#   scripts/train-curve.sh [--steps N] [--np N] [FILE...]
# Prints the JSON Lines of zinf-train (zinf.train/1) on stdout; a summary on stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=300 np=1
while [[ $# -gt 0 ]]; do
  case $1 in
    --steps) steps=$2; shift 2 ;;
    --np) np=$2; shift 2 ;;
    -h|--help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) break ;;
  esac
done
dir=$(mktemp -d "${TMPDIR:-/var/tmp}/zinf-curve-XXXXXX")
trap 'rm -rf "$dir"' EXIT
if [[ $# -gt 0 ]]; then
  cat "$@" >"$dir/corpus.txt"
else
  cat man/*.[157] README.md BENCHMARKS.md libzinf/include/zinf/*.hpp >"$dir/corpus.txt"
fi
echo "# corpus: $(stat -c %s "$dir/corpus.txt") bytes" >&2
launch=()
if ((np > 1)); then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  launch=(mpirun -np "$np")
fi
bin/zinf-shard layout --model gpt:layers=4,hidden=128,heads=4,vocab=256,seq=128 --dp "$np" \
    --param-dtype fp32 --param cpu --optim cpu |
  "${launch[@]}" bin/zinf-shard init --dir "$dir/gpt" -q >/dev/null
"${launch[@]}" bin/zinf-train --manifest "$dir/gpt/manifest.jsonl" --text "$dir/corpus.txt" --steps "$steps" \
  --batch $((8 / np)) --seq 128 --lr 2e-3 --warmup 20 --shuffle --eval-every 25 --eval-batches 8 --json
