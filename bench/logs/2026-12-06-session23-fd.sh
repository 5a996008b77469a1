#!/usr/bin/env bash
# Session 23: full-dims q4_k_m, three engines, the default kernels (AVX-512 + AMX),
# after the gemm scratch fix (pp512) and the AVX2 work (no change to this path's
# kernels). Intel Xeon 6/207, 2 threads.
set -euo pipefail
cd "$(dirname "$0")/../.."
PN=target/release/pn REPS=2 ROUNDS=${ROUNDS:-2} bench/compare.sh ${MODEL:-/tmp/fd.gguf} 2
