#!/usr/bin/env bash
# The NCCL ABI's real clients on a GPU machine (issue 19, item 4), from
# the gpu-run/nccl/ folder that nccl/gpu/collect.sh made. Its `ddp` part
# on 2 processes ran and passed on an H200 (cuda/gpu/run.sh's ddp step,
# docs/hardware.md runs 5-7); the others have not run. Each part skips, saying why,
# where what it needs is missing. Logs go to $OUT when set, else ./logs.
#
# 1. PyTorch DDP: ddp_losses.py as 1 process with torch's own NCCL, then
#    as 2 and 3 processes on the one GPU with LD_PRELOAD of our
#    libnccl.so.2 (real NCCL refuses ranks sharing a GPU); the losses of
#    every step must match the single process's within 1e-4 (relative).
# 2. cudarc: bin/cudarc-nccl-check (nccl/cudarc-check), Candle's pattern
#    (rank 0's Id::new shared through a file, Comm::from_rank on each
#    rank's stream, all_reduce of CudaSlices, 1 to 4M+3 f32, then
#    all_reduce_in_place, broadcast and all_gather) as 2 and 3 processes
#    on the one GPU with LD_LIBRARY_PATH=lib (cudarc opens libnccl.so);
#    every rank checks that cudarc mapped our library and compares each
#    result with an f64 reference. Then its host mode (cudarc's
#    result-level calls on host memory, as in CI) as 3 processes.
# 3. nccl-tests: all_reduce_perf built here from the carried source
#    against our header and library (needs nvcc), run with 2 thread ranks
#    on the one GPU (-t 2 -g 1), 8 B to 64 MiB, its own correctness check
#    on (-c 1); and torch's NCCL with 1 rank beside it for latency, where
#    that library can be found.
#
# FERROCCL_NCCL_STEPS (ddp,cudarc,nccl-tests; all when unset) picks the
# parts: cuda/gpu/run.sh runs `ddp` alone, 2 processes, in its budget.
# FERROCCL_NCCL_WORLDS (default "2 3") are DDP's process counts.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
logs=${OUT:-$here/logs}
mkdir -p "$logs"
lib=$here/lib
status=0
steps=${FERROCCL_NCCL_STEPS:-ddp,cudarc,nccl-tests}
wants() { [[ ",$steps," == *",$1,"* ]]; }

# Our library compiles its reduction kernels with NVRTC: PyPI's
# nvidia-cuda-nvrtc in the Python that holds PyTorch, or the toolkit's.
# Every part gets its folder added to the loader's path (never in place
# of what is there: torch's own libraries are found through it).
nvrtc_dir=${FERROCCL_NVRTC_DIR:-}
[ -n "$nvrtc_dir" ] || for root in "$(python3 -c 'import sys; print(sys.prefix)' 2>/dev/null)" /opt/torch/.venv /usr/local/cuda /usr/local/cuda-13.0; do
  [ -n "$root" ] && [ -d "$root" ] || continue
  hit=$(find "$root" -name 'libnvrtc.so*' -not -name '*builtins*' 2>/dev/null | head -1)
  if [ -n "$hit" ]; then nvrtc_dir=$(dirname "$hit"); break; fi
done
echo "libnvrtc: ${nvrtc_dir:-not found}"
with_nvrtc="${nvrtc_dir:+$nvrtc_dir:}${LD_LIBRARY_PATH:-}"

