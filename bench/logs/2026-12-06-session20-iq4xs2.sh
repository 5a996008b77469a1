# Session 20: a second three-engine round on full-dims iq4_xs (the final log's round read pp512 1.20x llama.cpp / 1.06x ik).
cd /work/main
PN=target/release/pn REPS=2 ROUNDS=1 bash bench/compare.sh /tmp/fd-iq4_xs.gguf 2
