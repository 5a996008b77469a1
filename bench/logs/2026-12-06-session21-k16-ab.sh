#!/usr/bin/env bash
# Session 21: K = 16 (and K = 4) decode, the session's base binary (f96fe26, /tmp/pn-old)
# against the slot rows (/tmp/pn-new), alternated, full-dims q4_k_m.
set -euo pipefail
for r in 1 2 3 4; do
  for b in old new; do
    for k in 16 4; do
      a=$(/tmp/pn-$b bench -q -m /tmp/fd.gguf --slots $k --prompt-len 32 --gen 32 -t 2 | tail -1 | sed -E 's/.*"agg_tg_tok_s":([0-9.]+).*/\1/')
      echo "round $r $b K=$k $a"
    done
  done
done
