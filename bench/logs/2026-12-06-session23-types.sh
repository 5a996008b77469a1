#!/usr/bin/env bash
# Session 23: full-dims q5_k_m and iq4_xs (`pn synth --preset full-dims --type T --seed 1`),
# three engines, the default kernels (AVX-512 + AMX), one round each. Intel Xeon 6/207.
set -euo pipefail
cd "$(dirname "$0")/../.."
for t in q5_k_m iq4_xs q8_0; do
  echo "=== $t"
  PN=${PN:-target/release/pn} REPS=2 ROUNDS=1 bench/compare.sh /tmp/fd-$t.gguf 2
done
