#!/bin/bash
cd /work/main
export TRANSPORTS=default TUNER_STATE=/tmp/ferroccl-peers/pingpong TUNER_FAST_NS=150 TURNS=3
MINB=8 MAXB=32768 ITERS=5000 WARMUP=200 bench/tuner-check.sh /tmp/perf-head /work/tuner-small > /work/tuner-small.txt 2>&1
MINB=131072 MAXB=16777216 ITERS=300 WARMUP=20 bench/tuner-check.sh /tmp/perf-head /work/tuner-large > /work/tuner-large.txt 2>&1
echo DONE >> /work/tuner-large.txt
