#!/usr/bin/env bash
# The first GPU run (issue 35), from the gpu-run/ folder that
# cuda/gpu/collect.sh made, on a machine with a CUDA driver and no Rust
# toolchain. One command of at most 8 minutes: the steps run in the order
# of what they prove per minute, each under its own timeout, and no step
# starts after FERROCCL_GPU_BUDGET seconds (450: 7.5 minutes) from the
# start, nor runs past 20 s after it (the device tool's timeout_s=480). Writes at most 8 files to $OUT (./out when unset):
#
#   summary.md    one line per step, rewritten after every step (a kill
#                 leaves it)
#   env.txt       the machine: GPU, driver, MPS, Python, torch, NVRTC
#   probe.txt     which driver calls wait for a parked stream (step 2)
#   logs.tar.gz   every step's log, archived after every step
#   stacks.txt    for a step that hung: its processes' threads, where each
#                 waits, and (with cuda-gdb) their backtraces
#
#   ./run.sh          every step
#   ./run.sh --dry    the same steps without a GPU (no device required):
#                     proves the script, the binaries and the budget here
#
# The steps (FERROCCL_GPU_STEPS=name,name runs only those):
#   env        versions (no timeout worth counting)
#   probe      bin/ferroccl-sync-probe: the device rule against the driver
#   kernels    bin/test-engine: every kernel against the host stand-in,
#              bit for bit, and the gates
#   executor   bin/test-ferroccl-lib exec::oracle::kernel_gpu: the device
#              executor's kernels without the launcher
#   ipc        bin/test-ferroccl_cuda_ipc: VMM/IPC memory across processes
#   threads    bin/test-cuda: the launcher on thread ranks, the raw entry
#              points first, then every collective and the stream order
#   threads-bulk  where threads failed: every collective again with the
#              bulk protocol alone (FERROCCL_PROTO=Simple)
#   staged     ferroccl-perf allreduce --device cuda --ranks 2, every call
#              staged (FERROCCL_P2P_DISABLE=1), 1 MiB to 64 MiB, checked
#   processes  under MPS only (skipped, saying so, where it did not start):
#              test-cuda's process tests, then a rank killed mid-run
#   ddp        PyTorch DDP through the NCCL ABI (LD_PRELOAD of our
#              libnccl.so.2): 1 process with torch's NCCL, 2 with ours;
#              then python/gpu/run.sh where that script exists
#   candle     bin/candle_cuda_check under bin/ferroccl-run -n 2: Candle
#              CUDA tensors on the device path against the host path
#              (collected only with FERROCCL_CANDLE_CUDA=1)
#   bench      bin/ferroccl-kernel-bench 64 256 (reduce vs copy)
#   perf       ferroccl-perf's busbw: staged (2 slot sizes) against host
#              memory, the executor under MPS (allreduce, allgather,
#              reduce-scatter, 1 MiB to 1 GiB; allreduce on 1 and 32
#              channels; 8 bytes by LL)
#   sanitize   compute-sanitizer memcheck over the kernel and executor
#              GPU tests
set -uo pipefail
dry=0
[ "${1:-}" = --dry ] && dry=1
here=$(cd "$(dirname "$0")" && pwd)
cd "$here"
out=${OUT:-$here/out}
# collect.sh packs the binaries, the NCCL library and the Python package
# into kit.tgz: unpacked into a folder of /tmp, from which every step
# runs (gpu-run/ itself stays as carried).
if [ -f kit.tgz ]; then
  kit=$(mktemp -d /tmp/ferroccl-kit.XXXXXX)
  tar -xzf kit.tgz -C "$kit" || { echo "cannot unpack $here/kit.tgz" >&2; exit 1; }
  cp commit "$kit/" 2>/dev/null
  trap 'cd / && rm -rf "$kit"' EXIT
  cd "$kit"
fi
mkdir -p "$out"
logs=$(mktemp -d /tmp/ferroccl-gpu-logs.XXXXXX)
budget=${FERROCCL_GPU_BUDGET:-450}
only=${FERROCCL_GPU_STEPS:-}
t0=$(date +%s)
summary=$out/summary.md
rows=()

