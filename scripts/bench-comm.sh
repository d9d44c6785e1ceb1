#!/usr/bin/env bash
# The issue's target for zinf-commbench: zinf's allgather and reduce-scatter
# bus bandwidth at least 95% of the bare MPI calls (--raw) from 1MiB up, 4
# ranks on one machine. Rounds alternate zinf and the bare call; best of 9.
# Then the measurement behind the MPI backend's design: MPI's blocking
# collectives against its non-blocking ones (scripts/bench-mpi-nbc.cpp).
#   scripts/bench-comm.sh [NP]        (default 4; oversubscribed when needed)
set -euo pipefail
cd "$(dirname "$0")/.."
np=${1:-4}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
make --no-print-directory -s bin/zinf-commbench >&2
echo "# $(nproc) cores, $np ranks, $(uptime | sed 's/.*load/load/')"
for op in allgather reduce-scatter; do
  mpirun -np "$np" bin/zinf-commbench --op "$op" -b 1M -e 64M -f 2 -n 10 --rounds 9 --raw | grep -v '^# [0-9]'
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mpicxx -O2 -std=c++17 scripts/bench-mpi-nbc.cpp -o "$tmp/nbc"
echo "# MPI alone: blocking (coll/tuned) vs non-blocking (coll/libnbc), per operation"
mpirun -np "$np" "$tmp/nbc"
