#!/usr/bin/env bash
# The K table of issue 15: aggregate decode tok/s of K sequences stepped together, llama.cpp
# (the oracle's llama_bench_batch.py: K prompts, then decode steps of all K) beside
# `pn bench --slots K`, and pn's single-sequence `pn bench` decode (K = 1 is compared to it:
# across the two processes, and in one, `pn bench --slots 1`'s `k1_over_single`).
#
#   bench/ktable.sh MODEL.gguf [THREADS]
#
# Env: KS (default 1,2,4,8,16), PROMPT (32), GEN (32), ROUNDS (1): the engines run in turn
# ROUNDS times; each round prints both engines' figures and the ratios pn / llama.cpp per K
# (same minutes), then the medians over rounds — on a machine whose speed drifts the
# per-round ratios are the figures to read. PN: a pn binary (default: builds the release
# one). The oracle's venv: ~/.cache/pn-oracle/venv (ORACLE_VENV), its scripts:
# ../shared/oracle (ORACLE).
set -euo pipefail
model=${1:?usage: bench/ktable.sh MODEL.gguf [THREADS]}
threads=${2:-2}
ks=${KS:-1,2,4,8,16}
prompt=${PROMPT:-32}
gen=${GEN:-32}
rounds=${ROUNDS:-1}
root=$(cd "$(dirname "$0")/.." && pwd)
oracle=${ORACLE:-$root/../shared/oracle}
venv=${ORACLE_VENV:-$HOME/.cache/pn-oracle/venv}
if [[ -z "${PN:-}" ]]; then
  (cd "$root" && cargo build --release -q -p pn-cli)
  PN="${CARGO_TARGET_DIR:-$root/target}/release/pn"
fi
[[ -x "$venv/bin/python" ]] || { echo "no oracle venv at $venv (../shared/oracle/setup.sh makes it)" >&2; exit 1; }

field() { sed -E "s/.*\"$1\": ?([0-9.]+).*/\1/"; }
ratios=()
for ((r = 1; r <= rounds; r++)); do
  echo "== round $r/$rounds: $model, $threads threads, prompt $prompt, gen $gen"
  llama=$("$venv/bin/python" "$oracle/llama_bench_batch.py" "$model" --seqs "$ks" --prompt-len "$prompt" --gen "$gen" --threads "$threads" 2>/dev/null | grep agg_tg)
  echo "$llama"
  single=$("$PN" bench -q -m "$model" --prompt-len "$prompt" --gen "$gen" --threads "$threads" | tail -1)
  echo "pn single: $single"
  line="round $r:"
  for k in ${ks//,/ }; do
    out=$("$PN" bench -q -m "$model" --slots "$k" --prompt-len "$prompt" --gen "$gen" --threads "$threads" | tail -1)
    echo "pn K=$k: $out"
    p=$(field agg_tg_tok_s <<<"$out")
    l=$(grep "\"seqs\": $k," <<<"$llama" | field agg_tg_tok_s)
    x=$(awk "BEGIN{printf \"%.2f\", $p / $l}")
    line+=" K=$k $x"
    ratios+=("$k $x")
    if [[ $k == 1 ]]; then
      line+=" (pn K=1 / pn single: $(awk "BEGIN{printf \"%.3f\", $p / $(field tg_tok_s <<<"$single")}") across processes, $(field k1_over_single <<<"$out") in one)"
    fi
  done
  echo "$line  (pn / llama.cpp, aggregate decode)"
done
echo -n "median over $rounds round(s), pn / llama.cpp:"
for k in ${ks//,/ }; do
  m=$(printf '%s\n' "${ratios[@]}" | awk -v k="$k" '$1 == k {print $2}' | sort -n | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}')
  echo -n " K=$k $m"
done
echo
