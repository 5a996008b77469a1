#!/usr/bin/env bash
# Session 22: the K table on full-dims q4_k_m, two rounds (K = 1 / 4 / 16), build 04d7d53 (log),
# run again on 4608373 (log2; no CPU change between them)
# (no CPU change this session), then the streaming probe in the same minutes.
set -euo pipefail
cd "$(dirname "$0")/../.."
PN=target/release/pn ROUNDS=2 KS=1,4,16 bench/ktable.sh /tmp/fd.gguf 2
gcc -O2 -march=native -DOPS=2 -o /tmp/probe bench/probe_stream.c
(/tmp/probe 1 8192 1073741824 & /tmp/probe 1 8192 1073741824; wait)
