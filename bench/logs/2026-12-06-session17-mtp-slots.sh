#!/usr/bin/env bash
# MTP drafting with slots, the slots' block passes batched (new) or each slot's alone
# (old = the build before, ddeb679): pn batch, the built-in model, the six prompts of
# bench/mtp-prompts.txt, 256 greedy tokens each, 6 slots (and 16 with the prompts
# repeated), 2 threads; binaries alternated, aggregate tok/s from the end line.
set -u
OLD=${OLD:-/tmp/pn-old}; NEW=${NEW:-/tmp/pn-new}
P=bench/mtp-prompts.txt
cat $P $P $P > /tmp/mtp-prompts-18.txt
for round in 1 2; do
  for slots in 6 16; do
    f=$P; [ $slots = 16 ] && f=/tmp/mtp-prompts-18.txt
    for d in "none" "mtp always" "mtp adaptive"; do
      set -- $d
      args=(--draft $1); [ $# -gt 1 ] && args+=(--draft-policy $2)
      for b in OLD NEW; do
        bin=${!b}
        line=$($bin batch --prompts-file $f -n 256 --greedy --slots $slots -t 2 "${args[@]}" 2>&1 >/dev/null | grep -E "tok/s|draft" | tr '\n' ' ')
        echo "round $round slots $slots $d $b: $line"
      done
    done
  done
done
