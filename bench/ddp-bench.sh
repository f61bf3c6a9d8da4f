#!/usr/bin/env bash
# Step time of the data-parallel MLP example (examples/mlp_ddp.rs) with the
# reducer, against the same step with no communication and against handing
# every gradient over after backward, for several bucket caps and with
# prefix streaming. Prints markdown tables (medians over repeats of each
# run's median step time) for docs/ddp-performance.md.
#
#   bench/ddp-bench.sh [ranks...]          default: 2 4
#   REPEATS=5 STEPS=10 MODEL="--in 1024 ..." bench/ddp-bench.sh 2
#
# Needs target/release/ferroccl-run and target/release/examples/mlp_ddp
# (cargo build --release --bin ferroccl-run --example mlp_ddp); honours
# CARGO_TARGET_DIR. Configurations run interleaved, one repeat of each
# after another, so that a burst of load on a shared machine hits all of
# them rather than one.
set -euo pipefail
cd "$(dirname "$0")/.."
T="${CARGO_TARGET_DIR:-target}/release"
RUN="$T/ferroccl-run"
EX="$T/examples/mlp_ddp"
[[ -x "$RUN" && -x "$EX" ]] || { echo "build first: cargo build --release --bin ferroccl-run --example mlp_ddp" >&2; exit 1; }
RANKS=("${@:-2 4}")
[[ $# -eq 0 ]] && RANKS=(2 4)
REPEATS="${REPEATS:-5}"
STEPS="${STEPS:-10}"
MODEL="${MODEL:---in 1024 --hidden 1024 --layers 10 --out 64 --batch 16}"

# label | flags
CONFIGS=(
  "none|--mode none"
  "after-backward, 25 MiB|--mode after-backward --bucket-mb 25"
  "reducer, 1 MiB|--mode reducer --bucket-mb 1"
  "reducer, 5 MiB|--mode reducer --bucket-mb 5"
  "reducer, 25 MiB|--mode reducer --bucket-mb 25"
  "reducer, 100 MiB|--mode reducer --bucket-mb 100"
  "reducer, 25 MiB + prefix 4 MiB|--mode reducer --bucket-mb 25 --prefix-chunk-mb 4"
  "reducer, 100 MiB + prefix 4 MiB|--mode reducer --bucket-mb 100 --prefix-chunk-mb 4"
  "reducer, 100 MiB + prefix 12 MiB|--mode reducer --bucket-mb 100 --prefix-chunk-mb 12"
)

median() { sort -g | awk '{a[NR]=$1} END {if (NR==0) print "nan"; else if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

for n in "${RANKS[@]}"; do
  tmp=$(mktemp -d)
  echo "## $n ranks ($(date -u +%FT%TZ), nproc=$(nproc), load at start: $(cut -d' ' -f1-3 /proc/loadavg))"
  echo
  echo "model: $MODEL, $STEPS timed steps after 2 warm-up steps, $REPEATS repeats"
  echo
  for ((r = 0; r < REPEATS; r++)); do
    for i in "${!CONFIGS[@]}"; do
      flags="${CONFIGS[$i]#*|}"
      # shellcheck disable=SC2086
      line=$("$RUN" -n "$n" -- "$EX" $MODEL $flags --steps "$STEPS" --warmup 2 | grep 'step_ms_median=')
      sed -E 's/.*step_ms_median=([0-9.]+).*/\1/' <<<"$line" >>"$tmp/$i"
      sed -E 's/.*buckets=([0-9]+) chunks=([0-9]+).*/\1 \2/' <<<"$line" >"$tmp/$i.layout"
    done
  done
  none=$(median <"$tmp/0")
  after=$(median <"$tmp/1")
  none_min=$(sort -g "$tmp/0" | head -1)
  after_min=$(sort -g "$tmp/1" | head -1)
  hidden() { awk -v a="$1" -v x="$2" -v z="$3" 'BEGIN { if (a - z <= 0) print "n/a"; else printf "%.0f%%", 100 * (a - x) / (a - z) }'; }
  echo "| configuration | buckets | collectives | step ms, median | step ms, min | runs (ms) | hidden (medians) | hidden (mins) |"
  echo "|---|---:|---:|---:|---:|---|---:|---:|"
  for i in "${!CONFIGS[@]}"; do
    label="${CONFIGS[$i]%%|*}"
    m=$(median <"$tmp/$i")
    lo=$(sort -g "$tmp/$i" | head -1)
    read -r b c <"$tmp/$i.layout"
    runs=$(sort -g "$tmp/$i" | tr '\n' ' ' | sed 's/ $//')
    h1=$(hidden "$after" "$m" "$none")
    h2=$(hidden "$after_min" "$lo" "$none_min")
    if [[ $i -le 1 ]]; then h1="-"; h2="-"; fi
    echo "| $label | $b | $c | $m | $lo | $runs | $h1 | $h2 |"
  done
  echo
  echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo
  rm -rf "$tmp"
done
