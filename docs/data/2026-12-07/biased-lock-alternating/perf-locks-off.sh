#!/bin/sh
FERROCCL_BIASED_LOCKS=0 exec /tmp/perf-table "$@"
