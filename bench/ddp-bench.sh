#!/usr/bin/env bash
# Step time of the data-parallel MLP example (examples/mlp_ddp/) with the
# reducer, against the same step with no communication and against handing
# every gradient over after backward, for bucket caps of 1, 5, 25 and
# 100 MiB and with prefix streaming. Prints markdown tables for
# docs/performance-history.md ("Data-parallel step time").
#
#   bench/ddp-bench.sh [ranks...]            default: 2 4
#   REPEATS=3 STEPS=20 MODEL="--in 1024 ..." VARIANTS="none;after:25;red:5" bench/ddp-bench.sh 2
#
# Every variant runs in the same job (`mlp_ddp --mode compare`), taking
# turns step by step on the same data, so that load from other work on a
# shared machine falls on all of them alike; each repeat is a fresh job.
# Needs target/release/ferroccl-run and target/release/examples/mlp_ddp
# (cargo build --release -p ferroccl-run -p ferroccl --bin ferroccl-run
# --example mlp_ddp); honours CARGO_TARGET_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
T="${CARGO_TARGET_DIR:-target}/release"
RUN="$T/ferroccl-run"
EX="$T/examples/mlp_ddp"
[[ -x "$RUN" && -x "$EX" ]] || { echo "build first: cargo build --release -p ferroccl-run -p ferroccl --bin ferroccl-run --example mlp_ddp" >&2; exit 1; }
RANKS=("$@")
[[ $# -eq 0 ]] && RANKS=(2 4)
REPEATS="${REPEATS:-3}"
STEPS="${STEPS:-20}"
MODEL="${MODEL:---in 1024 --hidden 1024 --layers 10 --out 64 --batch 16}"
VARIANTS="${VARIANTS:-none;after:25;one;red:1;red:5;red:25;red:100;red:25:4;red:100:4;red:100:12}"

for n in "${RANKS[@]}"; do
  for ((r = 1; r <= REPEATS; r++)); do
    echo "### $n ranks, run $r ($(date -u +%FT%TZ), nproc=$(nproc), load before: $(cut -d' ' -f1-3 /proc/loadavg))"
    echo
    # shellcheck disable=SC2086
    "$RUN" -n "$n" -- "$EX" --mode compare $MODEL --variants "$VARIANTS" --steps "$STEPS" --warmup 2 \
      | sed -n 's/^\[rank 0\] //p'
    echo
    echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo
  done
done
