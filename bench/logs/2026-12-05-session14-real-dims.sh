# Session 14: the 20.5 GB real-dims q4_k_m file (pn synth --preset full-dims --type q4_k_m
# --layers 40 --experts 256), three engines in turn, two rounds, REPS=1.
cd /work/main
git log --oneline | head -1
ROUNDS=2 REPS=1 PN=target/release/pn bash bench/compare.sh /tmp/real.gguf 2 2>&1 | grep -E "^ik_llama|^pn:|^llama.cpp:|^pp|^==|^-- round|median"
echo DONE
