#!/bin/bash
# Start-up after start-up, gated: the 2-rank allgather of 512 KiB and 2 MiB
# gathered by ferroccl (FERROCCL_PERF, a fresh pair of processes each
# time) and by the bare program of its route (bench/bound/staged.c
# allgather, 8 slots of 64 KiB, a fresh pair and fresh shared memory each
# time), alternating: does the bare program have slow start-ups too?
cd /work/main; . bench/fast_state.sh
PP=/tmp/ferroccl-peers/pingpong; PERF=${FERROCCL_PERF:-/tmp/perf-warm}
for i in $(seq 1 ${N:-16}); do
  for s in 524288 2097152; do
    b=$((s / 2)); it=$((256 * 1048576 / s))
    wait_fast 150 $PP
    echo "$i $s ferroccl $($PERF allgather --ranks 2 -b $s -e $s -n $it -w 20 -c 0 2>&1 | grep -E '^ +[0-9]+ +[0-9]+ +float' | awk '{print $6}')"
    wait_fast 150 $PP
    echo "$i $s staged $(/tmp/staged allgather $b 65536 8 $it | grep -o 'mean [0-9.]*' | cut -d' ' -f2)"
  done
  echo "# state after $($PP | head -1)"
done
