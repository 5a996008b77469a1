#!/usr/bin/env bash
# Session 34, after the AMX threshold change (0ae641e): three engines on full-dims q5_k_m,
# three rounds (its pp128 runs ~16 tokens an expert, which now take the AVX-512 kernels).
set -euo pipefail
cd "$(dirname "$0")/../.."
PN=${PN:-target/release/pn} REPS=2 ROUNDS=3 bench/compare.sh /tmp/fd-q5_k_m.gguf 2
