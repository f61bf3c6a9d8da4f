#!/bin/bash
# in turns: IMPI, ferroccl, bare staged (ring of 3 passes, chunk 64K and half), oneshot
P=/tmp/peers2; I=$P/x/impi_rt/impi_rt-2021.19.0.data/data; F=${F:-/tmp/perf-base}
for t in 1 2 3; do
 for s in 131072 524288; do
  impi=$( (export PATH=$I/bin:$PATH I_MPI_ROOT=$I; mpirun -n 2 $P/mb_impi allreduce $s $s 20 4 2>&1 | grep -E '^ +[0-9]' | awk '{print $2}') )
  ours=$($F all_reduce --ranks 2 -b $s -e $s -n 2000 -w 100 -c 0 2>&1 | grep -E '^ +[0-9]' | awk '{print $6}')
  st64=$(/tmp/staged allreduce $s 65536 8 2000 | tail -1)
  sth=$(/tmp/staged allreduce $s $((s/2)) 8 2000 | tail -1)
  one=$(/tmp/staged oneshot $s 65536 8 2000 | tail -1)
  echo "turn $t size $s impi $impi ours $ours | st64: $st64 | sthalf: $sth | oneshot: $one"
 done
done
