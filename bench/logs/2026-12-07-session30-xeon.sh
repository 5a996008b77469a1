#!/usr/bin/env bash
# Session 30 (batched products written token-major, docs/perf.md "Session 30") on the
# same Intel Xeon family 6 model 207 VM as session 29: that session's script unchanged
# (all three engines on full-dims q4_k_m, the K table, the other full-dims files,
# real-dims q4_k_m, decode against the two-thread read probe).
set -euo pipefail
exec bash "$(dirname "$0")/2026-12-07-session29-xeon.sh" "$@"
