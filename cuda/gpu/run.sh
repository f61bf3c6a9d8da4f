#!/usr/bin/env bash
# The GPU run (issue 15, item 6): run from the gpu-run/ folder that
# cuda/gpu/collect.sh made, on a machine with a CUDA driver and no Rust
# toolchain. Finds libnvrtc in the Python environment there, runs every
# gathered test binary with the GPU required, and ends with short tables.
# Logs go to $OUT (the device tool's folder) when it is set, else ./logs.
#
#   ./run.sh          everything (tests, then benchmarks)
#   ./run.sh tests    the test binaries only
#   ./run.sh bench    the kernel benchmark and every ferroccl-perf run
#   ./run.sh staged   the kernel benchmark and the staged runs (--ranks)
#   ./run.sh threads  the kernel benchmark and the thread-rank runs (-t)
#   ./run.sh channels allreduce -t 2, 64 MiB to 1 GiB, with
#                     FERROCCL_MAX_NCHANNELS 1, 4, 16 and 32 (the default
#                     of 8 is unmeasured)
#   ./run.sh processes  process ranks on the one GPU by the device executor
#                     (cuda-ipc): without MPS, then under MPS, and a rank
#                     killed while the others' kernels wait
#
# What runs:
# - tests: every bin/test-* (test-ferroccl-lib: only the executor kernels'
#   GPU test); then test-cuda (ferroccl's tests/cuda.rs, thread ranks: its
#   device calls take the device executor) once more with
#   FERROCCL_P2P_DISABLE=1, every call staged through host memory, logged
#   apart (test-cuda-p2p-disabled.log).
# - kernel benchmark: reduce kernels against a device-to-device copy,
#   64 MiB to 1 GiB (the copy is the reference of the -t busbw below).
# - staged: ferroccl-perf allreduce --device cuda --ranks 2 and 4 (ranks
#   in separate processes) with FERROCCL_P2P_DISABLE=1, so that every call
#   is staged through host memory, 1 MiB to 1 GiB, with each rank's pinned
#   copy bandwidth.
# - processes: ferroccl-perf --device cuda --ranks 2 (allreduce, 1 to
#   16 MiB, bounded at 2 minutes) without MPS: kernels of two processes do
#   not run at once on one GPU without it, so this says what happens. Then
#   the MPS daemon is started (as root; its pipe and log folders under
#   /tmp/ferroccl-mps*), test-cuda's process tests run (every collective x
#   Element x op on 2 and 4 processes, a killed process; they skip without
#   FERROCCL_GPU_PROCESS_TESTS=1), allreduce, allgather and reducescatter --ranks 2
#   and 4, 1 MiB to 1 GiB, checked, the path from the INFO lines; then
#   allreduce --ranks 3 of 256 MiB, 1000 calls, with one rank killed
#   (SIGKILL) after 8 s: the survivors must end with an error naming it,
#   well before the run's bound. MPS is stopped at the end.
# - threads: ferroccl-perf allreduce|allgather|reducescatter --device cuda
#   -t 2 and -t 4 (ranks as threads of one process on one GPU: the device
#   executor), allreduce 1 MiB to 4 GiB, the others to 1 GiB; which path
#   the calls took comes from their INFO lines (perf-cuda-*-t*-info.txt);
#   then the 8-byte
#   allreduce latency of -t 2 and -t 4 with the LL protocol
#   (FERROCCL_PROTO=LL, 1000 calls after 100).
#
# The device tool bounds one command at 10 minutes: where everything may
# not fit, run `tests`, `staged` and `threads` as separate calls. Each test
# binary is bounded at 4 minutes, each ferroccl-perf run at 5, so one that
# hangs cannot eat the whole call.
set -uo pipefail
mode=${1:-all}
case "$mode" in
  all | tests | bench | staged | threads | processes | channels) ;;
  *) echo "usage: $0 [all|tests|bench|staged|threads|processes|channels]" >&2; exit 2 ;;
esac
# Which parts run.
run_tests=0 run_staged=0 run_threads=0 run_processes=0 run_channels=0
case "$mode" in
  all) run_tests=1 run_staged=1 run_threads=1 run_processes=1 run_channels=1 ;;
  tests) run_tests=1 ;;
  bench) run_staged=1 run_threads=1 run_processes=1 run_channels=1 ;;
  channels) run_channels=1 ;;
  staged) run_staged=1 ;;
  threads) run_threads=1 ;;
  processes) run_processes=1 ;;
esac
cd "$(dirname "$0")"
logs=${OUT:-$PWD/logs}
mkdir -p "$logs"

