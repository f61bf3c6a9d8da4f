#!/bin/bash
# The script, every row on 2 and 4 ranks, gated before each run.
set -u
cd /work/main
O=${1:?outdir}; mkdir -p $O
. bench/fast_state.sh
PP=/tmp/ferroccl-peers/pingpong
for op in ${OPS:-allreduce allgather reducescatter}; do for n in ${NS:-2 4}; do
  for half in small large; do
    if [ $half = small ]; then a="8 16384 3 5000"; else a="65536 16777216 3 100"; fi
    wait_fast 150 $PP
    echo "== $op $n $half $(date -u +%T) gate $(round_trip $PP) ns" >&2
    ../shared/peers/sbs2.sh $op $n $a > $O/$op-$n-$half.raw 2>&1
    echo "   after $(round_trip $PP) ns $(date -u +%T)" >&2
  done
  { echo "### $op $n"; cat $O/$op-$n-small.raw $O/$op-$n-large.raw | ../shared/peers/table.py $op $n; } >> $O/tables.md
done; done
