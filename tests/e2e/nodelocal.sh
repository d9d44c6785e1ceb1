#!/usr/bin/env bash
# Node-local disks (zinf-manifest(5) rank_dirs; zinf-shard init --rank-dir):
# each rank's folder lies somewhere of its own, the manifest in the data
# directory. On this one machine a "node" is a mount namespace in which the
# other ranks' folders are covered by an empty tmpfs (unshare -m), so a rank
# that read or wrote another's files would fail. Checked: init under mpirun
# writes each rank's folder from its own process; training under mpirun
# reads and writes only its own folder, commits every rank's hashes in the
# one manifest, resumes, and gives the bits of the same run with every
# folder beneath the data directory; verify per node; reshard and init
# --force with rank folders; and the refusals: a rank folder missing (66),
# one zinf did not make or made for another rank (65, nothing written
# there), and bad --rank-dir values (64).
source "$(dirname "$0")/lib.bash"
source "$(dirname "$0")/train_lib.bash"
W=$(mktemp -d /var/tmp/zinf-e2e-nodelocal-XXXXXX)
on_exit "rm -rf '$W'"
M=gpt:layers=1,hidden=32,heads=2,vocab=256,seq=32
RUN=(--batch 2 --seq 16 --threads 1 --lr 3e-3 --schedule constant --json --quiet "${POOL[@]}")
cat "$ROOT"/man/*.1 >"$W/corpus.txt"
CORPUS=$W/corpus.txt
# What a manifest commits (tensor, rank, state, step, xxh3), not where.
committed() { jq -s -c '[.[] | select(has("schema") | not) | [.tensor, .rank, .state, .step, .xxh3]]' "$1"; }

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
mpi() { timeout -k 5 120 mpirun -np "$@"; }
# The nodes' disks: node<r> holds rank r's folder. as_node runs a command
# in a namespace where every other node's disk is an empty tmpfs; its rank
# comes from mpirun (OMPI_COMM_WORLD_RANK) or $NODE.
NODES=$W/nodes
mkdir -p "$NODES"/node{0,1}
cat >"$W/as-node" <<EOF
#!/usr/bin/env bash
r=\${OMPI_COMM_WORLD_RANK:-\$NODE}
for d in "$NODES"/node*; do
  [[ \$d == "$NODES/node\$r" ]] || mount -t tmpfs -o size=64k zinf-other-node "\$d" || exit 97
done
# (made by sudo for a user: the command runs as that user again)
[[ -z \${ZINF_NODE_UID:-} ]] || exec setpriv --reuid="\$ZINF_NODE_UID" --regid="\$ZINF_NODE_GID" --init-groups "\$@"
exec "\$@"
EOF
chmod +x "$W/as-node"
# The namespace and its mounts need root: a user's run gets them through
# password-less sudo, keeping mpirun's environment (-E), and the command
# runs as the user inside.
AS=(unshare -m --propagation private "$W/as-node")
if ((EUID != 0)) && command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
  AS=(sudo -n -E ZINF_NODE_UID="$(id -u)" ZINF_NODE_GID="$(id -g)" "${AS[@]}")
fi
isolated=1
NODE=1 "${AS[@]}" test ! -e "$NODES/node0/x" 2>/dev/null || isolated=0
if ((isolated)); then
  touch "$NODES/node0/x"
  NODE=1 "${AS[@]}" test ! -e "$NODES/node0/x" || isolated=0
  NODE=0 "${AS[@]}" test -e "$NODES/node0/x" || isolated=0
  rm -f "$NODES/node0/x"
fi
RD=(--rank-dir "$NODES/node%r/zinf/rank%r")

# ----------------------------------------------------------- the reference
# The same model, dp 2, every folder beneath the data directory.
"$SH" layout --model "$M" --dp 2 | "$SH" init --dir "$W/ref" "${POOL[@]}" >/dev/null
"$SH" cat -m "$W/ref/manifest.jsonl" --tensor wte.weight --state master >"$W/ref.wte"
ref0=$(committed "$W/ref/manifest.jsonl" | sha256sum)
mpi 2 "$TR" --manifest "$W/ref/manifest.jsonl" --text "$CORPUS" --steps 6 "${RUN[@]}" >"$W/ref.jsonl"
check "reference: 6 steps at dp 2" test "$(wc -l <"$W/ref.jsonl")" -ge 6

# ------------------------------------------------------------ bad options
refuse() { # WANT NAME ARGS...: init refuses with WANT, and writes nothing
  local want=$1 name=$2
  shift 2
  rm -rf "$W/bad" "$W/badr"
  out=$("$SH" layout --model "$M" --dp 2 | "$SH" init --dir "$W/bad" "${POOL[@]}" "$@" 2>"$W/.err")
  rc=$?
  err=$(<"$W/.err")
  expect_rc "$want" "$name"
  check "…nothing written ($name)" test ! -e "$W/bad/manifest.jsonl" -a ! -e "$W/badr"
}
refuse 64 "--rank-dir relative" --rank-dir "badr/rank%r"
refuse 64 "--rank-dir without %r for dp 2" --rank-dir "$W/badr/rank"
refuse 64 "--rank-dir with an unknown %x" --rank-dir "$W/badr/rank%r%x"
refuse 64 "--rank-dir given 3 times for dp 2" --rank-dir "$W/badr/a" --rank-dir "$W/badr/b" --rank-dir "$W/badr/c"
refuse 64 "--rank-dir with '..'" --rank-dir "$W/badr/../badr/rank%r"
mkdir -p "$W/full1" && echo keep >"$W/full1/precious"
run bash -c "'$SH' layout --model '$M' --dp 2 | '$SH' init --dir '$W/bad' ${POOL[*]} --rank-dir '$W/fresh0' --rank-dir '$W/full1'"
expect_rc 64 "a rank folder that holds other files is refused"
check "…the message names the folder" contains "$err" "$W/full1"
check "…its file is untouched, nothing else there" test "$(ls -A "$W/full1")" = precious -a "$(<"$W/full1/precious")" = keep
check "…no manifest" test ! -e "$W/bad/manifest.jsonl"

# ------------------------------------------- one process, two named folders
# --rank-dir once per rank: folders on different file systems (a tmpfs,
# which refuses O_DIRECT, and this disk).
SHM=$(mktemp -d /dev/shm/zinf-e2e-nl-XXXXXX)
on_exit "rm -rf '$SHM'"
run bash -c "'$SH' layout --model '$M' --dp 2 | '$SH' init --dir '$W/two' ${POOL[*]} --rank-dir '$SHM/r0' --rank-dir '$W/elsewhere/r1'"
expect_rc 0 "init, one process, rank folders on a tmpfs and on disk"
check "…the header names them" test "$(jq -c 'select(has("schema")) | .rank_dirs' "$W/two/manifest.jsonl")" = "[\"$SHM/r0\",\"$W/elsewhere/r1\"]"
check "…rank 0's files on the tmpfs, rank 1's on disk, none beneath --dir" \
  test -s "$SHM/r0/master.bin" -a -s "$W/elsewhere/r1/master.bin" -a ! -e "$W/two/rank0" -a ! -e "$W/two/rank1"
check "…each folder marked with its rank" \
  test "$(jq -c .rank "$SHM/r0/.zinf-rank")$(jq -c .rank "$W/elsewhere/r1/.zinf-rank")" = 01
run "$SH" verify -m "$W/two/manifest.jsonl"
expect_rc 0 "…verify reads both folders"
run "$SH" inspect -m "$W/two/manifest.jsonl"
check "…inspect shows the rank folders" contains "$out" "rank folders (node-local): $SHM/r0"
"$SH" cat -m "$W/two/manifest.jsonl" --tensor wte.weight --state master >"$W/two.wte"
check "…cat gathers the same tensor as the plain layout" cmp -s "$W/ref.wte" "$W/two.wte"

# A manifest that aims a rank folder elsewhere: refused, nothing written there.
jq -c 'if has("schema") then .rank_dirs[1] = "'"$W/victim"'" else . end' "$W/two/manifest.jsonl" >"$W/evil.jsonl"
mkdir -p "$W/victim" && cp "$W/elsewhere/r1/master.bin" "$W/victim/master.bin"
before=$(sums "$W/victim")
run bash -c "'$SH' cat -m '$W/evil.jsonl' --data-dir '$W/two' --tensor wte.weight --state master >/dev/null"
expect_rc 65 "cat: a rank folder without zinf's marker is refused"
check "…naming the rank and the folder" has_all "$err" "rank 1" "$W/victim"
echo '{"zinf":"rank folder","rank":0}' >"$W/victim/.zinf-rank"
run "$SH" verify -m "$W/evil.jsonl" --data-dir "$W/two"
expect_rc 65 "verify: a marker naming another rank is refused"
rm -f "$W/victim/.zinf-rank"
mkdir -p "$W/evil" && cp "$W/evil.jsonl" "$W/evil/manifest.jsonl"
run bash -c "jq -c 'if has(\"schema\") then .dir = \"$W/evil\" else . end' '$W/evil.jsonl' >'$W/evil/manifest.jsonl'; \
  mpirun -np 2 '$TR' --manifest '$W/evil/manifest.jsonl' --text '$CORPUS' --steps 2 ${RUN[*]}"
expect_rc 65 "zinf-train: every rank refuses a manifest whose rank folder zinf did not make"
check "…the folder it names is untouched" test "$(sums "$W/victim")" = "$before"
jq -c 'if has("schema") then . else (if .rank == 0 then .file = "rank1/x.bin" else . end) end' \
  "$W/two/manifest.jsonl" >"$W/misnamed.jsonl"
run "$SH" verify -m "$W/misnamed.jsonl"
expect_rc 65 "a record whose file is not its rank's (rank1/x.bin for rank 0) is refused"

# reshard dp 2 -> 1 into a node-local folder, and back to dp 2 beneath a directory.
run bash -c "'$SH' reshard -m '$W/two/manifest.jsonl' --dp 1 --dir '$W/one' ${POOL[*]} --rank-dir '$SHM/one%r'"
expect_rc 0 "reshard into a rank folder"
check "…its rank 0 files are there" test -s "$SHM/one0/master.bin" -a ! -e "$W/one/rank0"
"$SH" cat -m "$W/one/manifest.jsonl" --tensor wte.weight --state master >"$W/one.wte"
check "…with the same values" cmp -s "$W/ref.wte" "$W/one.wte"

# ------------------------------------------------------- one node per rank
if ((isolated == 0)); then
  skip "nodes as mount namespaces" "unshare -m or mount -t tmpfs is not allowed here (neither root nor password-less sudo)"
else
  run bash -c "'$SH' layout --model '$M' --dp 2 >'$W/nl.layout' && \
    mpirun -np 2 ${AS[*]} '$SH' init -m '$W/nl.layout' --dir '$W/nl' ${POOL[*]} ${RD[*]}"
  expect_rc 0 "init under mpirun -np 2, each node writing only its own rank folder"
  check "…node 0 holds rank 0's files only, node 1 rank 1's" \
    test -s "$NODES/node0/zinf/rank0/param.bin" -a -s "$NODES/node1/zinf/rank1/param.bin" \
    -a ! -e "$NODES/node0/zinf/rank1" -a ! -e "$NODES/node1/zinf/rank0"
  check "…the manifest holds every rank's hashes" \
    test "$(jq -s '[.[] | select(has("xxh3"))] | length' "$W/nl/manifest.jsonl")" = \
    "$(jq -s '[.[] | select(has("schema") | not)] | length' "$W/nl/manifest.jsonl")"
  check "…the values are the plain layout's" test "$(committed "$W/nl/manifest.jsonl" | sha256sum)" = "$ref0"

  t0=$EPOCHREALTIME
  mpi 2 "${AS[@]}" "$TR" --manifest "$W/nl/manifest.jsonl" --text "$CORPUS" --steps 3 "${RUN[@]}" >"$W/nl.jsonl" 2>"$W/nl.err"
  rc=$?
  ms_since "$t0"
  healthy_s=$(((REPLY + 999) / 1000)) # the baseline of "promptly", below
  err=$(<"$W/nl.err")
  expect_rc 0 "train 3 steps under mpirun, each rank seeing only its own node's disk"
  check "…rank 0 committed step 3 for both ranks" test "$(manifest_step "$W/nl/manifest.jsonl")" = 3
  mpi 2 "${AS[@]}" "$TR" --manifest "$W/nl/manifest.jsonl" --text "$CORPUS" --steps 6 --resume "${RUN[@]}" \
    >>"$W/nl.jsonl" 2>"$W/nl.err"
  rc=$?
  err=$(<"$W/nl.err")
  expect_rc 0 "…resumed for 3 more"
  check "…losses of steps 1-6 equal the plain layout's to the bit" \
    test "$(losses "$W/nl.jsonl")" = "$(losses "$W/ref.jsonl" 1 6)"
  check "…and so does every committed hash" \
    test "$(committed "$W/nl/manifest.jsonl" | sha256sum)" = "$(committed "$W/ref/manifest.jsonl" | sha256sum)"
  for r in 0 1; do
    run env NODE=$r "${AS[@]}" "$SH" verify -m "$W/nl/manifest.jsonl" --ranks $r
    expect_rc 0 "verify --ranks $r on node $r"
  done
  run env NODE=0 "${AS[@]}" "$SH" verify -m "$W/nl/manifest.jsonl"
  expect_rc 66 "verify of every rank on node 0: rank 1's folder is not there (66)"
  check "…naming rank 1 and its folder" has_all "$err" "rank 1" "$NODES/node1/zinf/rank1"

  # Node 1's disk was wiped: every rank fails fast, the manifest stays.
  mv "$NODES/node1/zinf" "$NODES/node1/zinf.away"
  before=$(sha256sum <"$W/nl/manifest.jsonl")
  # Promptly: not waiting for the other rank's deadline (300 s by default;
  # mpi's 120 s stop would come first). The job's start counts, seconds on
  # a loaded machine or where the host name is slow to resolve: the bound is
  # 30 s plus three times the healthy 3-step job's time above.
  SECONDS=0
  mpi 2 "${AS[@]}" "$TR" --manifest "$W/nl/manifest.jsonl" --text "$CORPUS" --steps 8 --resume "${RUN[@]}" \
    >/dev/null 2>"$W/nl.err"
  rc=$?
  err=$(<"$W/nl.err")
  expect_rc 66 "a rank whose folder is missing on its node: the job exits 66"
  check "…promptly ($SECONDS s; a healthy 3-step job took $healthy_s s)" test "$SECONDS" -lt $((30 + 3 * healthy_s))
  check "…naming the rank and the folder" has_all "$err" "rank 1" "$NODES/node1/zinf/rank1"
  check "…the manifest unchanged" test "$(sha256sum <"$W/nl/manifest.jsonl")" = "$before"
  mv "$NODES/node1/zinf.away" "$NODES/node1/zinf"

  # init --force with new rank folders: the old node-local files go once
  # the new manifest is committed.
  run bash -c "mpirun -np 2 ${AS[*]} '$SH' init -m '$W/nl.layout' --dir '$W/nl' --force ${POOL[*]} \
    --rank-dir '$NODES/node%r/zinf2/rank%r'"
  expect_rc 0 "init --force into new rank folders"
  check "…the old folders' state files are gone, the new ones there" \
    test -z "$(find "$NODES"/node*/zinf -type f ! -name .zinf-rank ! -name .zinf-lock)" \
    -a -s "$NODES/node1/zinf2/rank1/master.bin"
  run "$SH" verify -m "$W/nl/manifest.jsonl"
  expect_rc 0 "…and the new state verifies"
