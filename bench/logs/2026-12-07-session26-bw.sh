#!/usr/bin/env bash
# Session 26: full-dims q4_k_m decode against the two-thread read probe on the AMD EPYC
# Zen 3 box (a slow stretch of the host), after the 9–32-token block-wise order.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-4} bench/bw_fraction.sh ${MODEL:-/tmp/fd.gguf} 327
