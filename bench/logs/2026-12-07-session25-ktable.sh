#!/usr/bin/env bash
# Session 25: issue 15's K table on the AMD EPYC Zen 3 (AVX2 only, 2 cores) box,
# full-dims q4_k_m, one round.
set -euo pipefail
cd "$(dirname "$0")/../.."
PN=${PN:-target/release/pn} KS=${KS:-1,4,16} ROUNDS=${ROUNDS:-1} bench/ktable.sh ${MODEL:-/tmp/fd.gguf} 2
