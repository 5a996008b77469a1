# Session 10: three engines on the full-dims files with rows16 (Intel Xeon 6/207, 2 threads).
cd /work/main
for m in /tmp/fd.gguf /tmp/fd-iq4_xs.gguf /tmp/fd-q5_k_m.gguf; do
  echo "== $m $(date)"
  REPS=2 PN=target/release/pn bash bench/compare.sh "$m" 2 2>&1 | grep -E "^(pp|ik|pn|llama|==)"
done
