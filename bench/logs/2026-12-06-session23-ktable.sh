#!/usr/bin/env bash
# Session 23: issue 15's K table on full-dims q4_k_m (nothing in the K-slot path changed
# this session; a fresh round for the record). Intel Xeon 6/207, 2 threads.
set -euo pipefail
cd "$(dirname "$0")/../.."
PN=${PN:-target/release/pn} KS=1,4,16 ROUNDS=${ROUNDS:-1} bench/ktable.sh ${MODEL:-/tmp/fd.gguf} 2
