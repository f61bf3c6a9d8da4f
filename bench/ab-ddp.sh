#!/usr/bin/env bash
# The data-parallel step time of two builds side by side in one session, in
# turns (A, B, A, B, ...), as bench/ab.sh does for ferroccl-perf: the A runs
# give the run-to-run noise. Each turn is one job of examples/mlp_ddp in
# compare mode (every variant taking turns step by step inside the job).
#
#   bench/ab-ddp.sh A_RUN A_MLP_DDP B_RUN B_MLP_DDP [OUT_DIR]
# (A_RUN, B_RUN: the ferroccl-run launchers of the two builds.)
# Environment:
#   RANKS="2 4"  TURNS=2  STEPS=20
#   VARIANTS="none;after:25;red:25;red:25:4"   (mlp_ddp --variants)
#   MODEL="--in 1024 --hidden 1024 --layers 10 --out 64 --batch 16"
# Prints, per rank count and variant, the median step time of every turn,
# the A-to-A spread (noise) and B against A.
set -euo pipefail
ar=${1:?usage: bench/ab-ddp.sh A_RUN A_MLP_DDP B_RUN B_MLP_DDP [OUT_DIR]}
ae=${2:?usage}
br=${3:?usage}
be=${4:?usage}
out=${5:-$(mktemp -d "${TMPDIR:-/tmp}/ferroccl-ab-ddp.XXXXXX")}
mkdir -p "$out"
RANKS=${RANKS:-2 4}
TURNS=${TURNS:-2}
STEPS=${STEPS:-20}
VARIANTS=${VARIANTS:-none;after:25;red:25;red:25:4}
MODEL=${MODEL:---in 1024 --hidden 1024 --layers 10 --out 64 --batch 16}
echo "## $(date -u '+%Y-%m-%dT%H:%M:%SZ') nproc=$(nproc) load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "## A=$ar $ae"
echo "## B=$br $be"
for n in $RANKS; do
  for ((t = 1; t <= TURNS; t++)); do
    for side in a b; do
      run=$ar ex=$ae
      [[ $side == b ]] && run=$br ex=$be
      # shellcheck disable=SC2086
      "$run" -n "$n" -- "$ex" --mode compare $MODEL --variants "$VARIANTS" \
        --steps "$STEPS" --warmup 2 | sed -n 's/^\[rank 0\] //p' > "$out/ddp-$n-$side$t.md"
    done
  done
  python3 - "$out" "$n" "$TURNS" <<'PY'
import sys, statistics
out, n, turns = sys.argv[1], sys.argv[2], int(sys.argv[3])
def table(path):
    rows = {}
    for line in open(path):
        cells = [c.strip() for c in line.strip().strip('|').split('|')]
        if len(cells) == 7 and cells[3].replace('.', '', 1).isdigit():
            rows[cells[0]] = float(cells[3])
    return rows
runs = {f"{s}{t}": table(f"{out}/ddp-{n}-{s}{t}.md") for t in range(1, turns + 1) for s in "ab"}
labels = list(runs["a1"])
names = [f"{s}{t}" for t in range(1, turns + 1) for s in "ab"]
print(f"\n{n} ranks: median step ms of each turn\n")
print("| variant | " + " | ".join(names) + " | A spread | B vs A |")
print("|---|" + "---:|" * (len(names) + 2))
for l in labels:
    a = [runs[f"a{t}"][l] for t in range(1, turns + 1)]
    b = [runs[f"b{t}"][l] for t in range(1, turns + 1)]
    spread = (max(a) - min(a)) / statistics.mean(a) * 100
    diff = (statistics.mean(b) - statistics.mean(a)) / statistics.mean(a) * 100
    cells = " | ".join(f"{runs[k][l]:.1f}" for k in names)
    print(f"| {l} | {cells} | {spread:.1f}% | {diff:+.1f}% |")
PY
done
echo "## raw output in $out"
