#!/bin/bash
# The 2-rank broadcast of 128 KiB-1 MiB against its bound, in one run:
# per turn, bench/bound/cma_bcast.c (one process_vm_readv by the
# receiver, a flag each way, spinning) at each size, then
# bench/peers.sh (Open MPI, Intel MPI, ferroccl) over the same sizes.
# gcc -O3 -march=native -o /tmp/cma_bcast bench/bound/cma_bcast.c first.
# usage: docs/data/2026-12-01/bcast-bound/run.sh TURNS > out.txt
set -e
for t in $(seq 1 "${1:-3}"); do
  for s in 131072 262144 524288 1048576; do
    echo "turn $t bare $(/tmp/cma_bcast $s $s 3000)"
  done
  PEERS="openmpi intelmpi" bench/peers.sh broadcast 2 131072 1048576 1 | sed "s/^/turn $t peers /"
done
