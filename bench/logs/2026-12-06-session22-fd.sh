#!/usr/bin/env bash
# Session 22: full-dims q4_k_m, three engines, one round (REPS=2), then the probe.
set -euo pipefail
cd "$(dirname "$0")/../.."
PN=target/release/pn REPS=2 ROUNDS=1 bench/compare.sh /tmp/fd.gguf 2
gcc -O2 -march=native -DOPS=2 -o /tmp/probe bench/probe_stream.c
(/tmp/probe 1 8192 1073741824 & /tmp/probe 1 8192 1073741824; wait)
