#!/usr/bin/env bash
# Session 23: the AVX2 path (PN_NO_AVX512=1) beside ik_llama.cpp built for AVX2 only
# (cmake -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
# -DGGML_AVX512=OFF -DGGML_AVXVNNI=OFF; no zmm instruction in the binary) and llama.cpp
# (llama-cpp-python as built for this CPU: its AVX-512 kernels, so pn ÷ llama.cpp here
# understates an AVX2-only comparison). full-dims q4_k_m, 2 threads, Intel Xeon 6/207.
set -euo pipefail
cd "$(dirname "$0")/../.."
PN_NO_AVX512=1 PN=${PN:-target/release/pn} IK_BENCH=$HOME/.cache/pn-oracle/ik-avx2/bin/llama-bench REPS=2 ROUNDS=${ROUNDS:-2} bench/compare.sh ${MODEL:-/tmp/fd.gguf} 2
