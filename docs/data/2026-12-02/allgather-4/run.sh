#!/bin/bash
# The 4-rank allgather of 32-512 KiB (gathered) on the model-207 VM (4
# ranks over 2 cores): the default (staging areas from 32 KiB blocks; the
# pull from 64 KiB blocks), the ring (FERROCCL_SPREAD=0) and no pull
# (FERROCCL_CMA=0), 3 turns, in turns. Columns: size, out-of-place and
# in-place µs a call.
P=${P:-target/release/ferroccl-perf}
echo "# $(date -u +%FT%TZ) $(git log -1 --format=%h) $(/tmp/pingpong 2>&1)"
for t in 1 2 3; do
  for v in A=1 FERROCCL_SPREAD=0 FERROCCL_CMA=0; do
    echo "## turn $t $v: $(env $v $P allgather --ranks 4 -b 32K -e 512K -f 4 -n 1000 -w 50 -c 0 2>&1 | grep -E '^ +[0-9]' | awk '{printf "%s %s %s  ", $1, $6, $10}')"
  done
done
