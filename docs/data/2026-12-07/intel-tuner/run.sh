#!/bin/bash
# The tuner check of tuner-routes/run.sh on the Intel VM: the same bands,
# no gate (this VM has one state), every run's machine line printed.
cd /work/main
D=docs/data/2026-12-07/intel-tuner
export TRANSPORTS=default TUNER_STATE=/tmp/ferroccl-peers/pingpong TURNS=3
MINB=8 MAXB=32768 ITERS=5000 WARMUP=200 bench/tuner-check.sh /tmp/perf-head /tmp/intel-tuner-small > $D/tuner-check-small.txt 2>&1
MINB=131072 MAXB=16777216 ITERS=300 WARMUP=20 bench/tuner-check.sh /tmp/perf-head /tmp/intel-tuner-large > $D/tuner-check-large.txt 2>&1
echo DONE >> $D/tuner-check-large.txt
