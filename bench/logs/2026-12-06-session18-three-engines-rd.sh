# Session 18, final build: the three engines on the 20.5 GB real-dims q4_k_m file
# (pn synth --preset full-dims --type q4_k_m --layers 40 --experts 256 --seed 1), one round.
cd /work/main
git log --oneline | head -1
ROUNDS=1 REPS=1 bash bench/compare.sh /tmp/rd.gguf 2