write_summary() {
  {
    echo "# GPU run $(cat commit 2>/dev/null || echo '?') $( [ $dry = 1 ] && echo '(dry run, no GPU)')"
    echo
    echo "| step | result | seconds | note |"
    echo "|---|---|---|---|"
    printf '%s\n' "${rows[@]}"
    echo
    echo "elapsed $(($(date +%s) - t0)) s of a budget of $budget s"
  } >"$summary.tmp" && mv "$summary.tmp" "$summary"
  tar -czf "$out/logs.tar.gz.tmp" -C "$logs" . 2>/dev/null && mv "$out/logs.tar.gz.tmp" "$out/logs.tar.gz"
}

# stacks NAME PGID: where every thread of the step's processes waits.
stacks() {
  local name=$1 pgid=$2
  {
    echo "== step $name hung: its processes at $(date -u +%T)"
    for pid in $(pgrep -g "$pgid"); do
      echo "-- pid $pid: $(tr '\0' ' ' </proc/"$pid"/cmdline 2>/dev/null)"
      for task in /proc/"$pid"/task/*; do
        printf '   %s %s wchan=%s\n' "${task##*/}" "$(cat "$task"/comm 2>/dev/null)" "$(cat "$task"/wchan 2>/dev/null)"
        sed 's/^/      /' "$task"/stack 2>/dev/null | head -12
      done
      if command -v cuda-gdb >/dev/null; then
        timeout 30 cuda-gdb -batch -p "$pid" -ex 'thread apply all bt 12' 2>&1 | grep -E '^(Thread|#)' | head -200
      fi
    done
  } >>"$out/stacks.txt" 2>&1
}

# step NAME TIMEOUT NOTE -- COMMAND...: run COMMAND in a process group of
# its own, its output in NAME.log, bounded by TIMEOUT (stacks, then the
# whole group killed), and add its row.
step() {
  local name=$1 limit=$2 note=$3
  shift 4
  if [ -n "$only" ] && [[ ",$only," != *",$name,"* ]]; then return; fi
  local now=$(($(date +%s) - t0))
  if [ "$now" -ge "$budget" ]; then
    rows+=("| $name | NOT STARTED (budget spent at ${now} s) | 0 | $note |")
    write_summary
    return
  fi
  # Never past 20 s after the budget's end: 470 s of the 480 the command
  # is given (docs/hardware.md), so the summary is written before a kill.
  local left=$((budget + 20 - now))
  [ "$limit" -gt "$left" ] && limit=$left
  local start=$(date +%s) status
  echo "== $name (at most $limit s): $*"
  setsid "$@" >"$logs/$name.log" 2>&1 &
  local pid=$! rc=
  while :; do
    if ! kill -0 "$pid" 2>/dev/null; then wait "$pid"; rc=$?; break; fi
    if [ $(($(date +%s) - start)) -ge "$limit" ]; then
      stacks "$name" "$pid"
      kill -9 -- -"$pid" 2>/dev/null
      wait "$pid" 2>/dev/null
      rc=timeout
      break
    fi
    sleep 1
  done
  case $rc in
    0) status=ok ;;
    77) status=$(tail -1 "$logs/$name.log") ;;
    timeout) status="HUNG (killed at $limit s; stacks.txt)" ;;
    *) status="FAILED ($rc): $(grep -E 'panicked|FAILED|Error|error' "$logs/$name.log" | head -1 | cut -c1-160)" ;;
  esac
  local tests
  tests=$(grep -E '^test result' "$logs/$name.log" | tail -1 | sed 's/test result: //; s/; finished.*//')
  rows+=("| $name | $status | $(($(date +%s) - start)) | $note${tests:+ ($tests)} |")
  tail -3 "$logs/$name.log"
  write_summary
}

