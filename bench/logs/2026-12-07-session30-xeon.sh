#!/usr/bin/env bash
# Session 30 (token-major batched outputs) on the same Intel Xeon family 6 model 207 box as session 29 that exposes AVX-512 (F/BW/VL/VNNI/
# BF16/FP16) and AVX-VNNI but no AMX (2 vCPUs, 24 GB): issue 20's figures for this machine
# kind with all three engines (ik_llama.cpp built natively by the oracle's ik_setup.sh):
# full-dims q4_k_m (two rounds), the K table (two rounds), the other full-dims files (one
# round each), real-dims q4_k_m (one round), decode against the two-thread read probe.
set -euo pipefail
cd "$(dirname "$0")/../.."
PN=${PN:-target/release/pn}
lscpu | grep -E "Model name|Model:|Flags" | cut -c1-400
PN=$PN REPS=2 ROUNDS=2 bench/compare.sh /tmp/fd.gguf 2
PN=$PN KS=1,4,16 ROUNDS=2 bench/ktable.sh /tmp/fd.gguf 2
for t in q5_k_m iq4_xs q8_0; do
  PN=$PN REPS=2 ROUNDS=1 bench/compare.sh /tmp/fd-$t.gguf 2
done
PN=$PN REPS=2 ROUNDS=1 bench/compare.sh /tmp/rd.gguf 2
PN=$PN ROUNDS=3 GEN=64 bench/bw_fraction.sh /tmp/fd.gguf 329
PN=$PN ROUNDS=2 GEN=48 bench/bw_fraction.sh /tmp/rd.gguf 1697
