#!/usr/bin/env bash
# A TCP collective (allreduce unless VETH_OP names another) across two network
# namespaces joined by a rate-limited veth pair: ferroccl beside Open MPI's TCP
# path, interleaved in one run (issue 17).
#
# usage: bench/veth.sh [RATE...]        (as root; default RATE: 1gbit 10gbit)
#   RATE is a tc rate (1gbit, 10gbit, ...) or "none" (no limit).
# Topology: namespaces fcc-a (10.77.0.1) and fcc-b (10.77.0.2), one veth pair
# named fccv in both, a tbf qdisc with RATE on both ends. 2 ranks: one per
# namespace; 4 ranks: two per namespace (ranks 0,1 in fcc-a; 2,3 in fcc-b),
# every rank on TCP (FERROCCL_TRANSPORT=tcp; Open MPI --mca btl tcp,self).
# Open MPI's remote daemon is started in fcc-b by an rsh agent that runs
# "ip netns exec" instead of ssh.
#
# Prints: the raw line rate per RATE (iperf3, one stream, one direction and
# both at once, before and after the collectives), then every table as it is
# measured, then a summary (bench/veth_summary.py): small-size latency and
# large-size busbw, medians over the rounds with ranges, busbw at 64 MiB
# against the measured line rate.
# Environment:
#   VETH_ROUNDS=N      rounds of (ferroccl, Open MPI) per setting (default 3)
#   VETH_RANKS="2 4"   rank counts
#   VETH_OUT=DIR       keep raw outputs there (default: a temp dir; printed)
#   VETH_QUICK=1       smoke test: 1 round, tiny iteration counts, up to 4 MiB
#   VETH_LOCKSTEP=1    also run ferroccl with FERROCCL_PIPELINE_DEPTH=1 (each
#                      ring slice after the previous one), interleaved, as
#                      column "ferroccl depth 1" (issue 37's A/B of pipelining)
#   VETH_BASELINE=DIR  also run another build's ferroccl-run and ferroccl-perf
#                      (from DIR), interleaved, as column "ferroccl baseline"
#                      (an A/B of two commits on the same links)
#   VETH_ALGO=NAME     FERROCCL_ALGO for every ferroccl run (e.g. hierarchical)
#   VETH_OP=NAME       the collective (default allreduce; allgather,
#                      reducescatter: named as ferroccl-perf and mpi_bench do)
#   VETH_SWEEPS="MIN MAX ITERS WARMUP;..."  replace the size sweeps
# Sizes: 8 B..32 KiB (x4, 200 iterations), 64 KiB..16 MiB (x4, 10),
# 64 MiB and 256 MiB (3 iterations, 1 warm-up; Open MPI's bench does 3).
# Needs: ip, tc, iperf3, mpirun/mpicc; builds ferroccl-perf and ferroccl-run.
# The namespaces are removed on exit, also on failure or Ctrl-C.
set -euo pipefail
[ "$(id -u)" = 0 ] || { echo "veth.sh: needs root (ip netns, tc)" >&2; exit 1; }
rates=("$@"); [ ${#rates[@]} -gt 0 ] || rates=(1gbit 10gbit)
quick=${VETH_QUICK:-0} op=${VETH_OP:-allreduce}
rounds=${VETH_ROUNDS:-$([ "$quick" = 1 ] && echo 1 || echo 3)} ranks_list=${VETH_RANKS:-"2 4"}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
peers=${PEERS_DIR:-$root/../shared/peers}
[ -f "$peers/mpi_bench.c" ] || peers=/work/shared/peers
out=${VETH_OUT:-$(mktemp -d "${TMPDIR:-/tmp}/ferroccl-veth.XXXXXX")}
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

(cd "$root" && cargo build --release -q -p ferroccl-bench --bin ferroccl-perf -p ferroccl-run --bin ferroccl-run)
bin=${CARGO_TARGET_DIR:-$root/target}/release
mpib=${TMPDIR:-/tmp}/ferroccl-peers/mpi_bench
[ -x "$mpib" ] || { mkdir -p "$(dirname "$mpib")"; mpicc -O2 -o "$mpib" "$peers/mpi_bench.c"; }

# Left over from an interrupted run of this script: same names, ours.
cleanup
ip netns add $NSA; ip netns add $NSB
ip link add $DEV-a type veth peer name $DEV-b
ip link set $DEV-a netns $NSA; ip link set $DEV-b netns $NSB
ip -n $NSA link set $DEV-a name $DEV; ip -n $NSB link set $DEV-b name $DEV
ip -n $NSA addr add $IPA/24 dev $DEV; ip -n $NSB addr add $IPB/24 dev $DEV
for ns in $NSA $NSB; do ip -n "$ns" link set lo up; ip -n "$ns" link set $DEV up; done

# mpirun's launch agent: skip ssh's options, map the host to its namespace.
cat > "$out/rsh.sh" <<EOF
#!/bin/bash
while [ \$# -gt 0 ] && [ "\${1#-}" != "\$1" ]; do shift; done
host=\$1; shift
case \$host in $IPA) ns=$NSA;; $IPB) ns=$NSB;; *) echo "rsh.sh: unknown host \$host" >&2; exit 1;; esac
exec ip netns exec "\$ns" /bin/sh -c "\$*"
EOF
chmod +x "$out/rsh.sh"

