#!/usr/bin/env bash
# Session 24, final build: the AVX2 path (PN_NO_AVX512=1) on the q8_0 and iq4_xs full-dims
# files beside ik_llama.cpp's AVX2-only build. Intel Xeon 6/207, 2 threads.
cd "$(dirname "$0")/../.."
for m in fd-q8_0 fd-iq4_xs; do
  echo "=== $m"
  PN_NO_AVX512=1 PN=target/release/pn REPS=2 ROUNDS=2 IK_BENCH=$HOME/.cache/pn-oracle/ik-avx2/bin/llama-bench bench/compare.sh /tmp/$m.gguf 2
done
