#!/bin/bash
# The table of peers-table-2 again (FERROCCL_PERF: the build), its output
# beside this script: after the inline streams and the windows without
# locked instructions.
OUT=$(cd "$(dirname "$0")" && pwd) exec "$(dirname "$0")/../peers-table-2/run.sh"