echo "== machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee "$logs/gpu.txt"
echo "commit $(cat commit 2>/dev/null)"

# NVRTC: PyPI's nvidia-cuda-nvrtc, in the Python that holds PyTorch, or
# the CUDA toolkit's. The folder must be on the loader's path, or
# libnvrtc-builtins is not found.
nvrtc_dir=${FERROCCL_NVRTC_DIR:-}
[ -n "$nvrtc_dir" ] || for root in "$(python3 -c 'import sys; print(sys.prefix)' 2>/dev/null)" /opt/torch/.venv /usr/local/cuda /usr/local/cuda-13.0; do
  [ -n "$root" ] && [ -d "$root" ] || continue
  hit=$(find "$root" -name 'libnvrtc.so*' -not -name '*builtins*' 2>/dev/null | head -1)
  if [ -n "$hit" ]; then nvrtc_dir=$(dirname "$hit"); break; fi
done
echo "libnvrtc: ${nvrtc_dir:-not found}"
[ -n "$nvrtc_dir" ] && export LD_LIBRARY_PATH="$nvrtc_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export FERROCCL_REQUIRE_NVRTC=1 FERROCCL_REQUIRE_DEVICE=1 RUST_BACKTRACE=1

results=()
# run_test LABEL LOG BINARY [VAR=VALUE ...]: run one test binary, bounded,
# with the variables set for it alone, and add its row to the table.
run_test() {
  local label=$1 log=$2 t=$3
  shift 3
  local start rc status ms summary
  start=$(date +%s%N)
  local args=(--test-threads=1)
  # ferroccl's library tests: only the executor kernels on the GPU.
  [ "$(basename "$t")" = test-ferroccl-lib ] && args+=(exec::program::kernel_gpu --nocapture)
  env "$@" timeout 240 "$t" "${args[@]}" >"$log" 2>&1
  rc=$?
  case $rc in
    0) status=ok ;;
    124) status="TIMED OUT (240 s)" ;;
    *) status="FAILED ($rc)" ;;
  esac
  ms=$((($(date +%s%N) - start) / 1000000))
  summary=$(grep -E '^test result' "$log" | tail -1 | sed 's/test result: //; s/; finished.*//')
  results+=("$(printf '| %s | %s | %d.%03d s | %s |' "$label" "$status" $((ms / 1000)) $((ms % 1000)) "$summary")")
}
if [ "$run_tests" = 1 ]; then
  for t in bin/test-*; do
    name=$(basename "$t")
    run_test "$name" "$logs/$name.log" "$t"
  done
  # ferroccl's tests/cuda.rs runs its ranks as threads of one process, so
  # its device calls took the device executor above; once more with P2P
  # off, every call staged through host memory.
  if [ -x bin/test-cuda ]; then
    run_test "test-cuda (FERROCCL_P2P_DISABLE=1)" "$logs/test-cuda-p2p-disabled.log" bin/test-cuda \
      FERROCCL_P2P_DISABLE=1
  fi
fi

perf_rows=()
thread_rows=()
channel_rows=()
latency_rows=()
copy_row=
if [ "$run_staged" = 1 ] || [ "$run_threads" = 1 ] || [ "$run_channels" = 1 ]; then
echo
echo "== kernel benchmark (reduce vs device-to-device copy, bytes read + written)"
timeout 240 bin/ferroccl-kernel-bench 64 256 1024 2>&1 | tee "$logs/kernel-bench.txt"
# The copy's rate at 64 MiB, 256 MiB and 1 GiB as bytes copied per second
# (its `copy GB/s` counts bytes read plus written: half of that), the
# reference the -t runs' busbw is put beside.
copy_at() {
  awk -v size="$1" '$1 == size { printf "%.1f", $6 / 2; exit }' "$logs/kernel-bench.txt"
}
c64=$(copy_at 64M) c256=$(copy_at 256M) c1g=$(copy_at 1024M)
copy_row="$(printf '| d2d copy (kernel bench, bytes copied/s) | - | %s | %s | %s | - | - | - | - |' \
  "${c64:-?}" "${c256:-?}" "${c1g:-?}")"
fi

