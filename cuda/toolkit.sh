#!/usr/bin/env bash
# A CUDA compiler for building feature `candle-cuda` (Candle's CUDA
# kernels are compiled by nvcc at build time) on a machine without a GPU,
# a driver or a system CUDA toolkit: the toolkit's pip wheels, unpacked
# into one folder that has a toolkit's layout (bin/nvcc, nvvm/bin/cicc,
# include/ with the runtime and CCCL headers, lib/).
#
#   eval "$(cuda/toolkit.sh)"        # installs once, prints the exports
#   source cuda/toolkit.sh           # the same, into this shell
#   cargo build -p ferroccl --features candle-cuda --lib
#
# Idempotent: a second run finds the folder (a stamp file names the
# wheels) and installs nothing. The folder is $FERROCCL_CUDA_TOOLKIT, else
# /opt/ferroccl-cuda-toolkit where that is writable, else
# ~/.cache/ferroccl-cuda-toolkit; about 350 MiB.
#
# What it exports:
#   CUDA_HOME, CUDA_PATH  the folder's nvidia/cu13 (Candle's kernel build
#                         and cudarc's build script look there)
#   PATH                  with its bin/ first (nvcc)
#   CUDA_COMPUTE_CAP      90 unless set: the architecture Candle's kernels
#                         are compiled for; without it the kernel build asks
#                         nvidia-smi, which fails without a driver
#
# This is enough to compile and lint (`cargo build --lib`, `cargo clippy`):
# nothing is linked against CUDA then. Linking a binary with the feature
# (tests, examples) also needs libcuda, libnvrtc, cuBLAS and cuRAND,
# which Candle links (a driver's machine, or the toolkit's stubs and
# libraries): not provided here.
#
# cudarc needs no toolkit version: ferroccl-cuda names CUDA 13.0's API
# (feature cuda-13000), which wins over Candle's "ask nvcc".

# Sourced or run: `return` works only when sourced.
(return 0 2>/dev/null) && _ft_sourced=1 || _ft_sourced=0

_ft_main() {
  set -euo pipefail
  local wheels="nvidia-cuda-nvcc==13.5.37 nvidia-nvvm==13.5.37 nvidia-cuda-crt==13.5.37 nvidia-cuda-runtime==13.5.37 nvidia-cuda-cccl==13.3.5.0.6"
  local dir=${FERROCCL_CUDA_TOOLKIT:-}
  if [ -z "$dir" ]; then
    if mkdir -p /opt/ferroccl-cuda-toolkit 2>/dev/null && [ -w /opt/ferroccl-cuda-toolkit ]; then
      dir=/opt/ferroccl-cuda-toolkit
    else
      dir=${HOME}/.cache/ferroccl-cuda-toolkit
    fi
  fi
  local home=$dir/nvidia/cu13
  if [ ! -x "$home/bin/nvcc" ] || [ "$(cat "$dir/.wheels" 2>/dev/null)" != "$wheels" ]; then
    echo "cuda/toolkit.sh: installing $wheels into $dir" >&2
    if ! python3 -m pip --version >/dev/null 2>&1; then
      echo "cuda/toolkit.sh: needs python3 with pip" >&2
      return 1
    fi
    # One pip call for every wheel: they share the folder nvidia/cu13, and
    # pip --target does not merge into a folder that an earlier call made
    # (it skips it). Only what pip put there is removed first.
    mkdir -p "$dir"
    rm -rf "$dir/nvidia" "$dir"/nvidia_*.dist-info "$dir/.wheels"
    # shellcheck disable=SC2086
    local pip="python3 -m pip install -q --disable-pip-version-check --no-deps --target $dir $wheels"
    # A Debian-managed python3 refuses installs (PEP 668) unless told that
    # this one, into a folder of its own, is fine.
    $pip >&2 || $pip --break-system-packages >&2 || {
      echo "cuda/toolkit.sh: pip failed" >&2
      return 1
    }
    echo "$wheels" >"$dir/.wheels"
  fi
  if ! "$home/bin/nvcc" --version >/dev/null 2>&1; then
    echo "cuda/toolkit.sh: $home/bin/nvcc does not run" >&2
    return 1
  fi
  _ft_exports="export CUDA_HOME='$home'
export CUDA_PATH='$home'
export PATH='$home/bin':\"\$PATH\"
export CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-90}"
}

if [ "$_ft_sourced" = 1 ]; then
  # In a subshell, so that set -e and a failure do not reach the caller's
  # shell; the exports are applied here.
  if _ft_out=$( _ft_main && printf '%s\n' "$_ft_exports" ); then
    eval "$_ft_out"
  else
    echo "cuda/toolkit.sh: failed" >&2
  fi
  unset _ft_out _ft_sourced _ft_exports
  unset -f _ft_main
else
  _ft_main
  printf '%s\n' "$_ft_exports"
fi
