# Session 12: the K table on full-dims q4_k_m, llama.cpp (llama_bench_batch.py) then the
# session-start binary (/tmp/pn-s12a, 5453a32) and the final one, alternated per K.
cd /work/main
. ~/.cache/pn-oracle/venv/bin/activate
python ../shared/oracle/llama_bench_batch.py /tmp/fd.gguf --seqs 1,4,16 --prompt-len 32 --gen 32 --threads 2 2>&1 | grep "agg_tg"
for k in 1 4 16; do for b in /tmp/pn-s12a target/release/pn; do echo -n "$b K=$k "; $b bench -m /tmp/fd.gguf --slots $k --prompt-len 32 --gen 32 --threads 2 2>&1 | tail -1; done; done
