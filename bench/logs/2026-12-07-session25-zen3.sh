#!/usr/bin/env bash
# Session 25: the first run on the machine kind issue 20 was filed on — AMD EPYC (Zen 3,
# family 25 model 1), AVX2 + FMA + F16C only (no AVX-512, no VNNI), 2 cores (one thread
# each), 24 GB. pn's default path here is its plain AVX2 kernels; ik_llama.cpp built
# natively by the oracle's ik_setup.sh, `-rtr 1`; llama.cpp the oracle's build.
# Full-dims q4_k_m two rounds, then q8_0 / q5_k_m / iq4_xs one round each.
set -euo pipefail
cd "$(dirname "$0")/../.."
PN=${PN:-target/release/pn}
PN=$PN REPS=2 ROUNDS=${ROUNDS:-2} bench/compare.sh ${MODEL:-/tmp/fd.gguf} 2
for t in ${TYPES:-q8_0 q5_k_m iq4_xs}; do
  PN=$PN REPS=2 ROUNDS=1 bench/compare.sh /tmp/fd-$t.gguf 2
done
