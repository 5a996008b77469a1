# Session 13, final build: full-dims q5_k_m and iq4_xs, three engines in turn for two
# rounds each (bench/compare.sh ROUNDS=2, REPS=2): per-round ratios and their medians.
cd /work/main
git log --oneline | head -1
for f in /tmp/fd-q5_k_m.gguf /tmp/fd-iq4_xs.gguf; do
  ROUNDS=2 REPS=2 PN=target/release/pn bash bench/compare.sh $f 2 2>&1 | grep -E "^ik_llama|^pn:|^llama.cpp:|^pp|^==|^-- round|median"
done
echo DONE
