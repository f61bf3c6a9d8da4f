#!/usr/bin/env bash
# The GPU run (issue 15, item 6): run from the gpu-run/ folder that
# cuda/gpu/collect.sh made, on a machine with a CUDA driver and no Rust
# toolchain. Finds libnvrtc in the Python environment there, runs every
# gathered test binary with the GPU required, and ends with a short table.
# Logs go to $OUT (the device tool's folder) when it is set, else ./logs.
#
#   ./run.sh          everything (tests, then benchmarks)
#   ./run.sh tests    the test binaries only
#   ./run.sh bench    the kernel benchmark and ferroccl-perf only
#
# The device tool bounds one command at 10 minutes: where everything may
# not fit, run `tests` and `bench` as two calls. Each test binary is
# bounded at 4 minutes, so one that hangs cannot eat the whole call.
set -uo pipefail
mode=${1:-all}
case "$mode" in
  all | tests | bench) ;;
  *) echo "usage: $0 [all|tests|bench]" >&2; exit 2 ;;
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
[ "$mode" = bench ] || for t in bin/test-*; do
  name=$(basename "$t")
  start=$(date +%s%N)
  args=(--test-threads=1)
  # ferroccl's library tests: only the executor kernels on the GPU.
  [ "$name" = test-ferroccl-lib ] && args+=(exec::program::kernel_gpu --nocapture)
  timeout 240 "$t" "${args[@]}" >"$logs/$name.log" 2>&1
  rc=$?
  case $rc in
    0) status=ok ;;
    124) status="TIMED OUT (240 s)" ;;
    *) status="FAILED ($rc)" ;;
  esac
  ms=$((($(date +%s%N) - start) / 1000000))
  summary=$(grep -E '^test result' "$logs/$name.log" | tail -1 | sed 's/test result: //; s/; finished.*//')
  results+=("$(printf '| %s | %s | %d.%03d s | %s |' "$name" "$status" $((ms / 1000)) $((ms % 1000)) "$summary")")
done

perf_rows=()
if [ "$mode" != tests ]; then
echo
echo "== kernel benchmark (reduce vs device-to-device copy, bytes read + written)"
timeout 240 bin/ferroccl-kernel-bench 64 256 1024 2>&1 | tee "$logs/kernel-bench.txt"

# Staged allreduce on one GPU, 2 and 4 ranks, 1 MiB to 1 GiB, checked,
# with the pinned host copy bandwidth of 1 GiB measured in the same run
# (issue 15, "Measure"). Few iterations: a 1 GiB call through host memory
# takes a good fraction of a second, and the whole run must stay short.
echo
echo "== ferroccl-perf --device cuda (staged allreduce, f32)"
for ranks in 2 4; do
  log="$logs/perf-cuda-allreduce-$ranks.txt"
  start=$(date +%s)
  FERROCCL_TIMEOUT=120 timeout 300 bin/ferroccl-perf allreduce --device cuda --ranks "$ranks" \
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

if [ ${#perf_rows[@]} -gt 0 ]; then
  echo
  echo "ferroccl-perf --device cuda allreduce f32 (GB/s; pinned copy: each rank's d2h/h2d of 1 GiB, measured in turn)"
  echo "| ranks | result | busbw 1 GiB out/in place | pinned copy d2h/h2d | #wrong | time |"
  echo "|---|---|---|---|---|---|"
  printf '%s\n' "${perf_rows[@]}"
fi

if [ ${#results[@]} -gt 0 ]; then
  echo
  echo "| test binary | result | time | counts |"
  echo "|---|---|---|---|"
  printf '%s\n' "${results[@]}"
fi
