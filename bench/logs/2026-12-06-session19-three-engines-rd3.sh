# Session 19: a fourth round of the three engines on the 20.5 GB real-dims q4_k_m file
# (REPS=2), on the final build.
cd /work/main
git log --oneline | head -1
ROUNDS=1 REPS=2 bash bench/compare.sh /tmp/rd.gguf 2
