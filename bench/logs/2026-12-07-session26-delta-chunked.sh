#!/usr/bin/env bash
# Session 26 (issue 20): session 21's measurement of the delta rule's chunked form against
# the recurrence (512 and 4096 tokens a pass, full-dims q4_k_m, two rounds), run again
# unchanged on the AMD EPYC Zen 3 (AVX2 only) box.
set -euo pipefail
exec "$(dirname "$0")/2026-12-06-session21-delta-chunked.sh"