# NVRTC: PyPI's nvidia-cuda-nvrtc in the Python that holds PyTorch, or the
# toolkit's. Its folder goes on the loader's path (libnvrtc-builtins),
# added to what is there, never in its place.
nvrtc_dir=${FERROCCL_NVRTC_DIR:-}
[ -n "$nvrtc_dir" ] || for root in "$(python3 -c 'import sys; print(sys.prefix)' 2>/dev/null)" /opt/torch/.venv /usr/local/cuda; do
  [ -n "$root" ] && [ -d "$root" ] || continue
  hit=$(find "$root" -name 'libnvrtc.so*' -not -name '*builtins*' 2>/dev/null | head -1)
  if [ -n "$hit" ]; then nvrtc_dir=$(dirname "$hit"); break; fi
done
[ -n "$nvrtc_dir" ] && export LD_LIBRARY_PATH="$nvrtc_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export RUST_BACKTRACE=1 FERROCCL_TIMEOUT=${FERROCCL_TIMEOUT:-60}
if [ $dry = 0 ]; then
  export FERROCCL_REQUIRE_NVRTC=1 FERROCCL_REQUIRE_DEVICE=1
fi

environment() {
  echo "date $(date -u +%FT%TZ), commit $(cat commit 2>/dev/null)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader 2>&1
  nvidia-smi -q 2>/dev/null | grep -iE 'CUDA Version|Compute Mode|MIG Mode' | head -5
  echo "nvidia-cuda-mps-control: $(command -v nvidia-cuda-mps-control || echo absent)"
  echo "cuda-gdb: $(command -v cuda-gdb || echo absent)"
  echo "libnvrtc: ${nvrtc_dir:-not found}"
  python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count())' 2>&1 | tail -1
  uname -r; nproc; free -g | head -2
  # What a short sleep costs there: the host waits of the staged path and
  # the executor's watchdog sleep 20 us between polls, and a VM's timer
  # may round that up (run 8's staged calls cost about 1 ms more than the
  # same calls on host memory, whatever their size).
  python3 -c 'import time
for us in (20, 100):
    t = time.perf_counter()
    for _ in range(500): time.sleep(us / 1e6)
    print("sleep(%d us) takes %.1f us" % (us, (time.perf_counter() - t) / 500 * 1e6))' 2>&1
  return 0
}
environment >"$out/env.txt" 2>&1
rows+=("| env | ok | 0 | env.txt |")
write_summary

step probe 90 "driver calls that wait for a parked stream (probe.txt)" -- bin/ferroccl-sync-probe
cp "$logs/probe.log" "$out/probe.txt" 2>/dev/null
step kernels 90 "kernels vs the stand-in, gates" -- bin/test-engine --test-threads=1
step executor 90 "executor kernels, no launcher" -- bin/test-ferroccl-lib exec::oracle::kernel_gpu --test-threads=1
step ipc 60 "VMM/IPC across processes" -- bin/test-ferroccl_cuda_ipc --test-threads=1
step threads-raw 60 "thread ranks: raw entry points" -- bin/test-cuda raw_entry_points --test-threads=1
step threads 120 "thread ranks: every collective, stream order" -- bin/test-cuda --skip raw_entry_points --skip process --test-threads=1

# Only where threads failed: the same collectives with the bulk protocol
# alone (FERROCCL_PROTO=Simple), which says whether a lost frame is LL's
# (the second GPU run: all_reduce #6 on 2 thread ranks lost one).
threads_bulk() {
  grep -q '^test result: ok' "$logs/threads.log" 2>/dev/null && { echo "skipped: threads passed"; exit 77; }
  FERROCCL_PROTO=Simple exec bin/test-cuda every_collective_on_device_memory --test-threads=1
}
export -f threads_bulk
export dry logs
step threads-bulk 100 "only if threads failed: the same, bulk protocol only" -- bash -c threads_bulk

