#!/usr/bin/env bash
# TCP small-message allreduce latency, ferroccl beside Open MPI's TCP path,
# in alternating rounds (issue 17): one line per (peer, round, bytes, us).
#   bench/tcp-latency.sh RANKS [ROUNDS] [PERF ...]
# PERF: ferroccl-perf builds to compare, each labelled by its file name
# (default: target/release/ferroccl-perf, labelled "ferroccl"); every round
# runs each of them, then Open MPI (8 B to 32 KiB by 4x, and 64 KiB).
# Needs Open MPI (../shared/peers/run.sh installs it and builds mpi_bench once).
set -euo pipefail
n=${1:-2} rounds=${2:-3}
shift $(( $# < 2 ? $# : 2 ))
here=$(cd "$(dirname "$0")/.." && pwd)
perfs=("$@")
[ ${#perfs[@]} -gt 0 ] || perfs=("${CARGO_TARGET_DIR:-$here/target}/release/ferroccl-perf")
bench=${TMPDIR:-/tmp}/ferroccl-peers/mpi_bench
[ -x "$bench" ] || { mkdir -p "$(dirname "$bench")"; mpicc -O2 -o "$bench" "$here/../shared/peers/mpi_bench.c"; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for r in $(seq "$rounds"); do
  for perf in "${perfs[@]}"; do
    label=$(basename "$perf"); [ ${#perfs[@]} -gt 1 ] || label=ferroccl
    FERROCCL_TRANSPORT=tcp "$perf" all_reduce --ranks "$n" -b 8 -e 64K -f 2 -n 500 -w 50 2>&1 |
      grep -v '^#' | awk -v r="$r" -v l="$label" '{ print l, r, $1, $6 }'
  done
  mpirun --oversubscribe --mca btl tcp,self -n "$n" "$bench" allreduce 8 65536 500 2>&1 |
    grep -v '^\[' | grep -v '^#' | awk -v r="$r" '{ print "ompi", r, $1, $2 }'
  mpirun --oversubscribe --mca btl tcp,self -n "$n" "$bench" allreduce 65536 65536 500 2>&1 |
    grep -v '^\[' | grep -v '^#' | awk -v r="$r" '{ print "ompi", r, $1, $2 }'
done
