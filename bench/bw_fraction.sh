#!/usr/bin/env bash
# Decode against the measured two-thread read bandwidth, interleaved (docs/perf.md
# "Session 23"): ROUNDS times, the two-thread probe (bench/probe_threads.c), one
# `pn bench` decode (--prompt-len 1 --gen GEN), the probe again; per round the decode's
# bytes a token (BYTES_MB: weights + the recurrent state read and written; full-dims
# q4_k_m 327) × tok/s over the mean of the two probes (best and median pass).
#   bench/bw_fraction.sh MODEL.gguf [BYTES_MB]      (env: ROUNDS=6, GEN=64, PN)
set -euo pipefail
model=${1:?usage: bench/bw_fraction.sh MODEL.gguf [BYTES_MB]}
mb=${2:-327}
root=$(cd "$(dirname "$0")/.." && pwd)
pn=${PN:-$root/target/release/pn}
probe=$(mktemp)
trap 'rm -f "$probe"' EXIT
gcc -O2 -march=native -pthread -o "$probe" "$root/bench/probe_threads.c"
for _ in $(seq "${ROUNDS:-6}"); do
  a=$("$probe" 2 8192 1073741824)
  tg=$("$pn" bench -q -m "$model" -t 2 --prompt-len 1 --gen "${GEN:-64}" --reps 1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["tg_tok_s"])')
  b=$("$probe" 2 8192 1073741824)
  python3 - "$a" "$b" "$tg" "$mb" <<'PY'
import re, sys
(a, b, tg, mb) = sys.argv[1:]
pa = [float(x) for x in re.findall(r"(?:best|median) ([0-9.]+)", a)]
pb = [float(x) for x in re.findall(r"(?:best|median) ([0-9.]+)", b)]
best, med = (pa[0] + pb[0]) / 2, (pa[1] + pb[1]) / 2
gbs = float(tg) * float(mb) / 1000
print(f"probe best {best:.1f} median {med:.1f} GB/s | decode {float(tg):.2f} tok/s = {gbs:.1f} GB/s | {100*gbs/best:.0f}% of best, {100*gbs/med:.0f}% of median")
PY
done
