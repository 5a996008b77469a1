# Session 13: three engines on the 20.5 GB real-dims q4_k_m file (`pn synth --preset
# full-dims --type q4_k_m --layers 40 --experts 256`), Intel Xeon 6/207, 2 threads, REPS=1.
cd /work/main
git log --oneline | head -1
free -g | grep Mem
REPS=1 PN=target/release/pn bash bench/compare.sh /tmp/real.gguf 2 2>&1 | grep -E "^(pp|ik|pn|llama|==)"
echo DONE
