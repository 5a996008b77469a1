#!/usr/bin/env bash
# Session 35, after 0424afa: three more rounds of the three engines on the full-dims
# q5_k_m and iq4_xs files (prefill ÷ llama.cpp, the ratios still short in the first run).
set -euo pipefail
cd "$(dirname "$0")/../.."
PN=${PN:-target/release/pn}
for t in q5_k_m iq4_xs; do
  PN=$PN REPS=2 ROUNDS=3 bench/compare.sh /tmp/fd-$t.gguf 2
done
