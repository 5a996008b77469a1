#!/usr/bin/env bash
# Session 33 (GFNI decode of the 16-row K-quant kernels; docs/perf.md "Session 33") on
# the same Intel Xeon family 6 model 207 VM as sessions 29-32: session 29's script
# unchanged (all three engines on full-dims q4_k_m, the K table, the other full-dims
# files, real-dims q4_k_m, decode against the two-thread read probe).
set -euo pipefail
exec bash "$(dirname "$0")/2026-12-07-session29-xeon.sh" "$@"