if [ "$run_staged" = 1 ]; then
# Staged allreduce on one GPU, 2 and 4 ranks, 1 MiB to 1 GiB, checked,
# with the pinned host copy bandwidth of 1 GiB measured in the same run
# (issue 15, "Measure"). Few iterations: a 1 GiB call through host memory
# takes a good fraction of a second, and the whole run must stay short.
echo
echo "== ferroccl-perf --device cuda (staged allreduce, f32)"
for ranks in 2 4; do
  log="$logs/perf-cuda-allreduce-$ranks.txt"
  start=$(date +%s)
  FERROCCL_P2P_DISABLE=1 FERROCCL_TIMEOUT=120 timeout 300 bin/ferroccl-perf allreduce --device cuda --ranks "$ranks" \
    -d float -b 1M -e 1G -f 4 -n 8 -w 2 -c 1 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  if [ "$rc" -eq 0 ]; then status=ok; else status="FAILED ($rc)"; fi
  # Row of 1 GiB: busbw out of place (column 8) and in place (12).
  bus=$(awk '$1 == 1073741824 { print $8 " / " $12 }' "$log")
  # Each rank's `# pinned copy: d2h X GB/s, h2d Y GB/s (N bytes) device D`.
  pinned=$(awk '/^# pinned copy:/ { printf "%s%s/%s", sep, $5, $8; sep = ", " }' "$log")
  wrong=$(sed -n 's/^# Out of bounds values : //p' "$log")
  perf_rows+=("$(printf '| %s | %s | %s | %s | %s | %d s |' "$ranks" "$status" "${bus:-?}" "${pinned:-?}" "${wrong:-?}" $(($(date +%s) - start)))")
done
fi

# Thread ranks (-t): every rank a thread of one process on the one GPU, so
# every pair of ranks has the same-process path and the device executor
# runs the calls, GPU to GPU. Allreduce to 4 GiB (-t 4: 12 GiB of device
# buffers per rank, 48 GiB in all, and as much host memory for the check's
# mirrors), allgather and reducescatter to 1 GiB to keep the time; checked. INFO lines go to a file of their own: the path the calls
# took (the choice is logged once per communicator, the protocol once per
# size class, so the calls are not slowed).
# bus_at BYTES LOG: busbw out of place (column 8) / in place (12) of a row.
bus_at() { awk -v b="$1" '$1 == b { print $8 " / " $12 }' "$2"; }
if [ "$run_threads" = 1 ]; then
echo
echo "== ferroccl-perf --device cuda -t (thread ranks of one process, f32)"
for coll in allreduce allgather reducescatter; do
  max=1G
  [ "$coll" = allreduce ] && max=4G
  for threads in 2 4; do
    log="$logs/perf-cuda-$coll-t$threads.txt"
    info="$logs/perf-cuda-$coll-t$threads-info.txt"
    start=$(date +%s)
    FERROCCL_DEBUG=INFO FERROCCL_TIMEOUT=120 timeout 300 bin/ferroccl-perf "$coll" --device cuda \
      -t "$threads" -d float -b 1M -e "$max" -f 4 -n 8 -w 2 -c 1 2>"$info" | tee "$log"
    rc=${PIPESTATUS[0]}
    # What is not INFO (errors, warnings) to the console as well.
    grep -v ' INFO ' "$info" >&2
    if [ "$rc" -eq 0 ]; then status=ok; else status="FAILED ($rc)"; fi
    if grep -q 'device calls run by the device executor' "$info"; then
      path=executor
    elif grep -q 'device calls staged through host memory' "$info"; then
      path=staged
    else
      path=?
    fi
    b64=$(bus_at 67108864 "$log") b256=$(bus_at 268435456 "$log")
    b1g=$(bus_at 1073741824 "$log") b4g=$(bus_at 4294967296 "$log")
    wrong=$(sed -n 's/^# Out of bounds values : //p' "$log")
    thread_rows+=("$(printf '| %s -t %s | %s | %s | %s | %s | %s | %s | %s | %d s |' "$coll" "$threads" "$status" \
      "${b64:--}" "${b256:--}" "${b1g:--}" "${b4g:--}" "$path" "${wrong:-?}" $(($(date +%s) - start)))")
  done
done

# 8-byte allreduce latency with the LL protocol: the time column (us per
# call, the mean of 1000 back-to-back calls from CUDA events; out of place
# column 6, in place 10). Default logging: nothing on the calls' path.
echo
echo "== ferroccl-perf --device cuda -t: 8-byte allreduce latency (FERROCCL_PROTO=LL)"
for threads in 2 4; do
  log="$logs/perf-cuda-latency-t$threads.txt"
  FERROCCL_PROTO=LL FERROCCL_TIMEOUT=60 timeout 120 bin/ferroccl-perf allreduce --device cuda \
    -t "$threads" -d float -b 8 -e 8 -n 1000 -w 100 -c 1 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  if [ "$rc" -eq 0 ]; then status=ok; else status="FAILED ($rc)"; fi
  us=$(awk '$1 == 8 { print $6 " / " $10 }' "$log")
  wrong=$(sed -n 's/^# Out of bounds values : //p' "$log")
  latency_rows+=("$(printf '| %s | %s | %s | %s |' "$threads" "$status" "${us:-?}" "${wrong:-?}")")
