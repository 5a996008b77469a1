#!/usr/bin/env bash
# Session 34: a second and third round of the three engines on the other full-dims files
# (the AMX VM of 2026-12-07-session34-amx.sh ran them once, in a slow and noisy phase).
set -euo pipefail
cd "$(dirname "$0")/../.."
PN=${PN:-target/release/pn}
for t in q5_k_m iq4_xs q8_0; do
  PN=$PN REPS=2 ROUNDS=2 bench/compare.sh /tmp/fd-$t.gguf 2
done
