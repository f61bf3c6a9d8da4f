#!/bin/bash
# The 4-rank allreduce of 512 KiB and 2 MiB on the 2 CPUs, one build, four
# ways of starting its ranks, in gated turns (order reversed every other
# turn): ferroccl-perf --ranks 4 (no pinning: more ranks than CPUs),
# ferroccl-run --bind-to none and --bind-to core (ranks 0, 2 on CPU 0; 1, 3
# on CPU 1, as Intel MPI pins them), and Open MPI's mpirun --bind-to none.
# usage: run.sh PERF TURNS
cd /work/main; . bench/fast_state.sh
PERF=$1 turns=$2; PP=/tmp/ferroccl-peers/pingpong
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
a=(allreduce -b 524288 -e 2097152 -f 4 -n 1000 -w 20 -c 0)
m_perf() { $PERF "${a[@]}" --ranks 4; }
m_runnone() { /tmp/ferroccl-run -n 4 --bind-to none $PERF "${a[@]}"; }
m_runcore() { /tmp/ferroccl-run -n 4 --bind-to core $PERF "${a[@]}"; }
m_mpinone() { mpirun --oversubscribe --bind-to none -n 4 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=$((29700 + RANDOM % 200)) $PERF "${a[@]}"; }
ms=(perf runnone runcore mpinone)
for ((t = 1; t <= turns; t++)); do
  if ((t % 2)); then order=("${ms[@]}"); else order=(); for ((i = ${#ms[@]} - 1; i >= 0; i--)); do order+=("${ms[i]}"); done; fi
  for m in "${order[@]}"; do
    wait_fast 150 $PP
    r=$(m_$m 2>&1 | sed "s/^\[rank 0\] //" | grep -E "^ +(524288|2097152) " | awk '{printf "%s %s %s | ", $1, $6, $10}')
    echo "$m $t $r after $(round_trip $PP) ns"
  done
done
