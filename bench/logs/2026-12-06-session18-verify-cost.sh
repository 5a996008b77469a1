# Session 18, final build: the cost of a verify pass of 2 / 4 / 8 tokens (rolled back to
# its first token: the rollback now swaps the kept state in) relative to a 1-token step,
# full-dims q4_k_m, three runs (best of 10 each).
cd /work/main
git log --oneline | head -1
for i in 1 2 3; do target/release/pn bench -q -m /tmp/fd.gguf --verify-cost -t 2 --reps 10 2>&1 | tail -1; done
