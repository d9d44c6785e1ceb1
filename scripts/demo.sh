#!/usr/bin/env bash
# make demo: the most complete pipeline zinf has today, on built-in defaults,
# in a scratch directory on disk (ZINF_DEMO_DIR, else $TMPDIR, else /var/tmp).
#   1. sweep the drive: block size x queue depth x queues
#   2. pick the best engine configuration (--best) into engine.json
#   3. zinf-plan: the paper's memory and bandwidth model fed with a quick sweep
#      and the CPU AdamW update, both as JSON: where GPT-2 1.5B's states would go
#      with a 16GiB GPU, this machine's memory and this disk, and how efficiently
#   4. write a 512MiB "state file" and read it back verified
#   5. read it through the library API with that configuration (zinf-iobench)
#   6. stress the pinned pool from 4 threads, every buffer checked (zinf-pinstress)
#   7. stream the state file through a 64MiB pinned pool, 8x smaller than it
#      (zinf-streambench): how zinf moves a partition larger than its pinned memory
#   8. lay GPT-2 124M out over 2 ranks, initialise every partition on disk with
#      engine.json (under mpirun -np 2, each process its own rank), and verify
#      every xxh3: layout | init | verify, one pipe
#   9. inspect the manifest: tensors, bytes per rank, totals per tier
#  10. reshard to 3 ranks and show that a tensor's bytes did not change
#  11. zinf-commbench under mpirun -np 2: allgather and reduce-scatter through
#      zinf's communicator beside the bare MPI calls, every result checked
#  12. zinf-optbench: the CPU AdamW update against the memory bandwidth, then
#      the optimizer step with its state in memory and streamed from disk
#  13. zinf-train: a small GPT (byte-level, vocab 256) laid out over 2 ranks
#      and initialised on disk, then trained under mpirun -np 2 on a corpus
#      made of the repository's own sources and man pages: the loss falls
#      below the text's unigram entropy, the validation loss with it
#  14. plots of the sweep, the collectives, the optimizer step and the
#      training run (scripts/plot.sh), kept with their JSON Lines
#  15. zinf-sample: text from the model step 13 trained, greedy and drawn
# The scratch directory goes at the end; the JSON Lines and the plots stay in
# a results folder beside it (ZINF_DEMO_OUT, else zinf-demo-results-* there).
set -euo pipefail
cd "$(dirname "$0")/.."
parent=${ZINF_DEMO_DIR:-${TMPDIR:-/var/tmp}}
dir=$(mktemp -d "$parent/zinf-demo-XXXXXX")
trap 'rm -rf "$dir"' EXIT
out=${ZINF_DEMO_OUT:-$(mktemp -d "$parent/zinf-demo-results-XXXXXX")}
mkdir -p "$out"

say() { printf '\n== %s\n' "$*" >&2; }
# mpirun refuses root without both, and a small machine has fewer cores than ranks.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
launch=()
command -v mpirun >/dev/null && launch=(mpirun -np 2)

say "1/15 zinf-nvmebench: sweep in $dir (JSON Lines kept in $out/nvmebench.jsonl)"
bin/zinf-nvmebench --dir "$dir" --size 256MiB -b 128KiB,1MiB,4MiB -d 4,32 -Q 1,2 --json -q |
  tee "$out/nvmebench.jsonl" | jq -c '{op, engine, block_size, queue_depth, queues, gibps: (.gibps * 1000 | round / 1000)}'

say "2/15 zinf-nvmebench --best: the engine configuration, in the keys the engine reads"
bin/zinf-nvmebench --dir "$dir" --size 256MiB -b 1MiB,4MiB -d 16,32 -Q 1,2 --best -q >"$dir/engine.json"
cat "$dir/engine.json"

say "3/15 zinf-plan: GPT-2 1.5B on a 16GiB GPU (12 GB/s PCIe, given), this machine's memory, this disk and CPU (measured)"
bin/zinf-nvmebench --dir "$dir" --size 256MiB -b 1MiB,4MiB -d 32 -Q 2 --json -q >"$dir/nvme.jsonl"
bin/zinf-optbench --params 20M --state update --steps 3 --json -q >"$dir/optim.jsonl"
bin/zinf-plan --model gpt2-1.5b --gpu-mem 16GiB --bw-cpu-gpu 12 --nvme "$dir" \
  --bench "$dir/nvme.jsonl" "$dir/optim.jsonl" -q

say "4/15 a 512MiB state file, written and read back with an xxh3 check of every 4KiB"
bin/zinf-nvmebench --file "$dir/state.bin" --size 512MiB -b 1MiB -d 32 -Q 2 --verify --keep --json -q |
  jq -c '{op, engine, block_size, gibps: (.gibps * 1000 | round / 1000), verify}'

say "5/15 zinf-iobench: one Engine::read of the whole file with engine.json"
bin/zinf-iobench --file "$dir/state.bin" --config "$dir/engine.json" --rounds 3 -q

