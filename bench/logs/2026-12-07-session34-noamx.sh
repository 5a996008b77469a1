#!/usr/bin/env bash
# Session 34: what the AMX tiles give pn on this VM (Intel Xeon 6/207 with AMX exposed):
# `pn bench` with and without PN_NO_AMX (the AVX-512 VNNI kernels instead; bitwise the
# same results), processes alternated, ROUNDS rounds per full-dims file, prompt 128 and 512.
set -euo pipefail
cd "$(dirname "$0")/../.."
PN=${PN:-target/release/pn}
for m in fd fd-q5_k_m fd-iq4_xs fd-q8_0; do
  for r in $(seq "${ROUNDS:-2}"); do
    for p in 128 512; do
      a=$($PN bench -q --model /tmp/$m.gguf --prompt-len $p --gen 16 --reps 2 --threads 2)
      b=$(PN_NO_AMX=1 $PN bench -q --model /tmp/$m.gguf --prompt-len $p --gen 16 --reps 2 --threads 2)
      python3 - "$m" "$r" "$p" "$a" "$b" <<'PY'
import json, sys
m, r, p, a, b = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4]), json.loads(sys.argv[5])
print(f"{m:10} round {r} pp{p}: AMX {a['pp_tok_s']:7.1f} (first {a['first_pp_tok_s']:7.1f})  "
      f"no AMX {b['pp_tok_s']:7.1f} (first {b['first_pp_tok_s']:7.1f})  AMX / no AMX {a['pp_tok_s'] / b['pp_tok_s']:.3f}")
PY
    done
  done
done
