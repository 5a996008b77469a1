# Session 15: three engines, full-dims q5_k_m and iq4_xs, two rounds each (bench/compare.sh).
cd /work/main
git log --oneline | head -1
for m in /tmp/fd-q5_k_m.gguf /tmp/fd-iq4_xs.gguf; do
  echo "== $m"
  ROUNDS=2 REPS=2 PN=target/release/pn bench/compare.sh $m 2
done
echo DONE
