#!/usr/bin/env bash
# Step time and memory per rank of the FSDP layer against the DDP layer on
# the same model (examples/mlp_fsdp/, --mode compare): compute only
# (none), the DDP reducer during and after backward, FullShard (prefetch,
# serial, kept after forward), ShardGradOp and NoShard, for 2 and 4 ranks,
# with SGD and with Adam. Prints the markdown tables for docs/performance-log.md
# ("FSDP against DDP") and draws the step times as an SVG.
#
#   bench/fsdp-bench.sh [ranks...]            default: 2 4
#   STEPS=20 OPTIMIZERS="sgd adam" MODEL="--in 256 ..." VARIANTS="none;ddp;full" \
#     OUT=/tmp/fsdp PLOT=docs/perf-fsdp.svg bench/fsdp-bench.sh 2
#
# Every variant runs in the same job, taking turns step by step on the same
# data, so that load from other work on a shared machine falls on all of
# them alike. OUT (default: a new temporary directory) receives one table
# per run (N-OPTIMIZER.md) and fsdp.csv (ranks, optimizer, variant, median
# and min step ms, loss, then bytes per rank: params, grads, optim, peak
# gathered, peak reduction buffers, peak total), which the Python at the end
# draws into PLOT (default docs/perf-fsdp.svg; PLOT= skips it). Builds
# ferroccl-run and the example first; honours CARGO_TARGET_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p ferroccl-run -p ferroccl --bin ferroccl-run --example mlp_fsdp
T="${CARGO_TARGET_DIR:-target}/release"
RUN="$T/ferroccl-run"
EX="$T/examples/mlp_fsdp"
RANKS=("$@")
[[ $# -eq 0 ]] && RANKS=(2 4)
STEPS="${STEPS:-20}"
OPTIMIZERS="${OPTIMIZERS:-sgd adam}"
MODEL="${MODEL:---in 256 --hidden 2048 --layers 4 --out 16 --batch 16}"
VARIANTS="${VARIANTS:-none;ddp;ddp-after;full;full-serial;full-keep;grad-op;no-shard}"
OUT="${OUT:-$(mktemp -d /tmp/fsdp-bench.XXXXXX)}"
PLOT="${PLOT-docs/perf-fsdp.svg}"
mkdir -p "$OUT"
CSV="$OUT/fsdp.csv"
echo "ranks,optimizer,variant,median_ms,min_ms,loss,params,grads,optim,peak_gathered,peak_reducing,peak_total" >"$CSV"

for n in "${RANKS[@]}"; do
  for opt in $OPTIMIZERS; do
    case "$opt" in
      sgd) lr=0.01 ;;
      adam) lr=0.0005 ;;
      *) echo "unknown optimizer $opt" >&2; exit 2 ;;
    esac
    echo "### $n ranks, $opt ($(date -u +%FT%TZ), nproc=$(nproc), load before: $(cut -d' ' -f1-3 /proc/loadavg))"
    echo
    # shellcheck disable=SC2086
    "$RUN" -n "$n" -- "$EX" --mode compare $MODEL --optimizer "$opt" --lr "$lr" \
      --variants "$VARIANTS" --steps "$STEPS" --warmup 2 \
      | sed -n 's/^\[rank 0\] //p' >"$OUT/$n-$opt.txt"
    grep -v '^csv,' "$OUT/$n-$opt.txt" | tee "$OUT/$n-$opt.md"
    grep '^csv,' "$OUT/$n-$opt.txt" | cut -d, -f2- >>"$CSV"
    echo
    echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo
  done
done
echo "tables and $CSV in $OUT"

[[ -z "$PLOT" ]] && exit 0
python3 - "$CSV" "$PLOT" <<'EOF'
# Grouped bars: median step ms per variant, one bar per (ranks, optimizer),
# with the minimum as a tick. Standard library only.
import csv
import sys

rows = list(csv.DictReader(open(sys.argv[1])))
variants = list(dict.fromkeys(r["variant"] for r in rows))
series = list(dict.fromkeys((r["ranks"], r["optimizer"]) for r in rows))
colors = ["#1f77b4", "#aec7e8", "#d62728", "#ff9896", "#2ca02c", "#98df8a"]
get = {(r["ranks"], r["optimizer"], r["variant"]): r for r in rows}
W, H, L, R, T, B = 900, 460, 70, 170, 50, 70
ymax = max(float(r["median_ms"]) for r in rows) * 1.1
step = next(s for s in (1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000) if ymax / s <= 8)
gw = (W - L - R) / len(variants)
bw = gw * 0.8 / len(series)
sy = lambda y: H - B - y / ymax * (H - T - B)
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
       f'<rect width="{W}" height="{H}" fill="white"/>',
       f'<text x="{W / 2}" y="25" text-anchor="middle" font-size="15">mlp_fsdp --mode compare: step time per variant (median bar, min tick)</text>']
y = 0
while y <= ymax:
    svg.append(f'<line x1="{L}" x2="{W - R}" y1="{sy(y):.1f}" y2="{sy(y):.1f}" stroke="#ddd"/>')
    svg.append(f'<text x="{L - 6}" y="{sy(y) + 4:.1f}" text-anchor="end">{y:g}</text>')
    y += step
for i, v in enumerate(variants):
    x0 = L + i * gw + gw * 0.1
    svg.append(f'<text x="{L + (i + 0.5) * gw:.1f}" y="{H - B + 18}" text-anchor="middle">{v}</text>')
    for j, s in enumerate(series):
        r = get.get((s[0], s[1], v))
        if r is None:
            continue
        med, mn = float(r["median_ms"]), float(r["min_ms"])
        x = x0 + j * bw
        svg.append(f'<rect x="{x:.1f}" y="{sy(med):.1f}" width="{bw - 1:.1f}" height="{sy(0) - sy(med):.1f}" fill="{colors[j % len(colors)]}"/>')
        svg.append(f'<line x1="{x:.1f}" x2="{x + bw - 1:.1f}" y1="{sy(mn):.1f}" y2="{sy(mn):.1f}" stroke="black"/>')
svg.append(f'<line x1="{L}" x2="{W - R}" y1="{H - B}" y2="{H - B}" stroke="black"/>')
svg.append(f'<line x1="{L}" x2="{L}" y1="{T}" y2="{H - B}" stroke="black"/>')
svg.append(f'<text x="18" y="{(T + H - B) / 2}" transform="rotate(-90 18 {(T + H - B) / 2})" text-anchor="middle">step time (ms)</text>')
for j, s in enumerate(series):
    ly = T + 10 + j * 18
    svg.append(f'<rect x="{W - R + 12}" y="{ly - 6}" width="14" height="12" fill="{colors[j % len(colors)]}"/>')
    svg.append(f'<text x="{W - R + 32}" y="{ly + 4}">{s[0]} ranks, {s[1]}</text>')
svg.append("</svg>")
open(sys.argv[2], "w").write("\n".join(svg) + "\n")
print(f"plot: {sys.argv[2]}")
EOF
