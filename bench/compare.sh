#!/usr/bin/env bash
# Side-by-side prefill / decode speed of Pantheon and llama.cpp on one GGUF.
#
#   bench/compare.sh MODEL.gguf [THREADS]
#
# Runs `target/release/pn bench` and the oracle's llama_bench.py (llama.cpp through
# llama-cpp-python, venv at ~/.cache/pn-oracle/venv) with the same token stream, the same
# threads (default 2), prompt 128 + 32 generated tokens, then prompt 512; prints each
# engine's JSON line and the ratios pn / llama.cpp. Builds the release binary first
# (CARGO_TARGET_DIR is honoured). Env: REPS (default 3), PN (path to a pn binary).
set -euo pipefail
model=${1:?usage: bench/compare.sh MODEL.gguf [THREADS]}
threads=${2:-2}
reps=${REPS:-3}
root=$(cd "$(dirname "$0")/.." && pwd)
oracle=${ORACLE:-$root/../shared/oracle}
venv=${ORACLE_VENV:-$HOME/.cache/pn-oracle/venv}

if [[ -z "${PN:-}" ]]; then
  (cd "$root" && cargo build --release -q -p pn-cli)
  PN="${CARGO_TARGET_DIR:-$root/target}/release/pn"
fi
[[ -x "$PN" ]] || { echo "no pn binary at $PN" >&2; exit 1; }
# shellcheck disable=SC1091
. "$venv/bin/activate"

field() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }
ratio() { python3 -c 'import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); print(f"{a/b:.2f}" if b>0 else "n/a")' "$1" "$2"; }

summary=()
for pl in 128 512; do
  pn=$("$PN" bench --model "$model" --prompt-len "$pl" --gen 32 --threads "$threads" --reps "$reps" | tail -1)
  ll=$(python "$oracle/llama_bench.py" "$model" --prompt-len "$pl" --gen 32 --threads "$threads" --reps "$reps" | tail -1)
  echo "pn:        $pn"
  echo "llama.cpp: $ll"
  pp_r=$(ratio "$(field "$pn" pp_tok_s)" "$(field "$ll" pp_tok_s)")
  tg_r=$(ratio "$(field "$pn" tg_tok_s)" "$(field "$ll" tg_tok_s)")
  summary+=("pp$pl: pn $(field "$pn" pp_tok_s) vs llama.cpp $(field "$ll" pp_tok_s) tok/s -> ${pp_r}x | tg (after pp$pl): pn $(field "$pn" tg_tok_s) vs llama.cpp $(field "$ll" tg_tok_s) tok/s -> ${tg_r}x")
done
echo
echo "== $(basename "$model"), $threads threads (ratios: pn / llama.cpp)"
printf '%s\n' "${summary[@]}"
