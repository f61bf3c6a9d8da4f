#!/bin/bash
# The tuner check of ../../2026-12-07/tuner-routes/run.sh again on the AMD
# VM with the build of the day (/tmp/perf-head), gated on its fast state.
cd /work/main
D=docs/data/2026-12-08/amd-tuner
export TRANSPORTS=default TUNER_STATE=/tmp/ferroccl-peers/pingpong TUNER_FAST_NS=150 TURNS=3
MINB=8 MAXB=32768 ITERS=5000 WARMUP=200 bench/tuner-check.sh /tmp/perf-head /tmp/amd-tuner-small > $D/tuner-check-small.txt 2>&1
MINB=131072 MAXB=16777216 ITERS=300 WARMUP=20 bench/tuner-check.sh /tmp/perf-head /tmp/amd-tuner-large > $D/tuner-check-large.txt 2>&1
echo DONE >> $D/tuner-check-large.txt
