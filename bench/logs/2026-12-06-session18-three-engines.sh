# Session 18, final build: pn vs llama.cpp vs ik_llama.cpp (-rtr 1, built this session
# by ../shared/oracle/ik_setup.sh), full-dims q4_k_m, 2 threads, two rounds.
cd /work/main
git log --oneline | head -1
ROUNDS=2 REPS=2 bash bench/compare.sh /tmp/fd.gguf 2
