#!/usr/bin/env bash
# MTP acceptance on the built-in default model: the six prompts of bench/mtp-prompts.txt
# (models/default/README.md), 128 tokens each, greedy, 2 threads, for 1/2/3 drafts.
# Prints the per-prompt lines and the totals, overall and per draft position (position i:
# accepted at i / drafted at i; every round drafts N here, so rounds = drafted / N).
# Usage: [KV=f16|q8_0|q4_0] bench/mtp_acceptance.sh [pn binary]   (default KV: pn's, q4_0)
set -euo pipefail
PN=${1:-target/release/pn}
kv=(); [ -z "${KV:-}" ] || kv=(--kv-type "$KV")
cd "$(dirname "$0")/.."
for n in 1 2 3; do
  drafted=0; accepted=0; pos=()
  for ((i = 0; i < n; i++)); do pos[i]=0; done
  while IFS= read -r p; do
    line=$("$PN" run "${kv[@]}" --draft mtp --draft-n "$n" --draft-policy always --greedy -n 128 -t 2 -p "$p" 2>&1 >/dev/null | grep '^\[draft')
    d=$(sed -E 's/.*drafted ([0-9]+), accepted ([0-9]+).*/\1/' <<<"$line")
    a=$(sed -E 's/.*drafted ([0-9]+), accepted ([0-9]+).*/\2/' <<<"$line")
    read -r -a pct <<<"$(sed -E 's/.*per position ([0-9. %]+)\)\]/\1/; s/%//g' <<<"$line")"
    for ((i = 0; i < n; i++)); do
      pos[i]=$(awk "BEGIN{printf \"%d\", ${pct[i]:-0} * $d / $n / 100 + 0.5}")
      pos[i]=$((pos[i] + ${tot[i]:-0})); tot[i]=${pos[i]}
    done
    drafted=$((drafted + d)); accepted=$((accepted + a))
    echo "n=$n ${p@Q}: $line"
  done < bench/mtp-prompts.txt
  rounds=$((drafted / n)); per=""
  for ((i = 0; i < n; i++)); do per+=" $(awk "BEGIN{printf \"%.1f%%\", 100*${tot[i]}/$rounds}")"; tot[i]=0; done
  echo "n=$n total (KV ${KV:-default}): drafted $drafted, accepted $accepted ($(awk "BEGIN{printf \"%.1f\", 100*$accepted/$drafted}")%; per position$per)"
done
