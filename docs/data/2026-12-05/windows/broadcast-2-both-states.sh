#!/bin/bash
# wait for the fast state, then 3 turns
for i in $(seq 1 60); do rt=$(/tmp/ferroccl-peers/pingpong | tail -1 | sed 's/.*round trip \([0-9]*\) ns.*/\1/'); [ "$rt" -lt 150 ] && break; sleep 10; done
echo "# state before: $rt ns (after $i looks)"
for t in 1 2 3; do for e in X=1 FERROCCL_CMA=0; do
  echo "$t $e windows: $(env $e /tmp/perf-25e69c3 broadcast --ranks 2 -b 2097152 -e 33554432 -f 4 -n 40 -w 5 -R 2 2>&1 | grep -E '^ +(2097152|8388608|33554432) ' | awk '{print $1, $6, $10}' | tr '\n' ' ')"
  echo "   ordinary: $(env $e /tmp/perf-25e69c3 broadcast --ranks 2 -b 2097152 -e 33554432 -f 4 -n 40 -w 5 2>&1 | grep -E '^ +(2097152|8388608|33554432) ' | awk '{print $1, $6, $10}' | tr '\n' ' ')"
done; echo "# $(/tmp/ferroccl-peers/pingpong | tail -1)"; done
