#!/usr/bin/env bash
# Session 28 (AMD EPYC Zen 3, AVX2, 2 cores): full-dims q4_k_m decode against the
# two-thread read probe, interleaved (329 MB a token: 302.8 MB of weights, 13.2 MB of
# recurrent state read and written; `pn info`).
set -euo pipefail
cd "$(dirname "$0")/../.."
PN=${PN:-target/release/pn} ROUNDS=4 GEN=64 bench/bw_fraction.sh /tmp/fd.gguf 329