done
fi

# The channel count (FERROCCL_MAX_NCHANNELS: blocks a rank cuts a call
# into; the default of 8 is unmeasured): allreduce -t 2, 64 MiB to 1 GiB,
# for 1, 4, 16 and 32 channels.
if [ "$run_channels" = 1 ]; then
echo
echo "== ferroccl-perf --device cuda -t 2: allreduce by the channel bound"
for ch in 1 4 16 32; do
  log="$logs/perf-cuda-allreduce-t2-ch$ch.txt"
  FERROCCL_MAX_NCHANNELS=$ch FERROCCL_TIMEOUT=120 timeout 240 bin/ferroccl-perf allreduce --device cuda \
    -t 2 -d float -b 64M -e 1G -f 4 -n 8 -w 2 -c 1 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  if [ "$rc" -eq 0 ]; then status=ok; else status="FAILED ($rc)"; fi
  channel_rows+=("$(printf '| %s | %s | %s | %s | %s |' "$ch" "$status" \
    "$(bus_at 67108864 "$log")" "$(bus_at 268435456 "$log")" "$(bus_at 1073741824 "$log")")")
done
fi

# Process ranks on the one GPU: the device executor over FIFOs mapped
# with cuda-ipc (see the header).
process_rows=()
# path_of INFO: which path the calls took, from the INFO lines.
path_of() {
  if grep -q 'device calls run by the device executor' "$1"; then echo executor
  elif grep -q 'device calls staged through host memory' "$1"; then echo staged
  else echo '?'; fi
}
# perf_row LABEL LOG INFO RC SECONDS: a row of the processes table.
perf_row() {
  local status
  if [ "$4" -eq 0 ]; then status=ok; elif [ "$4" -eq 124 ]; then status="TIMED OUT"; else status="FAILED ($4)"; fi
  local b16 b64 b256 b1g wrong
  b16=$(awk '$1 == 16777216 { print $8 " / " $12 }' "$2") b64=$(awk '$1 == 67108864 { print $8 " / " $12 }' "$2")
  b256=$(awk '$1 == 268435456 { print $8 " / " $12 }' "$2") b1g=$(awk '$1 == 1073741824 { print $8 " / " $12 }' "$2")
  wrong=$(sed -n 's/^# Out of bounds values : //p' "$2")
  process_rows+=("$(printf '| %s | %s | %s | %s | %s | %s | %s | %s | %d s |' "$1" "$status" \
    "${b16:--}" "${b64:--}" "${b256:--}" "${b1g:--}" "$(path_of "$3")" "${wrong:-?}" "$5")")
}
if [ "$run_processes" = 1 ]; then
  echo
  echo "== ferroccl-perf --device cuda --ranks 2, no MPS (device executor over cuda-ipc)"
  log="$logs/perf-cuda-processes-nomps.txt" info="$logs/perf-cuda-processes-nomps-info.txt"
  start=$(date +%s)
  FERROCCL_DEBUG=INFO FERROCCL_TIMEOUT=60 timeout 120 bin/ferroccl-perf allreduce --device cuda --ranks 2 \
    -d float -b 1M -e 16M -f 4 -n 4 -w 1 -c 1 2>"$info" | tee "$log"
  rc=${PIPESTATUS[0]}
  grep -v ' INFO ' "$info" >&2
  perf_row "allreduce --ranks 2, no MPS" "$log" "$info" "$rc" $(($(date +%s) - start))

  echo
  echo "== MPS"
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/ferroccl-mps CUDA_MPS_LOG_DIRECTORY=/tmp/ferroccl-mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if nvidia-cuda-mps-control -d; then
    mps=on
    sleep 1
  else
    mps="could not start"
  fi
  echo "MPS daemon: $mps"
  # tests/cuda.rs's process tests: every collective x Element x op on 2
  # and 4 processes, and a killed process (children of test-cuda).
  if [ -x bin/test-cuda ]; then
    start=$(date +%s%N)
    FERROCCL_GPU_PROCESS_TESTS=1 timeout 300 bin/test-cuda --test-threads=1 process \
      >"$logs/test-cuda-processes.log" 2>&1
    rc=$?
    case $rc in 0) status=ok ;; 124) status="TIMED OUT (300 s)" ;; *) status="FAILED ($rc)" ;; esac
    ms=$((($(date +%s%N) - start) / 1000000))
    summary=$(grep -E '^test result' "$logs/test-cuda-processes.log" | tail -1 | sed 's/test result: //; s/; finished.*//')
    results+=("$(printf '| test-cuda process tests (MPS %s) | %s | %d.%03d s | %s |' "$mps" "$status" $((ms / 1000)) $((ms % 1000)) "$summary")")
  fi
  for coll in allreduce allgather reducescatter; do
    for ranks in 2 4; do
      log="$logs/perf-cuda-$coll-processes-$ranks.txt" info="$logs/perf-cuda-$coll-processes-$ranks-info.txt"
      start=$(date +%s)
      FERROCCL_DEBUG=INFO FERROCCL_TIMEOUT=120 timeout 300 bin/ferroccl-perf "$coll" --device cuda \
        --ranks "$ranks" -d float -b 1M -e 1G -f 4 -n 8 -w 2 -c 1 2>"$info" | tee "$log"
      rc=${PIPESTATUS[0]}
      grep -v ' INFO ' "$info" >&2
      perf_row "$coll --ranks $ranks, MPS $mps" "$log" "$info" "$rc" $(($(date +%s) - start))
    done
  done

  echo
  echo "== a rank killed while the others' kernels wait (--ranks 3, MPS $mps)"
  log="$logs/perf-cuda-killed.txt"
  start=$(date +%s)
  FERROCCL_TIMEOUT=60 timeout 120 bin/ferroccl-perf allreduce --device cuda --ranks 3 \
    -d float -b 256M -e 256M -n 1000 -w 1 -c 0 >"$log" 2>&1 &
  perf=$!
  sleep 8
  victim=$(pgrep -P "$perf" | sed -n 2p)
  [ -n "$victim" ] && kill -9 "$victim"
  wait "$perf"
  rc=$?
  took=$(($(date +%s) - start))
  cat "$log"
  named=$(grep -c "rank" "$log")
  killed_row="$(printf '| --ranks 3, pid %s killed at 8 s | exit %s after %d s | %s lines naming a rank |' "${victim:-none}" "$rc" "$took" "$named")"

  [ "$mps" = on ] && echo quit | nvidia-cuda-mps-control
