# Session 14: full-dims q5_k_m, iq4_xs and q8_0 files, three engines in turn, two rounds
# each (bench/compare.sh ROUNDS=2, REPS=2).
cd /work/main
git log --oneline | head -1
for f in /tmp/fd-q5_k_m.gguf /tmp/fd-iq4_xs.gguf /tmp/fd-q8_0.gguf; do
  ROUNDS=2 REPS=2 PN=target/release/pn bash bench/compare.sh $f 2 2>&1 | grep -E "^== .*median|median"
done
echo DONE
