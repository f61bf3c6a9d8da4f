#!/usr/bin/env bash
# The NCCL ABI's real clients on a GPU machine (issue 19, item 4), from
# the gpu-run/nccl/ folder that nccl/gpu/collect.sh made. Not run yet: no
# session has had a GPU since it was written. Each part skips, saying why,
# where what it needs is missing. Logs go to $OUT when set, else ./logs.
#
# 1. PyTorch DDP: ddp_losses.py as 1 process with torch's own NCCL, then
#    as 2 and 3 processes on the one GPU with LD_PRELOAD of our
#    libnccl.so.2 (real NCCL refuses ranks sharing a GPU); the losses of
#    every step must match the single process's within 1e-4 (relative).
# 2. nccl-tests: all_reduce_perf built here from the carried source
#    against our header and library (needs nvcc), run with 2 thread ranks
#    on the one GPU (-t 2 -g 1), 8 B to 64 MiB, its own correctness check
#    on (-c 1); and torch's NCCL with 1 rank beside it for latency, where
#    that library can be found.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
logs=${OUT:-$here/logs}
mkdir -p "$logs"
lib=$here/lib
status=0

echo "== PyTorch DDP with LD_PRELOAD=$lib/libnccl.so.2"
if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  python3 "$here/ddp_losses.py" --world 1 --out "$logs/ddp-1.json" >"$logs/ddp-1.log" 2>&1 ||
    { echo "single-process run failed (see ddp-1.log)"; status=1; }
  for world in 2 3; do
    port=$((29500 + world))
    pids=()
    for ((r = 0; r < world; r++)); do
      LD_PRELOAD=$lib/libnccl.so.2 FERROCCL_TIMEOUT=60 RANK=$r WORLD_SIZE=$world \
        MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
        timeout 600 python3 "$here/ddp_losses.py" --world "$world" --out "$logs/ddp-$world.json" \
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

echo "== nccl-tests all_reduce_perf on ferroccl"
if [ -d "$here/nccl-tests" ] && command -v nvcc >/dev/null; then
  home=$here/nccl-home
  mkdir -p "$home"
  ln -sfn "$here/include" "$home/include"
  ln -sfn "$lib" "$home/lib"
  if make -C "$here/nccl-tests" -j8 NCCL_HOME="$home" MPI=0 >"$logs/nccl-tests-build.log" 2>&1; then
    LD_LIBRARY_PATH=$lib FERROCCL_TIMEOUT=60 timeout 600 \
      "$here/nccl-tests/build/all_reduce_perf" -b 8 -e 64M -f 4 -t 2 -g 1 -c 1 \
      | tee "$logs/all_reduce_perf-ferroccl.txt" || status=1
    torch_nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(nvidia.nccl.__path__[0], "lib"))' 2>/dev/null || true)
    if [ -n "$torch_nccl" ] && [ -e "$torch_nccl/libnccl.so.2" ]; then
      LD_LIBRARY_PATH=$torch_nccl timeout 600 \
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
exit $status
