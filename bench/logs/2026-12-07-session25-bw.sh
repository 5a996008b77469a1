#!/usr/bin/env bash
# Session 25: full-dims q4_k_m decode against the two-thread read probe (now with an AVX2
# path) on the AMD EPYC Zen 3 box, after the fused AVX2 kernels.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-4} bench/bw_fraction.sh ${MODEL:-/tmp/fd.gguf} 327
