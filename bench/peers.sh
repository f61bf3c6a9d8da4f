#!/usr/bin/env bash
# Side by side, in turns: Open MPI, MPICH, Intel MPI, Gloo and ferroccl
# (ordinary buffers and windows), one collective, one rank count, every
# size; bench/peers_table.py turns the output into docs/performance.md's
# first table (medians over the turns, ferroccl's ratio to the best peer).
#
#   bench/peers.sh OP RANKS [MINB] [MAXB] [TURNS] | bench/peers_table.py
#   OP: allreduce | allgather | reducescatter | broadcast | reduce | alltoall
#
# Each turn, and the end, prints the machine's cross-core round trip and
# copy speed (bench/bound/pingpong.c): compare cells only between runs
# that printed about the same.
#
# Sizes are nccl-tests sizes (allgather and reduce-scatter: the whole
# gathered array; all-to-all: a rank's whole send buffer), from MINB (8)
# to MAXB (64 MiB) by 4x; TURNS (3). f32 sum, out of place (broadcast in
# place, as MPI_Bcast is), root 0. The peers run bench/peers/mpi_coll.c
# and bench/peers/gloo_coll.py: at least 20 calls and
# about 50 ms a size (at most 20,000, after a trial of 3); ferroccl-perf gets
# as many by the same rule (until 2026-12-01 19:35 UTC a fixed 5,000 up to
# 32 KiB, 500 to 1 MiB, 50 above: fewer than the MPIs below 1 MiB). MPICH
# is left out when the ranks outnumber the cores (its polling then takes
# milliseconds a call).
#
# Environment: PEERS_DIR (/tmp/ferroccl-peers: the MPI builds, made on first
# use: Open MPI from the system's mpicc, installed with apt-get if absent;
# MPICH 5.0.2 and Intel MPI 2021.19 from pip wheels), TORCH_PYTHON (a Python
# with torch; default /opt/ferroccl-torch/bin/python, else python3; Gloo is
# left out with a note when it has no torch), FERROCCL_PERF
# (target/release/ferroccl-perf), PEERS ("openmpi mpich intelmpi gloo";
# add "bound" for the bare program between shared buffers,
# bench/bound/windows.c, which bench/peers_table.py sets beside the
# windows: the most any call between windows could gain on the best peer;
# where the ranks outnumber the CPUs it is the faster of N processes and
# as many as the CPUs, and "bound-procs" beside it is N processes alone,
# the most a library of N processes taking turns could reach),
# FRESH (1: every call timed alone after its rank read the output and
# rewrote the input, as a training step does: ferroccl-perf --fresh 1 and
# MPI_COLL_FRESH=1; Gloo is left out), PEERS_FAST_NS (N: on a machine that
# flips between two states, as the AMD VM does, wait up to 10 minutes
# before each peer's run of a turn until the cross-core round trip is
# under N ns, and run it again, up to 4 more times, when it is not under
# N after the run; only the kept run is printed, with its "# state" line).
set -euo pipefail
op=${1:?usage: bench/peers.sh OP RANKS [MINB] [MAXB] [TURNS]}
n=${2:?usage: bench/peers.sh OP RANKS [MINB] [MAXB] [TURNS]}
minb=${3:-8} maxb=${4:-67108864} turns=${5:-3}
case $op in
allreduce | allgather | reducescatter | broadcast | reduce | alltoall) ;;
*) echo "peers.sh: unknown collective '$op'" >&2; exit 2 ;;
esac
here=$(cd "$(dirname "$0")" && pwd)
P=${PEERS_DIR:-/tmp/ferroccl-peers}
F=${FERROCCL_PERF:-target/release/ferroccl-perf}
PEERS=${PEERS:-openmpi mpich intelmpi gloo}
FRESH=${FRESH:-0}
fresh=()
if [ "$FRESH" = 1 ]; then
  export MPI_COLL_FRESH=1
  fresh=(--fresh 1)
