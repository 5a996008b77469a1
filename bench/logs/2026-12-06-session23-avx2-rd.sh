#!/usr/bin/env bash
# Session 23: the AVX2 path on the 20.5 GB real-dims q4_k_m file (`pn synth --preset
# full-dims --type q4_k_m --layers 40 --experts 256 --seed 1`), beside ik_llama.cpp built
# for AVX2 only and llama.cpp (llama-cpp-python's AVX-512 build); one round, REPS=1.
set -euo pipefail
cd "$(dirname "$0")/../.."
PN_NO_AVX512=1 PN=target/release/pn IK_BENCH=$HOME/.cache/pn-oracle/ik-avx2/bin/llama-bench REPS=1 ROUNDS=1 bench/compare.sh ${MODEL:-/tmp/rd.gguf} 2
