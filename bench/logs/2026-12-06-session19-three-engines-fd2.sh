# Session 19, final build: two more rounds of the three engines on full-dims q4_k_m.
cd /work/main
git log --oneline | head -1
ROUNDS=2 REPS=2 bash bench/compare.sh /tmp/fd.gguf 2
