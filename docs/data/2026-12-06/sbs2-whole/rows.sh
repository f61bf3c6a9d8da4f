#!/bin/bash
# Rows of the issue's script again, gated before each run: rows.sh OUTDIR op:n:half ...
set -u
cd /work/main
O=${1:?outdir}; shift; mkdir -p $O
. bench/fast_state.sh
PP=/tmp/ferroccl-peers/pingpong
for row in "$@"; do
  IFS=: read op n half <<< "$row"
  if [ $half = small ]; then a="8 16384 3 5000"; else a="65536 16777216 3 100"; fi
  wait_fast 150 $PP
  echo "== $op $n $half $(date -u +%T) gate $(round_trip $PP) ns" >&2
  ../shared/peers/sbs2.sh $op $n $a > $O/$op-$n-$half.raw 2>&1
  echo "   after $(round_trip $PP) ns $(date -u +%T)" >&2
done
