# Session 11, after the two-tile AMX pass: three engines on full-dims q8_0, two rounds.
cd /work/main
cargo build --release -p pn-cli 2>&1 | tail -1
git log --oneline | head -1
for f in /tmp/fd-q8_0.gguf /tmp/fd-q8_0.gguf; do
  REPS=2 bench/compare.sh $f 2>&1 | grep -E "^ik_llama|^pn:|^llama.cpp:|^pp|^=="
done