fi
if [ -z "${TORCH_PYTHON:-}" ]; then
  TORCH_PYTHON=python3
  [ -x /opt/ferroccl-torch/bin/python ] && TORCH_PYTHON=/opt/ferroccl-torch/bin/python
fi
[ -x "$F" ] || { echo "peers.sh: no $F (cargo build --release -p ferroccl-bench)" >&2; exit 2; }
M=$P/x/mpich/mpich-5.0.2.data/data
I=$P/x/impi_rt/impi_rt-2021.19.0.data/data
ID=$P/x/impi_devel/impi_devel-2021.19.0.data/data

# The MPI builds of mpi_coll.c (once; newer sources rebuild).
build() {
  mkdir -p "$P/dl" "$P/x"
  if ! command -v mpicc >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openmpi-bin libopenmpi-dev >/dev/null
  fi
  if [ -z "$(ls "$P"/dl/mpich-*.whl 2>/dev/null)" ]; then
    pip download --no-deps -q -d "$P/dl" mpich==5.0.2 impi-rt==2021.19.0 impi-devel==2021.19.0
  fi
  for w in "$P"/dl/*.whl; do
    d=$P/x/$(basename "$w" | cut -d- -f1)
    [ -d "$d" ] || { mkdir -p "$d" && python3 -m zipfile -e "$w" "$d"; }
  done
  chmod +x "$M"/bin/* "$I"/bin/* 2>/dev/null || true
  local src=$here/peers/mpi_coll.c
  mpicc -O2 -o "$P/mc_ompi" "$src"
  gcc -O2 -I"$M/include" -o "$P/mc_mpich" "$src" -L"$M/lib" -lmpi -Wl,-rpath,"$M/lib"
  gcc -O2 -I"$ID/include" -o "$P/mc_impi" "$src" -L"$I/lib" -lmpi -Wl,-rpath,"$I/lib"
}
if [ ! -x "$P/mc_impi" ] || [ "$here/peers/mpi_coll.c" -nt "$P/mc_impi" ]; then
  build >&2
fi
# The machine's state with every turn (bench/bound/pingpong.c): on the
# build VM every shared-memory time moves with it.
if [ ! -x "$P/pingpong" ] || [ "$here/bound/pingpong.c" -nt "$P/pingpong" ]; then
  mkdir -p "$P" && gcc -O2 -o "$P/pingpong" "$here/bound/pingpong.c"
fi
machine() { echo "# machine: $("$P/pingpong" 2>&1)"; }
# round_trip and wait_fast, from pingpong's line.
. "$here/fast_state.sh"
# One peer's run of a turn ("$@"), gated by PEERS_FAST_NS where it is set.
gated() {
  [[ -z ${PEERS_FAST_NS:-} ]] && { "$@"; return; }
  local try out after
  for ((try = 1; try <= 5; try++)); do
    wait_fast "$PEERS_FAST_NS" "$P/pingpong"
    out=$("$@")
    after=$(round_trip "$P/pingpong")
    ((after < PEERS_FAST_NS)) && break
  done
  printf '%s\n' "$out"
  echo "# state: round trip $after ns after the run (try $try)"
}
if [[ " $PEERS " == *" bound "* ]] &&
  { [ ! -x "$P/windows" ] || [ "$here/bound/windows.c" -nt "$P/windows" ]; }; then
  gcc -O3 -march=native -o "$P/windows" "$here/bound/windows.c"
fi

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
rows() { grep -E '^ +[0-9]' || true; }
ferroccl() {
  # As many calls as the peers make at each size, by mpi_coll.c's rule:
  # a trial of 3 calls, then about 50 ms of them, at least 20 and at most
  # 20,000.
  local s t iters
  for ((s = minb; s <= maxb; s *= 4)); do
    t=$("$F" "$op" --ranks "$n" -b "$s" -e "$s" -n 3 -w 5 -c 0 ${fresh[@]+"${fresh[@]}"} "$@" 2>&1 |
      rows | awk '{print $6}')
    iters=$(awk -v t="${t:-0}" 'BEGIN { k = 20; if (t > 0 && 50000 / t > k) k = int(50000 / t); if (k > 20000) k = 20000; print k }')
    "$F" "$op" --ranks "$n" -b "$s" -e "$s" -n "$iters" -w 20 -c 0 ${fresh[@]+"${fresh[@]}"} "$@" 2>&1 |
      rows | awk '{print $1, $6}'
  done
}
run_openmpi() {
  mpirun --oversubscribe -x MPI_COLL_FRESH="$FRESH" -n "$n" "$P/mc_ompi" "$op" "$minb" "$maxb" 4 2>&1 | rows
}
run_mpich() { "$M/bin/mpirun" -n "$n" "$P/mc_mpich" "$op" "$minb" "$maxb" 4 2>&1 | rows; }
run_intelmpi() {
  (export PATH=$I/bin:$PATH I_MPI_ROOT=$I
    mpirun -n "$n" "$P/mc_impi" "$op" "$minb" "$maxb" 4 2>&1 | rows)
}
run_gloo() { "$TORCH_PYTHON" "$here/peers/gloo_coll.py" "$n" "$op" "$minb" "$maxb" 4 2>&1 | rows; }
echo "# peers.sh $op $n $minb $maxb $turns$([ "$FRESH" = 1 ] && echo ' FRESH=1') ($(date -u +%FT%TZ), nproc $(nproc), load $(cut -d' ' -f1-3 /proc/loadavg))"
for t in $(seq 1 "$turns"); do
  echo "### turn $t"
  machine
  for peer in $PEERS; do
    case $peer in
    openmpi)
      echo "## openmpi"
      gated run_openmpi
      ;;
    mpich)
      if [ "$n" -le "$(nproc)" ]; then
        echo "## mpich"
        gated run_mpich
      fi
      ;;
    intelmpi)
      echo "## intelmpi"
      gated run_intelmpi
      ;;
    bound)
      # The bare program between shared buffers (bench/bound/windows.c):
      # what any call between windows must spend here, for the windows
      # column's target. Reused buffers only.
      if [ "$FRESH" = 1 ]; then
        [ "$t" = 1 ] && echo "# bound left out: windows.c has no fresh rounds" >&2
      else
        echo "## bound"
        # Where the ranks outnumber the CPUs, the same traffic done by as
        # many processes as CPUs too (WORKERS), and the faster counts:
        # nothing spent on ranks taking turns. There the N processes'
        # time comes after it too ("bound-procs"): the floor of a library
        # whose N processes take turns at every meeting.
        workers=$n
        [ "$n" -gt "$(nproc)" ] && workers="$n $(nproc)"
        procs=()
        for ((s = minb; s <= maxb; s *= 4)); do
          lines=""
          for w in $workers; do
            # A wrong result fails the run whichever count it came from.
            got=$(WORKERS=$w "$P/windows" "$op" "$n" "$s") || exit 1
            lines+="$w $got"$'\n'
          done
          printf '%s' "$lines" | awk '{print $2, $3}' | sort -k2 -g | head -1
          if [ "$workers" != "$n" ]; then
            procs+=("$(printf '%s' "$lines" | awk -v n="$n" '$1 == n {print $2, $3}')")
          fi
        done
        if [ "${#procs[@]}" -gt 0 ]; then
          echo "## bound-procs"
          printf '%s\n' "${procs[@]}"
        fi
      fi
      ;;
    gloo)
      if [ "$FRESH" = 1 ]; then
        [ "$t" = 1 ] && echo "# gloo left out: gloo_coll.py has no fresh rounds" >&2
      elif "$TORCH_PYTHON" -c "import torch" 2>/dev/null; then
        echo "## gloo"
        gated run_gloo
      elif [ "$t" = 1 ]; then
        echo "# gloo left out: $TORCH_PYTHON has no torch" >&2
      fi
      ;;
    esac
  done
  echo "## ferroccl"
  gated ferroccl
  echo "## ferroccl-win"
  gated ferroccl -R 2
done
machine
