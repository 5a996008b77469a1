#!/usr/bin/env bash
# Session 22: the K table on the built-in model, two rounds (K = 1 / 2 / 4 / 8 / 16).
set -euo pipefail
cd "$(dirname "$0")/../.."
PN=target/release/pn ROUNDS=2 bench/ktable.sh models/default/pn-default-code-q4_k_m.gguf 2