fi

if [ ${#process_rows[@]} -gt 0 ]; then
  echo
  echo "ferroccl-perf --device cuda --ranks (processes on one GPU) f32, busbw GB/s out / in place"
  echo "| run | result | 16 MiB | 64 MiB | 256 MiB | 1 GiB | path | #wrong | time |"
  echo "|---|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${process_rows[@]}"
  echo
  echo "| killed rank | survivors | errors |"
  echo "|---|---|---|"
  echo "$killed_row"
fi

if [ ${#perf_rows[@]} -gt 0 ]; then
  echo
  echo "ferroccl-perf --device cuda allreduce f32 (GB/s; pinned copy: each rank's d2h/h2d of 1 GiB, measured in turn)"
  echo "| ranks | result | busbw 1 GiB out/in place | pinned copy d2h/h2d | #wrong | time |"
  echo "|---|---|---|---|---|---|"
  printf '%s\n' "${perf_rows[@]}"
fi

if [ ${#thread_rows[@]} -gt 0 ]; then
  echo
  echo "ferroccl-perf --device cuda -t f32, busbw GB/s out / in place; d2d copy: the same GPU's copy, bytes copied per second"
  echo "| run | result | 64 MiB | 256 MiB | 1 GiB | 4 GiB | path | #wrong | time |"
  echo "|---|---|---|---|---|---|---|---|---|"
  [ -n "$copy_row" ] && printf '%s\n' "$copy_row"
  printf '%s\n' "${thread_rows[@]}"
fi

if [ ${#channel_rows[@]} -gt 0 ]; then
  echo
  echo "ferroccl-perf --device cuda -t 2 allreduce f32 by FERROCCL_MAX_NCHANNELS, busbw GB/s out / in place"
  echo "| channels | result | 64 MiB | 256 MiB | 1 GiB |"
  echo "|---|---|---|---|---|"
  printf '%s\n' "${channel_rows[@]}"
fi

if [ ${#latency_rows[@]} -gt 0 ]; then
  echo
  echo "ferroccl-perf --device cuda -t allreduce of 8 bytes, FERROCCL_PROTO=LL (us per call, 1000 calls)"
  echo "| threads | result | time out / in place (us) | #wrong |"
  echo "|---|---|---|---|"
  printf '%s\n' "${latency_rows[@]}"
fi

if [ ${#results[@]} -gt 0 ]; then
  echo
  echo "| test binary | result | time | counts |"
  echo "|---|---|---|---|"
  printf '%s\n' "${results[@]}"
fi
