#!/usr/bin/env bash
# Issue 17's lookup target on full-dims q4_k_m (random weights): decode tok/s with lookup
# drafts where the answer repeats a known text (--predict-answer: the plain run's own
# greedy token ids are the predicted output), plain and drafted in one process, best of
# 2, two rounds; draft-n 3 / 6 / 8, both policies.
# /tmp/fd.gguf: pn synth --preset full-dims --type q4_k_m --seed 1 --out /tmp/fd.gguf
set -u
PN=${PN:-target/release/pn}
M=${M:-/tmp/fd.gguf}
for round in 1 2; do
  for n in 3 6 8; do
    for pol in always adaptive; do
      echo "round $round n=$n $pol: $($PN bench --model $M -t 2 --draft lookup --draft-n $n --draft-policy $pol --predict-answer --gen 256 --reps 2 2>/dev/null)"
    done
  done
done
