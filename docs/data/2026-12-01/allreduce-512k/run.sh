#!/bin/bash
# The 2-rank allreduce of 512 KiB in fresh rounds: our three passes
# through shared buffers (bench/bound/pages.c, copies out and the sum's
# reads by pages), the one-meeting variant (WHOLE=1: each rank stages its
# whole input and adds the peer's whole copy), and ferroccl-perf --fresh 1,
# in turns; then Intel MPI and ferroccl side by side (FRESH=1
# bench/peers.sh). gcc -O3 -march=native -o /tmp/pages bench/bound/pages.c
# first. usage: docs/data/2026-12-01/allreduce-512k/run.sh TURNS > out.txt
for t in $(seq 1 "${1:-4}"); do
  echo "turn $t three-passes $(OUT=pages /tmp/pages allreduce 524288 2000)"
  echo "turn $t whole $(WHOLE=1 OUT=pages /tmp/pages allreduce 524288 2000)"
  echo "turn $t whole-128k $(WHOLE=1 CHUNK=131072 OUT=pages /tmp/pages allreduce 524288 2000)"
  echo "turn $t ferroccl-fresh $(target/release/ferroccl-perf allreduce --ranks 2 -b 524288 -e 524288 -n 2000 -w 50 --fresh 1 2>&1 | grep -E '^ +[0-9]')"
done
FRESH=1 PEERS="intelmpi" bench/peers.sh allreduce 2 524288 524288 3
