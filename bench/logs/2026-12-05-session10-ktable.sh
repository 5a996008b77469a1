# Session 10: K table, full-dims q4_k_m, llama.cpp (llama_bench_batch.py) vs pn bench --slots K.
cd /work/main
. ~/.cache/pn-oracle/venv/bin/activate
python ../shared/oracle/llama_bench_batch.py /tmp/fd.gguf --seqs 1,2,4,8,16 --prompt-len 32 --gen 32 --threads 2 2>&1 | grep "agg_tg"
for k in 1 2 4 8 16; do echo -n "pn K=$k "; target/release/pn bench -m /tmp/fd.gguf --slots $k --prompt-len 32 --gen 32 --threads 2 -q 2>&1 | tail -1; done