# The thread test with the context's hardware queues at 32
# (CUDA_DEVICE_MAX_CONNECTIONS; the default is 8) and at 1. Two streams of
# one context that share a queue run in one order: a stream parked at a
# gate (cuStreamWaitValue32) held back, so, the kernel the gate waited for
# (runs 3 and 4, docs/hardware.md). With calls that return when done
# nothing is parked, and both must pass; where threads failed they are
# skipped (the same fault, at a worse time).
threads_conns() {
  [ -z "$only" ] && ! grep -q '^test result: ok' "$logs/threads.log" 2>/dev/null &&
    { echo "skipped: threads failed"; exit 77; }
  CUDA_DEVICE_MAX_CONNECTIONS=$1 FERROCCL_TIMEOUT=${2:-60} exec bin/test-cuda every_collective_on_device_memory --test-threads=1
}
export -f threads_conns
export only
step threads-c32 90 "threads, 32 hardware queues" -- bash -c 'threads_conns 32'
step threads-c1 60 "threads, 1 hardware queue" -- bash -c 'threads_conns 1 15'

staged() {
  [ $dry = 1 ] && { echo "skipped: dry run (ferroccl-perf --device cuda needs a GPU)"; exit 77; }
  FERROCCL_P2P_DISABLE=1 bin/ferroccl-perf allreduce --device cuda --ranks 2 -d float -b 1M -e 64M -f 4 -n 4 -w 1 -c 1
}
export -f staged
export dry logs
step staged 90 "2 processes, staged, allreduce 1-64 MiB" -- bash -c staged

# Start the MPS daemon for the calling step's shell, which stops it when
# it exits; nonzero, the reason printed, where it did not start or does
# not answer.
mps_start() {
  command -v nvidia-cuda-mps-control >/dev/null || { echo "skipped: no nvidia-cuda-mps-control"; return 1; }
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/ferroccl-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/ferroccl-mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d || { echo "skipped: MPS did not start"; return 1; }
  trap 'echo quit | nvidia-cuda-mps-control' EXIT
  sleep 1
  echo get_server_list | timeout 10 nvidia-cuda-mps-control >/dev/null || { echo "skipped: MPS does not answer"; return 1; }
}
export -f mps_start

# Process ranks on one GPU need MPS for their kernels to run at once: the
# tests run only where the daemon started and answers.
processes() {
  [ $dry = 1 ] && { echo "skipped: dry run (MPS needs a GPU)"; exit 77; }
  mps_start || exit 77
  FERROCCL_GPU_PROCESS_TESTS=1 timeout 120 bin/test-cuda process --test-threads=1 || exit 1
  # A rank killed while the others' kernels wait: the launcher's children
  # are the ranks (timeout's child is the launcher itself).
  timeout 60 bin/ferroccl-perf allreduce --device cuda --ranks 3 -d float -b 256M -e 256M -n 1000 -w 1 -c 0 &
  local t=$!
  sleep 8
  local launcher rank
  launcher=$(pgrep -P "$t" | head -1)
  rank=$(pgrep -P "$launcher" | tail -1)
  [ -n "$rank" ] || { echo "no rank process found under the launcher $launcher"; exit 1; }
  echo "killing rank process $rank"
  kill -9 "$rank"
  wait "$t"
  echo "launcher ended with $? (it must name the killed rank above)"
}
export -f processes
step processes 150 "MPS: process tests, a killed rank" -- bash -c processes

