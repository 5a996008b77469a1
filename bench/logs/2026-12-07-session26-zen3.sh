#!/usr/bin/env bash
# Session 26 on the AMD EPYC Zen 3 box (AVX2 only, 2 cores): three engines on full-dims
# q4_k_m (two rounds), then the K table (llama_bench_batch.py beside `pn bench --slots K`,
# two rounds), with the 9–32-token block-wise order of x86_pack8 (commit 354c7a8).
set -euo pipefail
cd "$(dirname "$0")/../.."
PN=${PN:-target/release/pn}
lscpu | grep -E "Model name|Flags" | cut -c1-200
PN=$PN REPS=2 ROUNDS=2 bench/compare.sh /tmp/fd.gguf 2
PN=$PN KS=1,4,16 ROUNDS=2 bench/ktable.sh /tmp/fd.gguf 2
