#!/bin/bash
# The 4-rank all-to-all of 512 KiB and 2 MiB on the 2 CPUs, one build, two
# ways of starting its ranks, and Intel MPI, in gated turns (order reversed
# every other turn): ferroccl-perf --ranks 4 (no pinning: more ranks than
# CPUs), ferroccl-run --bind-to core (ranks 0, 2 on CPU 0; 1, 3 on CPU 1,
# as Intel MPI pins them), and Intel MPI (its own pinning) through
# bench/peers.sh's run of mpi_coll.c.
# usage: run.sh PERF TURNS
cd /work/main; . bench/fast_state.sh
PERF=$1 turns=$2; PP=/tmp/ferroccl-peers/pingpong
a=(alltoall -b 524288 -e 2097152 -f 4 -n 500 -w 20 -c 0)
# Each prints "SIZE MICROSECONDS" lines (ferroccl: out of place).
sizes='^ *(524288|2097152) '
m_perf() { $PERF "${a[@]}" --ranks 4 2>&1 | grep -E "$sizes" | awk '{print $1, $6}'; }
m_runcore() { /tmp/ferroccl-run -n 4 --bind-to core $PERF "${a[@]}" 2>&1 | sed "s/^\[rank 0\] //" | grep -E "$sizes" | awk '{print $1, $6}'; }
m_impi() { PEERS=intelmpi PEERS_FAST_NS=150 FERROCCL_PERF=$PERF bench/peers.sh alltoall 4 524288 2097152 1 2>/dev/null | grep -A3 "^## intelmpi" | grep -E "$sizes"; }
ms=(perf runcore impi)
for ((t = 1; t <= turns; t++)); do
  if ((t % 2)); then order=("${ms[@]}"); else order=(); for ((i = ${#ms[@]} - 1; i >= 0; i--)); do order+=("${ms[i]}"); done; fi
  for m in "${order[@]}"; do
    wait_fast 150 $PP
    r=$(m_$m | awk '{printf "%s %s | ", $1, $2}')
    echo "$m $t $r after $(round_trip $PP) ns"
  done
done
