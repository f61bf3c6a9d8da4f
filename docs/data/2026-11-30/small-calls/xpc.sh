#!/bin/bash
# A/B via csv (1 ns): variants main, xp (XPENV applied to xp), turns T
for t in $(seq 1 ${TURNS:-3}); do
 /tmp/waitfast.sh >/dev/null
 for v in main xp; do
  case $v in main) B=${BIN_A:-/work/main/target/release/ferroccl-perf}; E=;; xp) B=${BIN_B:-/work/xp-target/release/ferroccl-perf}; E=$XPENV;; esac
  for op in "$@"; do
   rm -f /tmp/c.csv; env $E $B $op --ranks ${RANKS:-2} -b ${MINB:-8} -e ${MAXB:-512} -f ${FACTOR:-8} -n ${ITERS:-300000} -w 2000 -c 0 --csv /tmp/c.csv >/dev/null 2>&1
   tail -n +2 /tmp/c.csv | awk -F, -v v=$v -v op=$op -v t=$t '{print t, op, v, $3, $8; print t, op"-ip", v, $3, $12}'
  done
 done
 /tmp/pingpong | sed 's/^/# /'
done
