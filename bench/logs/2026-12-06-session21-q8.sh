#!/usr/bin/env bash
# Session 21: full-dims q8_0, three engines, two rounds (no kernel change since session 20).
set -euo pipefail
cd "$(dirname "$0")/../.."
PN=target/release/pn ROUNDS=2 REPS=2 bench/compare.sh /tmp/fd-q8_0.gguf 2
