#!/usr/bin/env bash
# Gather, here, what the NCCL ABI's GPU checks need into gpu-run/nccl/
# (run after cuda/gpu/collect.sh, which recreates gpu-run/): the library
# under NCCL's names, our header, the scripts, and the cudarc program
# (nccl/cudarc-check, built here: there is no Rust toolchain there).
# Optional: a checkout of nccl-tests' source at $NCCL_TESTS_SRC is copied
# too, to be built there.
#
#   cuda/gpu/collect.sh && nccl/gpu/collect.sh      # here
#   cd gpu-run/nccl && ./run.sh                     # on the GPU machine
set -euo pipefail
cd "$(dirname "$0")/../.."
tdir=${CARGO_TARGET_DIR:-target}
out=gpu-run/nccl
rm -rf "$out" && mkdir -p "$out/lib" "$out/include" "$out/bin"
cargo build --release -p ferroccl-nccl
# A workspace of its own (cudarc's `nccl` feature stays out of the main
# build), in its own target directory, as nccl/tests/cudarc.rs builds it.
cargo build --locked --manifest-path nccl/cudarc-check/Cargo.toml --target-dir "$tdir/cudarc-check"
cp "$tdir/cudarc-check/debug/cudarc-nccl-check" "$out/bin/"
objcopy --strip-debug "$tdir/release/libferroccl_nccl.so" "$out/lib/libferroccl_nccl.so"
ln -sf libferroccl_nccl.so "$out/lib/libnccl.so.2"
ln -sf libferroccl_nccl.so "$out/lib/libnccl.so"
cp nccl/include/nccl.h "$out/include/"
cp nccl/gpu/run.sh nccl/gpu/ddp_losses.py "$out/"
if [ -n "${NCCL_TESTS_SRC:-}" ]; then
  cp -r "$NCCL_TESTS_SRC" "$out/nccl-tests"
fi
git rev-parse HEAD >"$out/commit"
du -sh "$out"
