#!/usr/bin/env bash
# Give the built library NCCL's file names, beside it:
#
#   libnccl.so.2 -> libferroccl_nccl.so   (the SONAME: LD_PRELOAD for
#                                          PyTorch, and what programs linked
#                                          with -lnccl load at run time)
#   libnccl.so   -> libferroccl_nccl.so   (what `cc -lnccl` links against,
#                                          and what cudarc dlopens)
#
# Usage: nccl/link-names.sh [PROFILE_DIR]
#   PROFILE_DIR defaults to $CARGO_TARGET_DIR/release (else target/release),
#   where `cargo build --release -p ferroccl-nccl` puts the library.
set -euo pipefail
dir=${1:-${CARGO_TARGET_DIR:-$(dirname "$0")/../target}/release}
lib="$dir/libferroccl_nccl.so"
if [ ! -f "$lib" ]; then
  echo "no $lib: run cargo build --release -p ferroccl-nccl first" >&2
  exit 1
fi
for name in libnccl.so.2 libnccl.so; do
  ln -sf libferroccl_nccl.so "$dir/$name"
done
echo "$dir/libnccl.so.2 and $dir/libnccl.so -> libferroccl_nccl.so"
