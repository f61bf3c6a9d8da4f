#!/bin/bash
# A/B/C via csv (1 ns): VARIANTS="name=bin ...", TURNS, MINB, MAXB, ITERS
for t in $(seq 1 ${TURNS:-3}); do
 /tmp/waitfast.sh >/dev/null
 for vb in $VARIANTS; do
  v=${vb%%=*}; B=${vb#*=}
  for op in "$@"; do
   rm -f /tmp/c3.csv; $B $op --ranks ${RANKS:-2} -b ${MINB:-8} -e ${MAXB:-8} -f ${FACTOR:-16} -n ${ITERS:-200000} -w 2000 -c 0 --csv /tmp/c3.csv >/dev/null 2>&1
   tail -n +2 /tmp/c3.csv | awk -F, -v v=$v -v op=$op -v t=$t '{print t, op, v, $3, $8; print t, op"-ip", v, $3, $12}'
  done
 done
 /tmp/pingpong | sed 's/^/# /'
done
