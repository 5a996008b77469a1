#!/usr/bin/env bash
# Session 35: the three engines on the full-dims q8_0, q5_k_m and iq4_xs files, three
# rounds each (after f36036d: the 4099-row LM head on the 16-row kernels). AMX VM
# (Xeon 6/207, AVX-512 VNNI + AMX + GFNI, 2 vCPUs).
set -euo pipefail
cd "$(dirname "$0")/../.."
PN=${PN:-target/release/pn}
for t in q8_0 q5_k_m iq4_xs; do
  PN=$PN REPS=2 ROUNDS=3 bench/compare.sh /tmp/fd-$t.gguf 2
done
