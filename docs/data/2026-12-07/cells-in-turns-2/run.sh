#!/bin/bash
# The cells below 1 in peers-table-2, each range again in five gated turns
# against Open MPI and Intel MPI (the best peer of every such cell).
cd /work/main; out=$(dirname "$0")
run() { echo "$(date -u +%T) $*" >> "$out/times.txt"
  PEERS="openmpi intelmpi" PEERS_FAST_NS=150 bench/peers.sh "$@" 5 > "$out/$1-$2-$3-$4.txt"; }
: > "$out/times.txt"
run allgather 2 512 131072
run alltoall 2 512 524288
run broadcast 2 8 8
run allreduce 4 524288 2097152
run alltoall 4 32 524288
run reducescatter 4 32768 32768
run allgather 4 131072 131072
run broadcast 4 32 32
echo "$(date -u +%T) end" >> "$out/times.txt"
