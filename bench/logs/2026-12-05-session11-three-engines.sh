# Session 11: three engines side by side after the Q8_0-family kernel change (build of the
# commit this log is committed with), full-dims q8_0 (two rounds) and q4_k_m (reference).
cd /work/main
cargo build --release -p pn-cli 2>&1 | tail -1
lscpu | grep -E "Model name|^Flags" | cut -c1-160
for f in /tmp/fd-q8_0.gguf /tmp/fd-q8_0.gguf /tmp/fd.gguf; do
  REPS=2 bench/compare.sh $f 2>&1 | grep -E "^ik_llama|^pn:|^llama.cpp:|^pp|^==" 
done
