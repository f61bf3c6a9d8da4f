#!/usr/bin/env bash
# ferroccl-perf next to its peers (Open MPI shared memory and TCP, PyTorch's
# Gloo), in one session, on the same sizes; then a side-by-side busbw table.
#
# usage: bench/compare.sh [OP] [RANKS] [MINBYTES] [MAXBYTES] [ITERS]
#   OP: allreduce | reducescatter | allgather   (f32, sum; the peers' set)
# Environment:
#   COMPARE_CSV=FILE   also write the summary as CSV to FILE
#   COMPARE_OUT=DIR    keep the raw outputs in DIR (default: a temp dir)
#   COMPARE_WINDOWS=1  also run ferroccl-perf -R 2 (buffers in windows)
#                      in the same session, as extra columns
#   FERROCCL_*         passed through to ferroccl (transport, buffsize, ...)
# The peers' script installs Open MPI and PyTorch on first use (minutes).
set -euo pipefail
op=${1:-allreduce} n=${2:-2} minb=${3:-1024} maxb=${4:-67108864} iters=${5:-20}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
peers=${PEERS_DIR:-$root/../shared/peers}
[ -x "$peers/run.sh" ] || peers=/work/shared/peers
out=${COMPARE_OUT:-$(mktemp -d "${TMPDIR:-/tmp}/ferroccl-compare.XXXXXX")}
mkdir -p "$out"

# The peers step sizes by 4; ferroccl does the same so every row pairs up.
(cd "$root" && cargo build --release -q -p ferroccl-bench --bin ferroccl-perf)
perf=${CARGO_TARGET_DIR:-$root/target}/release/ferroccl-perf

echo "## $(date -u '+%Y-%m-%dT%H:%M:%SZ') $(hostname) nproc=$(nproc) load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "## ferroccl ($op, $n ranks, transport ${FERROCCL_TRANSPORT:-default})"
"$perf" "$op" --ranks "$n" -b "$minb" -e "$maxb" -f 4 -n "$iters" -w 3 \
  --csv "$out/ferroccl.csv" | tee "$out/ferroccl.txt"
echo
windows=()
if [ "${COMPARE_WINDOWS:-0}" = 1 ]; then
  echo "## ferroccl with windows (-R 2, $op, $n ranks)"
  "$perf" "$op" --ranks "$n" -b "$minb" -e "$maxb" -f 4 -n "$iters" -w 3 -R 2 \
    --csv "$out/ferroccl-windows.csv" | tee "$out/ferroccl-windows.txt"
  windows=(--windows "$out/ferroccl-windows.csv")
  echo
fi
echo "## peers"
# ferroccl's allgather sizes (as nccl-tests') are the whole gathered array;
# the peers take the bytes each rank contributes and report the whole.
pminb=$minb pmaxb=$maxb
if [ "$op" = allgather ]; then pminb=$((minb / n)) pmaxb=$((maxb / n)); fi
# A peer that cannot run the collective (Gloo has no reduce_scatter) ends
# the peers' script early; keep what the others measured.
"$peers/run.sh" "$op" "$n" "$pminb" "$pmaxb" "$iters" | tee "$out/peers.txt" ||
  echo "## (the peers' script stopped early: a peer lacks $op)"
echo "## load after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
python3 "$here/compare_summary.py" "$out/ferroccl.csv" "$out/peers.txt" ${windows[@]+"${windows[@]}"} \
  ${COMPARE_CSV:+--csv "$COMPARE_CSV"}