ddp() {
  python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null ||
    { echo "skipped: no python3 with torch and a CUDA device"; exit 77; }
  [ -d nccl ] || { echo "skipped: no nccl/ (nccl/gpu/collect.sh)"; exit 77; }
  # Its logs go with the others (into logs.tar.gz), not beside them.
  mkdir -p "$logs/ddp"
  OUT=$logs/ddp FERROCCL_NCCL_STEPS=ddp FERROCCL_NCCL_WORLDS=2 nccl/run.sh &
  local run=$! waited=0
  # Where the ranks hang: every thread's native stack (the library keeps
  # its symbols) once the 2-process run is 75 s old, before its own
  # timeout kills it (the third run's capture came too late).
  while kill -0 $run 2>/dev/null; do
    sleep 1
    pgrep -f 'ddp_losses.py --world 2' >/dev/null && waited=$((waited + 1))
    if [ $waited = 75 ] && command -v cuda-gdb >/dev/null; then
      for pid in $(pgrep -f 'ddp_losses.py --world 2'); do
        [ "$(cat /proc/$pid/comm 2>/dev/null)" = timeout ] && continue
        { echo "-- pid $pid"; timeout 30 cuda-gdb -batch -p "$pid" -ex 'thread apply all bt 24' 2>&1 |
          grep -E '^(Thread|#)' | head -400; } >>"$logs/ddp/native-stacks.txt" 2>&1
      done
    fi
  done
  wait $run
}
export -f ddp
step ddp 150 "PyTorch DDP, LD_PRELOAD of our libnccl" -- bash -c ddp
if [ -x python/gpu/run.sh ] || [ -f python/gpu/run.sh ]; then
  step torch 90 "python/gpu/run.sh (the torch backend)" -- env OUT="$logs/torch" bash python/gpu/run.sh
else
  rows+=("| torch | skipped: no python/gpu/run.sh in this build | 0 | |")
  write_summary
