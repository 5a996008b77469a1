#!/usr/bin/env bash
# Session 25, after the fused AVX2 Q5_K / Q6_K / IQ4_XS kernels: three engines on the
# AMD EPYC Zen 3 (AVX2 only, 2 cores) box, one round per file.
set -euo pipefail
cd "$(dirname "$0")/../.."
PN=${PN:-target/release/pn}
for f in ${FILES:-/tmp/fd.gguf /tmp/fd-q5_k_m.gguf /tmp/fd-iq4_xs.gguf}; do
  PN=$PN REPS=2 ROUNDS=1 bench/compare.sh "$f" 2
done