if wants ddp; then
echo "== PyTorch DDP with LD_PRELOAD=$lib/libnccl.so.2"
if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  python3 "$here/ddp_losses.py" --world 1 --out "$logs/ddp-1.json" >"$logs/ddp-1.log" 2>&1 ||
    { echo "single-process run failed (see ddp-1.log)"; status=1; }
  for world in ${FERROCCL_NCCL_WORLDS:-2 3}; do
    port=$((29500 + world))
    pids=()
    for ((r = 0; r < world; r++)); do
      # Unbuffered, with the library's INFO lines (paths chosen, calls
      # failed), in the caller's process group (--foreground) so that a
      # hung step's stacks and kill reach the ranks.
      LD_PRELOAD=$lib/libnccl.so.2 LD_LIBRARY_PATH="$with_nvrtc" FERROCCL_TIMEOUT=60 RANK=$r WORLD_SIZE=$world \
        MASTER_ADDR=127.0.0.1 MASTER_PORT=$port PYTHONUNBUFFERED=1 FERROCCL_DEBUG=${FERROCCL_DEBUG:-INFO} \
        timeout --foreground 140 python3 "$here/ddp_losses.py" --world "$world" --out "$logs/ddp-$world.json" \
        >"$logs/ddp-$world-rank$r.log" 2>&1 &
      pids+=($!)
    done
    ok=1
    for p in "${pids[@]}"; do wait "$p" || ok=0; done
    if [ $ok = 1 ] && python3 "$here/ddp_losses.py" --compare "$logs/ddp-1.json" "$logs/ddp-$world.json"; then
      echo "DDP on $world processes: same losses as 1 process"
    else
      echo "DDP on $world processes: FAILED (logs ddp-$world-rank*.log)"
      status=1
    fi
  done
else
  echo "SKIP: no python3 with torch and a CUDA device"
fi
fi

if wants cudarc; then
echo "== cudarc nccl (Candle's pattern) with LD_LIBRARY_PATH=$lib"
if [ -x "$here/bin/cudarc-nccl-check" ] && command -v nvidia-smi >/dev/null; then
  for run in gpu:2 gpu:3 host:3; do
    mode=${run%:*} world=${run#*:}
    log="$logs/cudarc-$mode-$world.log"
    if LD_LIBRARY_PATH="$lib:$with_nvrtc" \
      FERROCCL_CHECK_EXPECT_LIB=$lib/libferroccl_nccl.so FERROCCL_TIMEOUT=60 \
      CUDARC_CHECK_TIMEOUT=240 timeout 300 "$here/bin/cudarc-nccl-check" "$mode" "$world" >"$log" 2>&1; then
      echo "cudarc $mode, $world processes: every rank OK"
    else
      echo "cudarc $mode, $world processes: FAILED (cudarc-$mode-$world.log):"
      tail -20 "$log"
      status=1
    fi
  done
else
  echo "SKIP: no bin/cudarc-nccl-check (nccl/gpu/collect.sh builds it) or no nvidia-smi"
fi
fi

if wants nccl-tests; then
echo "== nccl-tests all_reduce_perf on ferroccl"
if [ -d "$here/nccl-tests" ] && command -v nvcc >/dev/null; then
  home=$here/nccl-home
  mkdir -p "$home"
  ln -sfn "$here/include" "$home/include"
  ln -sfn "$lib" "$home/lib"
  # all_reduce_perf alone, for this GPU's architecture alone (every
  # test for every architecture takes many minutes).
  cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '.')
  if make -C "$here/nccl-tests/src" -j8 NCCL_HOME="$home" MPI=0 BUILDDIR="$here/nccl-tests/build" \
    ${cc:+NVCC_GENCODE="-gencode=arch=compute_$cc,code=sm_$cc"} \
    "$here/nccl-tests/build/all_reduce_perf" >"$logs/nccl-tests-build.log" 2>&1; then
    LD_LIBRARY_PATH="$lib:$with_nvrtc" FERROCCL_TIMEOUT=60 timeout 300 \
      "$here/nccl-tests/build/all_reduce_perf" -b 8 -e 64M -f 4 -t 2 -g 1 -c 1 \
      | tee "$logs/all_reduce_perf-ferroccl.txt" || status=1
    torch_nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(nvidia.nccl.__path__[0], "lib"))' 2>/dev/null || true)
    if [ -n "$torch_nccl" ] && [ -e "$torch_nccl/libnccl.so.2" ]; then
      LD_LIBRARY_PATH="$torch_nccl${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" timeout 300 \
        "$here/nccl-tests/build/all_reduce_perf" -b 8 -e 64M -f 4 -t 1 -g 1 -c 1 \
        | tee "$logs/all_reduce_perf-nccl-1rank.txt"
    fi
  else
    echo "nccl-tests did not build (nccl-tests-build.log)"
    status=1
  fi
else
  echo "SKIP: no nccl-tests source carried (NCCL_TESTS_SRC at collect time) or no nvcc"
fi
fi
exit $status
