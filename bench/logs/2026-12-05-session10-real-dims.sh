# Session 10: three engines on the 20.5 GB real-dims q4_k_m file with rows16 (Intel Xeon 6/207, 2 threads).
cd /work/main
REPS=1 PN=target/release/pn bash bench/compare.sh /tmp/real.gguf 2 2>&1 | grep -E "^(pp|ik|pn|llama|==)"
