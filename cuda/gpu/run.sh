#!/usr/bin/env bash
# The GPU run (issue 15, item 6): run from the gpu-run/ folder that
# cuda/gpu/collect.sh made, on a machine with a CUDA driver and no Rust
# toolchain. Finds libnvrtc in the Python environment there, runs every
# gathered test binary with the GPU required, and ends with a short table.
# Logs go to $OUT (the device tool's folder) when it is set, else ./logs.
set -uo pipefail
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
for t in bin/test-*; do
  name=$(basename "$t")
  start=$(date +%s%N)
  if "$t" --test-threads=1 >"$logs/$name.log" 2>&1; then status=ok; else status=FAILED; fi
  ms=$((($(date +%s%N) - start) / 1000000))
  summary=$(grep -E '^test result' "$logs/$name.log" | tail -1 | sed 's/test result: //; s/; finished.*//')
  results+=("$(printf '| %s | %s | %d.%03d s | %s |' "$name" "$status" $((ms / 1000)) $((ms % 1000)) "$summary")")
done

echo
echo "== kernel benchmark (reduce vs device-to-device copy, bytes read + written)"
bin/ferroccl-kernel-bench 64 256 1024 2>&1 | tee "$logs/kernel-bench.txt"

echo
echo "| test binary | result | time | counts |"
echo "|---|---|---|---|"
printf '%s\n' "${results[@]}"
