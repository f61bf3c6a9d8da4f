#!/usr/bin/env bash
# The 4-rank all-to-all of 2 and 8 MiB (a rank's input; blocks of 512 KiB
# and 2 MiB) beside its bare program, in turns, each run gated on the
# fast state: Intel MPI and ferroccl (bench/peers.sh), then the bare
# 4-process pull by cross-memory attach (bench/bound/cma_alltoall.c) in
# ferroccl's way (own block, then one process_vm_readv a peer block,
# nearest peer first) and by a bounce buffer with streaming stores.
#   FERROCCL_PERF=/tmp/perf-X docs/data/2026-12-06/alltoall-bound-4/run.sh OUT [TURNS]
set -euo pipefail
out=${1:?usage: run.sh OUT [TURNS]}
turns=${2:-5}
mkdir -p "$out"
cd "$(dirname "$0")/../../../.."
. bench/fast_state.sh
gcc -O3 -march=native -o /tmp/cma_alltoall bench/bound/cma_alltoall.c
pp=/tmp/ferroccl-peers/pingpong
for ((t = 1; t <= turns; t++)); do
  PEERS=intelmpi PEERS_FAST_NS=150 bench/peers.sh alltoall 4 2097152 8388608 1 >>"$out/peers.txt"
  for block in 524288 2097152; do
    for way in own-first bounce-262144; do
      w=${way%%-*} chunk=${way#*-}
      [ "$w" = own ] && w=own-first chunk=$block
      wait_fast 150 "$pp"
      echo "turn $t $(NPROC=4 WAY=$w /tmp/cma_alltoall $block $chunk 40) # after: $($pp | head -1)" >>"$out/bare.txt"
    done
  done
done
