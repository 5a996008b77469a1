#!/usr/bin/env bash
# Session 35, after 0424afa (one-token matmul tasks of up to 256 rows): the three engines
# on full-dims q8_0 and q4_k_m (three rounds each), then decode against the two-thread
# read probe on full-dims (329 MB a token) and real-dims (1697 MB). AMX VM (Xeon 6/207).
set -euo pipefail
cd "$(dirname "$0")/../.."
PN=${PN:-target/release/pn}
for f in /tmp/fd-q8_0.gguf /tmp/fd.gguf; do
  PN=$PN REPS=2 ROUNDS=3 bench/compare.sh "$f" 2
done
PN=$PN ROUNDS=3 GEN=64 bench/bw_fraction.sh /tmp/fd.gguf 329
PN=$PN ROUNDS=2 GEN=48 bench/bw_fraction.sh /tmp/rd.gguf 1697
