#!/bin/bash
# The 2-rank allgather of 8-32 MiB gathered, in gated turns (the AMD EPYC
# VM's fast state): the bare CMA and staged programs, then ferroccl's
# default (the calibrated pull) and the slots (FERROCCL_CMA=0).
# Build first: gcc -O3 -march=native -o /tmp/cma_allgather bench/bound/cma_allgather.c
#              gcc -O3 -march=native -o /tmp/staged bench/bound/staged.c
#              gcc -O3 -o /tmp/ferroccl-peers/pingpong bench/bound/pingpong.c (bench/peers.sh does it)
# Run from the checkout: docs/data/2026-12-05/allgather-8m/bounds.sh
. bench/fast_state.sh
PP=/tmp/ferroccl-peers/pingpong
F=${FERROCCL_PERF:-target/release/ferroccl-perf}
for turn in 1 2 3 4; do
  wait_fast 150 $PP
  echo "### turn $turn"
  echo "# state $(round_trip $PP)"
  for g in 8388608 16777216 33554432; do
    b=$((g/2))
    echo "cma $g $(/tmp/cma_allgather $b $b 30 2>&1 | tail -1)"
    echo "staged $g $(/tmp/staged allgather $b 65536 8 30 2>&1 | tail -1)"
  done
  for v in default slots; do
    echo "## ferroccl $v"
    cma=1; [ $v = slots ] && cma=0
    FERROCCL_CMA=$cma $F allgather --ranks 2 -b 8388608 -e 33554432 -f 2 -n 30 -w 5 2>/dev/null | awk '/^ *[0-9]/ {print $1, $6, $10}'
  done
  echo "# state after $(round_trip $PP)"
done
