#!/usr/bin/env bash
# Session 21: the K = 16 step against the streaming probe, alternated (issue 15: a K = 16
# step of full-dims q4_k_m reads ~1.05 GB of weights plus ~0.4 GB of recurrent state).
set -euo pipefail
cd "$(dirname "$0")/../.."
gcc -O2 -march=native -DOPS=2 -o /tmp/probe bench/probe_stream.c
for r in 1 2 3; do
  p=$( (/tmp/probe 1 8192 1073741824 & /tmp/probe 1 8192 1073741824; wait) | awk '{s+=$(NF-2)} END {print s}')
  j=$(target/release/pn bench --model /tmp/fd.gguf --slots 16 --prompt-len 32 --gen 32 -t 2 2>/dev/null | tail -1)
  agg=$(echo "$j" | sed -E 's/.*"agg_tg_tok_s":([0-9.]+).*/\1/')
  python3 -c "import sys; p,a=float(sys.argv[1]),float(sys.argv[2]); ms=16/a*1e3; print(f'round {sys.argv[3]}: probe {p:.1f} GB/s, K=16 {a:.1f} tok/s = {ms:.1f} ms a step, 1.45 GB/step = {1.45/ms*1e3:.1f} GB/s = {1.45/ms*1e3/p*100:.0f}% of the probe')" "$p" "$agg" "$r"
done
