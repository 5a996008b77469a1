# Session 16 final build: full-dims q5_k_m and iq4_xs, pn / llama.cpp / ik_llama.cpp side by side, one round each.
cd /work/main
git log --oneline | head -1
for f in /tmp/fd-q5_k_m.gguf /tmp/fd-iq4_xs.gguf; do ROUNDS=1 REPS=2 bash bench/compare.sh $f 2; done
echo DONE
