# Session 14, build after the fused-expert MoE, the f16 KV decode and 512-token passes:
# full-dims q4_k_m, three engines in turn for three rounds (bench/compare.sh ROUNDS=3,
# REPS=2): per-round ratios and their medians.
cd /work/main
git log --oneline | head -1
ROUNDS=3 REPS=2 PN=target/release/pn bash bench/compare.sh /tmp/fd.gguf 2 2>&1 | grep -E "^ik_llama|^pn:|^llama.cpp:|^pp|^==|^-- round|median"
echo DONE
