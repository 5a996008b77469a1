#!/usr/bin/env bash
# Session 27 on the AMD EPYC Zen 3 box (AVX2 only, 2 cores): three engines on the other
# full-dims files issue 20 names (q5_k_m, iq4_xs, q8_0), one round each, best of two.
set -euo pipefail
cd "$(dirname "$0")/../.."
PN=${PN:-target/release/pn}
for t in q5_k_m iq4_xs q8_0; do
  PN=$PN REPS=2 ROUNDS=1 bench/compare.sh /tmp/fd-$t.gguf 2
done
