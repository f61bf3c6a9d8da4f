#!/usr/bin/env bash
# The torch backend's check on a GPU (python/gpu/check_cuda.py), as the
# GPU run's `torch` step calls it from the unpacked gpu-run/kit.tgz
# (cuda/gpu/run.sh): the package that cuda/gpu/collect.sh laid out in its
# python/pkg, and
# the lent machine's own python3 and torch (nothing can be installed
# there). Exit 77: skipped, with the reason printed.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null ||
  { echo "skipped: no python3 with torch and a CUDA device"; exit 77; }
[ -f "$here/pkg/ferroccl/_ferroccl.abi3.so" ] ||
  { echo "skipped: no built package in $here/pkg (cuda/gpu/collect.sh)"; exit 77; }
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
# The C++ backend builds here on first use (collect.sh brings ninja), into
# a folder of this run's own.
[ -x "$here/bin/ninja" ] && export PATH="$here/bin:$PATH"
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$(mktemp -d)}
command -v c++ >/dev/null && echo "c++: $(c++ --version | head -1)" || echo "c++: none (the Python backend serves)"
PYTHONPATH="$here/pkg${PYTHONPATH:+:$PYTHONPATH}" python3 "$here/gpu/check_cuda.py" --ranks 2
