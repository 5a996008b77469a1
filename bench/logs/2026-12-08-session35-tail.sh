#!/usr/bin/env bash
# Session 35: the LM head's last rows % 16 rows (4099-row heads of the synthetic files)
# no longer push the whole matrix off the rows16 kernels. Old binary (8c9524f, /tmp/pn-old)
# and new alternated, decode (--prompt-len 1) on full-dims q4_k_m and q8_0, ROUNDS rounds.
set -euo pipefail
OLD=${OLD:-/tmp/pn-old}; NEW=${NEW:-target/release/pn}
for m in /tmp/fd.gguf /tmp/fd-q8_0.gguf; do
  for r in $(seq "${ROUNDS:-4}"); do
    for b in "$OLD" "$NEW"; do
      tg=$("$b" bench -q -m "$m" -t 2 --prompt-len 1 --gen 64 --reps 3 | python3 -c 'import json,sys; print(json.load(sys.stdin)["tg_tok_s"])')
      echo "$(basename "$m") round $r $( [ "$b" = "$OLD" ] && echo old || echo new ) tg $tg"
    done
  done
done
