#!/usr/bin/env bash
# Session 28 on the AMD EPYC Zen 3 box (AVX2 only, 2 cores), with x86_bcast8 (Q4_K at 4–7
# tokens, activations broadcast once a call) and `pn bench --slots 1`'s in-process K = 1
# comparison: session 26's run (three engines on full-dims q4_k_m and the K table, two
# rounds each), real-dims q4_k_m (one round, best of two), then real-dims decode against
# the two-thread read probe at its true bytes a token (1697 MB: 1565.6 MB of weights —
# every non-expert tensor but the embedding, 8 of 256 experts — plus 65.9 MB of recurrent
# state read and written; `pn info`).
set -euo pipefail
cd "$(dirname "$0")/../.."
PN=${PN:-target/release/pn}
PN=$PN bash bench/logs/2026-12-07-session26-zen3.sh
PN=$PN REPS=2 ROUNDS=1 bench/compare.sh /tmp/rd.gguf 2
PN=$PN ROUNDS=3 GEN=48 bench/bw_fraction.sh /tmp/rd.gguf 1697