set_rate() {
  local ns burst
  for ns in $NSA $NSB; do
    ip netns exec "$ns" "$TC" qdisc del dev $DEV root 2>/dev/null || true
    [ "$1" = none ] && continue
    # tbf needs a bucket of at least rate/HZ; 2 MB holds 10 Gb/s at HZ=250.
    case $1 in *gbit) burst=$(( ${1%gbit} >= 5 ? 2048 : 256 ))kb ;; *) burst=256kb ;; esac
    ip netns exec "$ns" "$TC" qdisc add dev $DEV root tbf rate "$1" burst "$burst" latency 20ms
  done
}

# One stream, fcc-a -> fcc-b, then both directions at once; Gb/s per direction.
line_rate() {
  local tag=$1 mode
  for mode in uni bidir; do
    ip netns exec $NSB iperf3 -s -1 -p 5201 >/dev/null 2>&1 & local srv=$!
    sleep 0.5
    local extra=(); [ $mode = bidir ] && extra=(--bidir)
    ip netns exec $NSA iperf3 -c $IPB -p 5201 -t "$([ "$quick" = 1 ] && echo 2 || echo 5)" -J "${extra[@]}" \
      > "$out/iperf-$tag-$mode.json" || true
    wait $srv || true
    python3 - "$out/iperf-$tag-$mode.json" "$tag" "$mode" <<'EOF' | tee -a "$out/rows.txt"
import json, sys
e = json.load(open(sys.argv[1]))["end"]
fwd = e["sum_received"]["bits_per_second"] / 1e9
rev = e.get("sum_received_bidir_reverse", {}).get("bits_per_second")
rate, when = sys.argv[2].rsplit("-", 1)
print("line", rate, sys.argv[3], when, "%.3f" % fwd, "%.3f" % (rev / 1e9 if rev else fwd))
EOF
  done
}

port=29600
# ferroccl: one ferroccl-run per namespace, node 0 in fcc-a (rank 0, prints).
# DEPTH (environment): FERROCCL_PIPELINE_DEPTH for this run, empty for the
# default; BIN: the binaries' directory (default: this tree's build).
ferroccl() {
  local bin=${BIN:-$bin}
  local n=$1 per=$(($1 / 2)); shift
  port=$((port + 1))
  local common=(-n $per --nnodes 2 --master-addr $IPA --master-port $port --bind-to none --no-prefix)
  local env=(env FERROCCL_TRANSPORT=tcp FERROCCL_SOCKET_IFNAME=$DEV FERROCCL_TOKEN=$((0x17000 + port)))
  [ -n "${DEPTH:-}" ] && env+=(FERROCCL_PIPELINE_DEPTH=$DEPTH)
  [ -n "${VETH_ALGO:-}" ] && env+=(FERROCCL_ALGO=$VETH_ALGO)
  ip netns exec $NSB timeout 900 "${env[@]}" "$bin/ferroccl-run" "${common[@]}" --node-rank 1 -- \
    "$bin/ferroccl-perf" "$op" "$@" > "$out/ferroccl-b.log" 2>&1 & local b=$!
  ip netns exec $NSA timeout 900 "${env[@]}" "$bin/ferroccl-run" "${common[@]}" --node-rank 0 -- \
    "$bin/ferroccl-perf" "$op" "$@" || echo "## ferroccl failed (status $?); fcc-b said: $(tail -3 "$out/ferroccl-b.log")"
  wait $b || true
}
# Open MPI: mpirun in fcc-a, half the ranks per namespace. More ranks than
# cores: yield when idle, as a local mpirun --oversubscribe would.
ompi() {
  local n=$1 per=$(($1 / 2)); shift
  local yield=0; [ "$n" -gt "$(nproc)" ] && yield=1
  ip netns exec $NSA timeout 900 env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    mpirun -n "$n" --host $IPA:$per,$IPB:$per --bind-to none --mca mpi_yield_when_idle $yield \
    --mca plm_rsh_agent "$out/rsh.sh" --mca plm_rsh_no_tree_spawn 1 \
    --mca oob_tcp_if_include 10.77.0.0/24 --mca btl tcp,self --mca btl_tcp_if_include 10.77.0.0/24 \
    "$mpib" "$op" "$@" 2>&1 | grep -v '^\[' || echo "## Open MPI failed"
}
# Rows: peer rate ranks round bytes time_us busbw (ferroccl: out of place).
tag() { awk -v p="$1" -v s="$2 $3 $4" '!/^#/ && NF >= 8 && $1 ~ /^[0-9]+$/ { print p, s, $1, $6, $8 }'; }
tagm() { awk -v p="$1" -v s="$2 $3 $4" '!/^#/ && NF == 4 && $1 ~ /^[0-9]+$/ { print p, s, $1, $2, $4 }'; }

