#!/bin/bash
# One cell range of ferroccl against Intel MPI (and optionally Open MPI)
# in many short gated turns, the order reversed every other turn, so that
# the VM's drift falls on both alike: ferroccl-perf --ranks N directly
# (as many calls as bench/peers.sh gives it), the MPIs through
# bench/peers.sh with one turn each.
# usage: run.sh PERF OP N MINB MAXB TURNS [PEER...]   (PEER: intelmpi openmpi)
cd /work/main; . bench/fast_state.sh
PERF=$1 op=$2 n=$3 minb=$4 maxb=$5 turns=$6; shift 6
peers=("${@:-intelmpi}")
PP=/tmp/ferroccl-peers/pingpong
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# "SIZE MICROSECONDS" lines; ferroccl out of place, as many calls a size
# as bench/peers.sh gives it (a trial of 3, then about 50 ms of calls).
m_ferroccl() {
  local s t iters
  for ((s = minb; s <= maxb; s *= 4)); do
    t=$($PERF "$op" --ranks "$n" -b $s -e $s -n 3 -w 5 -c 0 2>&1 | grep -E '^ +[0-9]+ ' | awk '{print $6}')
    iters=$(awk -v t="${t:-0}" 'BEGIN { k = 20; if (t > 0 && 50000 / t > k) k = int(50000 / t); if (k > 20000) k = 20000; print k }')
    $PERF "$op" --ranks "$n" -b $s -e $s -n "$iters" -w 20 -c 0 2>&1 | grep -E '^ +[0-9]+ ' | awk '{print $1, $6}'
  done
}
m_peer() {
  PEERS=$1 PEERS_FAST_NS=150 FERROCCL_PERF=$PERF bench/peers.sh "$op" "$n" "$minb" "$maxb" 1 2>/dev/null |
    awk -v p="## $1" '$0 == p {on = 1; next} /^##/ {on = 0} on && /^ *[0-9]+ +[0-9.]+$/ {print $1, $2}'
}
ms=(ferroccl "${peers[@]}")
for ((t = 1; t <= turns; t++)); do
  if ((t % 2)); then order=("${ms[@]}"); else order=(); for ((i = ${#ms[@]} - 1; i >= 0; i--)); do order+=("${ms[i]}"); done; fi
  for m in "${order[@]}"; do
    wait_fast 150 $PP
    if [ "$m" = ferroccl ]; then r=$(m_ferroccl); else r=$(m_peer "$m"); fi
    echo "$m $t $(echo "$r" | awk '{printf "%s %s | ", $1, $2}') after $(round_trip $PP) ns"
  done
done