say "6/15 zinf-pinstress: 4 threads lease, fill, hash and check a 128MiB pinned pool for 3s"
bin/zinf-pinstress --pinned 128MiB --pinned-buffer 8MiB -t 4 -s 3s --max-lease 3 -q

say "7/15 zinf-streambench: the 512MiB state file through a 64MiB pinned pool"
bin/zinf-streambench --file "$dir/state.bin" --config "$dir/engine.json" --pinned 64MiB --pinned-buffer 8MiB -q

say "8/15 zinf-shard: layout gpt2-124m --dp 2 | ${launch[*]:+${launch[*]} }init --dir $dir/run | verify > run.manifest"
bin/zinf-shard layout --model gpt2-124m --dp 2 |
  "${launch[@]}" bin/zinf-shard init --dir "$dir/run" --config "$dir/engine.json" |
  bin/zinf-shard verify --config "$dir/engine.json" >"$dir/run.manifest"
head -c 400 "$dir/run.manifest"; echo " ..."

say "9/15 zinf-shard inspect: the first tensors and the totals"
bin/zinf-shard inspect -m "$dir/run.manifest" | sed -n '1,9p;/^# tier/,$p'

say "10/15 zinf-shard reshard --dp 3, then cat wte.weight (master, fp32) from both layouts"
bin/zinf-shard reshard --dp 3 --dir "$dir/run3" -m "$dir/run.manifest" >"$dir/run3.manifest"
for m in run run3; do
  printf '%-5s wte.weight master sha256 %s\n' "$m" \
    "$(bin/zinf-shard cat -m "$dir/$m.manifest" --tensor wte.weight --state master | sha256sum | cut -c1-16)"
done

say "11/15 zinf-commbench: allgather and reduce-scatter over ${launch[*]:-one process}, beside the bare MPI calls"
: >"$out/commbench.jsonl"
for op in allgather reduce-scatter; do
  "${launch[@]}" bin/zinf-commbench --op "$op" -b 64KiB -e 16MiB -f 4 -n 10 --raw --check --json |
    tee -a "$out/commbench.jsonl" |
    jq -c 'def r: if type == "number" then . * 100 | round / 100 else . end;
           {op, bytes, busbw_gbps: (.busbw_gbps | r), raw_busbw_gbps: (.raw_busbw_gbps | r), wrong}'
done

say "12/15 zinf-optbench: CPU AdamW alone, then the optimizer step with its state in memory and on NVMe"
bin/zinf-optbench --params 20M --steps 3 --dir "$dir" -q --json | tee "$out/optbench.jsonl" |
  jq -c '{kind, state, seconds: (.seconds * 1000 | round / 1000), update_seconds, wait_seconds, commit_seconds}'

say "13/15 zinf-train: a 4-layer byte-level GPT over ${launch[*]:-one process} on the repository's own sources, parameters, optimizer state and activation checkpoints on NVMe (the ZeRO-Infinity engine, the optimizer overlapped with backward)"
ranks=$(( ${#launch[@]} ? 2 : 1 ))
cat man/*.[157] README.md libzinf/include/zinf/*.hpp libzinf/src/*/*.cpp >"$dir/corpus.txt"
bin/zinf-shard layout --model gpt:layers=4,hidden=128,heads=4,vocab=256,seq=128 --dp "$ranks" \
    --param nvme --optim nvme |
  "${launch[@]}" bin/zinf-shard init --dir "$dir/gpt" -q >/dev/null
"${launch[@]}" bin/zinf-train --manifest "$dir/gpt/manifest.jsonl" --text "$dir/corpus.txt" --steps 150 \
  --batch $(( 8 / ranks )) --seq 128 --lr 2e-3 --warmup 10 --shuffle --eval-every 25 --eval-batches 4 --offload-activations nvme --json |
  tee "$out/train.jsonl" |
  jq -c 'select(.step == 1 or .val_loss != null) | {step, loss, val_loss, tokens_per_s: (.tokens_per_s | round)}'

say "14/15 plots: the sweep, the collectives, the optimizer step and the training run"
for kind in nvmebench commbench optbench train; do
  scripts/plot.sh "$kind" "$out/$kind.jsonl" >"$out/$kind.png"
  echo "$out/$kind.png" >&2
done

say "15/15 zinf-sample: the model step 13 trained continues a line of its corpus, greedy, then drawn at temperature 0.8"
for t in 0 0.8; do
  printf 'temperature %s: // The ' "$t"  # the prompt; zinf-sample prints what follows it
  "${launch[@]}" bin/zinf-sample -m "$dir/gpt/manifest.jsonl" --prompt '// The ' -n 100 --temperature "$t" --seed 1 -q
  echo
done

say "done: the JSON Lines and plots are in $out; every program and its options are in man/ (man -l man/zinf-nvmebench.1)"
