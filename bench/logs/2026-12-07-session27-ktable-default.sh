#!/usr/bin/env bash
# Session 27 on the AMD EPYC Zen 3 box (AVX2 only, 2 cores): the K table of issue 15 on the
# built-in default model (llama_bench_batch.py beside `pn bench --slots K`), two rounds,
# 128 generated tokens per sequence.
set -euo pipefail
cd "$(dirname "$0")/../.."
PN=${PN:-target/release/pn} KS=1,2,4,8,16 GEN=128 ROUNDS=2 bench/ktable.sh models/default/pn-default-code-q4_k_m.gguf 2
