# Session 20: full-dims q4_k_m, three engines, earlier rounds. Rounds 1-2: build 7e4e6a7 (the Q6_K split, its offset correction still in finish16). Rounds 3-5: build 4280fae (the final kernels; the final log's build adds only logs and docs).
cd /work/main
PN=target/release/pn REPS=2 ROUNDS=2 bash bench/compare.sh /tmp/fd.gguf 2   # at 7e4e6a7
PN=target/release/pn REPS=2 ROUNDS=3 bash bench/compare.sh /tmp/fd.gguf 2   # at 4280fae
