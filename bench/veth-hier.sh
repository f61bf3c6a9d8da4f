#!/usr/bin/env bash
# Hierarchical against flat ring allreduce (or reduce-scatter, allgather)
# across two network namespaces joined by a rate-limited veth pair (issue 20),
# the variants in turns, and the simulator's prediction for the same setup.
#
# usage: bench/veth-hier.sh [RATE...]    (as root; default RATE: 1gbit 10gbit)
# Topology as bench/veth.sh (namespaces fcc-a 10.77.0.1 and fcc-b 10.77.0.2,
# one veth pair fccv, a tbf qdisc of RATE on both ends), 4 ranks: ranks 0,1 in
# fcc-a, 2,3 in fcc-b. Unlike veth.sh the transport is left to the library:
# shared memory inside a namespace, TCP over the veth between them.
# Variants, run one after the other in every round so that the load of a
# shared machine falls on each alike: FERROCCL_ALGO=ring, FERROCCL_ALGO=hier,
# and the tuner's own choice (no FERROCCL_ALGO; its INFO line is kept).
# Environment: VETH_COLL=allreduce|reducescatter|allgather (ferroccl-perf's
# name; default allreduce), VETH_ROUNDS=N (default 3), VETH_OUT=DIR (raw
# outputs; default a temp dir, printed). Sizes 1 MiB..64 MiB (x4), 3 timed calls after 1.
# Prints every table, then the median time per (rate, variant, size) with the
# range over rounds, the load before and after, and ferroccl-sim's prediction
# (bench/sim/veth-1g.conf, veth-10g.conf) for the rates that have a model.
set -euo pipefail
[ "$(id -u)" = 0 ] || { echo "veth-hier.sh: needs root (ip netns, tc)" >&2; exit 1; }
rates=("$@"); [ ${#rates[@]} -gt 0 ] || rates=(1gbit 10gbit)
rounds=${VETH_ROUNDS:-3}
coll=${VETH_COLL:-allreduce}
case $coll in
  allreduce) plan=all_reduce ;; reducescatter) plan=reduce_scatter ;; allgather) plan=all_gather ;;
  *) echo "veth-hier.sh: VETH_COLL must be allreduce, reducescatter or allgather" >&2; exit 2 ;;
esac
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
out=${VETH_OUT:-$(mktemp -d "${TMPDIR:-/tmp}/ferroccl-veth-hier.XXXXXX")}
mkdir -p "$out"
TC=$(command -v tc || echo /usr/sbin/tc)
NSA=fcc-a NSB=fcc-b IPA=10.77.0.1 IPB=10.77.0.2 DEV=fccv

cleanup() {
  local ns pid
  for ns in $NSA $NSB; do
    if ip netns list | grep -qw "^$ns"; then
      for pid in $(ip netns pids "$ns" 2>/dev/null); do kill "$pid" 2>/dev/null || true; done
      ip netns del "$ns" 2>/dev/null || true
    fi
  done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

(cd "$root" && cargo build --release -q -p ferroccl-bench --bin ferroccl-perf --bin ferroccl-sim -p ferroccl-run --bin ferroccl-run)
bin=${CARGO_TARGET_DIR:-$root/target}/release

cleanup
ip netns add $NSA; ip netns add $NSB
ip link add $DEV-a type veth peer name $DEV-b
ip link set $DEV-a netns $NSA; ip link set $DEV-b netns $NSB
ip -n $NSA link set $DEV-a name $DEV; ip -n $NSB link set $DEV-b name $DEV
ip -n $NSA addr add $IPA/24 dev $DEV; ip -n $NSB addr add $IPB/24 dev $DEV
for ns in $NSA $NSB; do ip -n "$ns" link set lo up; ip -n "$ns" link set $DEV up; done

set_rate() {
  local ns burst
  for ns in $NSA $NSB; do
    ip netns exec "$ns" "$TC" qdisc del dev $DEV root 2>/dev/null || true
    [ "$1" = none ] && continue
    case $1 in *gbit) burst=$(( ${1%gbit} >= 5 ? 2048 : 256 ))kb ;; *) burst=256kb ;; esac
    ip netns exec "$ns" "$TC" qdisc add dev $DEV root tbf rate "$1" burst "$burst" latency 20ms
  done
}