fi

# ------------------------------------- scripts/slurm/train.sbatch, with srun as mpirun
# A stand-in srun: its options dropped, the command run once per task under mpirun.
mkdir -p "$W/fake"
cat >"$W/fake/srun" <<'EOF'
#!/usr/bin/env bash
while [[ $1 == -* ]]; do shift; done
exec timeout -k 5 120 mpirun -np "$((SLURM_NNODES * SLURM_NTASKS_PER_NODE))" "$@"
EOF
chmod +x "$W/fake/srun"
job() { # STEPS: the batch script as sbatch would run it, on 2 "nodes"
  env PATH="$W/fake:$PATH" SLURM_NNODES=2 SLURM_NTASKS_PER_NODE=1 SLURM_JOB_NODELIST="n[1-2]" \
    SLURM_SUBMIT_DIR="$W" ZINF_BIN="$BIN" MODEL="$M" SHARED="$W/job" LOCAL="$W/local" TEXT="$CORPUS" \
    STEPS=$1 BATCH=2 SEQ=16 EXTRA="--threads 1 --pinned 8MiB --pinned-buffer 256KiB --quiet" \
    bash "$ROOT/scripts/slurm/train.sbatch"
}
run job 3
expect_rc 0 "train.sbatch: lays out, inits the rank folders in LOCAL and trains 3 steps"
check "…rank folders in LOCAL, the manifest in SHARED at step 3" \
  test -s "$W/local/rank0/master.bin" -a -s "$W/local/rank1/master.bin" -a \
  "$(manifest_step "$W/job/manifest.jsonl")" = 3
run job 5
expect_rc 0 "train.sbatch again: resumes to step 5"
check "…5 step records in train.jsonl, the manifest at step 5" \
  test "$(jq -s length "$W/job/train.jsonl")" = 5 -a "$(manifest_step "$W/job/manifest.jsonl")" = 5
run "$SH" verify -m "$W/job/manifest.jsonl"
expect_rc 0 "…and it verifies"

finish
