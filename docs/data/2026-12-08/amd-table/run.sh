#!/bin/bash
# The AMD VM's table of docs/data/2026-12-07/peers-table-2 again with the
# build of the day (FERROCCL_PERF), its output beside this script.
OUT=$(cd "$(dirname "$0")" && pwd) exec "$(dirname "$0")/../../2026-12-07/peers-table-2/run.sh"
