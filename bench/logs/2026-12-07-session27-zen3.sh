#!/usr/bin/env bash
# Session 27 on the AMD EPYC Zen 3 box (AVX2 only, 2 cores): three engines on full-dims
# q4_k_m (two rounds), the K table (llama_bench_batch.py beside `pn bench --slots K`, two
# rounds), then real-dims q4_k_m (one round, best of two), with x86_pack8x2 (Q4_K at 4+
# tokens two 8-row groups and two tokens a pass; commits d97a72c, then the scratch fix).
set -euo pipefail
cd "$(dirname "$0")/../.."
PN=${PN:-target/release/pn}
lscpu | grep -E "Model name|Flags" | cut -c1-200
PN=$PN REPS=2 ROUNDS=2 bench/compare.sh /tmp/fd.gguf 2
PN=$PN KS=1,4,16 ROUNDS=2 bench/ktable.sh /tmp/fd.gguf 2
PN=$PN REPS=2 ROUNDS=1 bench/compare.sh /tmp/rd.gguf 2
