#!/bin/bash
# The 2-rank all-to-all of 8 MiB, in gated turns, the order reversed every
# other turn: ferroccl by its default route (cross-memory attach at 4 MiB
# blocks), ferroccl through slots (FERROCCL_CMA=0), Intel MPI by default
# and with I_MPI_SHM_CMA=1 (bench/peers.sh's mpi_coll.c build).
# usage: routes.sh PERF TURNS
cd /work/main; . bench/fast_state.sh
PERF=$1 turns=$2; P=/tmp/ferroccl-peers; I=$P/x/impi_rt/impi_rt-2021.19.0.data/data
f() { $PERF alltoall --ranks 2 -b 8M -e 8M -n 60 -w 20 -c 0 --csv /tmp/routes.csv > /dev/null 2>&1; tail -1 /tmp/routes.csv | cut -d, -f8; }
m_cma() { f; }
m_slots() { FERROCCL_CMA=0 f; }
m_impi() { (export PATH=$I/bin:$PATH I_MPI_ROOT=$I; mpirun -n 2 $P/mc_impi alltoall 8388608 8388608 4 2>&1 | awk '/^ +[0-9]/ {print $2}'); }
m_impicma() { (export PATH=$I/bin:$PATH I_MPI_ROOT=$I I_MPI_SHM_CMA=1; mpirun -n 2 $P/mc_impi alltoall 8388608 8388608 4 2>&1 | awk '/^ +[0-9]/ {print $2}'); }
ms=(cma slots impi impicma)
for ((t = 1; t <= turns; t++)); do
  if ((t % 2)); then order=("${ms[@]}"); else order=(); for ((i = ${#ms[@]} - 1; i >= 0; i--)); do order+=("${ms[i]}"); done; fi
  for m in "${order[@]}"; do
    wait_fast 150 $P/pingpong
    echo "$m $t $(m_$m) after $(round_trip $P/pingpong) ns"
  done
done
