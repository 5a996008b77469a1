# Session 16 final build: full-dims q4_k_m, pn / llama.cpp / ik_llama.cpp side by side, two rounds.
cd /work/main
git log --oneline | head -1
ROUNDS=2 REPS=2 bash bench/compare.sh /tmp/fd.gguf 2
echo DONE
