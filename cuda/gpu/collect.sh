#!/usr/bin/env bash
# Build, here, what the first GPU run (cuda/gpu/run.sh) runs, and gather
# it into gpu-run/ at the repository root (ignored by git): only those
# binaries (debug info stripped, symbols kept so that a hung step's
# stacks name functions), the NCCL ABI library for the DDP step, and the
# scripts, packed into gpu-run/kit.tgz beside run.sh. It must stay under
# 48 MiB (the device tool carries 64 MiB): the size is printed, and the
# build fails above it.
#
#   cuda/gpu/collect.sh                 # here (needs the Rust toolchain)
#   gpu-run/run.sh --dry                # here: every step without a GPU
#   run(command="gpu-run/run.sh", carry=["gpu-run"], timeout_s=480)
#
# docs/hardware.md ("The next GPU run") has the exact call.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=gpu-run
tdir=${CARGO_TARGET_DIR:-target}
rm -rf "$out" && mkdir -p "$out/bin" "$out/nccl/lib"

# Test binaries by target: `--no-run --message-format=json` names each
# executable cargo built. name -> bin/test-<name>.
tests() {
  cargo test --release --no-run "$@" --message-format=json 2>/dev/null |
    jq -r 'select(.reason == "compiler-artifact" and .profile.test == true and .executable != null)
           | "\(.target.name) \(.executable)"'
}
{
  tests -p ferroccl-cuda --test engine
  tests -p ferroccl-cuda-ipc --lib
  tests -p ferroccl --test cuda
} | while read -r name exe; do
  objcopy --strip-debug "$exe" "$out/bin/test-$name"
done
# ferroccl's library tests, of which run.sh runs only the executor
# kernels' GPU test (exec::oracle::kernel_gpu).
lib=$(tests -p ferroccl --lib | awk '{ print $2 }' | head -1)
objcopy --strip-debug "$lib" "$out/bin/test-ferroccl-lib"

cargo build --release -p ferroccl-bench --bin ferroccl-perf
cargo build --release -p ferroccl-cuda --bins
for b in ferroccl-perf ferroccl-kernel-bench ferroccl-sync-probe; do
  objcopy --strip-debug "$tdir/release/$b" "$out/bin/$b"
done

# The NCCL ABI for the DDP step (nccl/gpu/run.sh's `ddp` part).
cargo build --release -p ferroccl-nccl
objcopy --strip-debug "$tdir/release/libferroccl_nccl.so" "$out/nccl/lib/libferroccl_nccl.so"
ln -sf libferroccl_nccl.so "$out/nccl/lib/libnccl.so.2"
ln -sf libferroccl_nccl.so "$out/nccl/lib/libnccl.so"
cp nccl/gpu/run.sh nccl/gpu/ddp_losses.py "$out/nccl/"

# The torch backend's GPU check (python/gpu/run.sh): the package laid out
# as Python imports it, the extension under the name abi3 gives it.
cargo build --release -p ferroccl-python
mkdir -p "$out/python/pkg/ferroccl"
cp -r python/gpu "$out/python/gpu"
cp python/ferroccl/*.py "$out/python/pkg/ferroccl/"
# The C++ torch backend's source, built there against that machine's
# torch on first use (docs/pytorch.md), and a ninja to build it with where
# one is here (the lent machine may have none; without it the Python
# backend serves, with a warning).
cp -r python/ferroccl/csrc "$out/python/pkg/ferroccl/csrc"
ninja_bin=$(command -v ninja || true)
[ -z "$ninja_bin" ] && [ -x /opt/ferroccl-torch/bin/ninja ] && ninja_bin=/opt/ferroccl-torch/bin/ninja
if [ -n "$ninja_bin" ]; then
  mkdir -p "$out/python/bin" && cp "$ninja_bin" "$out/python/bin/ninja"
fi
objcopy --strip-debug "$tdir/release/lib_ferroccl.so" "$out/python/pkg/ferroccl/_ferroccl.abi3.so"

# Candle's device path (feature candle-cuda, docs/frameworks.md), opt-in:
# FERROCCL_CANDLE_CUDA=1. Its binary links against libcuda, libnvrtc,
# libcudart, cuBLAS and cuRAND (Candle links cudarc), which must be on the
# linker's path (a CUDA toolkit's lib64 and lib64/stubs: CUDA_HOME, or
# LIBRARY_PATH); nvcc comes from cuda/toolkit.sh when CUDA_HOME has none.
# A subshell: cudarc's build script reads CUDA_HOME, and the builds above
# must not see it change.
if [ "${FERROCCL_CANDLE_CUDA:-0}" = 1 ]; then
  (
    [ -x "${CUDA_HOME:-/nonexistent}/bin/nvcc" ] || eval "$(cuda/toolkit.sh)"
    export CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-90}
    cargo build --release -p ferroccl --features candle-cuda --example candle_cuda_check
  )
  cargo build --release -p ferroccl-run --bin ferroccl-run
  objcopy --strip-debug "$tdir/release/examples/candle_cuda_check" "$out/bin/candle_cuda_check"
  objcopy --strip-debug "$tdir/release/ferroccl-run" "$out/bin/ferroccl-run"
fi

cp cuda/gpu/run.sh "$out/run.sh"
chmod +x "$out/run.sh" "$out/nccl/run.sh"
git rev-parse --short HEAD >"$out/commit"
ls -la "$out/bin"
echo "unpacked: $(du -sm "$out" | cut -f1) MiB"
# Packed: gzip takes the binaries to about a third (48 MiB to 16 on
# 2026-12-04), which leaves room under the tool's 64 MiB for the opt-in
# Candle binary and for growth. run.sh unpacks it into a folder of /tmp
# on every run (under a second), so gpu-run/ itself never grows.
tar -C "$out" -czf "$out/kit.tgz" bin nccl python
rm -rf "$out/bin" "$out/nccl" "$out/python"
size=$(du -sm "$out" | cut -f1)
echo "gpu-run/: $size MiB"
if [ "$size" -gt 48 ]; then
  echo "gpu-run/ is over 48 MiB: the device tool carries 64 MiB in all" >&2
  exit 1
fi
