# Session 12, final build: three engines on full-dims q4_k_m and q5_k_m (REPS=2 each),
# pn = this build, llama.cpp 0.3.36, ik_llama.cpp -rtr 1; nothing else running.
cd /work/main
cargo build --release -p pn-cli 2>&1 | tail -1
git log --oneline | head -1
lscpu | grep -E "Model name|^CPU\(s\)"
for f in /tmp/fd.gguf /tmp/fd-q5_k_m.gguf; do
  REPS=2 bench/compare.sh $f 2>&1 | grep -E "^ik_llama|^pn:|^llama.cpp:|^pp|^=="
done
