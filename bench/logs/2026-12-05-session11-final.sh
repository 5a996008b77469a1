# Session 11, final build: three engines on full-dims q8_0 (two rounds), iq4_xs and q5_k_m.
cd /work/main
cargo build --release -p pn-cli 2>&1 | tail -1
git log --oneline | head -1
for f in /tmp/fd-q8_0.gguf /tmp/fd-q8_0.gguf /tmp/fd-iq4_xs.gguf /tmp/fd-q5_k_m.gguf; do
  REPS=2 bench/compare.sh $f 2>&1 | grep -E "^ik_llama|^pn:|^llama.cpp:|^pp|^=="
done
