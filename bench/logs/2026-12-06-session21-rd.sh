#!/usr/bin/env bash
# Session 21: the 20.5 GB real-dims q4_k_m file, three engines, one round (no kernel change
# since session 20).
set -euo pipefail
cd "$(dirname "$0")/../.."
PN=target/release/pn ROUNDS=1 REPS=2 bench/compare.sh /tmp/rd.gguf 2
