#!/usr/bin/env bash
# Build, here, everything the GPU run needs and gather it into gpu-run/ at
# the repository root (ignored by git): the test binaries of ferroccl-cuda
# (and of every crate with device tests), the benchmark binaries, and
# run.sh, the one command to run on the GPU machine from that folder:
#
#   cuda/gpu/collect.sh            # here (needs the Rust toolchain)
#   cd gpu-run && ./run.sh         # there (CUDA driver, no toolchain)
#
# With the device tool: run collect.sh here, then
#   run(command="cd gpu-run && ./run.sh", carry=["gpu-run"])
# and copy the table it prints into docs/hardware.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=gpu-run
tdir=${CARGO_TARGET_DIR:-target}
rm -rf "$out" && mkdir -p "$out/bin"

# Test binaries: every test target of the crates that have device tests
# (ferroccl-bench: perf_device runs `ferroccl-perf --device cuda`, which it
# finds beside itself in bin/).
# `--no-run --message-format=json` names each executable cargo built.
crates=(-p ferroccl-cuda -p ferroccl-cuda-ipc -p ferroccl-bench)
# ferroccl itself: only its device test (tests/cuda.rs); its host tests
# run in CI.
{
  cargo test --release --no-run "${crates[@]}" --message-format=json 2>/dev/null
  cargo test --release --no-run -p ferroccl --test cuda --message-format=json 2>/dev/null
} |
  jq -r 'select(.reason == "compiler-artifact" and .profile.test == true and .executable != null)
         | "\(.target.name) \(.executable)"' |
  while read -r name exe; do
    # Two targets may share a name (a crate's lib and its test file).
    dest="$out/bin/test-$name"
    [ -e "$dest" ] && dest="$dest-${exe##*-}"
    objcopy --strip-debug "$exe" "$dest"
  done

# ferroccl's library tests, of which run.sh runs only the device
# executor's GPU test (exec::program::kernel_gpu): the rest run in CI.
lib=$(cargo test --release --no-run -p ferroccl --lib --message-format=json 2>/dev/null |
  jq -r 'select(.reason == "compiler-artifact" and .profile.test == true and .executable != null) | .executable' |
  head -1)
objcopy --strip-debug "$lib" "$out/bin/test-ferroccl-lib"

# Benchmarks (they print nccl-tests tables).
cargo build --release -p ferroccl-bench --bins
cargo build --release -p ferroccl-cuda --bins
for b in ferroccl-perf ferroccl-kernel-bench; do
  objcopy --strip-debug "$tdir/release/$b" "$out/bin/$b"
done

cp cuda/gpu/run.sh "$out/run.sh"
chmod +x "$out/run.sh"
git rev-parse HEAD >"$out/commit"
du -sh "$out"
ls -la "$out/bin"