if [ "$quick" = 1 ]; then
  sweeps=("8 32768 20 2" "65536 4194304 3 1")
else
  sweeps=("8 32768 200 20" "65536 16777216 10 3" "67108864 268435456 3 1")
fi
[ -n "${VETH_SWEEPS:-}" ] && IFS=';' read -r -a sweeps <<< "$VETH_SWEEPS"
echo "## $(date -u '+%Y-%m-%dT%H:%M:%SZ') $(hostname) nproc=$(nproc) load: $(cut -d' ' -f1-3 /proc/loadavg) out: $out"
: > "$out/rows.txt"
set_rate none; line_rate none-before
for rate in "${rates[@]}"; do
  set_rate "$rate"
  echo "## rate $rate: qdisc $(ip netns exec $NSA "$TC" qdisc show dev $DEV | head -1)"
  line_rate "$rate-before"
  for n in $ranks_list; do
    for r in $(seq "$rounds"); do
      for s in "${sweeps[@]}"; do
        set -- $s
        echo "## ferroccl $rate $n ranks round $r: $1..$2 B, $3 iterations (load $(cut -d' ' -f1 /proc/loadavg))"
        ferroccl "$n" -b "$1" -e "$2" -f 4 -n "$3" -w "$4" | tee "$out/f-$rate-$n-$r-$1.txt"
        tag ferroccl "$rate" "$n" "$r" < "$out/f-$rate-$n-$r-$1.txt" >> "$out/rows.txt"
        if [ "${VETH_LOCKSTEP:-0}" = 1 ]; then
          echo "## ferroccl depth 1 $rate $n ranks round $r: $1..$2 B, $3 iterations"
          DEPTH=1 ferroccl "$n" -b "$1" -e "$2" -f 4 -n "$3" -w "$4" | tee "$out/d-$rate-$n-$r-$1.txt"
          tag ferroccl-d1 "$rate" "$n" "$r" < "$out/d-$rate-$n-$r-$1.txt" >> "$out/rows.txt"
        fi
        if [ -n "${VETH_BASELINE:-}" ]; then
          echo "## ferroccl baseline ($VETH_BASELINE) $rate $n ranks round $r: $1..$2 B, $3 iterations"
          BIN=$VETH_BASELINE ferroccl "$n" -b "$1" -e "$2" -f 4 -n "$3" -w "$4" | tee "$out/b-$rate-$n-$r-$1.txt"
          tag ferroccl-base "$rate" "$n" "$r" < "$out/b-$rate-$n-$r-$1.txt" >> "$out/rows.txt"
        fi
        echo "## Open MPI $rate $n ranks round $r: $1..$2 B, $3 iterations"
        ompi "$n" "$1" "$2" "$3" | tee "$out/m-$rate-$n-$r-$1.txt"
        tagm ompi "$rate" "$n" "$r" < "$out/m-$rate-$n-$r-$1.txt" >> "$out/rows.txt"
      done
    done
  done
  line_rate "$rate-after"
done
echo "## done $(date -u '+%Y-%m-%dT%H:%M:%SZ') load: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 "$here/veth_summary.py" "$out/rows.txt"
