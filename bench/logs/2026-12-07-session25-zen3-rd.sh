#!/usr/bin/env bash
# Session 25: the 20.5 GB real-dims q4_k_m file (`pn synth --preset full-dims --type
# q4_k_m --layers 40 --experts 256`) on the AMD EPYC Zen 3 (AVX2 only, 2 cores, 24 GB:
# the file is mapped) box, three engines, one round, REPS=1.
set -euo pipefail
cd "$(dirname "$0")/../.."
PN=${PN:-target/release/pn} REPS=1 ROUNDS=${ROUNDS:-1} bench/compare.sh ${MODEL:-/tmp/rd.gguf} 2
