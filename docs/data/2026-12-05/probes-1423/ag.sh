#!/bin/bash
# 2-rank allgather 32-512 KiB gathered: ferroccl default, FERROCCL_CMA=0, Intel MPI; gated turns
cd /work/main
. bench/fast_state.sh
P=/tmp/ferroccl-peers; I=$(ls -d /opt/*impi* 2>/dev/null | head -1)
F=/tmp/perf-25e69c3
for t in 1 2 3 4; do
  wait_fast 150 $P/pingpong
  echo "# turn $t $(round_trip $P/pingpong) ns"
  for s in 32768 131072 524288; do
    for v in default cma0; do
      e=""; [ $v = cma0 ] && e="FERROCCL_CMA=0"
      r=$(env $e $F allgather --ranks 2 -b $s -e $s -n 2000 -w 50 -c 0 2>&1 | grep -E '^ +[0-9]' | awk '{print $6, $10}')
      echo "$v $s $r"
    done
  done
  echo "# after $(round_trip $P/pingpong) ns"
done
