#!/bin/bash
# The AMD instance's low cells in turns, against Intel MPI (broadcast: MPICH), gated.
set -u
cd /work/main
O=${1:?outdir}; mkdir -p $O
export PEERS_FAST_NS=150
run() { local name=$1; shift; echo "== $name $(date -u +%H:%M:%S)" >&2; "$@" > $O/$name.txt 2>&1; }
run allreduce-2-a env PEERS=intelmpi bench/peers.sh allreduce 2 8192 131072 5
run allreduce-2-b env PEERS=intelmpi bench/peers.sh allreduce 2 16384 262144 5
run allgather-2-a env PEERS=intelmpi bench/peers.sh allgather 2 8192 524288 5
run allgather-2-b env PEERS=intelmpi bench/peers.sh allgather 2 4096 262144 5
run alltoall-2 env PEERS=intelmpi bench/peers.sh alltoall 2 32768 131072 5
run reducescatter-4 env PEERS=intelmpi bench/peers.sh reducescatter 4 65536 1048576 5
run allreduce-4 env PEERS=intelmpi bench/peers.sh allreduce 4 262144 1048576 5
run broadcast-2 env PEERS=mpich bench/peers.sh broadcast 2 2048 8192 5
run broadcast-2-barrier env PEERS=mpich MPI_COLL_BARRIER=1 bench/peers.sh broadcast 2 2048 8192 5
run allgather-2-32m env PEERS=intelmpi bench/peers.sh allgather 2 33554432 33554432 3
echo "== peers done $(date -u +%H:%M:%S)" >&2
# The bare three passes (bench/bound/pages.c), memcpy and by pages, gated, 5 turns
. bench/fast_state.sh
for t in 1 2 3 4 5; do
  for b in 65536 131072; do
    for w in memcpy pages; do
      wait_fast 150 /tmp/ferroccl-peers/pingpong
      if [ $w = pages ]; then r=$(OUT=pages /tmp/pages allreduce $b 2000); else r=$(/tmp/pages allreduce $b 2000); fi
      echo "turn $t $b $w: $r  (after: $(round_trip /tmp/ferroccl-peers/pingpong) ns)"
    done
  done
done > $O/bound-pages.txt 2>&1
echo "== bound done $(date -u +%H:%M:%S)" >&2