port=29700
# One ferroccl-run per namespace (2 ranks each), node 0 in fcc-a prints.
run() {
  local algo=$1; shift
  port=$((port + 1))
  local common=(-n 2 --nnodes 2 --master-addr $IPA --master-port $port --bind-to none --no-prefix)
  local env=(env FERROCCL_SOCKET_IFNAME=$DEV FERROCCL_TOKEN=$((0x20000 + port)) FERROCCL_DEBUG=INFO)
  [ "$algo" = auto ] || env+=(FERROCCL_ALGO=$algo)
  ip netns exec $NSB timeout 900 "${env[@]}" "$bin/ferroccl-run" "${common[@]}" --node-rank 1 -- \
    "$bin/ferroccl-perf" "$coll" "$@" > "$out/b.log" 2>&1 & local b=$!
  ip netns exec $NSA timeout 900 "${env[@]}" "$bin/ferroccl-run" "${common[@]}" --node-rank 0 -- \
    "$bin/ferroccl-perf" "$coll" "$@" 2> "$out/a-$algo.err" || echo "## failed (status $?): $(tail -3 "$out/b.log")"
  wait $b || true
}

echo "## $(date -u '+%Y-%m-%dT%H:%M:%SZ') $(hostname) nproc=$(nproc) $coll load: $(cut -d' ' -f1-3 /proc/loadavg) out: $out"
: > "$out/rows.txt"
for rate in "${rates[@]}"; do
  set_rate "$rate"
  echo "## rate $rate: qdisc $(ip netns exec $NSA "$TC" qdisc show dev $DEV | head -1)"
  for r in $(seq "$rounds"); do
    for algo in ring hier auto; do
      echo "## $rate $algo round $r (load $(cut -d' ' -f1 /proc/loadavg))"
      run $algo -b 1M -e 64M -f 4 -n 3 -w 1 | tee "$out/$rate-$algo-$r.txt"
      grep -h "plan: $plan of" "$out/a-$algo.err" | sed 's/^.*plan: /## plan: /' | sort -u | head -4
      awk -v s="$rate $algo $r" '!/^#/ && NF >= 8 && $1 ~ /^[0-9]+$/ { print s, $1, $6, $8 }' \
        "$out/$rate-$algo-$r.txt" >> "$out/rows.txt"
    done
  done
done
echo "## done $(date -u '+%Y-%m-%dT%H:%M:%SZ') load: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$out/rows.txt" <<'EOF'
import collections, statistics, sys
t = collections.defaultdict(list)
for line in open(sys.argv[1]):
    rate, algo, _, size, us, busbw = line.split()
    t[(rate, int(size), algo)].append((float(us), float(busbw)))
print("| rate | bytes | variant | time ms median (min-max) | busbw GB/s median |")
print("|---|---|---|---|---|")
for (rate, size, algo), v in sorted(t.items()):
    us = sorted(x[0] for x in v)
    bw = statistics.median(x[1] for x in v)
    print(f"| {rate} | {size} | {algo} | {statistics.median(us)/1e3:.1f} ({us[0]/1e3:.1f}-{us[-1]/1e3:.1f}) | {bw:.3f} |")
EOF
for rate in "${rates[@]}"; do
  conf="$here/sim/veth-${rate%bit}.conf"
  [ -f "$conf" ] || continue
  echo "## ferroccl-sim $coll --model ${conf#$root/} --ranks 4 -b 1M -e 64M -f 4 --algo ring,hier"
  "$bin/ferroccl-sim" "$coll" --model "$conf" --ranks 4 -b 1M -e 64M -f 4 --algo ring,hier
done
