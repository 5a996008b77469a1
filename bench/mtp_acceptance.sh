#!/usr/bin/env bash
# MTP acceptance on the built-in default model: the six prompts of bench/mtp-prompts.txt
# (models/default/README.md), 128 tokens each, greedy, 2 threads, for 1/2/3 drafts.
# Prints the per-prompt lines and the totals. Usage: bench/mtp_acceptance.sh [pn binary]
set -euo pipefail
PN=${1:-target/release/pn}
cd "$(dirname "$0")/.."
for n in 1 2 3; do
  drafted=0; accepted=0
  while IFS= read -r p; do
    line=$("$PN" run --draft mtp --draft-n "$n" --greedy -n 128 -t 2 -p "$p" 2>&1 >/dev/null | grep '^\[draft')
    d=$(sed -E 's/.*drafted ([0-9]+), accepted ([0-9]+).*/\1/' <<<"$line")
    a=$(sed -E 's/.*drafted ([0-9]+), accepted ([0-9]+).*/\2/' <<<"$line")
    drafted=$((drafted + d)); accepted=$((accepted + a))
    echo "n=$n ${p@Q}: $line"
  done < bench/mtp-prompts.txt
  echo "n=$n total: drafted $drafted, accepted $accepted ($(awk "BEGIN{printf \"%.1f\", 100*$accepted/$drafted}")%)"
done
