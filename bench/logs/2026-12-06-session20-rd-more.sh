# Session 20: real-dims q4_k_m (20.5 GB), three engines: a round before the final log (build 4280fae, the final kernels) and one after (af5a848).
cd /work/main
PN=target/release/pn REPS=2 ROUNDS=1 bash bench/compare.sh /tmp/rd.gguf 2   # twice
