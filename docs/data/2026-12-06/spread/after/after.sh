#!/bin/bash
# After the spread change: the bare programs by sets, and the low cells again, gated.
set -u
cd /work/main
O=${1:?outdir}; mkdir -p $O
. bench/fast_state.sh
PP=/tmp/ferroccl-peers/pingpong
gcc -O3 -march=native -o /tmp/slot_reuse bench/bound/slot_reuse.c
gcc -O3 -march=native -o /tmp/pages bench/bound/pages.c
for t in 1 2 3 4 5; do
  for s in 8 32 64; do
    wait_fast 150 $PP
    echo "turn $t sets $s ($($PP))"; /tmp/slot_reuse 65536 20000 $s
  done
done > $O/slot_reuse.txt 2>&1
echo "== slot_reuse $(date -u +%T)" >&2
for t in 1 2 3; do
  for b in 65536 131072; do for s in 2 8 32; do
    wait_fast 150 $PP
    echo "turn $t ($($PP)): $(SETS=$s FRESH=0 /tmp/pages allreduce $b 5000)"
  done; done
done > $O/pages-sets.txt 2>&1
echo "== pages $(date -u +%T)" >&2
export PEERS_FAST_NS=150
run() { local name=$1; shift; echo "== $name $(date -u +%T)" >&2; "$@" > $O/$name.txt 2>&1; }
run allreduce-2-a env PEERS=intelmpi bench/peers.sh allreduce 2 8192 131072 5
run allreduce-2-b env PEERS=intelmpi bench/peers.sh allreduce 2 16384 262144 5
run allgather-2-a env PEERS=intelmpi bench/peers.sh allgather 2 8192 524288 5
run allgather-2-b env PEERS=intelmpi bench/peers.sh allgather 2 4096 262144 5
run alltoall-2 env PEERS=intelmpi bench/peers.sh alltoall 2 32768 524288 5
run reducescatter-2 env PEERS=intelmpi bench/peers.sh reducescatter 2 16384 1048576 5
run broadcast-2 env PEERS="openmpi intelmpi" bench/peers.sh broadcast 2 32768 524288 5
run reduce-2 env PEERS="openmpi intelmpi" bench/peers.sh reduce 2 32768 524288 5
echo "== done $(date -u +%T)" >&2
