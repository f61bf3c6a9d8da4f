#!/bin/bash
# Intel MPI's allreduce algorithms (I_MPI_ADJUST_ALLREDUCE=N) at one size, reused and fresh rounds
P=/tmp/ferroccl-peers; I=$P/x/impi_rt/impi_rt-2021.19.0.data/data
export PATH=$I/bin:$PATH I_MPI_ROOT=$I
OP=${OP:-allreduce}; VAR=${VAR:-I_MPI_ADJUST_ALLREDUCE}; S=${S:-524288}
for n in "" $(seq ${MINALG:-1} ${MAXALG:-16}); do
  for f in 0 1; do
    out=$(env ${n:+$VAR=$n} MPI_COLL_FRESH=$f timeout 60 mpirun -n 2 $P/mc_impi $OP $S $S 4 2>&1 | grep -E '^ +[0-9]' | awk '{print $2}')
    echo "$OP $S ${VAR}=${n:-default} fresh=$f: ${out:-failed}"
  done
done