fi
# Candle's device path (feature candle-cuda, docs/frameworks.md): every
# collective and the AllReduce op on CUDA tensors against the host path,
# 2 processes on one GPU, staged (no MPS needed). Collected only with
# FERROCCL_CANDLE_CUDA=1; the binary is linked to cuBLAS, cuRAND, cudart
# and NVRTC 13, looked for beside PyTorch's NVRTC where the loader lacks
# them.
candle() {
  [ -x bin/candle_cuda_check ] || { echo "skipped: not collected (FERROCCL_CANDLE_CUDA=1 cuda/gpu/collect.sh)"; exit 77; }
  [ $dry = 1 ] && { echo "skipped: dry run (CUDA tensors need a GPU)"; exit 77; }
  local site extra=
  site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' 2>/dev/null)
  for d in ${nvrtc_dir:-} "$site"/nvidia/*/lib "$site"/nvidia/cu13/lib; do
    [ -d "$d" ] && extra="$extra:$d"
  done
  export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}$extra"
  local missing
  missing=$(ldd bin/candle_cuda_check | awk '/not found/ { print $1 }' | tr '\n' ' ')
  [ -z "$missing" ] || { echo "skipped: the loader lacks $missing"; exit 77; }
  FERROCCL_P2P_DISABLE=1 bin/ferroccl-run -n 2 -- bin/candle_cuda_check
}
export -f candle
export nvrtc_dir
step candle 90 "Candle CUDA tensors, device path vs host, 2 processes" -- bash -c candle

bench() {
  [ $dry = 1 ] && { echo "skipped: dry run (the benchmark needs a GPU)"; exit 77; }
  bin/ferroccl-kernel-bench 64 256
}
export -f bench
step bench 60 "reduce kernels vs copy, 64 and 256 MiB" -- bash -c bench

# Speed of the two paths between processes on one GPU (docs/hardware.md,
# run 8), each against what bounds it in the same run: the staged path
# (copies through pinned host memory, the host's transport between them)
# against the same allreduce on host memory, with its default slot and
# with 4x the slot; the device executor (cuda-ipc, processes under MPS)
# for allreduce, allgather and reduce-scatter. busbw as nccl-tests.
perf() {
  [ $dry = 1 ] && { echo "skipped: dry run (ferroccl-perf --device cuda needs a GPU)"; exit 77; }
  local p=bin/ferroccl-perf
  echo "### host memory, 2 processes (the staged path's host part)"
  timeout 40 $p allreduce --ranks 2 -d float -b 1M -e 256M -f 4 -n 10 -w 2 -c 0 || exit 1
  echo "### staged, 2 processes, default slot"
  FERROCCL_P2P_DISABLE=1 timeout 50 $p allreduce --device cuda --ranks 2 -d float -b 1M -e 256M -f 4 -n 5 -w 1 -c 0 || exit 1
  echo "### staged, 2 processes, FERROCCL_BUFFSIZE=16777216 (4x the slot)"
  FERROCCL_BUFFSIZE=16777216 FERROCCL_P2P_DISABLE=1 timeout 50 $p allreduce --device cuda --ranks 2 -d float -b 1M -e 256M -f 4 -n 5 -w 1 -c 0 || exit 1
  # The executor between processes on one GPU needs MPS (processes()).
  mps_start || exit 0
  local op
  for op in allreduce allgather reduce_scatter; do
    echo "### executor (cuda-ipc, MPS), 2 processes, $op"
    FERROCCL_DEBUG=INFO timeout 50 $p $op --device cuda --ranks 2 -d float -b 1M -e 1G -f 4 -n 10 -w 2 -c 0 2>&1 |
      grep -vE 'INFO (ferroccl::comm::create|rendezvous)' | grep -E '^[ #]|cuda-ipc|staged|ERROR|WARN|error' || exit 1
  done
  # The default is 32 channels on 2 ranks since run 9 (1 channel: 9.9
  # GB/s at 1 GiB, 8: 60, 32: 146): checked results at the default, then
  # 8 (the old default), 16 and 64 beside it; then the 8-byte latency.
  echo "### executor, allreduce, default channels, results checked"
  timeout 40 $p allreduce --device cuda --ranks 2 -d float -b 1M -e 256M -f 16 -n 5 -w 1 -c 1 || exit 1
  local ch
  for ch in 8 16 64; do
    echo "### executor, allreduce, FERROCCL_MAX_NCHANNELS=$ch"
    FERROCCL_MAX_NCHANNELS=$ch timeout 40 $p allreduce --device cuda --ranks 2 -d float -b 64M -e 1G -f 4 -n 10 -w 2 -c 0 || exit 1
  done
  # Bytes in flight a block: since run 9 a thread reads 4 units of 16
  # bytes before it writes them; 1 is the kernel of run 9, 2 between.
  local u
  for u in 1 2; do
    echo "### executor, allreduce, FERROCCL_EXEC_UNROLL=$u (default channels)"
    FERROCCL_EXEC_UNROLL=$u timeout 40 $p allreduce --device cuda --ranks 2 -d float -b 64M -e 1G -f 4 -n 10 -w 2 -c 0 || exit 1
  done
  echo "### executor, allreduce of 8 bytes, LL"
  FERROCCL_PROTO=LL timeout 30 $p allreduce --device cuda --ranks 2 -d float -b 8 -e 8 -n 1000 -w 100 -c 0 || exit 1
}
export -f perf
step perf 200 "speed: staged (2 slots) and host, executor under MPS" -- bash -c perf

# compute-sanitizer (memcheck) over the reduction kernels' GPU test and
# the executor's kernels: an out-of-bounds access or a misaligned vector
# no test's bits would show. Capped at 60 s each (the tool slows kernels
# many times): a cut-short run ends 124 and says so.
sanitize() {
  [ $dry = 1 ] && { echo "skipped: dry run (compute-sanitizer needs a GPU)"; exit 77; }
  local cs
  cs=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
  [ -n "$cs" ] || { echo "skipped: no compute-sanitizer"; exit 77; }
  local rc=0
  timeout 60 "$cs" --tool memcheck --error-exitcode 3 bin/test-engine every_kernel --test-threads=1 || rc=$?
  echo "memcheck kernels: exit $rc"
  local rc2=0
  timeout 60 "$cs" --tool memcheck --error-exitcode 3 bin/test-ferroccl-lib exec::oracle::kernel_gpu --test-threads=1 || rc2=$?
  echo "memcheck executor: exit $rc2"
  [ $rc = 0 ] && [ $rc2 = 0 ]
}
export -f sanitize
step sanitize 130 "compute-sanitizer memcheck: kernels, executor" -- bash -c sanitize

echo
cat "$summary"
rm -rf "$logs"
