#!/usr/bin/env bash
# Session 32 (the K-quants' mins / offset correction in pairs of sub-blocks; recurrent
# state zeros written at creation; docs/perf.md "Session 32") on the same Intel Xeon
# family 6 model 207 VM as sessions 29-31: session 29's script unchanged (all three
# engines on full-dims q4_k_m, the K table, the other full-dims files, real-dims q4_k_m,
# decode against the two-thread read probe).
set -euo pipefail
exec bash "$(dirname "$0")/2026-12-07-session29-xeon.sh" "$@"
