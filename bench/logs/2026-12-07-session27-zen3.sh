#!/usr/bin/env bash
# Session 27 on the AMD EPYC Zen 3 box (AVX2 only, 2 cores), with x86_pack8x2 (Q4_K at 4+
# tokens two 8-row groups and two tokens a pass): session 26's run — three engines on
# full-dims q4_k_m and the K table, two rounds each — then real-dims q4_k_m (one round,
# best of two).
set -euo pipefail
cd "$(dirname "$0")/../.."
PN=${PN:-target/release/pn}
PN=$PN bash bench/logs/2026-12-07-session26-zen3.sh
PN=$PN REPS=2 ROUNDS=1 bench/compare.sh /tmp/rd.gguf 2
