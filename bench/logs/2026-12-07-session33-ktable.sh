#!/usr/bin/env bash
# Session 33: the whole K table (K = 1, 2, 4, 8, 16), three rounds, on full-dims q4_k_m and
# the built-in default model, after the three-engine run.
set -euo pipefail
cd "$(dirname "$0")/../.."
PN=${PN:-target/release/pn}
echo "== full-dims q4_k_m"
PN=$PN KS=1,2,4,8,16 ROUNDS=3 bench/ktable.sh /tmp/fd.gguf 2
echo "== the default model"
PN=$PN KS=1,2,4,8,16 ROUNDS=2 bench/ktable.sh models/default/pn-default-code-q4_k_m.gguf 2
