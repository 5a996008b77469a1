# Session 12, final build (items 1-5 of docs/perf.md "Session 12"): three engines on
# full-dims q4_k_m, q5_k_m and iq4_xs (REPS=2 each), pn vs llama.cpp 0.3.36 vs
# ik_llama.cpp -rtr 1; nothing else running.
cd /work/main
cargo build --release -p pn-cli 2>&1 | tail -1
git log --oneline | head -1
for f in /tmp/fd.gguf /tmp/fd-q5_k_m.gguf /tmp/fd-iq4_xs.gguf; do
  REPS=2 bench/compare.sh $f 2>&1 | grep -E "^ik_llama|^pn:|^llama.cpp:|^pp|^=="
done
