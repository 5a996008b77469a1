#!/usr/bin/env bash
# Session 26 (after the 9–32-token block-wise order): the 20.5 GB real-dims q4_k_m file (`pn synth --preset full-dims --type
# q4_k_m --layers 40 --experts 256`) on the AMD EPYC Zen 3 (AVX2 only, 2 cores, 24 GB:
# the file is mapped) box, three engines, one round. REPS=1 first (as session 25); then REPS=2 (best of 2: with REPS=1
# pn's only prefill faulted in the pages ik's repacked copy had evicted from the page cache).
set -euo pipefail
cd "$(dirname "$0")/../.."
PN=${PN:-target/release/pn} REPS=1 ROUNDS=${ROUNDS:-1} bench/compare.sh ${MODEL:-/tmp/rd.gguf} 2
PN=${PN:-target/release/pn} REPS=2 ROUNDS=1 bench/compare.sh ${MODEL:-/tmp/rd.gguf} 2
