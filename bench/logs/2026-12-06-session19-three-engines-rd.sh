# Session 19: the three engines on the 20.5 GB real-dims q4_k_m file after the plain
# huge-page copies (pn synth --preset full-dims --type q4_k_m --layers 40 --experts 256 --seed 1),
# two rounds, REPS=2 (pn's best of two passes; ik's llama-bench warms up itself).
cd /work/main
git log --oneline | head -1
ROUNDS=2 REPS=2 bash bench/compare.sh /tmp/rd.gguf 2
