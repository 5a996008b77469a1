#!/usr/bin/env bash
# Side-by-side prefill / decode speed of Pantheon, llama.cpp and (when built)
# ik_llama.cpp on one GGUF.
#
#   bench/compare.sh MODEL.gguf [THREADS]
#
# Runs `target/release/pn bench` and the oracle's llama_bench.py (llama.cpp through
# llama-cpp-python, venv at ~/.cache/pn-oracle/venv) with the same token stream, the same
# threads (default 2), prompt 128 + 32 generated tokens, then prompt 512; then, if
# ik_llama.cpp's llama-bench exists (~/.cache/pn-oracle/ik/bin, built by the oracle's
# ik_setup.sh), `llama-bench -p 128,512 -n 32 -rtr 1` (its run-time repacking; its decode
# runs from an empty context, not after the prompt). Prints each engine's numbers and the
# ratios pn / llama.cpp and pn / ik_llama.cpp. Builds the release binary first
# (CARGO_TARGET_DIR is honoured). Env: REPS (default 3), PN (path to a pn binary),
# IK_BENCH (path to ik's llama-bench; IK_BENCH=none skips it), ROUNDS (default 1): the
# engines run in turn ROUNDS times and the ratios of each round (all engines within the
# same minutes) are printed with their median — on a machine whose speed drifts, the
# median ratio is the figure to read.
set -euo pipefail
model=${1:?usage: bench/compare.sh MODEL.gguf [THREADS]}
threads=${2:-2}
reps=${REPS:-3}
root=$(cd "$(dirname "$0")/.." && pwd)
oracle=${ORACLE:-$root/../shared/oracle}
venv=${ORACLE_VENV:-$HOME/.cache/pn-oracle/venv}
ik=${IK_BENCH:-$HOME/.cache/pn-oracle/ik/bin/llama-bench}

if [[ -z "${PN:-}" ]]; then
  (cd "$root" && cargo build --release -q -p pn-cli)
  PN="${CARGO_TARGET_DIR:-$root/target}/release/pn"
fi
[[ -x "$PN" ]] || { echo "no pn binary at $PN" >&2; exit 1; }
# shellcheck disable=SC1091
. "$venv/bin/activate"

field() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }
ratio() { python3 -c 'import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); print(f"{a/b:.2f}" if b>0 else "n/a")' "$1" "$2"; }

rounds=${ROUNDS:-1}
# one line of ratios per round, per prompt length (128, then 512): pp / llama.cpp, pp / ik,
# tg / llama.cpp, tg / ik ("n/a" without ik)
ratios_file=$(mktemp)
trap 'rm -f "$ratios_file"' EXIT

one_round() {
# ik_llama.cpp first (one process runs pp128, pp512 and tg32): its JSON array turned into
# "pp128 pp512 tg" tok/s, or nothing when it is not built.
ik_pp128="" ik_pp512="" ik_tg=""
if [[ "$ik" != none && -x "$ik" ]]; then
  ik_json=$("$ik" -m "$model" -p 128,512 -n 32 -t "$threads" -r "$reps" -rtr 1 -o json 2>/dev/null)
  read -r ik_pp128 ik_pp512 ik_tg < <(python3 -c '
import json, sys
rows = json.loads(sys.argv[1])
ts = lambda p, g: next((r["avg_ts"] for r in rows if r["n_prompt"] == p and r["n_gen"] == g), 0.0)
print(f"{ts(128, 0):.2f} {ts(512, 0):.2f} {ts(0, 32):.2f}")' "$ik_json")
  echo "ik_llama.cpp: pp128 $ik_pp128 pp512 $ik_pp512 tg32 $ik_tg tok/s (-rtr 1)"
else
  echo "ik_llama.cpp: not built ($ik), skipped"
fi

summary=()
round_ratios=()
for pl in 128 512; do
  pn=$("$PN" bench --model "$model" --prompt-len "$pl" --gen 32 --threads "$threads" --reps "$reps" | tail -1)
  ll=$(python "$oracle/llama_bench.py" "$model" --prompt-len "$pl" --gen 32 --threads "$threads" --reps "$reps" | tail -1)
  echo "pn:        $pn"
  echo "llama.cpp: $ll"
  pn_pp=$(field "$pn" pp_tok_s) pn_tg=$(field "$pn" tg_tok_s)
  ll_pp=$(field "$ll" pp_tok_s) ll_tg=$(field "$ll" tg_tok_s)
  r_pp_ll=$(ratio "$pn_pp" "$ll_pp") r_tg_ll=$(ratio "$pn_tg" "$ll_tg") r_pp_ik="n/a" r_tg_ik="n/a"
  line="pp$pl: pn $pn_pp vs llama.cpp $ll_pp -> ${r_pp_ll}x"
  if [[ -n "$ik_tg" ]]; then
    ik_pp=$([[ $pl == 128 ]] && echo "$ik_pp128" || echo "$ik_pp512")
    r_pp_ik=$(ratio "$pn_pp" "$ik_pp") r_tg_ik=$(ratio "$pn_tg" "$ik_tg")
    line+=", vs ik $ik_pp -> ${r_pp_ik}x"
  fi
  line+=" | tg (after pp$pl): pn $pn_tg vs llama.cpp $ll_tg -> ${r_tg_ll}x"
  [[ -n "$ik_tg" ]] && line+=", vs ik $ik_tg -> ${r_tg_ik}x"
  round_ratios+=("$r_pp_ll" "$r_pp_ik" "$r_tg_ll" "$r_tg_ik")
  summary+=("$line")
done
echo
echo "== $(basename "$model"), $threads threads (ratios: pn / peer, tok/s)"
printf '%s\n' "${summary[@]}"
echo "${round_ratios[*]}" >> "$ratios_file"
}

for r in $(seq "$rounds"); do
  [[ $rounds -gt 1 ]] && echo "-- round $r of $rounds"
  one_round
done
if [[ $rounds -gt 1 ]]; then
  python3 - "$ratios_file" "$(basename "$model")" <<'PY'
import statistics, sys
names = ["pp128 / llama.cpp", "pp128 / ik", "tg (pp128) / llama.cpp", "tg (pp128) / ik",
         "pp512 / llama.cpp", "pp512 / ik", "tg (pp512) / llama.cpp", "tg (pp512) / ik"]
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
print(f"\n== {sys.argv[2]}: per-round ratios (pn / peer) over {len(rows)} rounds, median")
for i, n in enumerate(names):
    vals = [float(r[i]) for r in rows if r[i] != "n/a"]
    if vals:
        print(f"{n:24} {' '.join(f'{v:.2f}' for v in vals)}  median {statistics.median(vals):.2f}")
PY
fi
